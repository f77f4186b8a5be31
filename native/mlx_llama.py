"""Llama-family transformer in MLX: RMSNorm, grouped-query attention with RoPE, SwiGLU MLP.

Only the model maths lives here; the KV cache (`native.mlx_cache`) owns keys, values, their absolute
positions and per-key biases, and builds the attention mask, so eviction and splicing never touch this file.
Shapes: B batch, T new tokens, S cached keys, H query heads, Hkv key/value heads, D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn


@dataclass
class ModelArgs:
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    rms_eps: float = 1e-5
    rope_base: float = 10000.0
    rope_traditional: bool = False  # True: rotate interleaved pairs (GGUF's Q/K layout); False: half-split (HF)
    tie_embeddings: bool = True

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")


def rope(x: mx.array, args: ModelArgs, offset: int) -> mx.array:
    """Rotate (B, H, T, D) by positions offset .. offset+T-1."""
    return mx.fast.rope(x, args.head_dim, traditional=args.rope_traditional, base=args.rope_base, scale=1.0,
                        offset=offset)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        h, kv, d = args.n_heads, args.n_kv_heads, args.head_dim
        self.q_proj = nn.Linear(args.d_model, h * d, bias=False)
        self.k_proj = nn.Linear(args.d_model, kv * d, bias=False)
        self.v_proj = nn.Linear(args.d_model, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, args.d_model, bias=False)

    def __call__(self, x: mx.array, offset: int, layer_cache) -> mx.array:
        a = self.args
        B, T, _ = x.shape
        q = self.q_proj(x).reshape(B, T, a.n_heads, a.head_dim).transpose(0, 2, 1, 3)  # (B, H, T, D)
        k = self.k_proj(x).reshape(B, T, a.n_kv_heads, a.head_dim).transpose(0, 2, 1, 3)  # (B, Hkv, T, D)
        v = self.v_proj(x).reshape(B, T, a.n_kv_heads, a.head_dim).transpose(0, 2, 1, 3)
        q, k = rope(q, a, offset), rope(k, a, offset)
        keys, values, mask = layer_cache.update_and_fetch(k, v, q, offset)  # (B, Hkv, S, D) x2, mask
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=a.head_dim**-0.5, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(args.d_model, args.d_ff, bias=False)
        self.up_proj = nn.Linear(args.d_model, args.d_ff, bias=False)
        self.down_proj = nn.Linear(args.d_ff, args.d_model, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = nn.RMSNorm(args.d_model, eps=args.rms_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.d_model, eps=args.rms_eps)

    def __call__(self, x: mx.array, offset: int, layer_cache) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), offset, layer_cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.d_model)
        self.layers = [TransformerBlock(args) for _ in range(args.n_layers)]
        self.norm = nn.RMSNorm(args.d_model, eps=args.rms_eps)


class Model(nn.Module):
    """Token ids (B, T) at positions offset.. -> hidden states or logits, reading/writing `cache` (one entry per
    layer)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = LlamaModel(args)
        if not args.tie_embeddings:
            self.lm_head = nn.Linear(args.d_model, args.vocab_size, bias=False)

    def hidden(self, tokens: mx.array, offset: int, cache) -> mx.array:
        """Final-norm hidden states (B, T, d_model)."""
        h = self.model.embed_tokens(tokens)
        for layer, layer_cache in zip(self.model.layers, cache.layers):
            h = layer(h, offset, layer_cache)
        return self.model.norm(h)

    def logits(self, h: mx.array) -> mx.array:
        """(B, T, d_model) -> (B, T, vocab) float32."""
        if self.args.tie_embeddings:
            return self.model.embed_tokens.as_linear(h)
        return self.lm_head(h)
