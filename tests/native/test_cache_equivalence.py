"""Cached incremental decoding equals one-shot prefill, on each backend (the prompt-cache test of mlx-lm, restated).

MLX runs the same float32 maths whatever the batch shape: logits agree to 2e-3. llama.cpp picks different
kernels (and activation quantization) for a 1-token batch than for a long one, so its incremental logits drift
by up to ~0.5 logit; there we bound the KL divergence. Both must keep the argmax wherever the one-shot top-1 leads
by more than twice that drift (a near-tie may flip on another CPU's kernels). Measured here: KL <= 2e-3.
"""

import numpy as np
import pytest
from corpus_data import PROMPTS, teacher_forced
from logits import kl

KL_BOUND = 0.01  # nats, llama.cpp only
DECISIVE = {"mlx": 0.01, "llamacpp": 1.0}  # logits: top-1 leads that no batch split of this backend can flip


def assert_same_logits(backend, got: np.ndarray, want: np.ndarray) -> None:
    if backend.name == "mlx":
        np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)
    else:
        d = kl(want, got)
        assert d.max() < KL_BOUND, f"KL {d.max():.4g} nats"
    got, want = np.atleast_2d(got), np.atleast_2d(want)
    top2 = np.sort(want, -1)[:, -2:]
    decisive = top2[:, 1] - top2[:, 0] > DECISIVE[backend.name]
    assert (got.argmax(-1) == want.argmax(-1))[decisive].all()
    ranks = (want > want[np.arange(len(want)), got.argmax(-1)][:, None]).sum(-1)
    assert (ranks <= 1).all()  # at a near-tie the other of the two leading tokens, never a third


def _tokens(tok):
    ids, _ = teacher_forced(tok, PROMPTS[2], n_positions=24)
    return ids


def test_incremental_decode_matches_one_shot(backend):
    ids = _tokens(backend.tokenizer)
    one_shot = backend.new_session(512).forward_logits(ids)  # (T, vocab)
    s = backend.new_session(512)
    split = len(ids) - 12
    last = s.prefill(ids[:split])
    assert_same_logits(backend, last, one_shot[split - 1])
    for i in range(split, len(ids)):
        assert_same_logits(backend, s.decode(ids[i]), one_shot[i])
    assert s.n_past == len(ids)


def test_chunked_prefill_matches_one_shot(backend):
    ids = _tokens(backend.tokenizer)
    one_shot = backend.new_session(512).forward_logits(ids)
    s = backend.new_session(512)
    s.prefill(ids[:7])
    s.prefill(ids[7:20])
    rest = s.forward_logits(ids[20:])
    assert_same_logits(backend, rest, one_shot[20:])


def test_remove_tail_then_redecode_matches(backend):
    """Removing a tail of positions and decoding other tokens equals a fresh sequence with those tokens."""
    ids = _tokens(backend.tokenizer)
    s = backend.new_session(512)
    s.prefill(ids)
    s.remove(len(ids) - 5, len(ids))
    assert s.n_past == len(ids) - 5
    alt = backend.tokenizer.encode(" entirely different words")
    got = s.forward_logits(alt)
    fresh = backend.new_session(512).forward_logits(ids[:-5] + alt)[-len(alt):]
    assert_same_logits(backend, got, fresh)


def test_export_import_roundtrip_is_exact(backend):
    """Export a span, rebuild the sequence from a prefix plus the imported span: same next-token logits."""
    ids = _tokens(backend.tokenizer)
    full = backend.new_session(512)
    full.prefill(ids)
    span = full.export_kv(10, len(ids))
    assert len(span) == len(ids) - 10 and list(span.tokens) == ids[10:]
    probe = backend.tokenizer.encode(" and then")
    want = full.forward_logits(probe)
    s = backend.new_session(512)
    s.prefill(ids[:10])
    s.import_kv(span)
    assert s.n_past == len(ids)
    assert_same_logits(backend, s.forward_logits(probe), want)


def test_export_after_reanchored_import_carries_the_rotation(backend):
    """A span imported at another depth and exported at once holds its keys at the new positions.

    llama.cpp rotates shifted keys lazily, at the next decode; an export before that must not hand out keys that
    still sit at the old positions under the new position labels.
    """
    ids = _tokens(backend.tokenizer)
    full = backend.new_session(512)
    full.prefill(ids)
    span = full.export_kv(10, len(ids))
    s = backend.new_session(512)
    s.prefill(ids[:13])  # the span lands 3 positions later than it was computed
    s.import_kv(span)
    early = s.export_kv(13, s.n_past)
    s.decode(ids[0])  # any decode applies a pending shift
    s.remove(s.n_past - 1, s.n_past)
    late = s.export_kv(13, s.n_past)
    assert list(early.positions) == list(late.positions) == list(range(13, 13 + len(span)))
    if backend.name == "llamacpp":
        assert early.blob == late.blob
    else:
        np.testing.assert_array_equal(early.keys, late.keys)
    probe = backend.tokenizer.encode(" and then")
    outs = []
    for kv in (early, late):
        t = backend.new_session(512)
        t.prefill(ids[:13])
        t.import_kv(kv)
        outs.append(t.forward_logits(probe))
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("model", ["smollm2", "qwen"])
def test_keys_moved_before_an_import_answer_as_llamacpps_k_shift(request, model):
    """llama.cpp's K-shift rotates every cell of the cache at the next decode (~0.45 s at 32k cells); an import
    whose keys were rotated in the state (`move_keys`) lands at its new positions with nothing pending, and the
    logits after it are those after the K-shift (KL bound of this file), on a NORM (SmolLM2) and a NEOX (Qwen2.5)
    RoPE."""
    b = request.getfixturevalue("llamacpp_backend") if model == "smollm2" else \
        request.getfixturevalue("qwen_backends")("llamacpp")
    assert b.moves_keys()
    ids = _tokens(b.tokenizer)
    src = b.new_session(512)
    src.prefill(ids)
    span = src.export_kv(4, len(ids))
    probe = b.tokenizer.encode(" and then")
    outs = []
    for move in (False, True):
        s = b.new_session(512)
        s._move = move
        s.prefill(ids[:40])  # the span lands 36 positions deeper
        s.import_kv(span)
        assert s._shift_pending != move and s.n_past == 40 + len(span)
        assert list(s.export_kv(40, s.n_past).positions) == list(range(40, 40 + len(span)))
        outs.append(s.forward_logits(probe))
        s.close()
    src.close()
    assert_same_logits(b, outs[1], outs[0])
