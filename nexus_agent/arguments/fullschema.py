"""The full-schema path: the tool's schema segment enters the live context (spliced block or text prefill).

Used when the compressed signature is not enough: the arguments failed validation, or the schema is too
complex for a signature by the rule in `needs_full_schema`. The segment layout is the splice compiler's own
(`splice.prompt`: preamble, schema segment as a system message, user turn), so a spliced block and a text
prefill see identical token ids. A precompiled block is used when `splice` offers a loader for this model and
tool (`insert_schema`); otherwise, or when no valid block exists, the segment is prefilled as text.
"""

from __future__ import annotations

from registry.signature import compress

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


def schema_prefix(tokenizer, tool) -> tuple[list[int], list[int]]:
    """(preamble ids, schema segment ids) in the splice layout (a local layout when splice is absent)."""
    try:
        from splice.prompt import preamble_tokens, segment_tokens
    except ImportError:
        from nexus_agent.prompts import render_schema

        pre = tokenizer.encode_chat([{"role": "system", "content": "You call tools with JSON arguments."}], False)
        return pre, tokenizer.encode_chat([{"role": "system", "content": render_schema(tool)}], False)
    return preamble_tokens(tokenizer), segment_tokens(tokenizer, tool)


def user_tokens(tokenizer, request: str, problem: str | None = None, results: list[str] | None = None) -> list[int]:
    """The user turn after the schema segment: the step, the turn's earlier results, and the rejected
    attempt's problem, when any."""
    from nexus_agent.prompts import _with_results

    text = _with_results(request, results)
    text = text if not problem else f"{text}\n(Previous arguments were rejected: {problem})"
    try:
        from splice.prompt import user_turn_tokens
    except ImportError:
        full = tokenizer.encode_chat([{"role": "system", "content": "x"}, {"role": "user", "content": text}])
        return full[len(tokenizer.encode_chat([{"role": "system", "content": "x"}], False)):]
    return user_turn_tokens(tokenizer, text)


def insert_schema(live, tool) -> tuple[list[int], dict]:
    """Put preamble + the tool's schema segment into the live context: the precompiled block spliced at the
    current depth when `splice` is installed and a valid block exists (splice itself falls back to a text
    prefill of the segment otherwise), else a text prefill. Returns (ids now cached, what was done)."""
    tok = live.backend.tokenizer
    pre, seg = schema_prefix(tok, tool)
    live.prefill(pre)  # reuses the cached preamble when it is already there
    try:
        from splice.splicer import splice_tool
    except ImportError:
        live.prefill(pre + seg)
        return pre + seg, {"how": "text_prefill", "fallback": "splice is not installed"}
    r = splice_tool(live.session, live.backend, tool, depth=0)
    live.ids = pre + seg
    info = {"how": "splice" if r.fallback is None else "text_prefill", "plan": r.plan.mode, "tokens": r.n_tokens,
            "redecoded": r.redecoded, "load_ms": round(r.load_ms, 2), "splice_ms": round(r.splice_ms, 2),
            "fallback": r.fallback}
    return pre + seg, info
