"""Fault-suite fixtures: `fault(...)` records an injected fault; the session writes tests/faults/RESULTS.md."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from ledger import LEDGER, RESULTS, Fault  # noqa: E402


@pytest.fixture
def fault(request):
    """fault(name, component, expected) -> Fault; call `.observe(text, lost)` once the outcome is asserted."""
    made: list[Fault] = []
    request.node._faults = made

    def make(name: str, component: str, expected: str) -> Fault:
        f = Fault(name, component, expected, test=request.node.nodeid)
        made.append(f)
        LEDGER.faults.append(f)
        return f

    return make


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "teardown":
        passed = getattr(item, "_fault_call_passed", False)
        for f in getattr(item, "_faults", []):
            f.survived = passed
    elif rep.when == "call":
        item._fault_call_passed = rep.passed


def pytest_sessionfinish(session, exitstatus):
    # Only a run that included the whole fault suite rewrites the table (a -k subset would shrink it).
    if LEDGER.faults and not session.config.option.keyword and not session.config.option.markexpr:
        RESULTS.write_text(LEDGER.table())
