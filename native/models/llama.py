"""Llama (also Mistral, SmolLM2, Llama 3): RMSNorm, grouped-query attention with RoPE, SwiGLU MLP.

The attention here also serves Qwen2 (`qkv_bias`), Qwen3 (`qk_norm`: RMSNorm per head on q and k before RoPE)
and Gemma 3 (`qk_norm` with `norm_offset` 1: Gemma's 1 + w), which set those flags in `ModelArgs.extra`.
GGUF Llama weights store Q/K rows permuted for interleaved rotary pairs (`traditional=True`); Llama 3 scaling
arrives as the `rope_freqs` tensor of a GGUF or `rope_scaling` in config.json. A Mistral config's
`sliding_window` is not applied (llama.cpp's llama graph ignores it too).
Shapes: B batch, T new tokens, H heads, Hkv KV heads, D head dim.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from native.models.attention import attend
from native.models.base import (
    GGUF_LAYER_NAMES,
    CausalLM,
    Decoder,
    Fields,
    GatedMLP,
    ModelArgs,
    RMSNorm,
    config_rope,
    config_shape,
    merge_heads,
    rotate,
    split_heads,
    uniform_gguf_args,
)

GGUF_NAMES = dict(GGUF_LAYER_NAMES)
ROPE_TRADITIONAL_IN_GGUF = True  # llama.cpp's converter permutes Llama Q/K rows for interleaved pairs


def gguf_args(f: Fields, vocab_size: int, tensor) -> ModelArgs:
    return uniform_gguf_args(f, vocab_size, "llama", ROPE_TRADITIONAL_IN_GGUF, tensor("rope_freqs.weight"))


def config_args(f: Fields, architecture: str = "llama", **extra) -> ModelArgs:
    """`extra`: the flags of an architecture that reuses this block (`qkv_bias`, `qk_norm`, `norm_offset`)."""
    shape = config_shape(f)
    rope = config_rope(f, shape["head_dim"])
    return ModelArgs(architecture, **shape, ropes=(rope,) * shape["n_layers"], scale=shape["head_dim"] ** -0.5,
                     extra=extra)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        h, kv, d, bias = args.n_heads, args.n_kv_heads, args.head_dim, bool(args.extra.get("qkv_bias"))
        self.n_heads, self.n_kv_heads, self.head_dim = h, kv, d
        self.q_proj = nn.Linear(args.d_model, h * d, bias=bias)
        self.k_proj = nn.Linear(args.d_model, kv * d, bias=bias)
        self.v_proj = nn.Linear(args.d_model, kv * d, bias=bias)
        self.o_proj = nn.Linear(h * d, args.d_model, bias=False)
        self.qk_norm = bool(args.extra.get("qk_norm"))
        if self.qk_norm:  # Gemma's norms weigh by 1 + w (`norm_offset`)
            self.q_norm = RMSNorm(d, args.rms_eps, args.extra.get("norm_offset", 0.0))
            self.k_norm = RMSNorm(d, args.rms_eps, args.extra.get("norm_offset", 0.0))
        self.rope, self.scale, self.softcap = args.ropes[layer], args.scale, args.attn_softcap

    def project(self, x: mx.array, pos) -> tuple[mx.array, mx.array, mx.array]:
        """Rotated q (B, H, T, D), k and v (B, Hkv, T, D) of normed inputs x (B, T, d) at positions `pos`."""
        q = split_heads(self.q_proj(x), self.n_heads, self.head_dim)
        k = split_heads(self.k_proj(x), self.n_kv_heads, self.head_dim)
        v = split_heads(self.v_proj(x), self.n_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return rotate(self.rope, q, pos), rotate(self.rope, k, pos), v

    def __call__(self, x: mx.array, pos, layer_cache) -> mx.array:
        q, k, v = self.project(x, pos)
        return self.o_proj(merge_heads(attend(q, k, v, layer_cache, pos, self.scale, self.softcap)))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.self_attn = Attention(args, layer)
        self.mlp = GatedMLP(args.d_model, args.d_ff)
        self.input_layernorm = RMSNorm(args.d_model, args.rms_eps)
        self.post_attention_layernorm = RMSNorm(args.d_model, args.rms_eps)

    def project(self, h: mx.array, pos):
        """This layer's rotated q, k, v of the residual stream h (B, T, d)."""
        return self.self_attn.project(self.input_layernorm(h), pos)

    def __call__(self, h: mx.array, pos, layer_cache) -> mx.array:
        h = h + self.self_attn(self.input_layernorm(h), pos, layer_cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.model = Decoder(args, TransformerBlock, RMSNorm(args.d_model, args.rms_eps))


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved rotary pairs -> Hugging Face's half-split)."""
    out, d = w.shape
    return w.reshape(n_heads, out // n_heads // 2, 2, d).swapaxes(1, 2).reshape(out, d)


def hf_config(args: ModelArgs) -> dict:
    """config.json of these weights in Hugging Face's layout (see `hf_weights`)."""
    rope = args.ropes[0]
    if rope.freqs is not None:
        raise ValueError("a GGUF with per-pair rope_freqs has no config.json form here; export needs rope_scaling")
    cfg = {"model_type": "llama", "hidden_size": args.d_model, "num_hidden_layers": args.n_layers,
           "num_attention_heads": args.n_heads, "num_key_value_heads": args.n_kv_heads, "head_dim": args.head_dim,
           "intermediate_size": args.d_ff, "vocab_size": args.vocab_size, "rms_norm_eps": args.rms_eps,
           "rope_theta": rope.base, "tie_word_embeddings": args.tie_embeddings,
           "max_position_embeddings": args.n_ctx_train}
    if rope.scale != 1.0:
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": 1.0 / rope.scale}
    return cfg


def hf_weights(weights: dict[str, mx.array], args: ModelArgs) -> dict[str, mx.array]:
    """Our weights in Hugging Face's layout: half-split Q/K rows when the model rotates interleaved pairs."""
    if not args.ropes[0].traditional:
        return dict(weights)
    out = dict(weights)
    for name, n in (("q_proj", args.n_heads), ("k_proj", args.n_kv_heads)):
        for k in [k for k in weights if k.endswith(f"self_attn.{name}.weight")]:
            out[k] = mx.array(unpermute_qk(np.array(weights[k]), n))
        for k in [k for k in weights if k.endswith(f"self_attn.{name}.bias")]:
            out[k] = mx.array(unpermute_qk(np.array(weights[k])[:, None], n)[:, 0])
    return out
