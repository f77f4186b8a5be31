"""Tokenizer and chat template from a model's own files, identical for every backend.

A GGUF carries its vocabulary (`tokenizer.ggml.tokens`, `.token_type`, and `.merges` for byte-level BPE or
`.scores` for SentencePiece), its pre-tokenizer name (`tokenizer.ggml.pre`) and its Jinja chat template; we rebuild
the tokenizer with the `tokenizers` library from these, giving llama.cpp's ids, and render the template with
jinja2, so MLX and llama.cpp sessions see the same ids. An MLX/HF directory brings tokenizer.json and
tokenizer_config.json instead.

Text is encoded with `special=False` by default: "<|im_start|>" inside a tool description or a user message
stays plain text and cannot open a new chat turn. Only the chat template's own markup parses control tokens.
User-defined tokens (GGUF type 4: e.g. Gemma's runs of spaces) are ordinary text pieces and match everywhere.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from native.base import ModelError, TemplateRefusal

# GGUF pre-tokenizer name (the names llama.cpp accepts) -> the splits applied before byte-level BPE (its table,
# restated).
_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_LLAMA3 = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)
# Qwen2: as Llama 3 but every digit is its own word.
_QWEN2 = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)
# Qwen3.5: as Qwen2 but combining marks (\p{M}) stay inside letter runs.
_QWEN35 = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# llama.cpp's "default": punctuation runs, then the GPT-2 split, then digit runs cut into groups of three.
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp splits text into words before byte-level BPE merges them."""

    pattern: str | tuple[str, ...]  # the split regex, or several applied in turn (each splits the last's pieces)
    split_digits: bool = False  # split every digit off first (starcoder-style)
    ignore_merges: bool = False  # a word that is itself a token is kept whole (llama3-style)


_GPT2_PRE, _DIGITS_PRE = PreTokenizer(_GPT2), PreTokenizer(_GPT2, split_digits=True)
_LLAMA3_PRE, _QWEN2_PRE = PreTokenizer(_LLAMA3, ignore_merges=True), PreTokenizer(_QWEN2)
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": PreTokenizer(_DEFAULT), "gpt-2": _GPT2_PRE, "phi-2": _GPT2_PRE, "mpt": _GPT2_PRE,
    "olmo": _GPT2_PRE, "jais": _GPT2_PRE,
    "smollm": _DIGITS_PRE, "starcoder": _DIGITS_PRE, "refact": _DIGITS_PRE, "command-r": _DIGITS_PRE,
    "codeshell": _DIGITS_PRE, "exaone": _DIGITS_PRE, "minerva-7b": _DIGITS_PRE,
    "llama3": _LLAMA3_PRE, "llama-v3": _LLAMA3_PRE, "llama-bpe": _LLAMA3_PRE, "falcon3": _LLAMA3_PRE,
    "dbrx": PreTokenizer(_LLAMA3), "smaug-bpe": PreTokenizer(_LLAMA3),
    "qwen2": _QWEN2_PRE, "deepseek-r1-qwen": _QWEN2_PRE, "stablelm2": _QWEN2_PRE, "megrez": _QWEN2_PRE,
    "qwen35": PreTokenizer(_QWEN35),
}
TOKENIZER_MODELS = {"gpt2": "byte-level BPE", "llama": "SentencePiece BPE"}
CONTROL, USER_DEFINED = 3, 4  # GGUF token types matched whole: in template markup only / in all text


def _byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], pre: str) -> HFTokenizer:
    spec = PRE_TOKENIZERS[pre]
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=spec.ignore_merges))
    steps = []
    if spec.split_digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    for pattern in (spec.pattern,) if isinstance(spec.pattern, str) else spec.pattern:
        steps.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    return tok


SPACE = "\u2581"  # "▁": SentencePiece's visible space


