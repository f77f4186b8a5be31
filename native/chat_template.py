"""Chat templates: how a conversation becomes the model's prompt text.

`render` compiles a model's Jinja template once (sandboxed, with what Hugging Face's renderer gives templates) and
renders a conversation with it. Call ids reach it as nine letters or digits; where the template refuses the
conversation as sent (its own `raise_exception`), it is given the shapes templates ask for (one call per message,
user and assistant turns in alternation, no system role) before the refusal is the request's error
(`TemplateRefusal`). `dir_templates` finds a model folder's templates where Hugging Face's tools put them;
`fallback_template` is the turn format of a model that carries none. The tokenizer (`native.tokenizer`) turns the
rendered text into ids, telling markup from contents by the placeholders defined here.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import json
import os
import re
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.sandbox

from native.base import ModelError, TemplateRefusal

# A model that carries no chat template (a base model such as the packaged Gemma 3 270M) gets the turn format
# its vocabulary's control tokens name, as llama.cpp's server falls back to one; a system message is a turn of
# its own, so every message renders independently (splicing needs it).
FALLBACK_TEMPLATES = {
    "<start_of_turn>": ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] | replace('assistant', "
                        "'model') }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
                        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"),
    "<|im_start|>": ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                     "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
}


def read_template(value: str) -> str:
    """A chat template given on the command line (`--chat-template`, as vLLM's): a file's path, or the Jinja
    text itself; checked to compile, so a broken one is named at start, not at the first request."""
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            source = f.read()
    elif "{{" in value or "{%" in value:
        source = value
    else:
        raise ModelError(f"--chat-template: no such file {value!r} (give a Jinja file's path or the template text)")
    try:
        _compiled(source, ())
    except jinja2.TemplateError as e:
        raise ModelError(f"--chat-template: the template does not compile: {e}") from None
    return source


def fallback_template(vocab) -> str | None:
    """The turn format named by the first marker in `vocab` (token texts), or None."""
    return next((t for marker, t in FALLBACK_TEMPLATES.items() if marker in vocab), None)


CONTENT_PLACEHOLDER = "\ue000m{}\ue001"  # private-use code points: never in a chat template's own markup
TOOL_PLACEHOLDER = "\ue000t{}\ue001"
PIECE_RE = re.compile("\ue000([mt][0-9]+)\ue001")


def render(source: str, messages: list[dict], specials: tuple[str, ...], held: dict | None = None, **variables) -> str:
    """`messages` rendered with the template `source`; `specials`: the model's special-token texts, escaped inside
    `tojson`; `held`: id(tool) -> index, tools rendered as their placeholders; `variables` reach the template
    (add_generation_prompt, bos_token, tools, ...)."""
    try:
        template = _compiled(source, specials)
    except jinja2.TemplateError as e:  # the model's file, not the request: named at its first use
        raise ModelError(f"this model's chat template does not compile: {e}") from None
    messages = _without_reasoning(_template_call_ids(messages))
    token = _HELD.set(held)
    try:
        return _render_once(template, messages, variables)
    except ModelError as refused:  # the template's own refusal (`raise_exception`), or its failure on this
        # conversation: the conversation in the shapes templates ask for, tried only where it refused it as sent
        alternating = _alternating(messages)
        for shaped in (_one_call_per_message(messages), alternating, _alternating(_no_system(alternating))):
            if shaped != messages:
                try:
                    return _render_once(template, shaped, variables)
                except ModelError:
                    pass
        raise TemplateRefusal(f"{refused} (this model's chat template refuses the conversation)") from None
    finally:
        _HELD.reset(token)


# what a template's own code raises where it meets a value it did not expect (an undefined variable used, a
# list where it takes a string, a missing key): the template's failure on this conversation, not the server's
_TEMPLATE_FAILURES = (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError, ArithmeticError)


def _render_once(template: jinja2.Template, messages: list[dict], variables: dict) -> str:
    try:
        return template.render(messages=messages, **variables)
    except ModelError:
        raise
    except _TEMPLATE_FAILURES as e:
        raise ModelError(f"chat template error: {type(e).__name__}: {e}") from None


def rendered_contents(pieces: list[str], texts: list[str], rendered: str) -> list[str] | None:
    """The text a template rendered for each message content and tool, where it did not insert them verbatim.

    `pieces`: a rendering with placeholders split by PIECE_RE (markup at even indexes, placeholder names at odd
    ones), `texts`: each placeholder's text as sent, `rendered`: the rendering with the real texts. Templates trim
    contents (Llama 3.1's `| trim`), cut an earlier reply's reasoning off (`content.split('</think>')[-1]`), or
    write a content as a JSON string (Phi-4's tool results): each content's rendered text is read as the part of
    `rendered` between its markup neighbours that is a part of its text as sent (or of that text's JSON string
    form). Tools are taken verbatim. None when `rendered` has no such reading.
    """
    out: list[str] = []
    cur = 0
    for k in range(0, len(pieces) - 1, 2):
        if not rendered.startswith(pieces[k], cur):
            return None
        cur += len(pieces[k])
        name, text, after = pieces[k + 1], texts[k // 2], pieces[k + 2]
        forms = (text,) if name[0] == "t" else (text, json.dumps(text, ensure_ascii=False)[1:-1])
        if not after:  # no markup to find the end by: only the text as sent
            ends = [cur + len(f) for f in forms if rendered.startswith(f, cur)]
        else:
            ends, e = [], rendered.find(after, cur)
            while e >= 0 and e - cur <= max(map(len, forms)):
                ends.append(e)
                e = rendered.find(after, e + 1)
        ends = [e for e in ends if any(rendered[cur:e] in f for f in forms)]
        if not ends:
            return None
        end = max(ends, key=lambda e: (rendered[cur:e] == text, e))  # as sent if it can be, else the longest part
        out.append(rendered[cur:end])
        cur = end
    return out if rendered[cur:] == pieces[-1] else None


class JsonText(dict):
    """A JSON object that `tojson` renders as the text it was parsed from (`text`): an assistant's tool-call
    arguments in a conversation, shown to the model the way they were written (by itself, mostly), not
    re-serialized, so the tokens a server's context holds for its own call match the next request's."""

    def __init__(self, value: dict, text: str):
        super().__init__(value)
        self.text = text


def tojson(value, indent=None, separators=None, sort_keys=False, ensure_ascii=False, specials=()) -> str:
    """The `tojson` chat templates are written for (Hugging Face's): keys in their given order, no HTML escaping,
    non-ASCII kept (jinja2's own sorts keys and escapes `<`: not the text the models were trained on); a
    `JsonText` as its own text. A special token's text inside a JSON string gets its first character
    \\u-escaped, so that a tool's description can never be read as a control token (`<tool_call>`,
    `<|im_start|>`)."""
    if isinstance(value, JsonText) and indent is None and separators is None and not sort_keys:
        text = value.text
    else:
        text = json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys,
                          ensure_ascii=ensure_ascii, default=_json_default)
    for s in specials:
        if s in text:
            text = text.replace(s, f"\\u{ord(s[0]):04x}{s[1:]}")
    return text


def _json_default(value):
    """What templates hand `tojson` beside JSON values: a filter's lazy result (`tools | map(attribute='function')`)
    as its list, an undefined variable as null."""
    if isinstance(value, jinja2.Undefined):
        return None
    try:
        return list(value)
    except TypeError:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable") from None


_HELD: contextvars.ContextVar[dict | None] = contextvars.ContextVar("tools_held", default=None)


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`, Hugging Face's mark of the assistant's text (for training masks):
    its body, rendered."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


@functools.lru_cache(maxsize=16)
def _compiled(source: str, specials: tuple[str, ...]) -> jinja2.Template:
    """A chat template compiled once (sandboxed), with what templates call beside Jinja's own as Hugging Face's
    renderer provides it: `raise_exception`, `strftime_now`, the `tojson` filter (this module's `tojson`; a tool
    held by the render in `_HELD` as its placeholder), `{% break %}`/`{% continue %}` and `{% generation %}`."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols, _Generation])
    env.globals["raise_exception"] = _raise_template_error
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)

    def held_or_json(value, **kw):
        held = _HELD.get()
        if held and id(value) in held and not kw:
            return TOOL_PLACEHOLDER.format(held[id(value)])
        return tojson(value, specials=specials, **kw)
    env.filters["tojson"] = held_or_json
    return env.from_string(source)


def _template_call_ids(messages: list[dict]) -> list[dict]:
    """`messages` with every tool call id, and the `tool_call_id` of every tool result, as nine letters or digits:
    an id that is not already is replaced by the first nine hex digits of its SHA-256, the same for the call and
    its result. Mistral's templates refuse any other id; no template gives an id a meaning beyond pairing a call
    with its result, and the same conversation renders the same text on every request (its prefix stays cached)."""
    def short(i):
        return i if not isinstance(i, str) or _TEMPLATE_ID.fullmatch(i) else hashlib.sha256(i.encode()).hexdigest()[:9]

    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = dict(m, tool_calls=[dict(c, id=short(c["id"])) if "id" in c else c for c in m["tool_calls"]])
        if "tool_call_id" in m:
            m = dict(m, tool_call_id=short(m["tool_call_id"]))
        out.append(m)
    return out


_TEMPLATE_ID = re.compile(r"[A-Za-z0-9]{9}")


def _without_reasoning(messages: list[dict]) -> list[dict]:
    """`messages` with the reasoning (`<think>...</think>`) an earlier reply may carry cut off its text, as Qwen3's
    and DeepSeek's templates show past replies. Templates that show it again branch on it (Laguna's writes other
    markup before a reply that holds `</think>`), so a content's markup could not be told from its text; Nexus's
    own replies carry none (thinking is closed, `enable_thinking` false)."""
    def cut(m):
        text = m.get("content")
        if m.get("role") != "assistant" or not isinstance(text, str) or "</think>" not in text:
            return m
        return dict(m, content=text.split("</think>")[-1].lstrip())

    return [cut(m) for m in messages]


def _alternating(messages: list[dict]) -> list[dict]:
    """`messages` as templates that take user and assistant turns in alternation take them (Gemma's, Mistral's
    first ones): a system message only first (a later one is a user turn), consecutive turns of one role one turn
    (their texts a blank line apart, their calls in order: two tool results rendered as user turns, a developer and
    a system message), a user turn before a first assistant turn and an assistant turn between a tool result and
    a user turn (empty ones: Mistral's templates count the turns around calls and results)."""
    out: list[dict] = []
    for m in messages:
        if m["role"] == "system" and out and out[-1]["role"] != "system":
            m = dict(m, role="user")
        if m["role"] == "user" and out and out[-1]["role"] == "tool":
            out.append({"role": "assistant", "content": ""})
        if out and out[-1]["role"] == m["role"] and m["role"] in ("system", "user", "assistant"):
            prev = out.pop()
            m = dict(prev, content="\n\n".join(t for t in (prev.get("content"), m.get("content")) if t),
                     **({"tool_calls": [*prev.get("tool_calls", ()), *m.get("tool_calls", ())]}
                        if prev.get("tool_calls") or m.get("tool_calls") else {}))
        out.append(m)
    first = 1 if out and out[0]["role"] == "system" else 0
    if len(out) > first and out[first]["role"] == "assistant":
        out.insert(first, {"role": "user", "content": ""})
    return out


def _no_system(messages: list[dict]) -> list[dict]:
    """`messages` with each system message's text at the head of the next user turn, a blank line apart (a user turn
    of its own where none follows): for templates with no system role (Gemma 2's)."""
    out: list[dict] = []
    held: list[str] = []
    for m in messages:
        if m["role"] == "system":
            held += [m["content"]] if m.get("content") else []
            continue
        if m["role"] == "user" and held:
            m = dict(m, content="\n\n".join([*held, *([m["content"]] if m.get("content") else [])]))
            held = []
        out.append(m)
    return out + ([{"role": "user", "content": "\n\n".join(held)}] if held else [])


def _one_call_per_message(messages: list[dict]) -> list[dict]:
    """`messages` with an assistant message of several tool calls as consecutive messages of one call each (its
    text on the first)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls") or []
        out += [m] if len(calls) < 2 else [dict(m, tool_calls=[c], content=m.get("content") if k == 0 else "")
                                           for k, c in enumerate(calls)]
    return out


def _raise_template_error(message: str):
    raise ModelError(f"chat template error: {message}")


def dir_templates(path: str, cfg: dict) -> tuple[str | None, str | None]:
    """(the default chat template, the one named "tool_use") of a model folder: tokenizer_config.json's
    `chat_template`, else `chat_template.jinja` (where newer Hugging Face tokenizers save it), else
    `chat_template.json`."""
    if cfg.get("chat_template"):
        return named_templates(cfg["chat_template"])
    jinja = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read(), None
    js = os.path.join(path, "chat_template.json")
    if os.path.isfile(js):
        with open(js, encoding="utf-8") as f:
            return named_templates(json.load(f).get("chat_template"))
    return None, None


def named_templates(value) -> tuple[str | None, str | None]:
    """(default, tool_use) of a `chat_template` entry: one template, or Hugging Face's list of named ones."""
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None), named.get("tool_use")
    return value or None, None
