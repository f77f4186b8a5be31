"""Load llama-family weights into `native.mlx_llama.Model` from a GGUF file or an MLX/HF model directory.

GGUF: `mx.load` returns MLX-quantized triples (weight, scales, biases) for Q4_0/Q4_1/Q8_0 tensors; Q/K are
stored permuted for interleaved rotary pairs, hence `rope_traditional=True`. HF/MLX directories keep Q/K in
the half-split layout (`rope_traditional=False`). On a CPU (no Metal) quantized matmuls are slow for more than
one row, so weights are dequantized to float32 at load and run through BLAS; on Metal they stay quantized.
"""

from __future__ import annotations

import glob
import os

import mlx.core as mx
import mlx.nn as nn

from native.base import ModelError, ModelInfo
from native.gguf_header import read_gguf_header
from native.mlx_llama import Model, ModelArgs
from native.model_files import ModelSource, check_architecture, fingerprint, read_json

_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GGUF_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def _gguf_name(name: str) -> str:
    stem, _, suffix = name.rpartition(".")  # suffix: weight | scales | biases
    if stem.startswith("blk."):
        _, i, part = stem.split(".", 2)
        if part not in _GGUF_LAYER_NAMES:
            raise KeyError(part)
        return f"model.layers.{i}.{_GGUF_LAYER_NAMES[part]}.{suffix}"
    return f"{_GGUF_TOP_NAMES[stem]}.{suffix}"


def _args_from_gguf(meta: dict, path: str) -> ModelArgs:
    arch = meta.get("general.architecture", "?")
    check_architecture(path, arch)

    def get(key, default=None):
        v = meta.get(f"{arch}.{key}", default)
        if v is None:
            raise ModelError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return v.item() if hasattr(v, "item") else v

    n_heads, d_model = int(get("attention.head_count")), int(get("embedding_length"))
    if meta.get(f"{arch}.rope.scaling.type", "none") not in ("none", None):
        raise ModelError(f"{path}: RoPE scaling {meta[f'{arch}.rope.scaling.type']!r} is not supported")
    return ModelArgs(
        d_model=d_model, n_layers=int(get("block_count")), n_heads=n_heads,
        n_kv_heads=int(get("attention.head_count_kv", n_heads)),
        head_dim=int(get("rope.dimension_count", d_model // n_heads)), d_ff=int(get("feed_forward_length")),
        vocab_size=len(meta["tokenizer.ggml.tokens"]), rms_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_base=float(get("rope.freq_base", 10000.0)), rope_traditional=True, tie_embeddings=True,
    )


def _args_from_config(cfg: dict, path: str) -> ModelArgs:
    check_architecture(path, cfg.get("model_type", "?"))
    if cfg.get("rope_scaling"):
        raise ModelError(f"{path}: RoPE scaling {cfg['rope_scaling']} is not supported")
    n_heads = cfg["num_attention_heads"]
    return ModelArgs(
        d_model=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"], n_heads=n_heads,
        n_kv_heads=cfg.get("num_key_value_heads", n_heads),
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
        d_ff=cfg["intermediate_size"], vocab_size=cfg["vocab_size"], rms_eps=cfg.get("rms_norm_eps", 1e-5),
        rope_base=cfg.get("rope_theta", 10000.0), rope_traditional=bool(cfg.get("rope_traditional", False)),
        tie_embeddings=cfg.get("tie_word_embeddings", True),
    )


def _dequantize_all(weights: dict[str, mx.array], args: ModelArgs) -> dict[str, mx.array]:
    """Replace each (weight, scales, biases) triple by a float32 weight."""
    out = {}
    for name, w in weights.items():
        if name.endswith((".scales", ".biases")):
            continue
        stem = name[: -len(".weight")]
        if f"{stem}.scales" in weights:
            scales, biases = weights[f"{stem}.scales"], weights.get(f"{stem}.biases")
            in_features = w.shape[1] * 32 // _bits(w, scales, args)
            group = in_features // scales.shape[1]
            w = mx.dequantize(w, scales, biases, group_size=group, bits=_bits(w, scales, args))
        out[name] = w.astype(mx.float32)
    return out


def _bits(w: mx.array, scales: mx.array, args: ModelArgs) -> int:
    for in_features in (args.d_model, args.d_ff, args.n_heads * args.head_dim):
        for bits in (4, 8, 2, 3, 5, 6):
            if w.shape[1] * 32 == in_features * bits and in_features % scales.shape[1] == 0:
                return bits
    raise ModelError(f"cannot infer the quantization of a tensor of shape {w.shape} with scales {scales.shape}")


def _quantization(weights: dict[str, mx.array], args: ModelArgs) -> tuple[int, int] | None:
    for name, s in weights.items():
        if name.endswith(".scales"):
            w = weights[name[: -len(".scales")] + ".weight"]
            bits = _bits(w, s, args)
            return w.shape[1] * 32 // bits // s.shape[1], bits
    return None


def load_model(src: ModelSource, quantized: bool | None = None) -> tuple[Model, ModelInfo, dict]:
    """Build the model; returns (model, info, gguf metadata or {})."""
    meta: dict = {}
    n_ctx = 0
    try:
        if src.format == "gguf":
            meta = read_gguf_header(src.path).metadata
            args = _args_from_gguf(meta, src.path)
            n_ctx = int(meta.get("llama.context_length", 0) or 0)
            raw = mx.load(src.path)
            weights = {}
            for k, v in raw.items():
                try:
                    weights[_gguf_name(k)] = v
                except KeyError:
                    raise ModelError(f"{src.path}: unexpected tensor {k!r} for a llama model") from None
        else:
            cfg = read_json(os.path.join(src.path, "config.json"))
            args = _args_from_config(cfg, src.path)
            n_ctx = int(cfg.get("max_position_embeddings", 0) or 0)
            weights = {}
            for f in sorted(glob.glob(os.path.join(src.path, "*.safetensors"))):
                weights.update(mx.load(f))
            weights = {k: v for k, v in weights.items() if "rotary_emb" not in k}
    except ModelError:
        raise
    except (ValueError, RuntimeError, KeyError) as e:
        raise ModelError(f"{src.path}: cannot load weights ({e})") from None

    if "lm_head.weight" in weights:
        args.tie_embeddings = False
    model = Model(args)
    if quantized is None:
        quantized = mx.metal.is_available()
    q = _quantization(weights, args)
    if q and quantized:
        group, bits = q
        nn.quantize(model, group_size=group, bits=bits, class_predicate=lambda p, m: f"{p}.scales" in weights)
    elif q:
        weights = _dequantize_all(weights, args)
    else:
        weights = {k: v.astype(mx.float32) for k, v in weights.items()}
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise ModelError(f"{src.path}: weights do not match a llama model ({e})") from None
    mx.eval(model.parameters())
    info = ModelInfo(
        path=src.path, format=src.format, fingerprint=fingerprint(src.path),
        architecture="llama", n_layers=args.n_layers, n_heads=args.n_heads, n_kv_heads=args.n_kv_heads,
        head_dim=args.head_dim, d_model=args.d_model, vocab_size=args.vocab_size,
        n_ctx_train=n_ctx or 4096, rope_base=args.rope_base,
        rope_traditional=args.rope_traditional, rms_eps=args.rms_eps,
    )
    return model, info, meta
