"""The certificate as an estimator on captured attention of the real model (NumPy fp32 replay)."""

from __future__ import annotations

import numpy as np
import pytest

from evals.eviction_replay import capture, replay, spearman
from evals.eviction_traces import make_trace, needle_positions
from nexus_agent.eviction import make_policy


@pytest.fixture(scope="module")
def cap(mlx_backend):
    tok = mlx_backend.tokenizer
    tr = make_trace(5, n_steps=14, n_facts=2)
    ids, _ = needle_positions(tok, tr)
    q, a = tok.encode(tr.facts[0].question), tok.encode(tr.facts[0].answer)
    return capture(mlx_backend, ids + q + a + tok.encode(" and the rest of it."), len(ids) + len(q))  # >= 6 steps


def test_certificate_covers_realized_error(cap):
    certs, errs = [], []
    for seed in range(2):
        e, c, _ = replay(cap, make_policy("certified"), 0.25, block=1, seed=seed)
        certs.append(c.ravel())
        errs.append(e[:, ::4].ravel())
    c, e = np.concatenate(certs), np.concatenate(errs)
    assert (e <= c).mean() >= 0.85  # δ = 0.1 nominal
    assert spearman(c, e) >= 0.7


def test_hajek_beats_topk_and_no_offset(cap):
    med = {}
    for name, kw in (("poisson", {}), ("topk", {"mode": "topk"}), ("no_offset", {"offset": False})):
        med[name] = np.median(np.concatenate([replay(cap, make_policy("certified", **kw), 0.25, block=1,
                                                     seed=s)[0].ravel() for s in range(2)]))
    assert med["poisson"] < med["topk"] and med["poisson"] < med["no_offset"]
