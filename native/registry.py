"""The backends Nexus knows, by name. One plain dict; it also drives the parametrized backend tests."""

from __future__ import annotations

import importlib

from native.base import Backend, ModelError

# name -> "module:Class"; imported lazily so that `nexus --help` does not load MLX or llama.cpp.
BACKENDS: dict[str, str] = {
    "mlx": "native.mlx_backend:MLXBackend",
    "llamacpp": "native.llamacpp_backend:LlamaCppBackend",
    "openai": "native.openai_backend:OpenAIBackend",  # text only: any OpenAI-compatible HTTP server
}


def load_backend(name: str, model: str | None = None, **options) -> Backend:
    """Load `model` (a GGUF file or an MLX/HF model directory; default: the packaged SmolLM2) on backend `name`.

    For "openai", `model` is the served model's name and options are OpenAIConfig fields (base_url, api_key...).
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
    module_name, cls_name = BACKENDS[name].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(model, **options)


__all__ = ["BACKENDS", "load_backend", "ModelError"]
