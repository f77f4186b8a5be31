"""The one decode loop. `generate_step` (token ids, with logits processors) -> `stream_generate`
(GenerationResponse) -> `generate` (str).

Chat, tool arguments and agent answers all run through `generate_step`, on every local backend; what differs
between them is only the list of logits processors (a grammar mask, a loop guard, a copy bias), the way
mlx-lm's `generate_step(sampler=, logits_processors=)` composes them. `Detokenizer` is the one place that
turns a growing token list into streamed text without splitting a UTF-8 character.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from native.base import Backend, Session

# A logits processor sees the tokens generated so far (prompt excluded) and the (vocab,) logits for the next
# one, and returns the logits to sample from (-inf forbids a token). Processors run in list order.
LogitsProcessor = Callable[[list[int], np.ndarray], np.ndarray]


def penalties(presence: float = 0.0, frequency: float = 0.0, bias: dict[int, float] | None = None) -> LogitsProcessor:
    """OpenAI's sampling adjustments as a logits processor: `bias` added to its tokens' logits (`logit_bias`); each
    token this reply has generated lowered by `presence` once and by `frequency` per time it was generated."""
    ids = np.fromiter((bias or {}).keys(), dtype=np.int64)
    values = np.fromiter((bias or {}).values(), dtype=np.float32)

    def apply(tokens: list[int], logits: np.ndarray) -> np.ndarray:
        logits = logits.copy()
        if len(ids):
            logits[ids] += values
        if tokens and (presence or frequency):
            seen, counts = np.unique(np.asarray(tokens, dtype=np.int64), return_counts=True)
            logits[seen] -= presence + frequency * counts
        return logits
    return apply


@dataclass
class SamplerConfig:
    """temperature 0 = greedy; top_p in (0, 1] keeps the smallest set of tokens with that much probability."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


class Sampler:
    def __init__(self, cfg: SamplerConfig):
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)

    def __call__(self, logits: np.ndarray) -> int:
        """Pick the next token from (vocab,) logits."""
        if self.cfg.temperature == 0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / self.cfg.temperature
        p = np.exp(z - z.max())
        p /= p.sum()
        if self.cfg.top_p < 1:
            order = np.argsort(-p)
            keep = order[: int(np.searchsorted(np.cumsum(p[order]), self.cfg.top_p)) + 1]
            q = np.zeros_like(p)
            q[keep] = p[keep]
            p = q / q.sum()
        return int(self.rng.choice(len(p), p=p))


def generate_step(
    session: Session, prompt: Sequence[int], sampler: Sampler, max_tokens: int,
    stop_ids: frozenset[int] = frozenset(), logits_processors: Sequence[LogitsProcessor] = (),
    logits: np.ndarray | None = None,
) -> Iterator[tuple[int, np.ndarray]]:
    """Prefill `prompt` (skipped when `logits` after it are given), then yield (token, the processed logits it
    was sampled from) until a stop token or `max_tokens`.

    A stop token is yielded too (the caller decides whether to show it) and ends the stream; it is not decoded.
    The stream also ends, without decoding the token just yielded, when a processor's optional
    `finished(tokens)` says so (a grammar that accepts nothing more), and, without yielding, when the
    processors leave no token allowed (every logit -inf). So the session holds the prompt and every yielded
    token except the last one (all of them in the no-token-allowed case).

    A processor's optional `ahead(tokens)` names tokens it will force or expects next (a copy planned whole, a draft
    read from the request; the first processor's plan is taken, and one with `extends` set drafts on after it, asked
    with the planned tokens as if taken): they are fed with the token just sampled in one forward pass instead of
    one decode each, and their logits are taken from it as each comes up (the processors still run on them, so a
    token they do not pick is never kept: the fed tokens from it on are removed and decoding goes on from there). A
    processor's optional `bind(view)` gets the `AheadView` of the session: the passes it runs of its own go through
    it, so they see the session as holding exactly the tokens so far, and a pass over tokens already fed ahead is
    read from their logits instead of being run again.
    """
    if logits is None:
        logits = session.prefill(list(prompt))
    n0 = session.n_past
    out: list[int] = []
    enders = [p.finished for p in logits_processors if hasattr(p, "finished")]
    planners = [p for p in logits_processors if hasattr(p, "ahead")]
    view = AheadView(session)  # `view.fed`: tokens in the session ahead of `out`; `view.rows`: the logits after each
    for p in logits_processors:
        if hasattr(p, "bind"):
            p.bind(view)

    def trim(n: int) -> None:
        view.fed, view.rows = [], []
        if session.n_past > n:
            session.remove(n, session.n_past)

    for i in range(max_tokens):
        for proc in logits_processors:
            logits = proc(out, logits)
        fed, rows = view.fed, view.rows  # (a processor's own pass may have dropped them)
        if not np.isfinite(logits).any():
            trim(n0 + len(out))
            return
        token = sampler(logits)
        yield token, logits
        if token in stop_ids or i == max_tokens - 1:
            trim(n0 + len(out))
            return
        out.append(token)
        if any(done(out) for done in enders):
            trim(n0 + len(out) - 1)
            return
        if fed and token == fed[0]:  # fed ahead already
            fed.pop(0)
            logits = rows.pop(0)
            continue
        if fed:  # the processors took another token: drop what was fed ahead
            trim(n0 + len(out) - 1)
        ahead: list[int] = []
        for p in planners:  # the first plan; a planner that `extends` drafts on after it
            if not ahead:
                ahead = list(p.ahead(out))
            elif getattr(p, "extends", False):
                ahead += p.ahead(out + ahead)
        if ahead:
            block = session.forward_logits([token, *ahead])
            logits, view.rows, view.fed = block[0], list(block[1:]), list(ahead)
        else:
            logits = session.decode(token)


