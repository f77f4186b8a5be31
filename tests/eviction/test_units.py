"""Pure pieces: config validation, inclusion probabilities, reservoir limits, the certificate's arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from nexus_agent.eviction import POLICIES, POSITIONAL_POLICIES, EvictionConfig, make_policy
from nexus_agent.eviction.certificate import certify_cell
from nexus_agent.eviction.policies.certified import inclusion_probabilities, systematic_sample
from nexus_agent.eviction.policy import OBSERVABLE, Observation, block_ids, protected_mask


@pytest.mark.parametrize("bad", [dict(budget=0.0), dict(budget=1.5), dict(budget=10), dict(block=0), dict(budget="x")])
def test_config_rejects(bad):
    with pytest.raises(ValueError):
        EvictionConfig(**bad)


def test_config_fraction_and_unknown_policy():
    assert EvictionConfig(budget=0.25).tokens(1000) == 250
    with pytest.raises(ValueError, match="known: full"):
        make_policy("nope")


def test_inclusion_probabilities_sum_to_budget():
    s = np.random.default_rng(0).pareto(1.5, 200)
    pi = inclusion_probabilities(s, 30)
    assert abs(pi.sum() - 30) < 1e-6 and pi.max() == 1.0 and pi.min() >= 1e-6
    assert np.all(np.diff(pi[np.argsort(s)]) >= -1e-12)  # monotone in the score


def test_systematic_sample_keeps_each_unit_with_probability_pi():
    rng = np.random.default_rng(0)
    pi = inclusion_probabilities(rng.pareto(1.5, 40), 6)
    draws = np.stack([systematic_sample(pi, rng) for _ in range(4000)])
    assert set(draws.sum(1).tolist()) == {6}  # fixed size: Σπ = 6
    assert draws[:, pi == 1.0].all()  # the certainty layer
    np.testing.assert_allclose(draws.mean(0), pi, atol=0.03)  # 4000 draws: 3 standard errors at π = 1/2


def test_reservoir_limits():
    rng = np.random.default_rng(0)
    scores = rng.random((1, 64))
    prot = np.zeros(64, bool)
    ids = block_ids(np.arange(64), prot, 8)
    top = make_policy("reservoir", n=None).select(scores, prot, 3, ids, rng)[0]
    det = make_policy("certified", mode="topk").select(scores, prot, 3, ids, rng)[0]
    np.testing.assert_array_equal(top, det)  # n -> inf is deterministic top-K
    draws = [make_policy("reservoir", n=1).select(scores, prot, 3, ids, rng)[0] for _ in range(20)]
    assert len({d.tobytes() for d in draws}) > 1 and all(d.sum() == 24 for d in draws)


def test_reservoir_given_uniforms_is_a_function_of_them():
    rng = np.random.default_rng(1)
    scores, prot = rng.random((1, 64)), np.zeros(64, bool)
    ids = block_ids(np.arange(64), prot, 8)
    u = rng.random((5, 1, 8))
    pol = make_policy("reservoir", n=5)
    a = pol.select(scores, prot, 3, ids, np.random.default_rng(2), u=u)[0]
    b = pol.select(scores * 1.5, prot, 3, ids, np.random.default_rng(3), u=u)[0]
    np.testing.assert_array_equal(a, pol.select(scores, prot, 3, ids, np.random.default_rng(4), u=u)[0])
    assert a.sum() == b.sum() == 24


def test_block_ids_cut_by_position():
    pos = np.array([0, 1, 2, 3, 8, 9, 10, 11, 20, 21, 22, 23])
    prot = np.zeros(12, bool)
    prot[:2] = True
    ids = block_ids(pos, prot, 4)  # blocks [0, 4), [8, 12), [20, 24); the first one partly protected
    np.testing.assert_array_equal(ids, [-1, -1, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    contiguous = np.arange(40)
    prot = contiguous < 4
    expected = [-1] * 4 + [i for i in range(5) for _ in range(8)][:36]  # free slots cut in slot order
    np.testing.assert_array_equal(block_ids(contiguous, prot, 8, offset=4), expected)


def test_certificate_zero_without_sampling_and_positive_with():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=16), rng.normal(size=(40, 16)), rng.normal(size=(40, 16))
    cert, y, _ = certify_cell(q, k, v, np.ones(40), np.full(40, -1))
    a = np.exp(k @ q / 4 - (k @ q / 4).max())
    np.testing.assert_allclose(y, a @ v / a.sum())
    assert cert == 0.0  # nothing sampled: the certificate is 0 by definition, not a computed float
    pi = np.full(40, 0.5)
    cert2, _, contrib = certify_cell(q, k, v, pi, np.arange(40))
    assert cert2 > 0 and (contrib >= 0).all() and contrib.sum() > 0


def test_certificate_unit_term_is_the_delete_one_change():
    rng = np.random.default_rng(2)
    q, k, v = rng.normal(size=16), rng.normal(size=(64, 16)), rng.normal(size=(64, 16))
    unit = np.repeat(np.arange(8), 8)  # 8 blocks of 8 tokens
    unit[:4] = -1  # sinks, π = 1
    pi = np.where(unit >= 0, 0.1 + 0.1 * np.maximum(unit, 0), 1.0)
    _, y, contrib = certify_cell(q, k, v, pi, unit)
    for u in range(8):
        rest = unit != u
        _, y_minus, _ = certify_cell(q, k[rest], v[rest], pi[rest], np.full(rest.sum(), -1))
        np.testing.assert_allclose(contrib[unit == u].sum(), (1 - pi[unit == u][0]) * np.sum((y - y_minus) ** 2),
                                   rtol=1e-9)


def _observation(needs, rng, hkv=2, group=3, n=96, w=8, d=16) -> Observation:
    """A random post-RoPE-like Observation that holds only the fields in `needs` (the rest None or zeros)."""
    keys = rng.normal(size=(hkv, n, d)).astype(np.float32) if "keys" in needs else np.zeros((hkv, n, d), np.float32)
    queries = rng.normal(size=(hkv * group, w, d)).astype(np.float32) if "queries" in needs else \
        np.zeros((hkv * group, w, d), np.float32)
    return Observation(keys, rng.normal(size=(hkv, n, d)).astype(np.float32) if "values" in needs else None,
                       np.arange(n), queries, np.arange(n - w, n), rng.random((hkv, n)) if "history" in needs else None)


@pytest.mark.parametrize("cls", POLICIES, ids=lambda c: c.name)
def test_policy_reads_only_what_it_declares(cls):
    """Every registered policy scores an Observation holding only its `needs`, and selects a keep mask that holds
    the protected slots with π in (0, 1]; the positional list is exactly the policies that need nothing."""
    assert cls.needs <= OBSERVABLE and (cls.name in POSITIONAL_POLICIES) == (not cls.needs)
    rng = np.random.default_rng(0)
    pol, obs = cls(), _observation(cls.needs, rng)
    scores = pol.score(obs)
    assert scores.shape == (2, 96) and np.isfinite(scores).all()
    sinks = pol.sinks(4, 8)
    prot = protected_mask(obs.positions, 96, sinks, 16)
    ids = block_ids(obs.positions, prot, 8, offset=sinks)
    kw = {"u": rng.random((pol.slot_draws, 2, int(ids.max()) + 1))} if pol.slot_draws else {}
    keep, pi = pol.select(scores, prot, 4, ids, rng, **kw)
    assert keep.shape == pi.shape == (2, 96) and keep[:, prot].all()
    assert (pi > 0).all() and (pi <= 1).all()
    if pol.capacity(64) < np.inf:
        assert pi.max() == 1.0 and keep.sum(1).max() <= prot.sum() + (4 + 1) * 8  # K blocks (+1: systematic)
