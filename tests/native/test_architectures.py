"""Every architecture in `native.models` against llama.cpp, on tiny random-weight GGUFs written here.

For each of a Llama 3 (GQA, `rope_freqs` scaling), a Mistral-style Llama (SentencePiece vocabulary, one KV head,
head_dim != d_model / n_heads), Qwen2 (q/k/v biases, untied output), Qwen3 (q/k norms), Gemma 3 (five
sliding-window layers of 16 tokens and one global, its own norms, embedding scale and GeGLU) and Gemma 2
(sliding and global layers in turn, soft-capped scores and logits; more in test_gemma2.py) GGUF, float32:
- both backends give the same logits on a 41-token prompt that outruns the window: measured here top-1
  agreement 1.0 on every position, KL(llama.cpp || MLX) <= 5e-6 nats, |logit difference| <= 0.015
  (float32 accumulation order); bounds: KL < 1e-4, top-1 equal wherever the lead is over 0.01;
- `nexus convert`'s MLX folder of the same weights gives the same logits in MLX;
- re-anchoring is exact per layer: a block exported at positions 0.. and imported at depth 37 into an empty
  sequence answers the next token as the original did (relative positions are all RoPE sees), on both backends;
- llama.cpp imports rotate their keys in the state itself (no K-shift of the whole cache) exactly where the
  RoPE is one Nexus models (plain NORM or NEOX, one base: Mistral, Qwen2, Qwen3), checked by a probe that refuses
  Llama 3's per-frequency factors, the sliding-window models' two bases and a deliberately wrong pair layout;
- every eviction policy runs on MLX, the positional ones on llama.cpp.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from logits import kl
from tiny_models import LLAMA3_SCALING, SPECS

from native import ModelError, load_backend
from nexus_agent.eviction import (
    POLICIES,
    POSITIONAL_POLICIES,
    EvictingSession,
    EvictionConfig,
    evict_positional,
    make_policy,
)

TEXT = "The quick brown fox jumps over the lazy dog. " * 4
KL_BOUND, DECISIVE = 1e-4, 0.01


def _ids(tok) -> list[int]:
    return ([tok.bos_id] if tok.add_bos else []) + tok.encode(TEXT)


def _assert_agree(got: np.ndarray, want: np.ndarray) -> None:
    got, want = np.atleast_2d(got), np.atleast_2d(want)
    assert kl(want, got).max() < KL_BOUND
    top2 = np.sort(want, -1)[:, -2:]
    decisive = top2[:, 1] - top2[:, 0] > DECISIVE
    assert decisive.mean() > 0.8
    assert (got.argmax(-1) == want.argmax(-1))[decisive].all()


@pytest.mark.parametrize("name", list(SPECS))
def test_backends_agree(tiny, name):
    path, mlx_b, cpp_b = tiny(name)
    spec = SPECS[name]
    assert mlx_b.info.architecture == spec.arch == cpp_b.info.architecture
    assert mlx_b.info.rope_traditional == cpp_b.info.rope_traditional == (spec.arch == "llama")
    ids = _ids(mlx_b.tokenizer)
    assert cpp_b.tokenizer.encode(TEXT) == mlx_b.tokenizer.encode(TEXT) and len(ids) > 40
    if spec.window:
        local = (16,) * 5 + (0,) if spec.arch == "gemma3" else (16, 0) * 2
        assert mlx_b.info.windows == local and len(ids) > 2 * spec.window
    _assert_agree(mlx_b.new_session(256).forward_logits(ids), cpp_b.new_session(256).forward_logits(ids))


@pytest.mark.parametrize("name", [n for n in SPECS if not SPECS[n].llama3_rope])
def test_mlx_folder_matches_gguf(tiny, name, tmp_path):
    from native.convert import convert

    path, mlx_b, _ = tiny(name)
    folder = convert(path, tmp_path / "folder")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] in {"llama": ("llama",), "qwen2": ("qwen2",), "qwen3": ("qwen3",),
                                 "gemma3": ("gemma3_text",), "gemma2": ("gemma2",)}[SPECS[name].arch]
    hf = load_backend("mlx", str(folder))
    ids = _ids(mlx_b.tokenizer)
    assert hf.tokenizer.encode(TEXT) == mlx_b.tokenizer.encode(TEXT)
    assert hf.info.windows == mlx_b.info.windows and hf.info.scale == pytest.approx(mlx_b.info.scale)
    np.testing.assert_allclose(hf.new_session(256).forward_logits(ids), mlx_b.new_session(256).forward_logits(ids),
                               atol=1e-3, rtol=0)
    hf.close()


def test_llama3_factors_match_mlx_lm():
    """Our Llama 3 RoPE wavelengths (GGUF `rope_freqs` factors and config.json `rope_scaling`) are mlx-lm's."""
    import mlx.core as mx
    from mlx_lm.models.rope_utils import Llama3RoPE

    from native.models.base import Fields, config_rope

    s, dims, base = LLAMA3_SCALING, 16, 500000.0
    cfg = {"rope_theta": base, "rope_scaling": {"rope_type": "llama3", "factor": s["factor"],
                                                "low_freq_factor": s["low_freq_factor"],
                                                "high_freq_factor": s["high_freq_factor"],
                                                "original_max_position_embeddings": s["original_context"]}}
    ours = config_rope(Fields(cfg, "config.json"), dims)
    theirs = Llama3RoPE(dims, base=base, scaling_config=cfg["rope_scaling"])
    np.testing.assert_allclose(np.array(ours.freqs), np.array(theirs._freqs.astype(mx.float32)), rtol=1e-5)
    x = mx.random.normal((1, 2, 5, dims))
    np.testing.assert_allclose(np.array(ours(x, 7)), np.array(theirs(x, 7)), atol=1e-4)