class AheadView:
    """The session as a processor's own passes see it inside `generate_step`: holding the prompt and the tokens
    so far, not the tokens fed ahead of them. A pass over a prefix of the fed tokens returns their logits
    without running; any other pass first drops what was fed (the loop then decodes on from its own token)."""

    def __init__(self, session: Session):
        self.session = session
        self.fed: list[int] = []
        self.rows: list[np.ndarray] = []

    @property
    def n_past(self) -> int:
        return self.session.n_past - len(self.fed)

    def fed_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, from the first, are fed ahead already (their logits free)."""
        n = 0
        while n < min(len(tokens), len(self.fed)) and tokens[n] == self.fed[n]:
            n += 1
        return n

    def forward_logits(self, tokens: Sequence[int]) -> np.ndarray:
        tokens = list(tokens)
        if tokens and self.fed_prefix(tokens) == len(tokens):
            return np.stack(self.rows[: len(tokens)])
        self.drop()
        return self.session.forward_logits(tokens)

    def remove(self, start: int, end: int) -> None:
        if start >= self.n_past:  # only what a served pass would have added: nothing to remove
            return
        self.drop()
        self.session.remove(start, end)

    def drop(self) -> None:
        if self.fed:
            self.session.remove(self.n_past, self.session.n_past)
            self.fed, self.rows = [], []


class Detokenizer:
    """Streamed text of a growing token list: `add(token)` returns the new text, holding back an incomplete
    UTF-8 sequence (decoded as U+FFFD) until the token that completes it arrives."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.text = ""

    def add(self, token: int) -> str:
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens)
        if text.endswith("\ufffd"):
            return ""
        piece, self.text = text[len(self.text):], text
        return piece

    def final(self) -> str:
        """The whole text (an incomplete trailing character included as U+FFFD)."""
        return self.tokenizer.decode(self.tokens)


@dataclass
class GenerationResponse:
    """One streamed piece of a generation.

    text: the new text since the last response (may be empty while a multi-byte character is incomplete);
    token: the token id just generated; finish_reason: None while streaming, then "stop" or "length";
    prompt_tps / generation_tps: tokens per second; ttft_s: seconds from the call to the first token.
    """

    text: str
    token: int
    prompt_tokens: int
    generation_tokens: int
    prompt_tps: float
    generation_tps: float
    ttft_s: float
    finish_reason: str | None = None
    extra: dict = field(default_factory=dict)


def stream_generate(
    backend: Backend,
    prompt: str | list[dict] | Sequence[int],
    max_tokens: int = 128,
    sampler: SamplerConfig | None = None,
    session: Session | None = None,
    logits_processors: Sequence[LogitsProcessor] = (),
    logits: np.ndarray | None = None,
) -> Iterator[GenerationResponse]:
    """Stream a completion. `prompt`: chat messages (rendered with the model's template), raw text, or token ids.

    `session`: decode on this session (kept open) instead of a fresh one; `logits`: the session already holds
    `prompt` and these are its next-token logits (no prefill). A text-only backend (`capabilities.text_only`,
    an HTTP server) streams through its `TextBackend.stream_text`; the other arguments apply to local backends.
    """
    if backend.capabilities.text_only:
        yield from backend.stream_text(prompt, max_tokens, sampler)
        return
    tok = backend.tokenizer
    if isinstance(prompt, str):
        ids = tok.encode(prompt)
    elif prompt and isinstance(prompt[0], dict):
        ids = tok.encode_chat(list(prompt))
    else:
        ids = [int(t) for t in prompt]
    own_session = session is None
    session = session or backend.new_session()
    t0 = time.perf_counter()
    t_first = None
    text = Detokenizer(tok)
    try:
        steps = generate_step(session, ids, Sampler(sampler or SamplerConfig()), max_tokens, tok.eos_ids,
                              logits_processors, logits)
        for token, _ in steps:
            now = time.perf_counter()
            if t_first is None:
                t_first = now
            stop = token in tok.eos_ids
            piece = "" if stop else text.add(token)
            n = len(text.tokens)
            finish = "stop" if stop else ("length" if n >= max_tokens else None)
            gen_time = now - t_first
            yield GenerationResponse(
                text=piece, token=token, prompt_tokens=len(ids), generation_tokens=n,
                prompt_tps=len(ids) / max(t_first - t0, 1e-9),
                generation_tps=(n - 1) / gen_time if gen_time > 0 else 0.0,
                ttft_s=t_first - t0, finish_reason=finish,
            )
            if finish:
                return
    finally:
        if own_session:
            session.close()


def generate(backend: Backend, prompt, max_tokens: int = 128, sampler: SamplerConfig | None = None) -> str:
    """The whole completion as one string."""
    return "".join(r.text for r in stream_generate(backend, prompt, max_tokens, sampler))
