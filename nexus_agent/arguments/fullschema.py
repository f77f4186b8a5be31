"""The full-schema path: the tool's schema segment enters the live context (spliced block or text prefill).

Used when the compressed signature is not enough: the arguments failed validation, or the schema is too
complex for a signature by the rule in `needs_full_schema`. The segment layout is the splice compiler's own
(`splice.prompt`: preamble, schema segment as a system message, user turn), so a spliced block and a text
prefill see identical token ids. A precompiled block is spliced when a valid one exists for this model and tool
(`insert_schema`); otherwise the segment is prefilled as text.
"""

from __future__ import annotations

from registry.signature import compress
from splice.prompt import DEFAULT_SYSTEM, LayoutError, preamble_tokens, schema_segment, segment_tokens, user_turn_tokens

MAX_SIGNATURE_PARAMS = 8


def needs_full_schema(tool) -> str | None:
    """Why a signature is not enough for `tool`, or None. Rule: the signature is lossy (a nested object cut to
    `{…}`, an enum cut to `|…`) or the tool has more than MAX_SIGNATURE_PARAMS top-level parameters."""
    sig = compress(tool)
    head = sig.split(" — ", 1)[0]
    if "{…}" in head:
        return "nested object deeper than the signature shows"
    if "|…" in head:
        return "enum longer than the signature shows"
    n = len((tool.input_schema or {}).get("properties") or {})
    if n > MAX_SIGNATURE_PARAMS:
        return f"{n} parameters (more than {MAX_SIGNATURE_PARAMS})"
    return None


def _user_text(request: str, problem: str | None, results: list[str] | None) -> str:
    """The user turn after the schema segment: the step, the turn's earlier results, and the rejected attempt's
    problem, when any."""
    from nexus_agent.prompts import _with_results

    text = _with_results(request, results)
    return text if not problem else f"{text}\n(Previous arguments were rejected: {problem})"


def full_schema_prompt(live, tool, request: str, problem: str | None = None,
                       results: list[str] | None = None) -> tuple[list[int], dict]:
    """(prompt ids, what was done): preamble and schema segment in the live context (`insert_schema`), then the
    user turn. A template that renders a message by what stands around it has no segment tokens to splice or
    reuse (`splice.prompt.LayoutError`): there the three messages are rendered as one conversation, as text."""
    tok = live.backend.tokenizer
    text = _user_text(request, problem, results)
    try:
        user = user_turn_tokens(tok, text)
        pre, seg = preamble_tokens(tok), segment_tokens(tok, tool)
    except LayoutError as e:
        ids = tok.encode_chat([{"role": "system", "content": DEFAULT_SYSTEM},
                               {"role": "system", "content": schema_segment(tool)}, {"role": "user", "content": text}])
        return ids, {"how": "text_prefill", "fallback": str(e)}
    return pre + seg + user, insert_schema(live, tool, pre, seg)


def insert_schema(live, tool, pre: list[int], seg: list[int]) -> dict:
    """Put the preamble `pre` and the tool's schema segment `seg` into the live context: the precompiled block
    spliced at the current depth when a valid block exists (splice itself falls back to a text prefill of the
    segment otherwise). Returns what was done."""
    from splice.splicer import splice_tool

    live.prefill(pre)  # reuses the cached preamble when it is already there
    r = splice_tool(live.session, live.backend, tool, depth=0)
    live.ids = pre + seg
    info = {"how": "splice" if r.fallback is None else "text_prefill", "plan": r.plan.mode, "tokens": r.n_tokens,
            "redecoded": r.redecoded, "load_ms": round(r.load_ms, 2), "splice_ms": round(r.splice_ms, 2),
            "fallback": r.fallback}
    return info
