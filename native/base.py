"""The backend interface: one `Backend` per loaded model, one `Session` per live sequence.

`Session` is what generation, the agent loop and eviction use; `KVSession` adds the KV-range operations that
splicing uses (backends with `can_splice`); `TextBackend` is the text API of a backend without sessions
(`text_only`). Everything above `native/` talks to these protocols and asks `Capabilities` instead of checking
types. Logits are float32 NumPy arrays of shape (vocab,) or (T, vocab); token ids are Python ints; positions are
absolute (logical) token positions in the sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from native.generate import GenerationResponse, SamplerConfig
    from native.tokenizer import Tokenizer


class ModelError(ValueError):
    """A model file or directory that cannot be used; the message names the path and what is wrong."""


class TemplateRefusal(ModelError):
    """The model's chat template refused a conversation (its `raise_exception`), in every shape Nexus could give it."""


class BackendError(RuntimeError):
    """A backend operation that failed at run time (context full, bad KV range, closed session...)."""


@dataclass(frozen=True)
class ModelInfo:
    """Shape and identity of a loaded model, and what its attention does per layer (scale, window, RoPE base)."""

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
    rope_base: float  # the global layers' base (`rope_bases` has every layer's)
    rope_traditional: bool  # True: rotary pairs are interleaved (2i, 2i+1), as GGUF stores Q/K; False: half-split
    rms_eps: float
    attn_scale: float = 0.0  # attention logit scale; 0: head_dim ** -0.5
    windows: tuple[int, ...] = ()  # per layer: sliding-window length in tokens, 0 = global; (): all global
    rope_bases: tuple[float, ...] = ()  # per layer; (): all `rope_base`
    attn_softcap: float = 0.0  # > 0: scores are soft-capped before the softmax (`native.models.attention.soft_cap`)

    @property
    def scale(self) -> float:
        """The factor on q·k before the softmax."""
        return self.attn_scale or self.head_dim**-0.5

    def window(self, layer: int) -> int:
        """Layer `layer`'s sliding window (tokens a query sees, itself included); 0: the whole context."""
        return self.windows[layer] if self.windows else 0


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; callers ask these flags instead of checking backend names or types.

    Each backend's flags live in its `native.registry.BACKENDS` entry, so that the CLI choices and the test
    matrix can select backends by capability without importing them.
    """

    can_splice: bool = False  # sessions are KVSessions: export/import KV ranges re-anchored to another depth
    can_skip_reanchor: bool = False  # import_kv(rotate=False) keeps keys as exported (measures what re-anchoring buys)
    can_bias_keys: bool = False  # additive per-key logit bias in attention (the Hajek offset)
    can_score_attention: bool = False  # exposes recent queries / attention for score-based eviction
    can_remove_positions: bool = False  # drop arbitrary cached positions (positional eviction)
    can_recompute_kv: bool = False  # recompute_kv rewrites K/V of cached tokens in place (CacheBlend repair)
    can_read_hidden: bool = False  # sessions have last_hidden(): the final hidden state at the last position
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
    """One live sequence and its KV cache: what generation, the agent loop and eviction use.

    `n_past` is the next logical position; evicting or removing cached positions does not change it, and new
    tokens always continue at `n_past`. A backend's session class subclasses this protocol and inherits the
    defaults below (`begin_answer`); a wrapper such as the evicting session implements every member itself.
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

    def remove(self, start: int, end: int) -> None:
        """Drop the cached entries whose positions lie in [start, end); a removed tail also lowers `n_past`."""
        ...

    def begin_answer(self, first_step: int | None = None) -> None:
        """Mark the start of an answer: its first step is the query at `first_step` (default `n_past`, the next
        token fed). A backend session keeps no per-answer state and does nothing; the evicting session starts
        certifying its answer steps here."""

    def close(self) -> None:
        """Free the cache; idempotent."""
        ...


@runtime_checkable
class KVSession(Session, Protocol):
    """A session whose cached keys/values can be copied out and back in: a backend with `can_splice` has these.

    Splicing (`splice.splicer`) imports a compiled block at the current depth with `import_kv` and repairs it
    with `recompute_kv` where the backend can (`can_recompute_kv`).
    """

    def export_kv(self, start: int, end: int) -> KVRange:
        """Copy the cached entries whose positions lie in [start, end)."""
        ...

    def import_kv(self, kv: KVRange, span: tuple[int, int] | None = None, rotate: bool = True) -> None:
        """Insert `kv` at the current depth: re-anchor it to start at `n_past`, then advance `n_past`.

        `span` = (a, b) imports only the entries kv[a:b] (indices into the range, not positions); entry a lands
        at `n_past`. `rotate=False` keeps the keys at the positions they were exported at (a "bare" splice);
        a backend without `can_skip_reanchor` raises BackendError for it.
        """
        ...

    def recompute_kv(self, start: int, end: int, frac: float) -> np.ndarray:
        """Recompute in place the K/V of the ceil(frac * T) cached tokens in [start, end) that deviate most from
        a pass in context (CacheBlend); return their positions, (K,) int64.

        A backend without `can_recompute_kv` cannot rewrite cached cells: it recomputes nothing and returns an
        empty array, so a blend repair there amounts to its decoded head.
        """
        return np.zeros(0, dtype=np.int64)


@runtime_checkable
class Backend(Protocol):
    """A loaded model behind one backend. `capabilities` says what it serves: sessions that are KVSessions
    (`can_splice`), or no sessions and the `TextBackend` API (`text_only`)."""

    name: str
    info: ModelInfo
    tokenizer: "Tokenizer"
    capabilities: Capabilities

    def new_session(self, n_ctx: int | None = None) -> Session:
        """A fresh sequence of up to `n_ctx` tokens (a KVSession when `can_splice`); text-only backends raise
        BackendError."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class TextBackend(Backend, Protocol):
    """A backend with `capabilities.text_only` (an HTTP server): no Session, no local tokenizer; generation goes
    through its text API."""

    def stream_text(self, prompt: str | list[dict], max_tokens: int = 128, sampler: SamplerConfig | None = None,
                    schema: dict | None = None) -> Iterator[GenerationResponse]:
        """Stream a completion of chat messages or raw text; `schema` constrains the reply where the server can."""
        ...


def as_token_list(tokens: Iterable[int]) -> list[int]:
    """Validate and copy a token sequence (rejects empty input and non-integers with a clear error)."""
    out = [int(t) for t in tokens]
    if not out:
        raise BackendError("no tokens given")
    return out
