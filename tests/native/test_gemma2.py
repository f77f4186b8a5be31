"""Gemma 2 on a tiny random-weight GGUF (`tests/tiny_models.py`: 4 layers, the even ones sliding over 16 tokens,
attention scores capped at 4 and logits at 10 so that both caps act on random weights), float32.

Measured here on the 42-token prompt (past the window): llama.cpp against MLX KL 1.5e-7 nats (flash attention
off) and 5.1e-7 (on), |logit difference| <= 0.0046 / 0.0082, top-1 equal on every position (the smallest top-2
gap is 0.022, so no position is a tie); our MLX model with its attention cap switched off: KL 0.0098, with both
caps off: 15.6. The bounds: KL < 1e-5 with the caps, > 1e-3 without. Splicing: a block exported at positions
0.. from any layout (MLX; llama.cpp with V transposed, flash attention off; llama.cpp with V per cell, flash
attention on) and imported at depth 0, 37 or 60 (past the window) into the same or the other llama.cpp layout
gives the next token the logits a prefill at that depth gives. Eviction policies, the MLX folder and the
re-anchoring matrix run on it in test_architectures.py.
"""

from __future__ import annotations

import dataclasses
import json

import mlx.core as mx
import numpy as np
import pytest
from llama_cpp import llama_cpp as C
from logits import kl

from native import BackendError, load_backend
from native.llamacpp_state import read_streams, set_v_layout
from native.models.attention import attention_weights

TEXT = "The quick brown fox jumps over the lazy dog. " * 4
TEXTS = ["Hello world! 12345 tokens", "  leading spaces\n\nnew lines\tand tabs   ", "naïve café, 日本語, emoji 😀👍🏽",
         '{"city": "Paris", "unit": "c"}', "<start_of_turn>user\nhi<end_of_turn>", ""]
LAYOUTS = ["mlx", "llamacpp-fa-off", "llamacpp-fa-on"]


@pytest.fixture(scope="module")
def gemma2(tiny):
    path, m, c = tiny("gemma2")
    ids = [m.tokenizer.bos_id] + m.tokenizer.encode(TEXT)
    return path, m, c, ids


def _session(gemma2, layout: str):
    _, m, c, _ = gemma2
    return m.new_session(256) if layout == "mlx" else c.new_session(256, flash_attn=layout.endswith("on"))


def test_soft_capped_logits_match_llama_cpp(gemma2):
    _, m, c, ids = gemma2
    assert m.info.architecture == c.info.architecture == "gemma2"
    assert m.info.windows == (16, 0, 16, 0) and m.info.attn_softcap == 4.0 and len(ids) > 2 * 16
    want = m.new_session(256).forward_logits(ids)
    for flash_attn in (False, True):
        got = c.new_session(256, flash_attn=flash_attn).forward_logits(ids)
        print(f"flash_attn={flash_attn}: KL {kl(got, want).max():.2e}, |diff| {np.abs(got - want).max():.4f}")
        assert kl(got, want).max() < 1e-5
        assert (got.argmax(-1) == want.argmax(-1)).all()
    top2 = np.sort(want, -1)[:, -2:]
    print(f"max |logit| {np.abs(want).max():.3f}, top-2 gap min {np.min(top2[:, 1] - top2[:, 0]):.4f}")
    assert np.abs(want).max() <= 10.0 and np.abs(got).max() <= 10.0  # the final cap
    assert (top2[:, 1] - top2[:, 0] > 0.01).mean() > 0.8  # top-1 agreement means something: no saturated ties
    layers, args = m.model.layers, m.model.args
    try:  # the same model without either cap is another model
        for layer in layers:
            layer.self_attn.softcap = 0.0
        no_attn_cap = m.new_session(256).forward_logits(ids)
        args.final_softcap = 0.0
        no_caps = m.new_session(256).forward_logits(ids)
    finally:
        for layer in layers:
            layer.self_attn.softcap = m.info.attn_softcap
        args.final_softcap = 10.0
    print(f"KL without the attention cap {kl(got, no_attn_cap).max():.5f}, without both {kl(got, no_caps).max():.5f}")
    assert kl(got, no_attn_cap).max() > 1e-3 and kl(no_attn_cap, no_caps).max() > 1e-3


