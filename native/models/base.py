"""Pieces every architecture shares: the arguments, metadata readers, norms, MLPs and the decoder skeleton.

`ModelArgs` is what an architecture file fills from a GGUF's metadata or a config.json; the per-layer `ropes`,
`windows` and the attention `scale` are what the runtime needs besides weights (re-anchoring, masks, eviction
scores). Parameter names follow Hugging Face (`model.layers.N.self_attn.q_proj`), so an MLX/HF folder loads
as it is and a GGUF's tensors are renamed once (`native.mlx_weights`).
Shapes: B batch, T new tokens, d d_model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn

from native.base import ModelError
from native.models.attention import soft_cap
from native.models.rope import Rope, llama3_factors, rope_from_factors


@dataclass
class ModelArgs:
    architecture: str
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    ropes: tuple[Rope, ...]  # one per layer
    scale: float  # attention logit scale
    windows: tuple[int, ...] = ()  # per layer: sliding-window length, 0 = global; () = all global
    rms_eps: float = 1e-5
    tie_embeddings: bool = True
    n_ctx_train: int = 4096
    attn_softcap: float = 0.0  # > 0: attention scores pass through soft_cap (Gemma 2)
    final_softcap: float = 0.0  # > 0: so do the output logits
    extra: dict = field(default_factory=dict)  # architecture-specific settings (e.g. qkv bias)

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        if len(self.ropes) != self.n_layers:
            raise ValueError(f"{len(self.ropes)} ropes for {self.n_layers} layers")
        if not self.windows:
            self.windows = (0,) * self.n_layers


_REQUIRED = object()


class Fields:
    """Typed reads of a model's metadata that fail with one line naming the file, the field and the fix.

    `prefix` is prepended to every key (a GGUF's "<arch>."; "" for config.json)."""

    def __init__(self, data: dict, path: str, prefix: str = ""):
        self.data, self.path, self.prefix = data, path, prefix

    def has(self, key: str) -> bool:
        return self.data.get(self.prefix + key) is not None

    def get(self, key: str, default=_REQUIRED, kind=None):
        v = self.data.get(self.prefix + key)
        if v is None:
            if default is _REQUIRED:
                raise ModelError(f"{self.path}: missing field {self.prefix + key!r} "
                                 f"(needed by the {self.data.get('general.architecture') or 'model'} architecture)")
            return default
        v = v.item() if hasattr(v, "item") else v
        return kind(v) if kind else v


# -- hyperparameters -------------------------------------------------------------------------------------------
# GGUF tensor names (blk.N.<part>) -> our (Hugging Face) module names; an architecture adds or overrides parts.
GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
GGUF_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def gguf_shape(f: Fields, vocab_size: int) -> dict:
    """The ModelArgs fields every GGUF architecture states the same way (f: "<arch>."-prefixed metadata)."""
    n_heads, d_model = f.get("attention.head_count", kind=int), f.get("embedding_length", kind=int)
    return dict(
        d_model=d_model, n_layers=f.get("block_count", kind=int), n_heads=n_heads,
        n_kv_heads=f.get("attention.head_count_kv", n_heads, int),
        head_dim=f.get("attention.key_length", d_model // n_heads, int), d_ff=f.get("feed_forward_length", kind=int),
        vocab_size=vocab_size, rms_eps=f.get("attention.layer_norm_rms_epsilon", 1e-5, float),
        n_ctx_train=f.get("context_length", 4096, int),
    )


def gguf_rope(f: Fields, dims: int, traditional: bool, factors=None, base: float | None = None) -> Rope:
    """The RoPE a GGUF states: `rope.freq_base`, linear `rope.scaling.*`, per-pair `rope_freqs` factors."""
    base = f.get("rope.freq_base", 10000.0, float) if base is None else base
    kind = f.get("rope.scaling.type", "none", str)
    if kind not in ("none", "linear"):
        raise ModelError(f"{f.path}: {f.prefix}rope.scaling.type = {kind!r} is not supported (supported: none, linear)")
    scale = 1.0 / f.get("rope.scaling.factor", 1.0, float) if kind == "linear" else 1.0
    if factors is not None:
        rope = rope_from_factors(dims, base, factors, traditional)
        return Rope(rope.dims, rope.base, traditional, scale, rope.freqs)
    return Rope(dims, base, traditional, scale)


def uniform_gguf_args(f: Fields, vocab_size: int, architecture: str, traditional: bool, factors=None,
                      **extra) -> ModelArgs:
    """ModelArgs of a GGUF whose layers all share one RoPE and the D ** -0.5 scale (Llama, Qwen); `extra` are the
    architecture's flags (`qkv_bias`, `qk_norm`)."""
    shape = gguf_shape(f, vocab_size)
    rope = gguf_rope(f, f.get("rope.dimension_count", shape["head_dim"], int), traditional, factors)
    return ModelArgs(architecture, **shape, ropes=(rope,) * shape["n_layers"], scale=shape["head_dim"] ** -0.5,
                     extra=extra)


def config_shape(f: Fields) -> dict:
    """The ModelArgs fields every config.json states the same way."""
    n_heads, d_model = f.get("num_attention_heads", kind=int), f.get("hidden_size", kind=int)
    return dict(
        d_model=d_model, n_layers=f.get("num_hidden_layers", kind=int), n_heads=n_heads,
        n_kv_heads=f.get("num_key_value_heads", n_heads, int), head_dim=f.get("head_dim", d_model // n_heads, int),
        d_ff=f.get("intermediate_size", kind=int), vocab_size=f.get("vocab_size", kind=int),
        rms_eps=f.get("rms_norm_eps", 1e-5, float), n_ctx_train=f.get("max_position_embeddings", 4096, int),
        tie_embeddings=bool(f.get("tie_word_embeddings", True)),
    )


def config_rope(f: Fields, dims: int, base: float | None = None, scaling: dict | None | bool = True) -> Rope:
    """The RoPE a config.json states: `rope_theta` and `rope_scaling` (none/default, linear, llama3); always the
    half-split pairs of Hugging Face weights unless `rope_traditional` says otherwise (MLX conversions)."""
    base = f.get("rope_theta", 10000.0, float) if base is None else base
    traditional = bool(f.get("rope_traditional", False))
    sc = f.get("rope_scaling", {}) if scaling is True else (scaling or {})
    kind = sc.get("rope_type", sc.get("type", "default"))
    if kind == "default":
        return Rope(dims, base, traditional)
    if kind == "linear":
        return Rope(dims, base, traditional, 1.0 / float(sc["factor"]))
    if kind == "llama3":
        factors = llama3_factors(dims, base, float(sc["factor"]), float(sc.get("low_freq_factor", 1.0)),
                                 float(sc.get("high_freq_factor", 4.0)),
                                 int(sc.get("original_max_position_embeddings", 8192)))
        return rope_from_factors(dims, base, factors, traditional)
    raise ModelError(f"{f.path}: rope_scaling type {kind!r} is not supported (supported: default, linear, llama3)")


class RMSNorm(nn.Module):
    """RMSNorm with weight w (Llama, Qwen) or, with `offset=1`, Gemma's 1 + w."""

    def __init__(self, dims: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.weight = mx.zeros((dims,)) if offset else mx.ones((dims,))
        self.eps, self.offset = eps, offset

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, self.weight + self.offset if self.offset else self.weight, self.eps)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU with silu (Llama, Qwen), GeGLU with tanh-approximated gelu (Gemma)."""

    def __init__(self, d_model: int, d_ff: int, act=nn.silu):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)
        self.act = act

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def split_heads(x: mx.array, n: int, head_dim: int) -> mx.array:
    """(B, T, n * D) -> (B, n, T, D)."""
    B, T, _ = x.shape
    return x.reshape(B, T, n, head_dim).transpose(0, 2, 1, 3)


def merge_heads(x: mx.array) -> mx.array:
    """(B, H, T, D) -> (B, T, H * D)."""
    B, _, T, _ = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, -1)


def rotate(rope: Rope, x: mx.array, pos) -> mx.array:
    """Rotate (1, H, T, D) at positions pos.. (int: contiguous from there) or at the positions (T,) given."""
    return rope(x, pos) if isinstance(pos, int) else rope.at(x, pos)


class Decoder(nn.Module):
    """`model.embed_tokens`, `model.layers`, `model.norm`; an architecture file gives the block class, the final
    norm, and optionally the embedding scale."""

    def __init__(self, args: ModelArgs, block, norm: nn.Module):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.d_model)
        self.layers = [block(args, i) for i in range(args.n_layers)]
        self.norm = norm


class CausalLM(nn.Module):
    """Token ids (B, T) at positions offset.. -> hidden states or logits, reading/writing `cache` (one layer cache
    per layer). Subclasses set `self.model = Decoder(...)` and may set `embed_scale`."""

    embed_scale: float = 0.0  # 0: none

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        if not args.tie_embeddings:
            self.lm_head = nn.Linear(args.d_model, args.vocab_size, bias=False)

    @property
    def layers(self) -> list:
        return self.model.layers

    def embed(self, tokens: mx.array) -> mx.array:
        h = self.model.embed_tokens(tokens)
        return h * self.embed_scale if self.embed_scale else h

    def hidden(self, tokens: mx.array, offset: int, cache) -> mx.array:
        """Final-norm hidden states (B, T, d_model)."""
        h = self.embed(tokens)
        for layer, layer_cache in zip(self.model.layers, cache.layers):
            h = layer(h, offset, layer_cache)
        return self.model.norm(h)

    def logits(self, h: mx.array) -> mx.array:
        """(B, T, d_model) -> (B, T, vocab), soft-capped when the model caps its logits."""
        logits = self.model.embed_tokens.as_linear(h) if self.args.tie_embeddings else self.lm_head(h)
        return soft_cap(logits, self.args.final_softcap)

    def shift_keys(self, keys: mx.array, delta: int) -> mx.array:
        """Re-anchor post-RoPE keys (L, Hkv, T, D) by `delta` positions, each layer with its own RoPE."""
        if delta == 0:
            return keys
        if len(set(self.args.ropes)) == 1:  # one RoPE for every layer: one rotation over all of them
            return self.args.ropes[0].shift(keys, delta)
        return mx.stack([rope.shift(keys[i], delta) for i, rope in enumerate(self.args.ropes)])
