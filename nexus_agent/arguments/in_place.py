"""A call's arguments decoded in place: on the decision's own context, right after the chosen name.

The model has the conversation and the candidates' schemas in context already, so no second prompt is
needed: the JSON object is decoded under the tool's schema (llguidance) with the copy bias toward values
from the request and the turn's tool results (`copying.CopyBias`), then checked with jsonschema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from nexus_agent.arguments.constrained import generate_json
from nexus_agent.arguments.copy_sources import Source
from nexus_agent.arguments.copying import DEFAULT_BIAS
from nexus_agent.arguments.decoder import validate
from nexus_agent.arguments.drafts import SourceDraft, copy_processors


@dataclass
class InPlace:
    """One call's arguments decoded in place: the arguments (None on a miss) and the `problem` in words, the
    JSON `text` decoded, `cut`: still open at the token limit; `fed` / `kept`: tokens drafts fed ahead and, of
    them, the tokens the decode kept (`drafts.SourceDraft`)."""

    arguments: dict | None
    problem: str | None
    text: str
    cut: bool = False
    fed: int = 0
    kept: int = 0


def decode_in_place(live, ids: list[int], logits, tool, sources: list[Source], max_tokens: int = 160,
                    copy_bias: float = DEFAULT_BIAS, on_token: Callable[[str], None] | None = None,
                    extend_to: int | None = None, earlier: Sequence[str] = ()) -> InPlace:
    """The arguments of `tool` decoded on `live` after `ids` (`logits`: the next-token logits there), wrapped up
    in `max_tokens` and going on to `extend_to` while the JSON is open (`constrained.generate_json`). `earlier`:
    the arguments of the turn's calls so far, drafted from as the request is (`drafts.SourceDraft`). The context
    then holds `ids` and the decoded tokens."""
    schema = tool.input_schema or {"type": "object"}
    tok = live.backend.tokenizer
    procs = copy_processors(tok, sources, schema, copy_bias, live.session, earlier=earlier)
    res = generate_json(live.session, ids, schema, tok, max_tokens, on_token=on_token, logits=logits,
                        processors=procs, extend_to=extend_to)
    for t in res.tokens[: res.decoded]:
        live.decoded(t)
    log = [entry for p in procs if isinstance(p, SourceDraft) for entry in p.log]
    fed, kept = sum(n for n, _ in log), sum(k for _, k in log)
    if res.error:
        return InPlace(None, res.error, res.text, False, fed, kept)
    args, problem = validate(res.text, schema)
    if res.cut:
        problem = f"cut at the token limit after {len(res.tokens)} tokens ({problem})"
    return InPlace(args, problem, res.text, res.cut, fed, kept)
