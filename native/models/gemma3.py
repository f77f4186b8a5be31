"""Gemma 3 (text): five sliding-window layers to one global layer, each kind with its own RoPE base, RMSNorm
with 1 + w weights everywhere (also per head on q and k), norms after attention and after the MLP too,
embeddings scaled by sqrt(d_model), GeGLU (tanh gelu), attention scale `query_pre_attn_scalar` ** -0.5, tied
output embeddings.

GGUF files store every norm weight as 1 + w (llama.cpp's converter adds the one); we keep Hugging Face's w,
so `from_gguf` subtracts it. llama.cpp fixes the local RoPE base at 10,000 and the pattern at 6 unless the
metadata says otherwise, and takes the attention scale from key_length except on the 27B shape.
Shapes: B batch, T new tokens, H heads, Hkv KV heads, D head dim.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

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
    gguf_rope,
    gguf_shape,
)
from native.models.llama import Attention
from native.models.rope import Rope

GGUF_NAMES = {**GGUF_LAYER_NAMES, "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
              "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
              "post_ffw_norm": "post_feedforward_layernorm"}
LOCAL_BASE, PATTERN = 10000.0, 6
EXTRA = {"qk_norm": True, "norm_offset": 1.0}  # Llama's attention with Gemma's q/k norms


def _layout(n_layers: int, pattern: int, window: int, local: Rope, global_: Rope):
    is_global = [(i + 1) % pattern == 0 for i in range(n_layers)]
    return (tuple(global_ if g else local for g in is_global), tuple(0 if g else window for g in is_global))


def gguf_args(f: Fields, vocab_size: int, tensor) -> ModelArgs:
    shape = gguf_shape(f, vocab_size)
    dims = f.get("rope.dimension_count", shape["head_dim"], int)
    local = Rope(dims, f.get("rope.freq_base_swa", LOCAL_BASE, float), traditional=False)
    ropes, windows = _layout(shape["n_layers"], f.get("attention.sliding_window_pattern", PATTERN, int),
                             f.get("attention.sliding_window", kind=int), local, gguf_rope(f, dims, False))
    big = shape["d_model"] == 5376 and shape["n_layers"] == 62  # 27B: llama.cpp's scale is d_model / n_heads
    scale = (shape["d_model"] // shape["n_heads"] if big else shape["head_dim"]) ** -0.5
    return ModelArgs("gemma3", **shape, ropes=ropes, scale=scale, windows=windows, tie_embeddings=True, extra=EXTRA)


def config_args(f: Fields) -> ModelArgs:
    if f.has("text_config"):  # a multimodal Gemma 3 folder: the language model's settings
        f = Fields({**f.get("text_config"), "model_type": "gemma3_text"}, f.path)
    shape = config_shape(f)
    dims = shape["head_dim"]
    local = config_rope(f, dims, base=f.get("rope_local_base_freq", LOCAL_BASE, float), scaling=None)
    ropes, windows = _layout(shape["n_layers"], f.get("sliding_window_pattern", PATTERN, int),
                             f.get("sliding_window", kind=int), local, config_rope(f, dims, base=f.get("rope_theta",
                                                                                                    1e6, float)))
    scale = f.get("query_pre_attn_scalar", dims, float) ** -0.5
    return ModelArgs("gemma3", **{**shape, "tie_embeddings": True}, ropes=ropes, scale=scale, windows=windows,
                     extra=EXTRA)


def from_gguf(weights: dict[str, mx.array], args: ModelArgs) -> dict[str, mx.array]:
    """GGUF norm weights are 1 + w: store w."""
    return {k: (v - 1.0 if k.endswith("norm.weight") else v) for k, v in weights.items()}


def from_hf(weights: dict[str, mx.array], args: ModelArgs) -> dict[str, mx.array]:
    """A multimodal folder's language model: strip its prefix, drop the vision tower and projector."""
    out = {}
    for k, v in weights.items():
        if k.startswith(("vision_tower.", "multi_modal_projector.")):
            continue
        out[k.removeprefix("language_model.")] = v
    return out


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        d, eps = args.d_model, args.rms_eps
        self.self_attn = Attention(args, layer)  # Llama's, with q/k norms weighing by 1 + w
        self.mlp = GatedMLP(d, args.d_ff, act=nn.gelu_approx)
        self.input_layernorm = RMSNorm(d, eps, offset=1.0)
        self.post_attention_layernorm = RMSNorm(d, eps, offset=1.0)
        self.pre_feedforward_layernorm = RMSNorm(d, eps, offset=1.0)
        self.post_feedforward_layernorm = RMSNorm(d, eps, offset=1.0)

    def project(self, h: mx.array, pos):
        return self.self_attn.project(self.input_layernorm(h), pos)

    def __call__(self, h: mx.array, pos, layer_cache) -> mx.array:
        h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), pos, layer_cache))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.embed_scale = args.d_model**0.5
        self.model = Decoder(args, TransformerBlock, RMSNorm(args.d_model, args.rms_eps, offset=1.0))


def hf_config(args: ModelArgs) -> dict:
    local = next((r for r, w in zip(args.ropes, args.windows) if w), args.ropes[0])
    global_ = next((r for r, w in zip(args.ropes, args.windows) if not w), args.ropes[0])
    pattern = next((i + 1 for i, w in enumerate(args.windows) if not w), args.n_layers)
    cfg = {"model_type": "gemma3_text", "hidden_size": args.d_model, "num_hidden_layers": args.n_layers,
           "num_attention_heads": args.n_heads, "num_key_value_heads": args.n_kv_heads, "head_dim": args.head_dim,
           "intermediate_size": args.d_ff, "vocab_size": args.vocab_size, "rms_norm_eps": args.rms_eps,
           "rope_theta": global_.base, "rope_local_base_freq": local.base, "query_pre_attn_scalar": args.scale ** -2,
           "sliding_window": max(args.windows), "sliding_window_pattern": pattern,
           "max_position_embeddings": args.n_ctx_train, "tie_word_embeddings": True, "rope_scaling": None,
           "hidden_activation": "gelu_pytorch_tanh"}
    if global_.scale != 1.0:
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": 1.0 / global_.scale}
    return cfg


def hf_weights(weights: dict[str, mx.array], args: ModelArgs) -> dict[str, mx.array]:
    return dict(weights)
