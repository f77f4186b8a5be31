"""The MLX backend: our model files (native.models, one per architecture) with the position-aware cache
(native.mlx_cache).

The reference backend for everything that touches keys and queries: splicing imports post-RoPE keys and
re-anchors them with one rotation, eviction compacts the cache and biases keys, and a hook sees the queries.
"""

from __future__ import annotations

import mlx.core as mx  # importing this package (native/__init__) first bound MLX's BLAS to OpenBLAS
import numpy as np

from native.base import BackendError, KVRange, KVSession, ModelInfo, as_token_list
from native.mlx_cache import KVCache
from native.mlx_recompute import recompute_slots, select_deviating
from native.mlx_weights import load_model
from native.model_files import resolve_model
from native.registry import BACKENDS
from native.tokenizer import tokenizer_from_dir, tokenizer_from_gguf

PREFILL_CHUNK = 512  # tokens per forward pass while prefilling: bounds the (T, S) attention scores


class MLXBackend:
    """A model of any architecture in `native.models.ARCHITECTURES`, from a GGUF file or an MLX/HF directory.
    `quantized`: keep quantized GGUF weights quantized (default: only on Metal; on a CPU they are dequantized to
    float32 at load)."""

    name = "mlx"
    capabilities = BACKENDS["mlx"].capabilities

    def __init__(self, model: str | None = None, quantized: bool | None = None):
        src = resolve_model(model)
        self.model, self.info, meta = load_model(src, quantized=quantized)
        self.tokenizer = tokenizer_from_gguf(meta, src.path) if src.format == "gguf" else tokenizer_from_dir(src.path)

    def new_session(self, n_ctx: int | None = None) -> "MLXSession":
        return MLXSession(self, n_ctx or self.info.n_ctx_train)

    def close(self) -> None:
        self.model = None


