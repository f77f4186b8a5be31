"""The answer path of an evicting session on the real model: which steps the certificate covers, what recall
brings back for a question, and that a recall is released to the exact evicted state."""

from __future__ import annotations

import numpy as np
import pytest

from evals.eviction_runtime import _answer, _clone, needle_survival
from evals.eviction_traces import make_trace, needle_positions
from nexus_agent.eviction import EvictingSession, EvictionConfig, make_policy


@pytest.fixture(scope="module")
def trace(mlx_backend):
    tr = make_trace(301, n_steps=30, n_facts=10)
    ids, needles = needle_positions(mlx_backend.tokenizer, tr)
    base = mlx_backend.new_session()
    base.prefill(ids)
    return tr, ids, needles, base.export_kv(0, len(ids))


def _evicted(mlx_backend, trace, tmp_path, policy="certified"):
    _, ids, _, kv = trace
    s = EvictingSession(_clone(mlx_backend, kv, len(ids) - 16), make_policy(policy),
                        EvictionConfig(budget=round(0.25 * len(ids))), spill_path=tmp_path / f"{policy}.spill")
    s.prefill(ids[-16:])  # the end of the prefill: one eviction, scored on the trace's last 16 queries
    assert len(s.evict_ms) == 1
    return s


def test_certificate_covers_only_the_answer_steps(mlx_backend, trace, tmp_path):
    # The certificate is over the first 6 answer steps only: the question's own tokens before begin_answer's
    # first step are not certified.
    tr, ids, _, _ = trace
    s = _evicted(mlx_backend, trace, tmp_path)
    q = mlx_backend.tokenizer.encode(tr.facts[2].question)
    first = s.n_past + len(q) - 1
    s.begin_answer(first_step=first)
    s.forward_logits(q + [42, 43, 44, 45, 46, 47, 48])  # 1 + 7 answer steps fed at once
    assert sorted(s.certifier.cells) == list(range(first, first + 6))
    n_cells = s.info.n_layers * len(range(0, s.info.n_heads, 4))
    assert all(len(v) == n_cells for v in s.certifier.cells.values())
    assert s.certificate > 0  # the certified tail is sampled, so the cells are not all zero


def test_recall_brings_back_the_asked_fact_and_release_restores(mlx_backend, trace, tmp_path):
    tr, ids, needles, _ = trace
    s = _evicted(mlx_backend, trace, tmp_path)
    pos0, pi0 = s.cache.positions.copy(), s.pi.copy()
    bias0 = s.cache.layers[3].bias.copy()
    budget0, allowance = s.budget, int(0.1 * len(ids))
    found = 0
    gone = [(f, p) for f, p in zip(tr.facts, needles) if p not in set(pos0.tolist())][:5]  # need the disk tier
    assert len(gone) == 5
    for f, needle in gone:
        _answer(s, mlx_backend.tokenizer, f)
        # no eviction inside the answer, even after a Poisson keep above the budget
        assert len(s.evict_ms) == 1 and s.cache.length == len(pos0)
        assert s.evicted_attention() > 0.5  # an answer head looks hard at something evicted
        back = s.recall(allowance)
        assert 0 < len(back) <= allowance and s.cache.length == len(pos0) + len(back)
        found += needle in set(back.tolist())
        s.release()
        np.testing.assert_array_equal(s.cache.positions, pos0)
        np.testing.assert_array_equal(s.pi, pi0)
        np.testing.assert_array_equal(s.cache.layers[3].bias, bias0)
        assert s.budget == budget0 and len(s.spill.available()) == len(ids) - len(pos0)
    assert found == len(gone)  # windows centred on the keys the question attends to most hold the fact


def test_a_second_recall_replaces_the_first(mlx_backend, trace, tmp_path):
    tr, ids, _, _ = trace
    s = _evicted(mlx_backend, trace, tmp_path)
    n0 = s.cache.length
    for f in tr.facts[:2]:
        _answer(s, mlx_backend.tokenizer, f)
        back = s.recall(100)
        assert s.cache.length == n0 + len(back)  # the allowance is not cumulative


def test_neighbour_ranked_recall_brings_back_whole_spilled_blocks(mlx_backend, trace, tmp_path):
    """rank="neighbours" (DESIGN §7) recalls only whole aligned blocks of spilled positions, the one its retained
    neighbours carried the most certificate variance for first, within the allowance."""
    tr, ids, _, _ = trace
    s = _evicted(mlx_backend, trace, tmp_path)
    spilled = set(s.spill.available().tolist())
    _answer(s, mlx_backend.tokenizer, tr.facts[0])
    assert s.var_contrib.sum() > 0  # the answer steps were certified
    back = s.recall(150, block=64, rank="neighbours")
    assert 0 < len(back) <= 150 and set(back.tolist()) <= spilled
    for b in np.unique(back // 64):  # whole blocks: every spilled position of each recalled block
        assert set(back[back // 64 == b].tolist()) == {p for p in spilled if p // 64 == b}
    pos = s.cache.positions
    blocks = np.unique(np.array(sorted(spilled)) // 64)
    var = {int(b): s.var_contrib[(pos >= (b - 1) * 64) & (pos < (b + 2) * 64)].sum() for b in blocks}
    best = max(var, key=lambda b: (var[b], -b))
    if sum(p // 64 == best for p in spilled) <= 150:
        assert best in set((back // 64).tolist())


def test_needle_survival_tracks_a_fixed_needle_set(mlx_backend):
    tok = mlx_backend.tokenizer
    tr = make_trace(100, n_steps=8, n_facts=3)
    pre, needles = needle_positions(tok, tr)
    stream = needle_positions(tok, make_trace(101, n_steps=12, n_facts=0))[0]
    out = needle_survival(mlx_backend, pre, needles, stream, make_policy("reservoir", n=None), budget=128)
    assert out["events"] == len(out["survival"]) >= 5 and out["n_past"][0] == len(pre)
    assert all(x * len(needles) == round(x * len(needles)) for x in out["survival"])  # one fixed denominator
    assert all(b <= a for a, b in zip(out["survival"], out["survival"][1:]))  # top-k never brings one back
    # flat in trace length: every event ends at or under the budget, and the bytes are those of the kept tokens
    # (not exactly equal per event: blocks are cut by position, and a kept block at the recent window's edge
    # can be partial)
    assert all(t <= 128 for t in out["cache_tokens"])
    assert len({b // t for b, t in zip(out["kv_bytes"], out["cache_tokens"])}) == 1
