"""Model architectures, one file each, chosen by the model's own metadata through `ARCHITECTURES`.

The key is a GGUF's `general.architecture` or a config.json's `model_type`; the value names the file here.
An architecture file provides:
- `gguf_args(fields, vocab_size, tensor) -> ModelArgs` and `config_args(fields) -> ModelArgs`,
- `GGUF_NAMES` (blk.N.<part> -> module name) and `Model(args)` (a `native.models.base.CausalLM`),
- optionally `from_gguf(weights, args)` / `from_hf(weights, args)` (weight conventions), and
  `hf_config(args)` / `hf_weights(weights, args)` (the same weights as a Hugging Face / mlx-lm folder).
Adding an architecture is one file and one entry here. Importing this package imports no MLX.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from native.base import ModelError

ARCHITECTURES = {
    "llama": "llama", "mistral": "llama",
    "qwen2": "qwen2", "qwen3": "qwen3",
    "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3",
}


def architecture(name: str, path: str, field: str) -> ModuleType:
    """The module for architecture `name` (read from `field` of the model at `path`), or a one-line ModelError."""
    if name not in ARCHITECTURES:
        raise ModelError(f"{path}: unsupported architecture {name!r} in {field} "
                         f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    return importlib.import_module(f"native.models.{ARCHITECTURES[name]}")
