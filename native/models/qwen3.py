"""Qwen3: the Llama block with RMSNorm per head on q and k before RoPE (`q_norm`, `k_norm`), no projection
biases, NEOX (half-split) RoPE pairs, head_dim stated apart from d_model / n_heads."""

from __future__ import annotations

from native.models import llama
from native.models.base import Fields, ModelArgs, uniform_gguf_args

GGUF_NAMES = {**llama.GGUF_NAMES, "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
Model = llama.Model
hf_weights = llama.hf_weights


def gguf_args(f: Fields, vocab_size: int, tensor) -> ModelArgs:
    return uniform_gguf_args(f, vocab_size, "qwen3", traditional=False, qk_norm=True)


def config_args(f: Fields) -> ModelArgs:
    return llama.config_args(f, "qwen3", qk_norm=True)


def hf_config(args: ModelArgs) -> dict:
    return {**llama.hf_config(args), "model_type": "qwen3"}
