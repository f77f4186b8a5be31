"""Fidelity of a splice against a one-shot text prefill (DESIGN section 8), shared by calibration and the eval.

A case is: preamble (system prompt) + `depth` tokens of synthetic history, then the tool's schema segment,
then a user turn and 8 teacher-forced answer tokens. The reference prefills segment + user + answer in one
batch; a variant inserts the segment its own way, then runs user + answer[:7] teacher-forced. KL(ref || variant)
in nats and top-1 agreement are averaged over the 8 positions after the user turn.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np

from native.base import KVRange
from registry.model import Tool
from splice.profile import RepairPlan
from splice.prompt import preamble_tokens, segment_tokens, user_turn_tokens
from splice.splicer import apply_plan

N_POSITIONS = 8
_TOPICS = ["the weather in Lyon", "a flaky unit test", "quarterly sales figures", "a broken build on CI",
           "renaming files in a folder", "unit conversion", "a calendar invite", "the notes from Monday"]


@dataclass
class Case:
    tool: Tool
    prefix: list[int]  # preamble + history; len(prefix) - n_preamble == depth
    n_preamble: int
    segment: list[int]
    user: list[int]
    answer: list[int]  # N_POSITIONS - 1 teacher-forced tokens

    @property
    def depth(self) -> int:
        return len(self.prefix) - self.n_preamble


def history_tokens(tokenizer, n: int, seed: int) -> list[int]:
    """`n` tokens of a seeded synthetic user/assistant exchange (cut at exactly n)."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        topic = rng.choice(_TOPICS)
        out += user_turn_tokens(tokenizer, f"Can you help me with {topic}? It is item {rng.randint(1, 999)}.")
        out += tokenizer.encode(f"Sure, here is what I found about {topic}: nothing unusual so far.", special=False)
        out += tokenizer.encode("<|im_end|>\n", special=True)
    return out[:n]


def make_case(tokenizer, tool: Tool, depth: int, seed: int = 0, system: str | None = None) -> Case:
    pre = preamble_tokens(tokenizer) if system is None else preamble_tokens(tokenizer, system)
    desc = (tool.description or tool.name).split(".")[0][:120]
    user = user_turn_tokens(tokenizer, f"Please call {tool.name} for me: {desc}.")
    answer = tokenizer.encode('{"name": "' + tool.name + '", "arguments": {', special=False)[: N_POSITIONS - 1]
    return Case(tool, pre + history_tokens(tokenizer, depth, seed), len(pre), segment_tokens(tokenizer, tool),
                user, answer)


def kl_top1(ref: np.ndarray, out: np.ndarray) -> tuple[float, float]:
    """Mean KL(ref || out) in nats and top-1 agreement over rows of (T, vocab) logits."""
    a, b = ref.astype(np.float64), out.astype(np.float64)
    la = a - a.max(1, keepdims=True)
    la -= np.log(np.exp(la).sum(1, keepdims=True))
    lb = b - b.max(1, keepdims=True)
    lb -= np.log(np.exp(lb).sum(1, keepdims=True))
    kl = (np.exp(la) * (la - lb)).sum(1)
    return float(kl.mean()), float((a.argmax(1) == b.argmax(1)).mean())


def decisive(ref: np.ndarray, margin: float) -> np.ndarray:
    """(T,) bool: rows where the reference's top-1 logit leads its top-2 by at least `margin` (all rows for 0).

    A flip where the reference is at a near-tie (lead ~0.1 logit) says little about a splice: any perturbation,
    even a different batch split, can flip it. Agreement on the decisive rows is reported beside plain top-1.
    """
    top2 = np.sort(ref, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0] >= margin


class CaseRunner:
    """Runs variants of one case in one session: the prefix is prefilled once and kept between variants."""

    def __init__(self, backend, case: Case):
        self.case = case
        # llama.cpp loads the whole block into a scratch sequence beside the live one: room for it twice
        n = len(case.prefix) + 2 * len(case.segment) + len(case.user) + N_POSITIONS + 8
        self.session = backend.new_session(n_ctx=max(n, 512) if backend.name == "mlx" else ((n + 255) // 256) * 256)
        self.session.prefill(case.prefix)
        self.base = self.session.n_past

    def _reset(self):
        self.session.remove(self.base, self.session.n_past)

    def reference(self) -> np.ndarray:
        """One-shot prefill of segment + user + answer: logits at the 8 positions after the user turn."""
        c = self.case
        logits = self.session.forward_logits(c.segment + c.user + c.answer)
        self._reset()
        return logits[-N_POSITIONS:]

    def run(self, kv: KVRange | None, plan: RepairPlan) -> tuple[np.ndarray, float, int]:
        """(logits (8, vocab), time to first token in ms, block tokens decoded as text) for one variant.

        TTFT covers inserting the segment (text prefill or splice + repair) and the user-turn forward pass.
        """
        c = self.case
        t0 = time.perf_counter()
        if kv is None or plan.mode == "text":
            self.session.prefill(c.segment)
            redecoded = len(c.segment)
        else:
            redecoded = apply_plan(self.session, kv, plan)
        logits = self.session.forward_logits(c.user + c.answer)
        ms = 1e3 * (time.perf_counter() - t0)
        self._reset()
        return logits[-N_POSITIONS:], ms, redecoded

    def text_in_batches(self, size: int = 1) -> np.ndarray:
        """Logits (8, vocab) after the segment is prefilled again in batches of `size` tokens (1: the decode path).

        The backend's own noise floor: the same text computed in other batch shapes than the reference's. On
        llama.cpp CPU a one-token batch runs the decode kernels, not the prefill ones, so it differs from the
        one-shot prefill while the segment in one batch is bit-exact; MLX's float32 path is batch-invariant. No
        TTFT: the speed baseline is the segment in one batch (`run` with a text plan), the fastest way to prefill it.
        """
        c = self.case
        for s in range(0, len(c.segment), size):
            self.session.prefill(c.segment[s : s + size])
        logits = self.session.forward_logits(c.user + c.answer)
        self._reset()
        return logits[-N_POSITIONS:]

    def roundtrip(self, shift: int = 1) -> np.ndarray:
        """Logits (8, vocab) after the segment's *exact* KV is re-anchored `shift` positions later and back.

        The segment is prefilled in this very context, exported, imported `shift` positions later (a filler token
        holds the gap), exported again and imported back at its own depth. Its keys differ from the reference's
        only by what two rotations round off in the cache: the floor of any splice that is not bit-exact.
        """
        c, s = self.case, self.session
        s.prefill(c.segment)
        exact = s.export_kv(self.base, s.n_past)
        self._reset()
        s.prefill(c.segment[:shift])
        s.import_kv(exact)
        moved = s.export_kv(self.base + shift, s.n_past)
        self._reset()
        s.import_kv(moved)
        logits = s.forward_logits(c.user + c.answer)
        self._reset()
        return logits[-N_POSITIONS:]

    def close(self):
        self.session.close()


def sample_tools(source, tokenizer, n: int, seed: int, min_tokens: int = 150, max_tokens: int = 400) -> list[Tool]:
    """`n` seeded tools whose schema segment has min..max tokens (realistic full schemas), from `source`: a tool
    file's path or a list of MCP tool dicts."""
    from registry.sources import load_tool_file

    items = list(source) if isinstance(source, list) else load_tool_file(source)
    random.Random(seed).shuffle(items)
    out = []
    for item in items:
        try:
            tool = Tool.from_mcp(item)
        except ValueError:
            continue
        if min_tokens <= len(segment_tokens(tokenizer, tool)) <= max_tokens:
            out.append(tool)
        if len(out) == n:
            break
    return out
