"""Seeded synthetic agent traces for the eviction eval: facts hidden in Action/Observation/Thought chatter.

A trace is text plus facts; each fact has a question prompt and its answer (the value), so recall can be
checked by teacher-forced exact match. Everything is derived from the seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_TOOLS = ["search_files", "read_file", "list_dir", "run_tests", "http_get", "grep_logs", "query_db", "git_log"]
_NOUNS = ["server", "project", "ticket", "invoice", "bucket", "cluster", "account", "device"]
_NAMES = ["Orion", "Maple", "Cobalt", "Delta", "Falcon", "Juniper", "Quartz", "Ember", "Nimbus", "Saffron",
          "Tundra", "Willow", "Zephyr", "Basalt", "Cedar", "Harbor"]
_THOUGHTS = ["I should check the next item before answering.", "That result looks incomplete, let me look again.",
             "The previous step did not return what I expected.", "Let me verify this with another tool call.",
             "I will keep going until the task is done.", "Nothing unusual here, moving on."]
# Fact values: single-token words (" tiger" is one SmolLM2 token). A 4-digit code tokenizes as " " + 4 digits and
# the 135M model misses its first digit even with the full cache (it answered 3 of 6 on seed 200), which left
# too few items the full cache answers for a meaningful recall measurement.
_VALUES = ["apple", "river", "tiger", "copper", "violet", "marble", "garden", "rocket", "silver", "pepper", "candle",
           "forest", "winter", "summer", "island", "pillow", "dragon", "banana", "mirror", "lemon", "orange",
           "purple", "yellow", "bridge", "castle", "engine", "jacket", "kitten", "ladder", "magnet", "pencil",
           "rabbit", "saddle", "tomato", "velvet", "wagon", "zebra", "anchor", "basket", "cactus"]
_OBS = ["returned 3 matching lines with no errors.", "finished in 0.4 seconds with status ok.",
        "listed 12 entries, none of them relevant.", "printed a long table of timestamps.",
        "reported that the cache was warm.", "gave an empty response."]


@dataclass
class Fact:
    key: str  # e.g. "server Orion"
    value: str  # e.g. "tiger"

    @property
    def statement(self) -> str:
        return f"Observation: the access code for {self.key} is {self.value}."

    @property
    def question(self) -> str:
        # A cloze in the trace's own statement form. After "Question: ...? Answer: ... is" the 135M model expects a
        # number and says " " (0 of 10 on seed 202 with the full cache); in this form it answers 8 of 10.
        return f"\nObservation: the access code for {self.key} is"

    @property
    def answer(self) -> str:
        return f" {self.value}"


@dataclass
class Trace:
    text: str
    facts: list[Fact]
    fact_chars: list[tuple[int, int]]  # character span of each fact's value in text


def make_trace(seed: int, n_steps: int = 40, n_facts: int = 6) -> Trace:
    """A trace of `n_steps` Thought/Action/Observation steps with `n_facts` facts at seeded steps."""
    rng = np.random.default_rng(seed)
    names = rng.permutation(_NAMES)[:n_facts]
    values = rng.permutation(_VALUES)[:n_facts]
    facts = [Fact(f"{rng.choice(_NOUNS)} {n}", str(v)) for n, v in zip(names, values)]
    where = sorted(rng.choice(np.arange(1, n_steps - 2), size=n_facts, replace=False).tolist())
    parts, spans, pos, fi = [], [], 0, 0
    for step in range(n_steps):
        tool = rng.choice(_TOOLS)
        chunk = f"Thought: {rng.choice(_THOUGHTS)}\nAction: {tool}(arg={int(rng.integers(0, 999))})\n"
        if fi < n_facts and step == where[fi]:
            f = facts[fi]
            start = pos + len(chunk) + f.statement.index(f.value)
            spans.append((start, start + len(f.value)))
            chunk += f.statement + "\n"
            fi += 1
        else:
            chunk += f"Observation: {tool} {rng.choice(_OBS)}\n"
        parts.append(chunk)
        pos += len(chunk)
    return Trace("".join(parts), facts, spans)


def needle_positions(tokenizer, trace: Trace) -> tuple[list[int], list[int]]:
    """Token ids of the trace and the token indices overlapping the facts' values (the needles)."""
    ids, needles = tokenizer.encode(trace.text), []
    # Recover character offsets by decoding prefixes of increasing length (byte-level BPE round-trips).
    ends, acc = [], ""
    for t in ids:
        acc += tokenizer.decode([t])
        ends.append(len(acc))
    starts = [0] + ends[:-1]
    for a, b in trace.fact_chars:
        needles += [i for i, (s, e) in enumerate(zip(starts, ends)) if s < b and e > a]
    return ids, needles
