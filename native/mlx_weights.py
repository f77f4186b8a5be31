"""Load any architecture of `native.models` from a GGUF file or an MLX/HF model directory.

The architecture comes from the model's own metadata (`general.architecture`, config.json's `model_type`);
its file says how to read the hyperparameters and which tensor is which. GGUF: `mx.load` returns MLX-quantized
triples (weight, scales, biases) for Q4_0/Q4_1/Q8_0 tensors; files with other types (K-quants, Q5_0, ...)
are dequantized to float32 by the `gguf` package. On a CPU (no Metal) quantized matmuls are slow for more
than one row, so weights are dequantized to float32 at load and run through BLAS; on Metal they stay quantized.
Nothing is half-loaded: every check runs before the model is returned.
"""

from __future__ import annotations

import glob
import os

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from native.base import ModelError, ModelInfo
from native.gguf_header import GGUFHeader, read_gguf_header
from native.model_files import ModelSource, fingerprint, read_json
from native.models import architecture
from native.models.base import GGUF_TOP_NAMES, CausalLM, Fields, ModelArgs

NOT_PARAMETERS = ("rope_freqs.weight",)  # GGUF tensors that configure the model (read by `gguf_args`)


def gguf_name(name: str, layer_names: dict[str, str]) -> str:
    """blk.N.<part>.<suffix> -> model.layers.N.<module>.<suffix>; token_embd/output_norm/output likewise."""
    stem, _, suffix = name.rpartition(".")  # suffix: weight | bias | scales | biases
    if stem.startswith("blk."):
        _, i, part = stem.split(".", 2)
        return f"model.layers.{i}.{layer_names[part]}.{suffix}"
    return f"{GGUF_TOP_NAMES[stem]}.{suffix}"


def read_gguf_tensors(path: str, header: GGUFHeader) -> dict[str, mx.array]:
    """Every tensor of a GGUF by its GGUF name: MLX's own reader where it knows the types, else float32."""
    try:
        return mx.load(path)
    except (RuntimeError, ValueError):
        pass
    import gguf  # types MLX cannot read (K-quants, Q5_0, ...): dequantized in NumPy from our tensor directory

    data = np.memmap(path, dtype=np.uint8, mode="r", offset=header.data_offset)
    out = {}
    for name, (dims, ggml_type, offset) in header.tensors.items():
        qtype = gguf.GGMLQuantizationType(ggml_type)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        shape = tuple(int(d) for d in reversed(dims))  # GGUF lists the innermost dimension first
        row_bytes = shape[-1] // block * size
        raw = data[offset : offset + int(np.prod(shape[:-1], dtype=np.int64)) * row_bytes]
        w = gguf.quants.dequantize(raw.reshape(*shape[:-1], row_bytes), qtype)
        out[name] = mx.array(np.ascontiguousarray(w, dtype=np.float32).reshape(shape))
    return out


def _gguf_weights(path: str, header: GGUFHeader):
    meta = header.metadata
    name = str(meta.get("general.architecture", "?"))
    arch = architecture(name, path, "general.architecture")
    raw = read_gguf_tensors(path, header)
    if "token_embd.weight" not in raw:
        raise ModelError(f"{path}: no token_embd tensor (not a language model GGUF?)")
    args = arch.gguf_args(Fields(meta, path, f"{name}."), int(raw["token_embd.weight"].shape[0]),
                          lambda t: np.array(raw[t].astype(mx.float32)) if t in raw else None)
    weights = {}
    for k, v in raw.items():
        if k in NOT_PARAMETERS:
            continue
        try:
            weights[gguf_name(k, arch.GGUF_NAMES)] = v
        except KeyError:
            raise ModelError(f"{path}: unexpected tensor {k!r} for a {name} model") from None
    return arch, args, weights


def _dir_weights(path: str):
    cfg_path = os.path.join(path, "config.json")
    cfg = read_json(cfg_path)
    arch = architecture(str(cfg.get("model_type", "?")), cfg_path, "model_type")
    args = arch.config_args(Fields(cfg, cfg_path))
    weights = {}
    for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        weights.update(mx.load(f))
    weights = {k: v for k, v in weights.items() if "rotary_emb" not in k}
    return arch, args, (arch.from_hf(weights, args) if hasattr(arch, "from_hf") else weights)


