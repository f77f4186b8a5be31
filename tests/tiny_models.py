"""Tiny random-weight GGUFs of each architecture in `native.models`, written with the `gguf` package.

A few layers and small dims, a real vocabulary taken from a packaged GGUF (SmolLM2's byte-level BPE or Gemma 3's
SentencePiece), the metadata llama.cpp reads for the architecture, float32 tensors. llama.cpp is the reference
implementation of every architecture, so loading one file in both backends checks our model file for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gguf
import numpy as np

from native.gguf_header import read_gguf_header
from native.models.rope import llama3_factors

LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_context": 64}


@dataclass(frozen=True)
class TinySpec:
    arch: str
    vocab: str = "bpe"  # "bpe": SmolLM2's tokens and merges; "spm": Gemma 3's SentencePiece vocabulary
    d_model: int = 64
    n_layers: int = 3
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    d_ff: int = 128
    rope_base: float = 10000.0
    qkv_bias: bool = False
    qk_norm: bool = False
    untied: bool = False
    llama3_rope: bool = False  # write per-pair `rope_freqs` factors (Llama 3 scaling)
    window: int = 0  # gemma2, gemma3: sliding window of their local layers
    softcaps: tuple[float, float] = (0.0, 0.0)  # gemma2: attention and final logit soft-caps
    extra: dict = field(default_factory=dict)


SPECS = {
    "llama3": TinySpec("llama", n_kv_heads=2, rope_base=500000.0, llama3_rope=True),
    "mistral": TinySpec("llama", vocab="spm", n_kv_heads=1, head_dim=32),
    "qwen2": TinySpec("qwen2", qkv_bias=True, untied=True, rope_base=1e6),
    "qwen3": TinySpec("qwen3", qk_norm=True, head_dim=32, rope_base=1e6),
    "gemma3": TinySpec("gemma3", vocab="spm", n_layers=6, n_kv_heads=1, head_dim=32, qk_norm=True, window=16,
                       rope_base=1e6),
    # caps small enough to bite on random weights (Gemma 2's own are 50 and 30): scores here reach about 6,
    # logits about 9 (capped to about 7), so a model that skipped either cap would not agree with llama.cpp
    "gemma2": TinySpec("gemma2", vocab="spm", n_layers=4, n_kv_heads=2, head_dim=32, window=16, softcaps=(4.0, 10.0)),
}


def _copy_vocab(w: gguf.GGUFWriter, meta: dict) -> None:
    w.add_token_list(list(meta["tokenizer.ggml.tokens"]))
    w.add_token_types([int(t) for t in meta["tokenizer.ggml.token_type"]])
    w.add_tokenizer_model(str(meta["tokenizer.ggml.model"]))
    w.add_tokenizer_pre(str(meta.get("tokenizer.ggml.pre", "default")))
    if "tokenizer.ggml.merges" in meta:
        w.add_token_merges(list(meta["tokenizer.ggml.merges"]))
    if "tokenizer.ggml.scores" in meta:
        w.add_token_scores([float(x) for x in meta["tokenizer.ggml.scores"]])
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                     ("unknown_token_id", w.add_unk_token_id)):
        if f"tokenizer.ggml.{key}" in meta:
            add(int(meta[f"tokenizer.ggml.{key}"]))
    w.add_add_bos_token(bool(meta.get("tokenizer.ggml.add_bos_token", False)))
    if "tokenizer.ggml.add_space_prefix" in meta:
        w.add_add_space_prefix(bool(meta["tokenizer.ggml.add_space_prefix"]))
    if meta.get("tokenizer.chat_template"):
        w.add_chat_template(str(meta["tokenizer.chat_template"]))


def write_tiny_gguf(path, spec: TinySpec, vocab_path: str, seed: int = 0, chat_template: str | None = None,
                    strings: dict[str, str] | None = None) -> str:
    """Write a random-weight GGUF of `spec` with the vocabulary of the GGUF at `vocab_path` (and its chat template,
    or `chat_template`), and the metadata `strings`; returns the path."""
    meta = read_gguf_header(vocab_path).metadata
    if chat_template is not None:
        meta = dict(meta, **{"tokenizer.chat_template": chat_template})
    rng = np.random.default_rng(seed)
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    d, hd, h, kv = spec.d_model, spec.head_dim, spec.n_heads, spec.n_kv_heads
    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_context_length(4096)
    w.add_embedding_length(d)
    w.add_block_count(spec.n_layers)
    w.add_feed_forward_length(spec.d_ff)
    w.add_head_count(h)
    w.add_head_count_kv(kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(spec.rope_base)
    w.add_layer_norm_rms_eps(1e-6)
    if spec.window:
        w.add_sliding_window(spec.window)
    if any(spec.softcaps):
        w.add_attn_logit_softcapping(spec.softcaps[0])
        w.add_final_logit_softcapping(spec.softcaps[1])
    _copy_vocab(w, meta)
    for key, value in (strings or {}).items():
        w.add_string(key, value)

    def dense(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def norm(n):  # around 1 (Gemma's GGUF norms are 1 + w as well)
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", (rng.standard_normal((n_vocab, d)) * 0.5).astype(np.float32))
    w.add_tensor("output_norm.weight", norm(d))
    if spec.untied:
        w.add_tensor("output.weight", dense(n_vocab, d))
    if spec.llama3_rope:
        s = LLAMA3_SCALING
        w.add_tensor("rope_freqs.weight", llama3_factors(hd, spec.rope_base, s["factor"], s["low_freq_factor"],
                                                         s["high_freq_factor"], s["original_context"]
                                                         ).astype(np.float32))
    for i in range(spec.n_layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", norm(d))
        w.add_tensor(b + "attn_q.weight", dense(h * hd, d))
        w.add_tensor(b + "attn_k.weight", dense(kv * hd, d))
        w.add_tensor(b + "attn_v.weight", dense(kv * hd, d))
        w.add_tensor(b + "attn_output.weight", dense(d, h * hd))
        if spec.qkv_bias:
            for name, n in (("attn_q", h * hd), ("attn_k", kv * hd), ("attn_v", kv * hd)):
                w.add_tensor(b + f"{name}.bias", (0.1 * rng.standard_normal(n)).astype(np.float32))
        if spec.qk_norm:
            w.add_tensor(b + "attn_q_norm.weight", norm(hd))
            w.add_tensor(b + "attn_k_norm.weight", norm(hd))
        w.add_tensor(b + "ffn_norm.weight", norm(d))
        w.add_tensor(b + "ffn_gate.weight", dense(spec.d_ff, d))
        w.add_tensor(b + "ffn_up.weight", dense(spec.d_ff, d))
        w.add_tensor(b + "ffn_down.weight", dense(d, spec.d_ff))
        if spec.arch in ("gemma2", "gemma3"):
            w.add_tensor(b + "post_attention_norm.weight", norm(d))
            w.add_tensor(b + "post_ffw_norm.weight", norm(d))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)
