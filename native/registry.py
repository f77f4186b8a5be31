"""The backends Nexus knows, by name, with what each can do. One plain dict; it drives the CLI `--backend`
choices and the parametrized backend tests.

Adding a backend is one module implementing `native.base.Backend` (and `KVSession` / `TextBackend` as its
capabilities say) plus one entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields, replace

from native.base import Backend, Capabilities, ModelError


@dataclass(frozen=True)
class BackendSpec:
    """Where a backend lives ("module:Class", imported on first load) and its capabilities.

    The capabilities are declared here rather than only on the class so that selecting backends by capability
    (`list_backends`) does not import MLX or llama.cpp; the class exposes the same object as `capabilities`.
    """

    target: str
    capabilities: Capabilities

    def __post_init__(self):
        if self.target.count(":") != 1:
            raise ValueError(f"backend target must be 'module:Class', got {self.target!r}")


BACKENDS: dict[str, BackendSpec] = {
    "llamacpp": BackendSpec(
        "native.llamacpp_backend:LlamaCppBackend",
        # no can_recompute_kv: a batch must start at the last position + 1, so cached cells cannot be rewritten;
        # no can_skip_reanchor: shifting positions (llama_memory_seq_add) always re-rotates the keys
        Capabilities(can_splice=True, can_remove_positions=True, can_read_hidden=True),
    ),
    "mlx": BackendSpec(
        "native.mlx_backend:MLXBackend",
        Capabilities(can_splice=True, can_skip_reanchor=True, can_bias_keys=True, can_score_attention=True,
                     can_remove_positions=True, can_recompute_kv=True, can_read_hidden=True),
    ),
    # any OpenAI-compatible HTTP server: the server owns the KV cache
    "openai": BackendSpec("native.openai_backend:OpenAIBackend", Capabilities(text_only=True)),
}


def list_backends(**flags: bool) -> list[str]:
    """Names of the backends whose capabilities have every given value, in BACKENDS order.

    `list_backends()` is every backend, `list_backends(text_only=False)` the local ones (sessions, tokenizer),
    `list_backends(can_splice=True)` those that can splice compiled blocks.
    """
    known = {f.name for f in fields(Capabilities)}
    unknown = sorted(set(flags) - known)
    if unknown:
        raise ValueError(f"unknown capability {', '.join(unknown)}; Capabilities has: {', '.join(sorted(known))}")
    return [name for name, spec in BACKENDS.items()
            if all(getattr(spec.capabilities, k) == v for k, v in flags.items())]


def load_backend(name: str, model: str | None = None, **options) -> Backend:
    """Load `model` (a GGUF file or an MLX/HF model directory; default: the packaged SmolLM2) on backend `name`.

    For "openai", `model` is the served model's name and options are OpenAIConfig fields (base_url, api_key...).
    `chat_template`: a Jinja template (a file's path or its text) rendered instead of the model's own, for a
    model that has none or one that fails (`--chat-template`, as llama.cpp's and vLLM's servers take it).
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
    template = options.pop("chat_template", None)
    if template is not None:  # read (and compiled) before the model is loaded: a bad one fails at once
        if BACKENDS[name].capabilities.text_only:
            raise ValueError(f"--chat-template: the {name} backend's server renders its own chat template")
        from native.chat_template import read_template

        template = read_template(template)
    module_name, cls_name = BACKENDS[name].target.split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    backend = cls(model, **options)
    if template is not None:
        backend.tokenizer = replace(backend.tokenizer, chat_template=template, tool_template=None)
    return backend


__all__ = ["BACKENDS", "BackendSpec", "ModelError", "list_backends", "load_backend"]
