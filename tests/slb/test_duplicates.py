"""Near-duplicate tools: the all-pairs pass against brute force, the duplicate-aware margin, and the CLI end to
end (a warning on register, `nexus tools duplicates`, `nexus route` saying the top tools are duplicates)."""

from __future__ import annotations

import json

import numpy as np

from slb.duplicates import duplicate_map, duplicate_pairs, margin_to_distinct

from .test_learn import _nexus


def test_duplicate_pairs_match_brute_force():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1500, 32)).astype(np.float32)
    x[700] = x[3] + 0.05 * x[9]  # planted near-duplicates across blocks
    x[1499] = x[1498]
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    pairs = duplicate_pairs(x, 0.9, block=256)
    s = x @ x.T
    want = {(a, b) for a, b in zip(*np.nonzero(np.triu(s >= 0.9, 1)))}
    assert {(a, b) for a, b, _ in pairs} == want and (3, 700) in want and (1498, 1499) in want
    assert all(a < b for a, b, _ in pairs) and [c for *_, c in pairs] == sorted((c for *_, c in pairs), reverse=True)


def test_margin_is_measured_to_the_first_distinct_candidate():
    dups = duplicate_map([(4, 7, 0.95)])
    assert dups == {4: {7: 0.95}, 7: {4: 0.95}}
    s, ids = np.array([0.8, 0.79, 0.6, 0.5], np.float32), np.array([4, 7, 1, 2])
    assert abs(margin_to_distinct(s, ids, dups) - 0.2) < 1e-6  # 7 is 4's duplicate: margin to tool 1
    assert abs(margin_to_distinct(s, ids, {}) - 0.01) < 1e-6
    assert margin_to_distinct(s[:1], ids[:1], dups) == 1.0


FACT = "Compute the factorial of a non-negative integer n."
DUP_TOOLS = [
    {"name": "math_factorial", "description": FACT,
     "inputSchema": {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}},
    {"name": "factorial.compute", "description": FACT,
     "inputSchema": {"type": "object", "required": ["number"], "properties": {"number": {"type": "integer"}}}},
    {"name": "hotel_search", "description": "Find hotels in a city for given dates.",
     "inputSchema": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}},
]


def test_cli_warns_lists_and_routes_with_duplicates(nexus_home, tmp_path):
    f = tmp_path / "tools.jsonl"
    f.write_text("".join(json.dumps(t) + "\n" for t in DUP_TOOLS))
    r = _nexus(nexus_home, "register", "--file", str(f))
    assert r.returncode == 0, r.stderr
    assert "warning: math_factorial and factorial.compute look like near-duplicates" in r.stderr \
        or "warning: factorial.compute and math_factorial look like near-duplicates" in r.stderr
    listed = json.loads(_nexus(nexus_home, "tools", "duplicates", "--json").stdout)
    assert {(p["a"], p["b"]) for p in listed} <= {("math_factorial", "factorial.compute"),
                                                  ("factorial.compute", "math_factorial")} and len(listed) == 1
    d = json.loads(_nexus(nexus_home, "route", "what is the factorial of 7", "--json").stdout)
    assert d["tool"] in ("math_factorial", "factorial.compute")
    assert [n for n, _ in d["duplicates"]] == [({"math_factorial", "factorial.compute"} - {d["tool"]}).pop()]
    assert d["margin"] > 0.1  # measured to hotel_search, not to the duplicate
    printed = _nexus(nexus_home, "route", "what is the factorial of 7").stdout
    assert "has near-duplicates among the candidates" in printed