def _score_merges(tokens: list[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """Every split of a token into two tokens, best-scored result first.

    llama.cpp's SentencePiece tokenizer starts from single characters and repeatedly joins the adjacent pair whose
    concatenation is the highest-scored token; a BPE whose merge ranks follow the scores does the same.
    """
    vocab = set(tokens)
    ranked = []
    for i, t in enumerate(tokens):
        for k in range(1, len(t)):
            if t[:k] in vocab and t[k:] in vocab:
                ranked.append((-scores[i], i, k))
    ranked.sort()
    return [(tokens[i][:k], tokens[i][k:]) for _, i, k in ranked]


def _sentencepiece_bpe(tokens: list[str], scores: Sequence[float], space_prefix: bool, unk: str | None) -> HFTokenizer:
    """A SentencePiece-style BPE: spaces become "▁", characters outside the vocabulary become <0xXX> byte tokens."""
    vocab = {t: i for i, t in enumerate(tokens)}
    model = models.BPE(vocab=vocab, merges=_score_merges(tokens, scores), byte_fallback=True, unk_token=unk,
                       fuse_unk=False)
    tok = HFTokenizer(model)
    steps = [normalizers.Prepend(SPACE)] if space_prefix else []
    tok.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", SPACE)])
    dec = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(dec + ([decoders.Strip(" ", 1, 0)] if space_prefix else []))
    return tok


@dataclass
class Tokenizer:
    """A GGUF's (byte-level or SentencePiece BPE) or a tokenizer.json's tokenizer, with a chat template.

    `_plain` never matches control tokens (user text); `_special` matches them (template markup).
    """

    _plain: HFTokenizer
    _special: HFTokenizer
    special_ids: frozenset[int]
    bos_id: int | None
    eos_ids: frozenset[int]  # generation stops on any of these
    chat_template: str | None
    bos_token: str
    eos_token: str
    digest: str  # hash of vocabulary + merges + specials: block files record it
    add_bos: bool = False  # the model asks for bos_id before a prompt (GGUF tokenizer.ggml.add_bos_token)
    tool_template: str | None = None  # a template named "tool_use" beside the default: rendered when tools are given

    @property
    def vocab_size(self) -> int:
        return self._special.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, special: bool = False) -> list[int]:
        """Token ids of `text` (no BOS added). `special=True` parses "<|im_start|>"-style markup as special tokens."""
        return (self._special if special else self._plain).encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self._special.decode(list(ids), skip_special_tokens=skip_special)

    def token_text(self, token_id: int) -> str:
        return self._special.id_to_token(int(token_id)) or ""

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        """Render chat `messages` ([{"role", "content"}]) with the model's Jinja template (sandboxed). `extra`
        reaches the template as variables (`tools=[{"type": "function", "function": {...}}]`)."""
        if not self.chat_template:
            raise ModelError("this model has no chat template; pass raw text to generate instead")
        messages = _template_call_ids(messages)
        held = extra.pop("_tools_held", None)  # id(tool) -> index: render those tools as placeholders
        # a reasoning model answers (or calls) at once: its decision is read from the reply's first token, and a
        # template that can open the reply with thinking (Qwen3's) closes it empty when asked so
        extra.setdefault("enable_thinking", False)
        source = self.tool_template if extra.get("tools") and self.tool_template else self.chat_template
        try:
            template = _compiled(source, self._specials())
        except jinja2.TemplateError as e:  # the model's file, not the request: named when the model loads
            raise ModelError(f"this model's chat template does not compile: {e}") from None
        token = _HELD.set(held)

        def render(msgs):
            return template.render(messages=msgs, add_generation_prompt=add_generation_prompt,
                                   bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        try:
            return render(messages)
        except ModelError as refused:  # the template's own refusal (`raise_exception`): the conversation as it
            # takes one, where that is one of the shapes templates ask for (only if it refused the conversation as is)
            alternating = _alternating(messages)
            for shaped in (_one_call_per_message(messages), alternating, _alternating(_no_system(alternating))):
                if shaped != messages:
                    try:
                        return render(shaped)
                    except ModelError:
                        pass
            raise TemplateRefusal(f"{refused} (this model's chat template refuses the conversation)") from None
        finally:
            _HELD.reset(token)

    def _specials(self) -> tuple[str, ...]:
        return tuple(t for t in (self.token_text(i) for i in self.special_ids) if len(t) > 1)

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> list[int]:
        """Token ids of a chat: template markup parses special tokens, message contents never do.

        The template is rendered once with each content replaced by a placeholder, so the markup and the
        contents are told apart by construction (searching the rendered text for a content could match inside
        the markup, e.g. a request "r" inside "<|im_start|>", and split a role marker). `tools` (OpenAI function
        tools) go to templates that have a tools section (`encode_chat_tools`).
        """
        return self.encode_chat_tools(messages, add_generation_prompt, tools)[0]

    def encode_chat_tools(self, messages: list[dict], add_generation_prompt: bool = True,
                          tools: list[dict] | None = None, epilogue: bool = False
                          ) -> tuple[list[int], list[tuple[int, int]]]:
        """(token ids, the [start, end) token span of each tool the template rendered with `tojson`, in order;
        with `epilogue`, then the span of the template's markup after the last tool, up to the next message
        content, when there is such markup: Qwen2.5's closing `</tools>`, its call-format instructions and the
        user turn's opener, the same tokens under every tool list).

        Each tool's JSON is tokenized on its own, like a message content (its special-token text is escaped by
        `_tojson`, so a tool description cannot open a turn): the same tool gives the same tokens wherever it
        stands, which is what lets a cached block of it be spliced (`nexus_agent.turn.decide`).
        """
        extra = {"tools": tools} if tools else {}
        marked = [dict(m, content=_PLACEHOLDER.format(i)) if m.get("content") else m for i, m in enumerate(messages)]
        held = {id(t): i for i, t in enumerate(tools or [])}
        pieces = _PIECE_RE.split(self.apply_chat_template(marked, add_generation_prompt, _tools_held=held, **extra))
        texts = [messages[int(p[1:])]["content"] if p[0] == "m" else self._tool_json(tools[int(p[1:])])
                 for p in pieces[1::2]]
        rendered = self.apply_chat_template(messages, add_generation_prompt, **extra)
        if "".join(p if k % 2 == 0 else texts[k // 2] for k, p in enumerate(pieces)) != rendered:
            raise ModelError("this chat template changes message contents (e.g. trims them), so markup and text "
                             "cannot be told apart safely; use a template that inserts contents verbatim")
        ids: list[int] = []
        spans: list[tuple[int, int]] = []
        last = max((k for k in range(1, len(pieces), 2) if pieces[k][0] == "t"), default=None)
        after = None
        for k, piece in enumerate(pieces):
            start = len(ids)
            if k % 2 == 0:
                ids += self.encode(piece, special=True)
                if last is not None and k == last + 1 and len(ids) > start:
                    after = (start, len(ids))
                continue
            ids += self.encode(texts[k // 2], special=False)
            if piece[0] == "t":
                spans.append((start, len(ids)))
        return ids, (spans + [after] if epilogue and after else spans)

    def _tool_json(self, tool) -> str:
        return _tojson(tool, specials=self._specials())

# Control tokens that end a turn in the chat templates of the supported families; generation stops on them as
# on the GGUF's eos (llama.cpp's end-of-generation set does the same).
END_OF_TURN = frozenset({"<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|endoftext|>",
                         "<|end_of_text|>"})
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


def fallback_template(vocab) -> str | None:
    """The turn format named by the first marker in `vocab` (token texts), or None."""
    return next((t for marker, t in FALLBACK_TEMPLATES.items() if marker in vocab), None)


_PLACEHOLDER = "\ue000m{}\ue001"  # private-use code points: never in a chat template's own markup
_TOOL_PLACEHOLDER = "\ue000t{}\ue001"
_PIECE_RE = re.compile("\ue000([mt][0-9]+)\ue001")


class JsonText(dict):
    """A JSON object that `tojson` renders as the text it was parsed from (`text`): an assistant's tool-call
    arguments in a conversation, shown to the model the way they were written (by itself, mostly), not
    re-serialized, so the tokens a server's context holds for its own call match the next request's."""

    def __init__(self, value: dict, text: str):
        super().__init__(value)
        self.text = text


def _tojson(value, indent=None, separators=None, sort_keys=False, ensure_ascii=False, specials=()) -> str:
    """The `tojson` chat templates are written for (Hugging Face's): keys in their given order, no HTML escaping,
    non-ASCII kept (jinja2's own sorts keys and escapes `<`: not the text the models were trained on); a
    `JsonText` as its own text. A special token's text inside a JSON string gets its first character
    \\u-escaped, so that a tool's description can never be read as a control token (`<tool_call>`,
    `<|im_start|>`)."""
    if isinstance(value, JsonText) and indent is None and separators is None and not sort_keys:
        text = value.text
    else:
        text = json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys,
                          ensure_ascii=ensure_ascii)
    for s in specials:
        if s in text:
            text = text.replace(s, f"\\u{ord(s[0]):04x}{s[1:]}")
    return text


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
    renderer provides it: `raise_exception`, `strftime_now`, `tojson` (special-token text escaped, `_tojson`; a tool
    held by the render in `_HELD` as its placeholder), `{% break %}`/`{% continue %}` and `{% generation %}`."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols, _Generation])
    env.globals["raise_exception"] = _raise_template_error
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)

    def tojson(value, **kw):
        held = _HELD.get()
        if held and id(value) in held and not kw:
            return _TOOL_PLACEHOLDER.format(held[id(value)])
        return _tojson(value, specials=specials, **kw)
    env.filters["tojson"] = tojson
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


def _alternating(messages: list[dict]) -> list[dict]:
    """`messages` as templates that take user and assistant turns in alternation take them (Gemma's, Mistral's
    first ones): a system message only first (a later one is a user turn), consecutive turns of one role one turn
    (their texts a blank line apart, their calls in order: two tool results rendered as user turns, a developer and
    a system message), and a user turn before a first assistant turn (an empty one)."""
    out: list[dict] = []
    for m in messages:
        if m["role"] == "system" and out and out[-1]["role"] != "system":
            m = dict(m, role="user")
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


def _digest(*parts) -> str:
    h = hashlib.blake2b(digest_size=12)
    for p in parts:
        h.update(json.dumps(p, ensure_ascii=False).encode())
    return h.hexdigest()


def tokenizer_from_gguf(meta: dict, path: str = "<gguf>") -> Tokenizer:
    """Build the tokenizer from GGUF metadata (see `native.gguf_header`).

    `tokenizer.ggml.model` "gpt2": byte-level BPE from tokens + merges, words split by `tokenizer.ggml.pre`.
    "llama": SentencePiece BPE from tokens + scores, "▁" for spaces, <0xXX> byte fallback, a leading "▁" when
    `tokenizer.ggml.add_space_prefix` says so. Control tokens are matched only in template markup; user-defined
    tokens (e.g. Gemma's runs of spaces and newlines) are matched in all text, as llama.cpp does.
    """
    kind = meta.get("tokenizer.ggml.model")
    if kind not in TOKENIZER_MODELS:
        supported = ", ".join(f"{v} {k!r}" for k, v in TOKENIZER_MODELS.items())
        raise ModelError(f"{path}: unsupported tokenizer model tokenizer.ggml.model={kind!r} (supported: {supported})")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if kind == "gpt2" and pre not in PRE_TOKENIZERS:
        raise ModelError(f"{path}: unsupported pre-tokenizer tokenizer.ggml.pre={pre!r} "
                         f"(supported: {', '.join(PRE_TOKENIZERS)})")
    if kind == "llama" and pre != "default":
        raise ModelError(f"{path}: unsupported pre-tokenizer tokenizer.ggml.pre={pre!r} for a SentencePiece "
                         "tokenizer (supported: 'default')")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types = [int(t) for t in meta.get("tokenizer.ggml.token_type", [1] * len(tokens))]
    vocab = {t: i for i, t in enumerate(tokens)}
    controls = [t for t, ty in zip(tokens, types) if ty == CONTROL]
    user_defined = [t for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    if kind == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
        plain = _byte_level_bpe(vocab, merges, pre)
        special = _byte_level_bpe(vocab, merges, pre)
        matched = [t for t, ty in zip(tokens, types) if ty in (CONTROL, USER_DEFINED)]
        digest = _digest(tokens, meta.get("tokenizer.ggml.merges", []), matched, pre)
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    else:
        scores = [float(x) for x in meta.get("tokenizer.ggml.scores", [0.0] * len(tokens))]
        space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        unk = meta.get("tokenizer.ggml.unknown_token_id")
        plain = _sentencepiece_bpe(tokens, scores, space_prefix, None if unk is None else tokens[int(unk)])
        special = HFTokenizer(plain.model)  # shares the model: the merge table is built once
        special.normalizer, special.decoder = plain.normalizer, plain.decoder
        digest = _digest(tokens, scores, types, kind, space_prefix)
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True))
    for tok in (plain, special):
        if user_defined:
            tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user_defined])
    special.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in controls])
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos = {int(meta["tokenizer.ggml.eos_token_id"])} if "tokenizer.ggml.eos_token_id" in meta else set()
    eos_token = tokens[min(eos)] if eos else ""
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        if key in meta:
            eos.add(int(meta[key]))
    eos |= {vocab[t] for t in controls if t in END_OF_TURN}
    return Tokenizer(
        _plain=plain, _special=special,
        special_ids=frozenset(vocab[t] for t in controls),
        bos_id=None if bos is None else int(bos),
        eos_ids=frozenset(eos), chat_template=meta.get("tokenizer.chat_template") or fallback_template(vocab),
        tool_template=meta.get("tokenizer.chat_template.tool_use"),
        bos_token=tokens[int(bos)] if bos is not None else "", eos_token=eos_token,
        digest=digest, add_bos=add_bos and bos is not None,
    )