@pytest.mark.parametrize("side", ["mlx", "llamacpp"])
@pytest.mark.parametrize("name", list(SPECS))
def test_reanchored_block_answers_as_prefilled(tiny, name, side):
    """RoPE sees only relative positions: keys re-anchored from 0.. to depth 37 (each layer with its own base),
    alone in a sequence, give the next token the logits it had at the original depth."""
    _, mlx_b, cpp_b = tiny(name)
    b = mlx_b if side == "mlx" else cpp_b
    ids = _ids(b.tokenizer)
    ref = b.new_session(256)
    ref.prefill(ids[:-1])
    kv = ref.export_kv(0, len(ids) - 1)
    want = ref.decode(ids[-1])
    moved = b.new_session(256)
    moved.n_past = 37  # an empty sequence that starts at depth 37
    moved.import_kv(kv)
    assert moved.n_past == 37 + len(ids) - 1
    got = moved.decode(ids[-1])
    if side == "mlx":
        np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)
    else:
        _assert_agree(got, want)


PLAIN_ROPE = {"mistral", "qwen2", "qwen3"}  # one base, no factors, no sliding window


@pytest.mark.parametrize("name", list(SPECS))
def test_keys_move_in_the_state_only_where_the_probe_agrees_with_llamacpp(tiny, name):
    """`moves_keys` (an import rotates its own keys) holds for plain RoPE; Llama 3's `rope_freqs` factors fail the
    probe against llama.cpp's K-shift, sliding-window models are not tried, and a wrong pair layout fails it."""
    _, _, b = tiny(name)
    assert b.moves_keys() == (name in PLAIN_ROPE)
    if b._rope is None:
        return
    keep, kept = b._rope, b._moves_keys
    try:
        b._rope, b._moves_keys = dataclasses.replace(keep, traditional=not keep.traditional), None
        assert not b.moves_keys()
    finally:
        b._rope, b._moves_keys = keep, kept