class MLXSession(KVSession):
    """One sequence. `n_past` is the next logical position; the cache may hold fewer entries (eviction)."""

    def __init__(self, backend: MLXBackend, n_ctx: int):
        if backend.model is None:
            raise BackendError("the MLX backend is closed")
        self.backend, self.info, self.n_ctx = backend, backend.info, n_ctx
        i: ModelInfo = backend.info
        self.cache = KVCache(i.n_layers, i.n_heads, i.n_kv_heads, i.head_dim, i.windows)
        self.n_past = 0
        self.tokens: list[int] = []  # token id at each cached slot, aligned with cache.positions

    # -- forward -------------------------------------------------------------------------------------------
    def _forward(self, tokens: list[int], all_logits: bool) -> np.ndarray:
        if self.n_past + len(tokens) > self.n_ctx:
            raise BackendError(f"context full: {self.n_past} + {len(tokens)} tokens > n_ctx={self.n_ctx}")
        model = self.backend.model
        outs = []
        for s in range(0, len(tokens), PREFILL_CHUNK):
            chunk = tokens[s : s + PREFILL_CHUNK]
            h = model.hidden(mx.array(chunk, dtype=mx.int32)[None], self.n_past, self.cache)
            if not all_logits and s + PREFILL_CHUNK < len(tokens):
                mx.eval(*self.cache.arrays())
            else:
                logits = model.logits(h if all_logits else h[:, -1:, :])[0]
                mx.eval(logits, *self.cache.arrays())
                outs.append(np.array(logits.astype(mx.float32)))
            self.n_past += len(chunk)
            self.tokens += chunk
        return np.concatenate(outs) if all_logits else outs[-1][-1]

    def prefill(self, tokens) -> np.ndarray:
        return self._forward(as_token_list(tokens), all_logits=False)

    def decode(self, token: int) -> np.ndarray:
        return self._forward([int(token)], all_logits=False)

    def forward_logits(self, tokens) -> np.ndarray:
        return self._forward(as_token_list(tokens), all_logits=True)

    def last_hidden(self) -> np.ndarray:
        """The model's final hidden state (after its output norm) at the last position fed, (d_model,) float32: that
        position is fed again (one decode step; the cache ends as it was)."""
        p = self.n_past - 1
        if not self.tokens or int(self.cache.positions[-1]) != p:
            raise BackendError("no last position to read a hidden state at")
        token = self.tokens[-1]
        self.remove(p, p + 1)
        h = self.backend.model.hidden(mx.array([[token]], dtype=mx.int32), self.n_past, self.cache)[0, -1]
        mx.eval(h, *self.cache.arrays())
        self.n_past += 1
        self.tokens.append(token)
        return np.array(h.astype(mx.float32))

    # -- KV ranges -------------------------------------------------------------------------------------------
    def export_kv(self, start: int, end: int) -> KVRange:
        slots = self.cache.slots_in(start, end)
        if not len(slots):
            raise BackendError(f"no cached positions in [{start}, {end})")
        keys, values = self.cache.export(slots)
        tokens = np.array([self.tokens[s] for s in slots], dtype=np.int64)
        return KVRange(positions=self.cache.positions[slots].copy(), tokens=tokens, keys=keys, values=values)

    def import_kv(self, kv: KVRange, span: tuple[int, int] | None = None, rotate: bool = True) -> None:
        """Insert `kv` at depth `n_past`: rotate keys by delta = n_past - first position (RoPE composes).

        `span` = (a, b) imports only the entries kv[a:b] (indices, not positions); entry a lands at `n_past`.
        `rotate=False` keeps the keys as exported (a "bare" splice, only for measuring what re-anchoring buys).
        """
        if kv.keys is None or kv.values is None:
            raise BackendError("this KV range has no keys/values arrays (was it exported by another backend?)")
        if span is not None:
            a, b = span
            if not 0 <= a < b <= len(kv):
                raise BackendError(f"span {span} is outside this KV range of {len(kv)} entries")
            kv = KVRange(positions=kv.positions[a:b], tokens=kv.tokens[a:b], keys=kv.keys[:, :, a:b],
                         values=kv.values[:, :, a:b])
        i = self.info
        if kv.keys.shape[:2] != (i.n_layers, i.n_kv_heads) or kv.keys.shape[3] != i.head_dim:
            raise BackendError(f"KV range layout {kv.keys.shape} does not match the model "
                               f"({i.n_layers}, {i.n_kv_heads}, T, {i.head_dim})")
        n = len(kv)
        if self.n_past + n > self.n_ctx:
            raise BackendError(f"context full: {self.n_past} + {n} tokens > n_ctx={self.n_ctx}")
        delta = self.n_past - int(kv.positions[0])
        keys = self.backend.model.shift_keys(mx.array(kv.keys), delta if rotate else 0)
        positions = kv.positions - kv.positions[0] + self.n_past
        self.cache.insert(keys, mx.array(kv.values), positions)
        self.tokens += [int(t) for t in kv.tokens]
        self.n_past = int(positions[-1]) + 1

    def recompute_kv(self, start: int, end: int, frac: float) -> np.ndarray:
        """CacheBlend repair of the cached span [start, end) (a splice): recompute in place, through every layer,
        the ceil(frac * T) tokens whose layer-1 K/V deviate most from a pass in context; returns their positions."""
        if not 0 < frac <= 1:
            raise BackendError(f"recompute_kv: frac must be in (0, 1], got {frac}")
        slots = self.cache.slots_in(start, end)
        if not len(slots):
            raise BackendError(f"recompute_kv: no cached positions in [{start}, {end})")
        model = self.backend.model
        pick, h1, _ = select_deviating(model, self.cache, [self.tokens[s] for s in slots], slots, frac)
        recompute_slots(model, self.cache, slots[pick], h1)
        return self.cache.positions[slots[pick]].copy()

    def remove(self, start: int, end: int) -> None:
        pos = self.cache.positions
        keep = np.nonzero((pos < start) | (pos >= end))[0]
        if not len(keep) or keep[-1] == len(keep) - 1:  # a suffix of the slots (rewinding a probe): no copy
            self.cache.truncate(len(keep))
        else:
            self.cache.keep(keep)
        self.tokens = [self.tokens[s] for s in keep]
        if end >= self.n_past:
            self.n_past = min(self.n_past, start)

    def close(self) -> None:
        self.cache = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