def tokenizer_from_dir(path: str) -> Tokenizer:
    """Build the tokenizer of an MLX/HF model directory (tokenizer.json + tokenizer_config.json)."""
    tj = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(tj):
        raise ModelError(f"{path}: no tokenizer.json in the model directory")
    special = HFTokenizer.from_file(tj)
    plain = HFTokenizer.from_file(tj)
    cfg = {}
    if os.path.isfile(os.path.join(path, "tokenizer_config.json")):
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            cfg = json.load(f)
    added = special.get_added_tokens_decoder()
    specials = {i: t.content for i, t in added.items() if t.special}
    # A second copy that treats specials as ordinary text: rebuild from the model/pre-tokenizer only.
    data = json.loads(plain.to_str())
    data["added_tokens"] = []
    plain = HFTokenizer.from_str(json.dumps(data))

    def tok_text(v):
        return v.get("content", "") if isinstance(v, dict) else (v or "")

    bos_t, eos_t = tok_text(cfg.get("bos_token")), tok_text(cfg.get("eos_token"))
    template, tool_template = _dir_templates(path, cfg)
    vocab = special.get_vocab(with_added_tokens=True)
    eos_ids = {vocab[eos_t]} if eos_t in vocab else set()
    eos_ids |= {i for i, t in specials.items() if t in END_OF_TURN}
    return Tokenizer(
        _plain=plain, _special=special, special_ids=frozenset(specials),
        bos_id=vocab.get(bos_t), eos_ids=frozenset(eos_ids),
        chat_template=template or fallback_template(vocab), tool_template=tool_template,
        bos_token=bos_t, eos_token=eos_t, digest=_digest(special.to_str()),
        add_bos=bool(cfg.get("add_bos_token", False)) and vocab.get(bos_t) is not None,
    )


