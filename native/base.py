"""The backend interface: one `Backend` per loaded model, one `Session` per live sequence.

Everything above `native/` (generation, splicing, eviction, the agent) talks to these protocols and asks for
capabilities instead of checking types. Logits are float32 NumPy arrays of shape (vocab,) or (T, vocab);
token ids are Python ints; positions are absolute (logical) token positions in the sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Protocol, Sequence, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from native.tokenizer import Tokenizer


class ModelError(ValueError):
    """A model file or directory that cannot be used; the message names the path and what is wrong."""


class BackendError(RuntimeError):
    """A backend operation that failed at run time (context full, bad KV range, closed session...)."""


@dataclass(frozen=True)
class ModelInfo:
    """Shape and identity of a loaded llama-family model."""

    path: str
    format: str  # "gguf" or "mlx-dir" (config.json + safetensors)
    fingerprint: str  # hex digest of the model file(s): identifies the model in block files and profiles
    architecture: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    vocab_size: int
    n_ctx_train: int
    rope_base: float
    rope_traditional: bool  # True: rotary pairs are interleaved (2i, 2i+1), as GGUF stores Q/K; False: half-split
    rms_eps: float


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; callers ask these flags instead of checking backend types."""

    can_splice: bool = False  # export/import KV ranges and re-anchor them to another depth
    can_bias_keys: bool = False  # additive per-key logit bias in attention (the Hajek offset)
    can_score_attention: bool = False  # exposes recent queries / attention for score-based eviction
    can_remove_positions: bool = False  # drop arbitrary cached positions (positional eviction)
    can_recompute_kv: bool = False  # rewrite K/V of cached tokens at arbitrary positions (CacheBlend repair)
    text_only: bool = False  # no local Session or tokenizer: generate through the backend's text API (HTTP servers)


@dataclass
class KVRange:
    """Cached keys/values of a span of tokens.

    `positions` (T,) int64 absolute positions and `tokens` (T,) int64 ids are always set. A backend fills
    either `keys`/`values` (L, n_kv, T, D) float32, keys post-RoPE at `positions` (MLX), or `blob`, an opaque
    state that only the same backend and context layout can load (llama.cpp's per-sequence state).
    """

    positions: np.ndarray
    tokens: np.ndarray
    keys: np.ndarray | None = None
    values: np.ndarray | None = None
    blob: bytes | None = None
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.positions.shape[0])


@runtime_checkable
class Session(Protocol):
    """One live sequence and its KV cache.

    `n_past` is the next logical position; evicting or removing cached positions does not change it, and new
    tokens always continue at `n_past`.
    """

    n_past: int

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Append `tokens` to the cache; return the logits after the last one, (vocab,) float32."""
        ...

    def decode(self, token: int) -> np.ndarray:
        """Append one token; return the next-token logits, (vocab,) float32."""
        ...

    def forward_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Append `tokens` (teacher forcing); return the logits at every one of them, (T, vocab) float32."""
        ...

    def export_kv(self, start: int, end: int) -> KVRange:
        """Copy the cached entries whose positions lie in [start, end)."""
        ...

    def import_kv(self, kv: KVRange) -> None:
        """Insert `kv` at the current depth: re-anchor it to start at `n_past`, then advance `n_past`."""
        ...

    def remove(self, start: int, end: int) -> None:
        """Drop the cached entries whose positions lie in [start, end); a removed tail also lowers `n_past`."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Backend(Protocol):
    """A loaded model behind one backend."""

    name: str
    info: ModelInfo
    tokenizer: "Tokenizer"
    capabilities: Capabilities

    def new_session(self, n_ctx: int | None = None) -> Session: ...

    def close(self) -> None: ...


def as_token_list(tokens: Iterable[int]) -> list[int]:
    """Validate and copy a token sequence (rejects empty input and non-integers with a clear error)."""
    out = [int(t) for t in tokens]
    if not out:
        raise BackendError("no tokens given")
    return out
