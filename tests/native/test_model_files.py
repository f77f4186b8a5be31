"""Model loading: bad inputs give one-line errors naming the file; an HF/MLX directory loads and matches the GGUF."""

import struct

import numpy as np
import pytest

from native import ModelError, list_backends, load_backend  # first: it points MLX at OpenBLAS (native.blas)
from native.model_files import default_model_path

# isort: split


def _write_gguf(path, metadata: dict[str, str]) -> None:
    """A minimal valid GGUF v3 with string metadata and no tensors."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 0, len(metadata)))
    for k, v in metadata.items():
        for s in (k,):
            out += struct.pack("<Q", len(s.encode())) + s.encode()
        out += struct.pack("<I", 8) + struct.pack("<Q", len(v.encode())) + v.encode()
    path.write_bytes(bytes(out))


@pytest.mark.parametrize("name", list_backends(text_only=False))
def test_bad_model_paths_give_one_line_errors(name, tmp_path):
    missing = tmp_path / "nope.gguf"
    text = tmp_path / "notes.txt"
    text.write_text("just some text, not a model")
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(open(default_model_path(), "rb").read(5000))
    foreign = tmp_path / "bert.gguf"
    _write_gguf(foreign, {"general.architecture": "bert"})
    cases = {
        missing: "no such model file",
        text: "not a GGUF file",
        truncated: "truncated GGUF header",
        foreign: "unsupported architecture 'bert'" if name == "mlx" else "architecture 'bert'",
        tmp_path: "needs config.json",
    }
    for path, message in cases.items():
        with pytest.raises(ModelError) as e:
            load_backend(name, str(path))
        assert message in str(e.value) and str(path) in str(e.value)
        assert "\n" not in str(e.value)


@pytest.mark.slow
def test_hf_directory_matches_gguf(mlx_backend, tmp_path):
    """`nexus convert` the packaged GGUF to an HF-layout folder (float32, half-split Q/K) and load it: same logits.

    This checks both loaders and the rotary convention: GGUF's interleaved pairs vs HF's half-split halves.
    """
    from native.convert import convert

    convert(None, tmp_path)
    tok = mlx_backend.tokenizer
    hf = load_backend("mlx", str(tmp_path))
    assert hf.info.format == "mlx-dir" and hf.info.rope_traditional is False
    ids = tok.encode_chat([{"role": "user", "content": "Name three rivers in Europe."}])
    assert hf.tokenizer.encode_chat([{"role": "user", "content": "Name three rivers in Europe."}]) == ids
    assert hf.tokenizer.encode("<|im_end|>") != tok.encode("<|im_end|>", special=True)  # plain text stays plain
    a = mlx_backend.new_session(256).forward_logits(ids)
    b = hf.new_session(256).forward_logits(ids)
    np.testing.assert_allclose(a, b, atol=2e-3, rtol=0)


def test_quantized_weights_load_and_match_float32(mlx_backend):
    """The Metal path keeps GGUF weights quantized, each module with its own bits (SmolLM2's Q4_1 file holds a
    Q8_0 embedding): on the CPU it loads too and gives the float32 path's logits within rounding."""
    q = load_backend("mlx", quantized=True)
    try:
        assert q.model.model.embed_tokens.bits == 8 and q.model.layers[0].self_attn.q_proj.bits == 4
        ids = mlx_backend.tokenizer.encode("Name three rivers in Europe.")
        got, want = q.new_session(64).forward_logits(ids), mlx_backend.new_session(64).forward_logits(ids)
        print(f"quantized vs float32: max |logit difference| {np.abs(got - want).max():.4f}")
        assert np.abs(got - want).max() < 0.2  # measured 0.063: MLX's quantized matmul rounds differently
        top2 = np.sort(want, -1)[:, -2:]
        decisive = top2[:, 1] - top2[:, 0] > 0.5
        assert decisive.any() and (got.argmax(-1) == want.argmax(-1))[decisive].all()
    finally:
        q.close()
