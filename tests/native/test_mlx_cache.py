"""The MLX cache's contract for eviction: explicit positions, per-key additive bias, real compaction, query hook."""

import numpy as np
from corpus_data import PROMPTS, teacher_forced


def _prefilled(mlx_backend):
    ids, _ = teacher_forced(mlx_backend.tokenizer, PROMPTS[5], n_positions=16)
    s = mlx_backend.new_session(512)
    s.prefill(ids)
    return s, ids


def test_bias_minus_inf_equals_removing_keys(mlx_backend):
    """A -inf bias on a span of keys gives the same next-token logits as dropping that span from the cache."""
    probe = mlx_backend.tokenizer.encode(" so the answer is")
    a, ids = _prefilled(mlx_backend)
    for layer in a.cache.layers:
        bias = np.zeros((layer.n_kv_heads, layer.length), np.float32)
        bias[:, 8:20] = -np.inf
        layer.bias = bias
    b, _ = _prefilled(mlx_backend)
    bytes_before = b.cache.nbytes
    b.remove(8, 20)
    assert b.n_past == len(ids) and b.cache.length == len(ids) - 12  # positions keep their numbers
    assert b.cache.nbytes < bytes_before  # compaction frees memory
    np.testing.assert_allclose(a.forward_logits(probe), b.forward_logits(probe), atol=2e-3, rtol=0)
    assert list(b.cache.positions[:10]) == [0, 1, 2, 3, 4, 5, 6, 7, 20, 21]


def test_bias_log2_counts_a_key_twice(mlx_backend):
    """An additive log(2) bias is the Hajek weight 1/pi with pi = 1/2: attention mass of that key doubles."""
    s, _ = _prefilled(mlx_backend)
    base = s.forward_logits(mlx_backend.tokenizer.encode(" ok"))
    s2, _ = _prefilled(mlx_backend)
    for layer in s2.cache.layers:
        bias = np.zeros((layer.n_kv_heads, layer.length), np.float32)
        bias[:, 3] = np.log(2.0)
        layer.bias = bias
    moved = s2.forward_logits(mlx_backend.tokenizer.encode(" ok"))
    assert np.abs(moved - base).max() > 1e-3  # the bias reaches the logits


def test_query_hook_sees_every_layer(mlx_backend):
    s, ids = _prefilled(mlx_backend)
    seen = []
    s.cache.query_hook = lambda layer, q, qpos: seen.append((layer, tuple(q.shape), tuple(qpos)))
    s.decode(ids[-1])
    assert [x[0] for x in seen] == list(range(mlx_backend.info.n_layers))
    assert seen[0][1] == (1, mlx_backend.info.n_heads, 1, mlx_backend.info.head_dim)
    assert seen[0][2] == (len(ids),)


def test_decode_bias_row_matches_the_full_mask(mlx_backend):
    """A one-token decode step with a bias reuses the bias row kept between steps (zero for new keys); it must
    give the logits of a batched forward, whose mask is built per query, also after the row is invalidated by a
    rewind, a new bias and a compaction."""
    probe = mlx_backend.tokenizer.encode(" so the answer is")
    rng = np.random.default_rng(0)
    a, _ = _prefilled(mlx_backend)
    b, _ = _prefilled(mlx_backend)

    def set_bias():
        bias = rng.uniform(0.0, 2.0, (a.cache.layers[0].n_kv_heads, a.cache.length)).astype(np.float32)
        for s in (a, b):
            for layer in s.cache.layers:
                layer.bias = bias.copy()

    def compare():
        n0 = a.n_past
        stepped = np.stack([a.decode(t) for t in probe])  # bias row, grown by one zero per step
        batched = b.forward_logits(probe)  # (T, S) mask with the bias
        np.testing.assert_allclose(stepped, batched, atol=2e-3, rtol=0)
        for s in (a, b):
            s.remove(n0, s.n_past)  # rewind: the row must not keep stale entries past the new length

    set_bias()
    compare()
    compare()  # after a truncate
    set_bias()
    compare()  # a new bias
    for s in (a, b):
        s.remove(8, 20)  # compaction
    compare()
