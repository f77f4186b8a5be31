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
