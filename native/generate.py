"""Generation in three layers: `generate_step` (token ids) -> `stream_generate` (GenerationResponse) ->
`generate` (str)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from native.base import Backend, Session


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
    session: Session, prompt: Sequence[int], sampler: Sampler, max_tokens: int, stop_ids: frozenset[int] = frozenset()
) -> Iterator[tuple[int, np.ndarray]]:
    """Prefill `prompt`, then yield (token, logits it was sampled from) until a stop token or `max_tokens`.

    A stop token is yielded too (the caller decides whether to show it) and ends the stream; it is not decoded.
    """
    logits = session.prefill(prompt)
    for i in range(max_tokens):
        token = sampler(logits)
        yield token, logits
        if token in stop_ids or i == max_tokens - 1:
            return
        logits = session.decode(token)


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
) -> Iterator[GenerationResponse]:
    """Stream a completion. `prompt`: chat messages (rendered with the model's template), raw text, or token ids.

    A text-only backend (`capabilities.text_only`, an HTTP server) streams through its `TextBackend.stream_text`;
    `session` applies to local backends only.
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
    out: list[int] = []
    shown = ""
    try:
        for token, _ in generate_step(session, ids, Sampler(sampler or SamplerConfig()), max_tokens, tok.eos_ids):
            now = time.perf_counter()
            if t_first is None:
                t_first = now
            stop = token in tok.eos_ids
            if not stop:
                out.append(token)
            text = tok.decode(out)
            piece = ""
            if not text.endswith("\ufffd"):  # hold back an incomplete UTF-8 sequence
                piece, shown = text[len(shown):], text
            finish = "stop" if stop else ("length" if len(out) >= max_tokens else None)
            gen_time = now - t_first
            yield GenerationResponse(
                text=piece, token=token, prompt_tokens=len(ids), generation_tokens=len(out),
                prompt_tps=len(ids) / max(t_first - t0, 1e-9),
                generation_tps=(len(out) - 1) / gen_time if gen_time > 0 else 0.0,
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
