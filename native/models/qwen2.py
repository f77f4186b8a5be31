"""Qwen2 / Qwen2.5: the Llama block with biases on the q, k and v projections; NEOX (half-split) RoPE pairs in
GGUF as in config.json; untied output embeddings on the larger models (an `output` tensor / `lm_head`)."""

from __future__ import annotations

from native.models import llama
from native.models.base import Fields, ModelArgs, uniform_gguf_args

GGUF_NAMES = llama.GGUF_NAMES
Model = llama.Model
hf_weights = llama.hf_weights


def gguf_args(f: Fields, vocab_size: int, tensor) -> ModelArgs:
    return uniform_gguf_args(f, vocab_size, "qwen2", traditional=False, qkv_bias=True)


def config_args(f: Fields) -> ModelArgs:
    return llama.config_args(f, "qwen2", qkv_bias=True)


def hf_config(args: ModelArgs) -> dict:
    return {**llama.hf_config(args), "model_type": "qwen2"}
