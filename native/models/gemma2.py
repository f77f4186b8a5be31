"""Gemma 2: soft-capped attention scores and output logits, sliding-window and global layers in turn, RMSNorm with
1 + w weights before and after both attention and the MLP, embeddings scaled by sqrt(d_model), GeGLU (tanh gelu),
attention scale `query_pre_attn_scalar` ** -0.5, one RoPE for every layer, tied output embeddings.

The blocks are Gemma 3's without its per-head q/k norms; the attention is Llama's with `attn_softcap` set, so the
cap is applied by `native.models.attention` (the one place its formula lives) and every reader of attention
weights sees it. Even layers (0, 2, ...) slide over `sliding_window` tokens, odd ones are global (Hugging Face's
and llama.cpp's rule). GGUF norm weights are stored as 1 + w (`gemma3.from_gguf` subtracts the one). llama.cpp
takes the attention scale from key_length except on the 27B shape (d_model / n_heads), and caps at 50 / 30 when a
GGUF names no `attn_logit_softcapping` / `final_logit_softcapping`.
Shapes: B batch, T new tokens, d d_model.
"""

from __future__ import annotations

import mlx.core as mx

from native.models import gemma3
from native.models.base import (
    CausalLM,
    Decoder,
    Fields,
    ModelArgs,
    RMSNorm,
    config_rope,
    config_shape,
    gguf_rope,
    gguf_shape,
)

GGUF_NAMES = {k: v for k, v in gemma3.GGUF_NAMES.items() if k not in ("attn_q_norm", "attn_k_norm")}
ATTN_CAP, FINAL_CAP, WINDOW = 50.0, 30.0, 4096  # the defaults of llama.cpp and of Hugging Face's Gemma2Config
EXTRA = {"norm_offset": 1.0}
from_gguf = gemma3.from_gguf  # GGUF norms are 1 + w, as in Gemma 3


def _windows(n_layers: int, window: int) -> tuple[int, ...]:
    return tuple(0 if i % 2 else window for i in range(n_layers))


def gguf_args(f: Fields, vocab_size: int, tensor) -> ModelArgs:
    shape = gguf_shape(f, vocab_size)
    rope = gguf_rope(f, f.get("rope.dimension_count", shape["head_dim"], int), traditional=False)
    big = shape["d_model"] == 4608 and shape["n_layers"] == 46  # 27B: llama.cpp's scale is d_model / n_heads
    scale = (shape["d_model"] // shape["n_heads"] if big else shape["head_dim"]) ** -0.5
    return ModelArgs("gemma2", **shape, ropes=(rope,) * shape["n_layers"], scale=scale,
                     windows=_windows(shape["n_layers"], f.get("attention.sliding_window", WINDOW, int)),
                     tie_embeddings=True, attn_softcap=f.get("attn_logit_softcapping", ATTN_CAP, float),
                     final_softcap=f.get("final_logit_softcapping", FINAL_CAP, float), extra=EXTRA)


def _config_cap(f: Fields, key: str, default: float) -> float:
    """A config.json cap: absent means Gemma2Config's default, null means no cap."""
    return 0.0 if key in f.data and f.data[key] is None else f.get(key, default, float)


def config_args(f: Fields) -> ModelArgs:
    shape = config_shape(f)
    rope = config_rope(f, shape["head_dim"])
    return ModelArgs("gemma2", **{**shape, "tie_embeddings": True}, ropes=(rope,) * shape["n_layers"],
                     scale=f.get("query_pre_attn_scalar", shape["head_dim"], float) ** -0.5,
                     windows=_windows(shape["n_layers"], f.get("sliding_window", WINDOW, int)),
                     attn_softcap=_config_cap(f, "attn_logit_softcapping", ATTN_CAP),
                     final_softcap=_config_cap(f, "final_logit_softcapping", FINAL_CAP), extra=EXTRA)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.embed_scale = args.d_model**0.5
        self.model = Decoder(args, gemma3.TransformerBlock, RMSNorm(args.d_model, args.rms_eps, offset=1.0))


def hf_config(args: ModelArgs) -> dict:
    rope = args.ropes[0]
    cfg = {"model_type": "gemma2", "hidden_size": args.d_model, "num_hidden_layers": args.n_layers,
           "num_attention_heads": args.n_heads, "num_key_value_heads": args.n_kv_heads, "head_dim": args.head_dim,
           "intermediate_size": args.d_ff, "vocab_size": args.vocab_size, "rms_norm_eps": args.rms_eps,
           "rope_theta": rope.base, "query_pre_attn_scalar": args.scale ** -2, "sliding_window": max(args.windows),
           "attn_logit_softcapping": args.attn_softcap or None, "final_logit_softcapping": args.final_softcap or None,
           "max_position_embeddings": args.n_ctx_train, "tie_word_embeddings": True,
           "hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh"}
    if rope.scale != 1.0:
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": 1.0 / rope.scale}
    return cfg


def hf_weights(weights: dict[str, mx.array], args: ModelArgs) -> dict[str, mx.array]:
    return dict(weights)