def _dequantize_all(weights: dict[str, mx.array], args: ModelArgs) -> dict[str, mx.array]:
    """Replace each (weight, scales, biases) triple by a float32 weight."""
    out = {}
    for name, w in weights.items():
        if name.endswith((".scales", ".biases")):
            continue
        stem = name[: -len(".weight")]
        if f"{stem}.scales" in weights:
            scales, biases = weights[f"{stem}.scales"], weights.get(f"{stem}.biases")
            bits = _bits(w, scales, args)
            group = w.shape[1] * 32 // bits // scales.shape[1]
            w = mx.dequantize(w, scales, biases, group_size=group, bits=bits)
        out[name] = w.astype(mx.float32)
    return out


def _bits(w: mx.array, scales: mx.array, args: ModelArgs) -> int:
    for in_features in (args.d_model, args.d_ff, args.n_heads * args.head_dim):
        for bits in (4, 8, 2, 3, 5, 6):
            if w.shape[1] * 32 == in_features * bits and in_features % scales.shape[1] == 0:
                return bits
    raise ModelError(f"cannot infer the quantization of a tensor of shape {w.shape} with scales {scales.shape}")


def _quantization(weights: dict[str, mx.array], args: ModelArgs) -> dict[str, tuple[int, int]]:
    """Module path -> (group size, bits) of every quantized tensor (a GGUF may mix types: Q8_0 embeddings in a
    Q4_1 file)."""
    out = {}
    for name, s in weights.items():
        if name.endswith(".scales"):
            stem = name[: -len(".scales")]
            w = weights[stem + ".weight"]
            bits = _bits(w, s, args)
            out[stem] = (w.shape[1] * 32 // bits // s.shape[1], bits)
    return out


def load_model(src: ModelSource, quantized: bool | None = None) -> tuple[CausalLM, ModelInfo, dict]:
    """Build the model; returns (model, info, gguf metadata or {})."""
    meta: dict = {}
    try:
        if src.format == "gguf":
            header = read_gguf_header(src.path)
            meta = header.metadata
            arch, args, weights = _gguf_weights(src.path, header)
        else:
            arch, args, weights = _dir_weights(src.path)
    except ModelError:
        raise
    except (ValueError, RuntimeError, KeyError, TypeError) as e:
        raise ModelError(f"{src.path}: cannot load weights ({e})") from None

    if "lm_head.weight" in weights:
        args.tie_embeddings = False
    if quantized is None:
        quantized = mx.metal.is_available()
    q = _quantization(weights, args)
    if q and not quantized:
        weights, q = _dequantize_all(weights, args), {}
    if not q:
        weights = {k: v.astype(mx.float32) for k, v in weights.items()}
    if src.format == "gguf" and hasattr(arch, "from_gguf"):
        weights = arch.from_gguf(weights, args)
    model = arch.Model(args)
    if q:
        nn.quantize(model, class_predicate=lambda p, m: p in q and {"group_size": q[p][0], "bits": q[p][1]})
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise ModelError(f"{src.path}: weights do not match a {args.architecture} model ({e})") from None
    mx.eval(model.parameters())
    return model, model_info(src, args), meta


def model_info(src: ModelSource, args: ModelArgs) -> ModelInfo:
    rope = args.ropes[-1]
    return ModelInfo(
        path=src.path, format=src.format, fingerprint=fingerprint(src.path), architecture=args.architecture,
        n_layers=args.n_layers, n_heads=args.n_heads, n_kv_heads=args.n_kv_heads, head_dim=args.head_dim,
        d_model=args.d_model, vocab_size=args.vocab_size, n_ctx_train=args.n_ctx_train, rope_base=rope.base,
        rope_traditional=rope.traditional, rms_eps=args.rms_eps, attn_scale=args.scale, windows=args.windows,
        rope_bases=tuple(r.base for r in args.ropes), attn_softcap=args.attn_softcap,
    )
