"""The per-model splice profile: how much of a block to repair at each depth, and where to stop splicing.

`nexus splice calibrate` measures fidelity on a calibration set and writes `profiles/<fp>.json`; the splicer
reads it. The repair curve is a step function over calibrated depths: a splice at depth n uses the entry of the
smallest calibrated depth >= n (conservative); beyond `max_depth` the segment is prefilled as text (fail closed).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from registry.home import model_profile_path, read_model_profile, update_model_profile

REPAIR_MODES = ("none", "head", "suffix", "blend", "text")


@dataclass(frozen=True)
class RepairPlan:
    """How one splice is done. `mode`: none (re-anchored block), head (decode the first `n` block tokens as
    text, splice the rest, then decode the last `tail` as text), suffix (splice all but the last `n`, decode
    those), blend (head `n`, then recompute in place the share `frac` of the spliced tokens whose layer-1 K/V
    deviate most from a fresh pass in context, CacheBlend-style; needs `capabilities.can_recompute_kv`, else it
    runs as head `n`), text (prefill all of it).
    `rotate=False` skips the RoPE re-anchor (the eval's "bare" baseline; MLX only)."""

    mode: str = "head"
    n: int = 16
    rotate: bool = True
    frac: float = 0.0  # blend only: share of the spliced (non-head) tokens recomputed, 0..1
    tail: int = 0  # head only: block tokens at the end decoded as text after the spliced middle

    def __post_init__(self):
        if self.mode not in REPAIR_MODES:
            raise ValueError(f"RepairPlan.mode must be one of {REPAIR_MODES}, got {self.mode!r}")
        if self.n < 0:
            raise ValueError(f"RepairPlan.n must be >= 0 tokens, got {self.n}")
        if not 0.0 <= self.frac <= 1.0 or (self.mode == "blend") != (self.frac > 0):
            raise ValueError("RepairPlan.frac must be in (0, 1] for blend and 0 otherwise, "
                             f"got {self.mode} {self.frac}")
        if self.tail < 0 or self.tail and self.mode != "head":
            raise ValueError(f"RepairPlan.tail must be >= 0 tokens, and only a head repair has one; "
                             f"got {self.mode} {self.tail}")


@dataclass
class SpliceProfile:
    """Calibrated repair curve for one (backend, model). `curve` is [[depth, head, blend_pct, tail], ...] sorted
    by depth, trailing zeros dropped ([depth, head] is a plain head repair): blend_pct > 0 recomputes that
    percentage of the spliced tokens by K/V deviation after the head (RepairPlan "blend"); tail > 0 decodes the
    block's last `tail` tokens as text after the spliced middle (a head repair only)."""

    backend: str
    fingerprint: str
    target_kl: float = 0.01
    curve: list[list[int]] = field(default_factory=lambda: [[2048, 16]])
    max_depth: int = 2048
    measured: dict = field(default_factory=dict)  # the calibration table the curve came from
    contexts: list[int] = field(default_factory=list)  # the block contexts it was calibrated with (prompt.CONTEXTS)
    options: dict = field(default_factory=dict)  # per calibrated depth: the passing plans, to fit a block's length

    def __post_init__(self):
        curve = []
        for e in self.curve:
            if not 2 <= len(e) <= 4:
                raise ValueError(f"SpliceProfile.curve entries are [depth, head, blend_pct, tail], got {list(e)}")
            d, head, pct, tail = (list(map(int, e)) + [0, 0])[:4]
            if head < 0 or tail < 0 or not 0 <= pct <= 100 or pct and tail:
                raise ValueError("SpliceProfile.curve head and tail counts must be >= 0, blend percentages 0..100, "
                                 f"and a blend entry has no tail; got {list(e)}")
            entry = [d, head, pct, tail]
            while len(entry) > 2 and not entry[-1]:
                entry.pop()
            curve.append(entry)
        self.curve = sorted(curve)
        for d, o in self.options.items():
            try:
                ok = (int(d) >= 0 and o["n_tokens"] > 0 and 0 <= o["block_share"] <= 1 and o["min_speedup"] >= 0
                      and o.get("text_kl", 0) >= 0 and o["plans"] and all(len(p) == 5 for p in o["plans"]))
            except (KeyError, TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"SpliceProfile.options[{d!r}] must hold n_tokens, block_share, min_speedup and "
                                 f"plans [[head, pct, tail, kl, rel_time], ...]; got {o!r}")
        if self.target_kl <= 0:
            raise ValueError(f"SpliceProfile.target_kl must be > 0 nats, got {self.target_kl}")

    def plan_for(self, depth: int, n_tokens: int) -> RepairPlan:
        """The repair for a splice at `depth` tokens after the system prompt of a block of `n_tokens`.

        The curve entry is the pick for the calibration tools' mean block length. With `options`, the pick is
        redone for this block's length: a fixed head costs a larger share of a shorter block, so the plan whose
        calibrated speedup cleared the floor may not clear it here.
        """
        if depth > self.max_depth:
            return RepairPlan("text", n_tokens)
        for d, n, pct, tail in (e + [0] * (4 - len(e)) for e in self.curve):
            if depth <= d:
                if str(d) in self.options:
                    n, pct, tail = fit_length(self.options[str(d)], n_tokens)
                if n + tail >= n_tokens:
                    return RepairPlan("text", n_tokens)
                if pct:
                    return RepairPlan("blend", n, frac=pct / 100)
                return RepairPlan("head", n, tail=tail) if n or tail else RepairPlan("none", 0)
        return RepairPlan("text", n_tokens)

    def describe(self, lengths: tuple[int, ...] = (128, 256, 384)) -> list[str]:
        """One line per calibrated depth: the plan a block of each of `lengths` tokens gets there."""
        def label(p: RepairPlan) -> str:
            return p.mode if p.mode in ("text", "none") else plan_key(p.n, round(p.frac * 100), p.tail)

        lines = []
        for d, *_ in self.curve:
            o = self.options.get(str(d))
            floor = f" (floor {o['min_speedup']:.2f}x, {len(o['plans'])} passing plans)" if o else ""
            lines.append(f"depth <= {d}{floor}: "
                         + ", ".join(f"{n} tokens -> {label(self.plan_for(d, n))}" for n in lengths))
        return lines

    def save(self) -> Path:
        """Merge this profile into `profiles/<fp>.json` under ["splice"][backend] (other keys are kept)."""
        return update_model_profile(self.fingerprint, ("splice", self.backend), asdict(self))


def fit_length(option: dict, n_tokens: int) -> tuple[int, int, int]:
    """(head, blend_pct, tail) of the calibrated plans for a block of `n_tokens`, by calibration's own rule: among
    plans predicted to reach the speed floor, the cheapest whose KL is at most the text floor's, else the lowest
    KL; when none reaches the floor, the cheapest plan that passed.

    `option`: {"min_speedup": the floor at this depth (0: the cheapest plan), "text_kl": KL of the text noise
    floor at calibration (0 when absent: only an exact plan is that quiet), "n_tokens": calibration's
    mean block length, "block_share": share of the text prefill's time that grows with block length, "plans":
    [[head, pct, tail, kl, rel_time], ...] cheapest first, rel_time = plan TTFT / text TTFT at calibration}. Text
    time scales by 1 + share * (n / n_cal - 1); a head or tail plan decodes the same tokens at any length, a
    blend's recomputed share grows with the block.
    """
    plans = option["plans"]  # never empty: SpliceProfile rejects that
    grow = option["block_share"] * (n_tokens / option["n_tokens"] - 1)

    def speedup(p):
        return (1 + grow) / max(1e-9, p[4] + grow * p[1] / 100)

    floor = option["min_speedup"]
    fast = [p for p in plans if floor and speedup(p) >= floor]
    quiet = [p for p in fast if p[3] <= option.get("text_kl", 0.0)]
    head, pct, tail = (quiet[0] if quiet else min(fast, key=lambda p: p[3]) if fast else plans[0])[:3]
    return int(head), int(pct), int(tail)


def plan_key(head: int, pct: int = 0, tail: int = 0) -> str:
    """The calibration table's key of a plan: head16, head16+tail4, blend16+10%."""
    return f"blend{head}+{pct}%" if pct else f"head{head}+tail{tail}" if tail else f"head{head}"


def load_profile(backend) -> SpliceProfile:
    """The calibrated profile of this backend+model, or the uncalibrated default (head-16 up to 2048) when none
    was calibrated or it was calibrated for other block contexts (blocks of an older format)."""
    from splice.prompt import CONTEXTS

    path = model_profile_path(backend.info.fingerprint)
    try:
        data = read_model_profile(backend.info.fingerprint).get("splice", {}).get(backend.name)
        if data is None:
            return SpliceProfile(backend=backend.name, fingerprint=backend.info.fingerprint)
        prof = SpliceProfile(**data)
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: unreadable splice profile ({e}); rerun `nexus splice calibrate`") from None
    if prof.fingerprint != backend.info.fingerprint or prof.backend != backend.name:
        raise ValueError(f"{path}: profile is for another model/backend; rerun `nexus splice calibrate`")
    if prof.contexts != list(CONTEXTS):
        return SpliceProfile(backend=backend.name, fingerprint=backend.info.fingerprint)
    return prof