def _dir_templates(path: str, cfg: dict) -> tuple[str | None, str | None]:
    """(the default chat template, the one named "tool_use") of a model folder: tokenizer_config.json's
    `chat_template`, else `chat_template.jinja` (where newer Hugging Face tokenizers save it), else
    `chat_template.json`."""
    if cfg.get("chat_template"):
        return _named_templates(cfg["chat_template"])
    jinja = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read(), None
    js = os.path.join(path, "chat_template.json")
    if os.path.isfile(js):
        with open(js, encoding="utf-8") as f:
            return _named_templates(json.load(f).get("chat_template"))
    return None, None


def _named_templates(value) -> tuple[str | None, str | None]:
    """(default, tool_use) of a `chat_template` entry: one template, or Hugging Face's list of named ones."""
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None), named.get("tool_use")
    return value or None, None


def load_tokenizer(model: str | None = None) -> Tokenizer:
    """The tokenizer of `model` (a GGUF file or model directory; None: the packaged SmolLM2)."""
    from native.gguf_header import read_gguf_header
    from native.model_files import resolve_model

    src = resolve_model(model)
    if src.format == "mlx-dir":
        return tokenizer_from_dir(src.path)
    return tokenizer_from_gguf(read_gguf_header(src.path).metadata, src.path)