def test_readers_of_attention_see_the_capped_weights(gemma2):
    """The NumPy weights eviction, the certificate and the disk tier read (`attention_weights` with the model's
    softcap) times V are what the model's attention layer outputs."""
    _, m, _, ids = gemma2
    s = m.new_session(256)
    seen = {}
    s.cache.query_hook = lambda layer, q, qpos: seen.setdefault(layer, (np.array(q[0]), qpos))
    s.prefill(ids)
    for li in (0, 1):  # a sliding layer and a global one
        q, qpos = seen[li]
        k, v = (np.array(a[0]) for a in s.cache.layers[li].view())
        w = attention_weights(q, k, m.info.scale, qpos, s.cache.positions, m.info.window(li),
                              softcap=m.info.attn_softcap)  # (H, T, S)
        g = q.shape[0] // k.shape[0]
        ours = np.einsum("hts,hsd->htd", w, np.repeat(v, g, axis=0))
        attn = m.model.layers[li].self_attn
        x = mx.array(ours.transpose(1, 0, 2).reshape(1, len(ids), -1))
        want = np.array(attn.o_proj(x))
        h = m.model.embed(mx.array([ids]))
        for layer, lc in zip(m.model.layers[:li], s.cache.layers[:li]):
            h = layer(h, 0, _Replay(lc))
        got = np.array(attn(m.model.layers[li].input_layernorm(h), 0, _Replay(s.cache.layers[li])))
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


class _Replay:
    """A layer cache that already holds the whole prompt: returns it with its mask, stores nothing."""

    def __init__(self, layer):
        self.layer = layer

    def update_and_fetch(self, k, v, q, offset):
        keys, values = self.layer.view()
        return keys, values, self.layer.mask(np.arange(offset, offset + q.shape[2]))


@pytest.mark.parametrize("special", [False, True])
def test_tokenizer_matches_llama_cpp(gemma2, special):
    _, m, c, _ = gemma2
    for text in TEXTS:
        raw = text.encode()
        buf = (C.llama_token * (len(raw) + 16))()
        n = C.llama_tokenize(c._vocab, raw, len(raw), buf, len(buf), False, special)
        assert m.tokenizer.encode(text, special=special) == list(buf[:n]), text


@pytest.fixture(scope="module")
def blocks(gemma2):
    """Per layout: the block ids[:30] prefilled at 0 and exported (30 tokens: past the 16-token window)."""
    _, _, _, ids = gemma2
    out = {}
    for layout in LAYOUTS:
        s = _session(gemma2, layout)
        s.prefill(ids[:30])
        out[layout] = s.export_kv(0, 30)
        s.close()
    return out


PAIRS = [("mlx", "mlx"), ("llamacpp-fa-off", "llamacpp-fa-off"), ("llamacpp-fa-off", "llamacpp-fa-on"),
         ("llamacpp-fa-on", "llamacpp-fa-off"), ("llamacpp-fa-on", "llamacpp-fa-on")]


@pytest.mark.parametrize("depth", [0, 37, 60])
@pytest.mark.parametrize("src,dst", PAIRS)
def test_spliced_block_answers_as_a_prefill_there(gemma2, blocks, src, dst, depth):
    _, _, _, ids = gemma2
    ref = _session(gemma2, dst)
    ref.n_past = depth  # an empty sequence that starts at `depth`
    ref.prefill(ids[:30])
    want = ref.decode(ids[30])
    moved = _session(gemma2, dst)
    moved.n_past = depth
    moved.import_kv(blocks[src])
    assert moved.n_past == depth + 30
    got = moved.decode(ids[30])
    if dst == "mlx":
        np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)
    else:
        assert kl(want[None], got[None]).max() < 1e-5 and got.argmax() == want.argmax()


