"""Splice a compiled block into a live session at its current depth, with the planned repair; fail closed.

`splice_tool` is what the agent calls: it loads (mmap) and verifies the block of the context that fits the depth
(`splice.prompt.context_for`), asks the profile for a plan and applies it. Any block problem (missing, foreign,
stale, corrupted, truncated), a plan of `text` or an import the backend refuses (`splice_or_text`) prefills the
segment as text instead, so a splice is never worse
than text prefill and never uses a wrong block.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from native.base import BackendError, KVRange, KVSession
from registry.model import Tool
from splice.block import BlockError, load_block
from splice.compiler import block_key, block_path
from splice.profile import RepairPlan, SpliceProfile, load_profile
from splice.prompt import context_for, segment_tokens


@dataclass
class SpliceResult:
    """What happened: `plan` applied, tokens decoded as text (`redecoded`) out of `n_tokens`, timings in ms."""

    plan: RepairPlan
    n_tokens: int
    redecoded: int
    load_ms: float = 0.0
    splice_ms: float = 0.0
    fallback: str | None = None  # why the block was not used (None when it was)

    @property
    def redecode_frac(self) -> float:
        return self.redecoded / self.n_tokens if self.n_tokens else 0.0


def apply_plan(session: KVSession, kv: KVRange, plan: RepairPlan, lead: list[int] = ()) -> int:
    """Insert block `kv` at `session.n_past` per `plan`, after the text tokens `lead` (decoded in the same pass as
    the block's head: one model pass fewer); returns how many block tokens were decoded as text or recomputed.

    head n (tail t): decode kv.tokens[:n] as text, import kv[n:T-t] re-anchored right after them (a batch must
    start at the last position + 1, so the head goes first), then decode the last t tokens as text.
    suffix n: import kv[:T-n], then decode the last n tokens.
    blend n, frac: head n, then `session.recompute_kv` rewrites the most-deviating frac of the spliced tokens in
    place (CacheBlend); on a backend without `can_recompute_kv` (llama.cpp) it recomputes none: the plan runs as
    head n.
    """
    T = len(kv)
    tokens = [int(t) for t in kv.tokens]
    n = min(plan.n, T)
    # every plan but text is (head decoded as text, spliced middle, tail decoded as text)
    head, tail = {"none": (0, 0), "suffix": (0, n), "head": (n, plan.tail), "blend": (n, 0)}.get(plan.mode, (T, 0))
    lead = [int(t) for t in lead]
    if plan.mode == "text" or plan.mode != "none" and head + tail >= T:
        session.prefill(lead + tokens)
        return T
    if head or lead:
        session.prefill(lead + tokens[:head])
    start = session.n_past
    session.import_kv(kv, span=(head, T - tail) if head or tail else None, rotate=plan.rotate)
    if tail:
        session.prefill(tokens[T - tail :])
    recomputed = len(session.recompute_kv(start, start + T - head, plan.frac)) if plan.mode == "blend" else 0
    return head + tail + recomputed


def splice_or_text(session: KVSession, kv: KVRange, plan: RepairPlan, lead: list[int] = ()) -> tuple[int, str | None]:
    """`apply_plan`, failing closed: when the backend refuses the import (`BackendError`: a KV layout it cannot
    convert, such as a quantized V cache saved with the other flash-attention setting, or a state it cannot read),
    whatever the attempt added is removed and the block's tokens are prefilled as text. Returns (tokens decoded as
    text or recomputed (not counting `lead`, text before the block: `apply_plan`), the refusal in words or None)."""
    start = session.n_past
    try:
        return apply_plan(session, kv, plan, lead), None
    except BackendError as e:
        if session.n_past > start:
            session.remove(start, session.n_past)
        # a full context raises here, as text prefill would
        session.prefill([int(t) for t in lead] + [int(t) for t in kv.tokens])
        return len(kv), f"the backend refused the block: {e}"


def splice_tool(session: KVSession, backend, tool: Tool, depth: int, profile: SpliceProfile | None = None,
                root: Path | None = None) -> SpliceResult:
    """Put `tool`'s schema segment into `session` at `session.n_past`; `depth` = tokens after the system prompt.

    Uses the block file when it verifies, the backend can splice this model and the profile allows; otherwise
    prefills the segment as text and says why in `fallback` (the agent's trace records it).
    """
    t0 = time.perf_counter()
    if not backend.capabilities.can_splice:  # e.g. llama.cpp on an architecture whose cache cannot K-shift
        seg = segment_tokens(backend.tokenizer, tool)
        session.prefill(seg)
        return SpliceResult(RepairPlan("text", len(seg)), len(seg), len(seg),
                            fallback=f"{backend.name} cannot splice a {backend.info.architecture} model",
                            splice_ms=1e3 * (time.perf_counter() - t0))
    profile = profile or load_profile(backend)
    try:
        c = context_for(depth)
        header, kv = load_block(block_path(backend, tool, root, c), block_key(backend, tool, c))
        if not tokens_match(kv, segment_tokens(backend.tokenizer, tool)):
            raise BlockError(f"block of {tool.name} holds other tokens than the current prompt format; recompile it")
    except BlockError as e:
        seg = segment_tokens(backend.tokenizer, tool)
        session.prefill(seg)
        return SpliceResult(RepairPlan("text", len(seg)), len(seg), len(seg), fallback=str(e),
                            splice_ms=1e3 * (time.perf_counter() - t0))
    t1 = time.perf_counter()
    plan = profile.plan_for(depth, len(kv))
    redecoded, refused = splice_or_text(session, kv, plan)
    t2 = time.perf_counter()
    if refused:
        return SpliceResult(RepairPlan("text", len(kv)), len(kv), redecoded, load_ms=1e3 * (t1 - t0),
                            splice_ms=1e3 * (t2 - t1), fallback=refused)
    return SpliceResult(plan, len(kv), redecoded, load_ms=1e3 * (t1 - t0), splice_ms=1e3 * (t2 - t1),
                        fallback="profile: depth beyond calibrated range" if plan.mode == "text" else None)


def tokens_match(kv: KVRange, tokens: list[int]) -> bool:
    return len(kv) == len(tokens) and bool(np.array_equal(kv.tokens, np.asarray(tokens)))
