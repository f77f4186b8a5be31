"""The per-model decision setting: who decides whether to call and which tool, and with what weights.

Stored beside the splice profile, in `profiles/<model fingerprint>.json` under "decide" (written by
`nexus eval decide --calibrate`); packaged models ship their measured setting in `decide_defaults.json`.
An uncalibrated model whose template has a tools section lets the model decide with neutral weights; one
without keeps the router's decision (too weak to choose until measured otherwise).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nexus_agent.turn.request_parts import request_values
from registry.home import model_profile_path, read_model_profile, update_model_profile

MODES = ("model", "router")
_DEFAULTS = Path(__file__).with_name("decide_defaults.json")
READING_KEYS = ("bias", "w_model", "w_top1", "w_margin", "w_values", "w_hidden", "splice_err")
NO_VALUE_FLOOR = 0.30  # router mode's floor for a request that names no value (README, "Deciding": stop 60)


@dataclass
class DecideProfile:
    """mode: "model" (the model decides among the candidates) or "router" (the router's pick stands); k: candidates
    shown; k_sure: candidates shown when the router's gate is sure (its path "auto": margin over tau), 0 for k (1:
    the router's pick is the only candidate, the model decides call or text and fills the arguments); fit_all: show
    every tool when there are at most this many (they fit the prompt); call = bias + w_model * logit(p_call) +
    w_top1 * top-1 score + w_margin * margin + w_values * values > 0 decides call vs text (p_call: the model's
    probability of starting a call; values: whether the request names a value a call takes,
    `request_parts.request_values`: chatter rarely names one); p_veto: where the model's own p(call), on every
    reading of the conversation, is below it, the answer is text whatever the router's evidence (the model is sure;
    0: never); a candidate's name scores the model's log-probability of it + name_weight x the router's score +
    rank_bias[its rank in the list shown] (`nexus eval decide` fits one offset for every rank after the first:
    positive counters a model that favours the first tool listed, negative keeps the router's order unless the model
    prefers another tool by that many nats); splice: the candidates' schemas are spliced from KV blocks
    (`turn.blocks`) where the backend can; splice_err / splice_name_err: how far a spliced prompt's reading may lie
    from the same prompt's prefilled as text, in logit p(call) and in a gap between two names' log-probabilities
    (measured by `nexus eval decide --splice`): a spliced decision within that reach of the other outcome is made
    again on the prompt as text (0: never); no_value_floor: in router mode, the router's top-1 score a request that
    names no value (`request_parts.request_values`) needs for a call, beside the gate's own floor (0: the gate
    alone); reading: a second call-or-text rule for where the model's final hidden state at the prompt's end can be
    read (a session's `last_hidden`: llama.cpp, MLX): {"bias", "w_model", "w_top1", "w_margin", "w_values": as
    above, "w_hidden": weights on that state scaled to unit length (the rule adds their dot product),
    "splice_err": its reach in score on a spliced prompt, None if not measured}, {} for none (the rule above
    decides); source: where the numbers come from (default | calibrated: how, when); metrics: what the calibration
    measured."""

    mode: str = "model"
    k: int = 5
    k_sure: int = 0
    fit_all: int = 10
    bias: float = 0.0
    w_model: float = 1.0
    w_top1: float = 0.0
    w_margin: float = 0.0
    w_values: float = 0.0
    p_veto: float = 0.0
    name_weight: float = 0.0
    rank_bias: list = field(default_factory=list)
    splice: bool = True
    splice_err: float = 0.0
    splice_name_err: float = 0.0
    no_value_floor: float = 0.0
    reading: dict = field(default_factory=dict)
    source: str = "default"
    metrics: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown decide mode {self.mode!r}; choose {' or '.join(MODES)}")
        if not 0.0 <= self.p_veto < 1.0:
            raise ValueError(f"p_veto is a probability below 1, got {self.p_veto}")
        if self.splice_err < 0 or self.splice_name_err < 0:
            raise ValueError(f"splice_err and splice_name_err are distances >= 0, got {self.splice_err}, "
                             f"{self.splice_name_err}")
        if self.k < 1 or self.k_sure < 0 or self.fit_all < 0:
            raise ValueError(f"k must be >= 1, k_sure and fit_all >= 0, got k={self.k}, k_sure={self.k_sure}, "
                             f"fit_all={self.fit_all}")
        missing = set(READING_KEYS) - set(self.reading)
        if self.reading and missing:
            raise ValueError(f"the hidden-state reading lacks {', '.join(sorted(missing))}")

    def shown(self, path: str) -> int:
        """How many candidates the model sees for a router decision on `path`."""
        return self.k_sure if path == "auto" and self.k_sure else self.k

    def hidden_term(self, hidden) -> float | None:
        """The hidden-state rule's term for `hidden` (the final hidden state at the prompt's end), None where the
        profile has no such rule, no state was read, or the state is another model's size."""
        if not self.reading or hidden is None:
            return None
        import numpy as np

        h = np.asarray(hidden, dtype=np.float64)
        w = np.asarray(self.reading["w_hidden"], dtype=np.float64)
        n = float(np.linalg.norm(h))
        return float(h @ w / n) if h.shape == w.shape and n > 0 else None

    def call_score(self, p_call: float, top1: float, margin: float, values: int = 0,
                   hidden: float | None = None) -> float:
        """> 0: call a tool; the logistic model's log-odds. `hidden`: `hidden_term` of the prompt's state, which
        selects the hidden-state rule (`reading`)."""
        p = min(max(p_call, 1e-9), 1 - 1e-9)
        r = self.reading if hidden is not None and self.reading else None
        w = r or {"bias": self.bias, "w_model": self.w_model, "w_top1": self.w_top1, "w_margin": self.w_margin,
                  "w_values": self.w_values}
        return (w["bias"] + w["w_model"] * math.log(p / (1 - p)) + w["w_top1"] * top1 + w["w_margin"] * margin
                + w["w_values"] * values + (hidden if r else 0.0))

    def calls(self, p_call: float, top1: float, margin: float, values: int = 0, unread: bool = False,
              hidden: float | None = None) -> bool:
        """Call or text, as the decider decides on the largest reading's p(call): the score, then the veto (which an
        unread reading beside lifts)."""
        return self.call_score(p_call, top1, margin, values, hidden) > 0 and (p_call >= self.p_veto or unread)

    def splice_may_flip(self, p_call: float, top1: float, margin: float, values: int = 0,
                        unread: bool = False, hidden: float | None = None) -> bool:
        """Whether a reading on a spliced prompt is within the splice's reach of deciding the other way: p(call)
        within `splice_err` (in logit), or with the hidden-state rule, its score within that rule's `splice_err`."""
        if hidden is not None and self.reading:
            err = self.reading["splice_err"]  # None: not measured, every spliced decision is made again as text
            score = self.call_score(p_call, top1, margin, values, hidden)
            return (err is None or abs(score) <= err) and (p_call >= self.p_veto or unread)
        if not self.splice_err:
            return False
        p = min(max(p_call, 1e-9), 1 - 1e-9)
        lo, hi = (1 / (1 + math.exp(-(math.log(p / (1 - p)) + e))) for e in (-self.splice_err, self.splice_err))
        return self.calls(lo, top1, margin, values, unread) != self.calls(hi, top1, margin, values, unread)

    def router_calls(self, score: float, request: str) -> bool:
        """Router mode: whether the router's pick for `request` (its top-1 score `score`, above the gate's floor) is
        called: a request that names no value needs `no_value_floor` ("Hi there! How are you today?" reached 0.20
        against a weather tool; chatter rarely names a value, a call takes one). Always so outside router mode or
        without a floor."""
        if self.mode != "router" or not self.no_value_floor:
            return True
        return score >= self.no_value_floor or request_values(request) > 0

    def name_score(self, logprob: float, score: float, rank: int) -> float:
        """How a candidate's name ranks: the model's log-probability, the router's score, the order offset."""
        return logprob + self.name_weight * score + (self.rank_bias[rank] if rank < len(self.rank_bias) else 0.0)


def load_decide_profile(fingerprint: str, template_tools: bool) -> DecideProfile:
    """The calibrated setting of this model, else the packaged default for its fingerprint, else the default
    by template (a tools section: the model decides; none: the router)."""
    path = model_profile_path(fingerprint)
    try:
        data = read_model_profile(fingerprint).get("decide")
    except ValueError as e:
        raise ValueError(f"{path}: unreadable profile ({e}); rerun `nexus eval decide --calibrate`") from None
    if data is None:
        data = json.loads(_DEFAULTS.read_text()).get(fingerprint)
    if data is not None:
        try:
            return DecideProfile(**data)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: bad decide profile ({e}); rerun `nexus eval decide --calibrate`") from None
    if template_tools:
        return DecideProfile(mode="model")
    return DecideProfile(mode="router", no_value_floor=NO_VALUE_FLOOR)


def save_decide_profile(fingerprint: str, profile: DecideProfile) -> Path:
    """Write `profile` under "decide" in the model's profile file (other sections kept)."""
    return update_model_profile(fingerprint, ("decide",), asdict(profile))
