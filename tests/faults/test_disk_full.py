"""The disk filling up during `nexus compile`: a real `nexus compile` subprocess under a file-size cap
(RLIMIT_FSIZE, the same EFBIG a full quota gives). No partial block may ever be read as valid."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

from registry.servers.calculator import FUNCTIONS as CALCULATOR
from registry.sources import register_functions
from registry.store import RegistryStore
from splice.block import load_block
from splice.compiler import artefact_kind, block_key, block_path

NEXUS = Path(sys.executable).with_name("nexus")
CAP = 1_500_000  # bytes: the smaller calculator blocks fit (1.43-1.45 MB), the larger ones do not (1.57-1.94 MB)


def _capped():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (CAP, CAP))


def _compile(nexus_home, capped: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ, NEXUS_HOME=str(nexus_home), NEXUS_THREADS="1")
    return subprocess.run([str(NEXUS), "compile", "--force"], env=env, capture_output=True, text=True, timeout=240,
                          preexec_fn=_capped if capped else None)


def test_disk_full_during_compile_leaves_no_partial_block(llamacpp_backend, nexus_home, fault):
    f = fault("disk full during nexus compile", "splice.compiler / registry.atomic",
              "exit 1 with a clear error; no .tmp left; every .kvb on disk verifies; failed tools stay stale")
    b = llamacpp_backend
    with RegistryStore() as store:
        register_functions(CALCULATOR, store)
        tools = store.list_tools()
    first = _compile(nexus_home, capped=False)
    assert first.returncode == 0, first.stderr
    before = {t.name: block_path(b, t).read_bytes() for t in tools}
    sizes = sorted(len(v) for v in before.values())
    assert sizes[0] < CAP < sizes[-1], sizes  # the cap really cuts a write in the middle

    failed = _compile(nexus_home, capped=True)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert "free disk space" in failed.stderr and ".kvb" in failed.stderr, failed.stderr
    folder = block_path(b, tools[0]).parent
    assert not [p.name for p in folder.iterdir() if not p.name.endswith(".kvb")]  # no temporary file left behind
    for t in tools:  # the old blocks survive untouched, and each verifies
        assert block_path(b, t).read_bytes() == before[t.name]
        load_block(block_path(b, t), block_key(b, t))

    # A fresh home: the capped compile writes what fits; nothing it leaves is partial or marked fresh.
    fresh = nexus_home.parent / "fresh-home"
    os.environ["NEXUS_HOME"] = str(fresh)  # restored by the autouse nexus_home fixture's monkeypatch
    with RegistryStore() as store:
        register_functions(CALCULATOR, store)
        failed = _compile(fresh, capped=True)
        assert failed.returncode == 1
        stale = {t.name for t in store.stale_tools(artefact_kind(b))}
        assert stale == {t.name for t in tools}  # compile did not finish: nothing is marked fresh
        written = 0
        for t in tools:
            p = block_path(b, t)
            if p.exists():
                load_block(p, block_key(b, t))  # raises BlockError for any partial file
                written += 1
        assert written < len(tools)
        assert all(p.suffix == ".kvb" for p in p.parent.iterdir())
        assert _compile(fresh, capped=False).returncode == 0
        assert not store.stale_tools(artefact_kind(b))
    f.observe(f"exit 1, one-line error; old blocks intact; fresh home: {written}/{len(tools)} complete blocks, "
              "0 partial, all still stale; rerun compiles all", lost=0)