def test_the_probe_verdict_is_kept_in_the_model_profile(tiny, nexus_home):
    """The probe runs once per model, not once per process: its verdict lands in `profiles/<fp>.json` with the
    llama.cpp build and RoPE it was taken with, the next backend of that file obeys it (a verdict written as
    False is taken as False, no probe), and a verdict of another build is probed again and replaced."""
    path, _, _ = tiny("qwen2")
    b = load_backend("llamacpp", path)
    try:
        assert b.moves_keys()
        profile = nexus_home / "profiles" / f"{b.info.fingerprint}.json"
        kept = json.loads(profile.read_text())["llamacpp"]["moves_keys"]
        assert kept["ok"] is True and kept["rope"] == list(dataclasses.astuple(b._rope))
    finally:
        b.close()
    for build, want in (("the same", False), ("another", True)):
        data = json.loads(profile.read_text())
        data["llamacpp"]["moves_keys"]["ok"] = False
        if build == "another":
            data["llamacpp"]["moves_keys"]["llama_cpp"] = "0.0.1"
        profile.write_text(json.dumps(data))
        b = load_backend("llamacpp", path)
        try:
            assert b.moves_keys() is want, build
        finally:
            b.close()
    assert json.loads(profile.read_text())["llamacpp"]["moves_keys"]["ok"] is True  # re-probed, rewritten


@pytest.mark.parametrize("policy", [p.name for p in POLICIES])
@pytest.mark.parametrize("name", ["qwen3", "gemma3", "gemma2"])
def test_every_policy_runs_on_mlx(tiny, name, policy, tmp_path):
    _, mlx_b, _ = tiny(name)
    ids = (_ids(mlx_b.tokenizer) * 4)[:150]
    s = EvictingSession(mlx_b.new_session(512), make_policy(policy), EvictionConfig(budget=64, block=8, recent=16),
                        spill_path=tmp_path / "s.spill")
    s.prefill(ids)
    logits = s.decode(ids[-1])
    assert np.isfinite(logits).all() and s.n_past == len(ids) + 1
    if not np.isinf(make_policy(policy).capacity(64)):
        assert s.cache.length <= 64 + 1


@pytest.mark.parametrize("name", ["mistral", "gemma3", "gemma2"])
def test_positional_eviction_on_llamacpp(tiny, name):
    _, _, cpp_b = tiny(name)
    ids = (_ids(cpp_b.tokenizer) * 4)[:150]
    s = cpp_b.new_session(512)
    s.prefill(ids)
    for policy in POSITIONAL_POLICIES:
        evict_positional(s, policy, EvictionConfig(budget=64, recent=32), 64)
        assert np.isfinite(s.decode(ids[-1])).all()
    with pytest.raises(ValueError, match="MLX"):
        evict_positional(s, "certified", EvictionConfig(budget=64, recent=32), 64)


def test_bad_model_metadata_gives_one_line_errors(tiny, tmp_path):
    """A config with a missing field, an architecture not in the dict, an export we cannot write: one line that
    names the file, the field and what is supported."""
    from native.convert import convert

    path, _, _ = tiny("qwen3")
    folder = convert(path, tmp_path / "ok")
    cfg = json.loads((folder / "config.json").read_text())
    for field, value, message in (("hidden_size", None, "missing field 'hidden_size'"),
                                  ("model_type", "mamba", "unsupported architecture 'mamba' in model_type"),
                                  ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "'yarn' is not supported")):
        bad = dict(cfg, **{field: value})
        if value is None:
            del bad[field]
        (folder / "config.json").write_text(json.dumps(bad))
        with pytest.raises(ModelError) as e:
            load_backend("mlx", str(folder))
        msg = str(e.value)
        assert message in msg and "config.json" in msg and "\n" not in msg, msg
        if field == "model_type":
            assert "gemma3" in msg and "qwen2" in msg  # what is supported
    llama3_path, _, _ = tiny("llama3")
    with pytest.raises(ModelError, match="rope_freqs"):
        convert(llama3_path, tmp_path / "llama3")