def test_v_layout_conversion_is_exact(blocks):
    off, on = blocks["llamacpp-fa-off"], blocks["llamacpp-fa-on"]
    assert [s.transposed for s in read_streams(off.blob)] == [True, True]  # the global and the sliding cache
    assert [s.transposed for s in read_streams(on.blob)] == [False, False]
    there = set_v_layout(off.blob, transposed=False)
    assert len(there) == len(off.blob) and [s.transposed for s in read_streams(there)] == [False, False]
    assert set_v_layout(there, transposed=True) == off.blob
    assert set_v_layout(off.blob, transposed=True) == off.blob
    st = read_streams(on.blob)[0]
    bad = bytearray(on.blob)
    bad[st.v_start : st.v_start + 4] = (2).to_bytes(4, "little")  # ggml Q4_0: no element to transpose
    with pytest.raises(BackendError, match="type 2 cannot be stored transposed"):
        set_v_layout(bytes(bad), transposed=True)
    with pytest.raises(BackendError, match="not a layout"):
        read_streams(on.blob[:-3])


@pytest.mark.parametrize("depth", [0, 37])
def test_a_refused_block_goes_in_as_text(gemma2, blocks, depth):
    """A block llama.cpp cannot take (a V type that cannot change layout, saved with flash attention on, imported
    with it off) is refused by the backend; the splice fails closed: nothing of the attempt stays in the cache,
    the block's tokens are prefilled as text, and the reason comes back (the trace's `splice_fallback`)."""
    from splice.profile import RepairPlan
    from splice.splicer import splice_or_text

    _, _, _, ids = gemma2
    on = blocks["llamacpp-fa-on"]
    st = read_streams(on.blob)[0]
    bad = bytearray(on.blob)
    bad[st.v_start : st.v_start + 4] = (2).to_bytes(4, "little")  # ggml Q4_0
    block = dataclasses.replace(on, blob=bytes(bad))
    ref = _session(gemma2, "llamacpp-fa-off")
    ref.n_past = depth
    ref.prefill(ids[:30])
    want = ref.decode(ids[30])
    s = _session(gemma2, "llamacpp-fa-off")
    s.n_past = depth
    for plan in (RepairPlan("head", 8), RepairPlan("none", 0)):
        n, refused = splice_or_text(s, block, plan)
        assert n == 30 and refused and "cannot be stored transposed" in refused
        assert s.n_past == depth + 30
        got = s.decode(ids[30])
        assert kl(want[None], got[None]).max() < 1e-5 and got.argmax() == want.argmax()
        s.remove(depth, s.n_past)
    n, refused = splice_or_text(s, blocks["llamacpp-fa-on"], RepairPlan("head", 8))  # a block it can take
    assert refused is None and n == 8 and s.n_past == depth + 30


def test_mlx_lm_gemma2_gives_the_same_logits(gemma2, tmp_path):
    """mlx-lm's own Gemma 2 class on our `nexus convert` folder of the same weights: the config.json we write
    (query_pre_attn_scalar, both caps) means to it what it means to us. mlx-lm has no sliding window, so the
    prompt stays within ours (16)."""
    from mlx_lm.models import gemma2 as theirs

    from native.convert import convert

    path, m, _, ids = gemma2
    folder = convert(path, tmp_path / "folder")
    model = theirs.Model(theirs.ModelArgs.from_dict(json.loads((folder / "config.json").read_text())))
    weights = {}
    for f in folder.glob("*.safetensors"):
        weights.update(mx.load(str(f)))
    model.load_weights(list(weights.items()))
    got = np.array(model(mx.array([ids[:16]]))[0].astype(mx.float32))
    want = m.new_session(256).forward_logits(ids[:16])
    np.testing.assert_allclose(got, want, atol=1e-3, rtol=0)
    hf = load_backend("mlx", str(folder))
    assert hf.info.attn_softcap == 4.0 and hf.info.windows == m.info.windows
    hf.close()
