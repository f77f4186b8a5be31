"""Tokenizer and chat template from a model's own files, identical for every backend.

A GGUF carries its vocabulary (`tokenizer.ggml.tokens`, `.token_type`, and `.merges` for byte-level BPE or
`.scores` for SentencePiece), its pre-tokenizer name (`tokenizer.ggml.pre`) and its Jinja chat template; we rebuild
the tokenizer with the `tokenizers` library from these, giving llama.cpp's ids, and render the template with
jinja2 (`native.chat_template`), so MLX and llama.cpp sessions see the same ids. An MLX/HF directory brings
tokenizer.json and tokenizer_config.json instead.

Text is encoded with `special=False` by default: "<|im_start|>" inside a tool description or a user message
stays plain text and cannot open a new chat turn. Only the chat template's own markup parses control tokens.
User-defined tokens (GGUF type 4: e.g. Gemma's runs of spaces) are ordinary text pieces and match everywhere.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from typing import Sequence

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from native.base import ModelError
from native.chat_template import (
    CONTENT_PLACEHOLDER,
    PIECE_RE,
    dir_templates,
    fallback_template,
    render,
    rendered_contents,
    tojson,
)

log = logging.getLogger(__name__)

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
# Falcon: as the default with the backtick among the punctuation and without the digit-run step.
_FALCON = (r"[\p{P}\$\+<=>\^~\|`]+", r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)""",
           r"[0-9][0-9][0-9]")
# Tekken (Mistral Nemo, Small 3, Ministral) and GPT-4o (Phi-4-mini, gpt-oss, Llama 4): a word is a run of
# capitals then a run of small letters (or the reverse), a slash ends a punctuation run; GPT-4o keeps an
# apostrophe suffix on its word and groups digits by three. llama.cpp writes "capital" as a letter outside a-z and
# "small" as a letter outside A-Z, as here (its regex engine has no \p{Lu}).
_UPPER, _LOWER = r"(?:(?=\p{L})[^a-z])", r"(?:(?=\p{L})[^A-Z])"
_SUFFIX = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*|\p{{N}}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_SUFFIX}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_SUFFIX}?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Seed-Coder: as Qwen2 but a punctuation run never takes a line break.
_SEED_CODER = (rf"{_SUFFIX}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}| ?[^\s\p{{L}}\p{{N}}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+")
# BLOOM-style: a word runs to the next space or listed punctuation mark.
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"
# DeepSeek-Coder: line breaks, letter runs, punctuation runs, CJK runs, single digits, in turn.
_DEEPSEEK_CODER = (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}")
# DeepSeek-V3 (and Hunyuan dense): digit groups of three, CJK runs, then letters with their marks.
_DEEPSEEK_V3 = (r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+",
                r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp splits text into words before byte-level BPE merges them."""

    pattern: str | tuple[str, ...]  # the split regex, or several applied in turn (each splits the last's pieces)
    split_digits: bool = False  # split every digit off first (starcoder-style)
    ignore_merges: bool = False  # a word that is itself a token is kept whole (llama3-style)


_GPT2_PRE, _DIGITS_PRE = PreTokenizer(_GPT2), PreTokenizer(_GPT2, split_digits=True)
_LLAMA3_PRE, _QWEN2_PRE = PreTokenizer(_LLAMA3, ignore_merges=True), PreTokenizer(_QWEN2)
_GPT4O_PRE, _BLOOM_PRE, _DEEPSEEK_V3_PRE = PreTokenizer(_GPT4O), PreTokenizer(_BLOOM), PreTokenizer(_DEEPSEEK_V3)
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": PreTokenizer(_DEFAULT), "gpt-2": _GPT2_PRE, "phi-2": _GPT2_PRE, "mpt": _GPT2_PRE,
    "olmo": _GPT2_PRE, "jais": _GPT2_PRE, "gigachat": _GPT2_PRE, "a.x-4.0": _GPT2_PRE, "mellum": _GPT2_PRE,
    "exaone4": _GPT2_PRE, "trillion": _GPT2_PRE, "granite-docling": _GPT2_PRE,
    "smollm": _DIGITS_PRE, "starcoder": _DIGITS_PRE, "refact": _DIGITS_PRE, "command-r": _DIGITS_PRE,
    "codeshell": _DIGITS_PRE, "exaone": _DIGITS_PRE, "minerva-7b": _DIGITS_PRE,
    "llama3": _LLAMA3_PRE, "llama-v3": _LLAMA3_PRE, "llama-bpe": _LLAMA3_PRE, "falcon3": _LLAMA3_PRE,
    "dbrx": PreTokenizer(_LLAMA3), "smaug-bpe": PreTokenizer(_LLAMA3), "glm4": PreTokenizer(_LLAMA3),
    "chatglm-bpe": PreTokenizer(_LLAMA3),
    "qwen2": _QWEN2_PRE, "deepseek-r1-qwen": _QWEN2_PRE, "stablelm2": _QWEN2_PRE, "megrez": _QWEN2_PRE,
    "kormo": _QWEN2_PRE, "hunyuan": _QWEN2_PRE, "grok-2": _QWEN2_PRE,
    "qwen35": PreTokenizer(_QWEN35),
    "falcon": PreTokenizer(_FALCON), "tekken": PreTokenizer(_TEKKEN, ignore_merges=True),
    "gpt-4o": _GPT4O_PRE, "llama4": _GPT4O_PRE, "minimax-m2": _GPT4O_PRE,
    "seed-coder": PreTokenizer(_SEED_CODER), "poro-chat": _BLOOM_PRE, "bloom": _BLOOM_PRE, "gpt3-finnish": _BLOOM_PRE,
    "viking": PreTokenizer((_BLOOM, r"\p{N}")), "deepseek-coder": PreTokenizer(_DEEPSEEK_CODER),
    "deepseek-v3": _DEEPSEEK_V3_PRE, "hunyuan-dense": _DEEPSEEK_V3_PRE,
}
# llama.cpp's names whose splits are its own code, not a regex (restated nowhere here): refused, named.
UNSUPPORTED_PRE = frozenset({"kimi-k2", "afmoe", "superbpe", "chameleon", "deepseek-llm", "bailingmoe",
                             "bailingmoe2", "llada-moe"})
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
        """Render chat `messages` ([{"role", "content"}]) with the model's Jinja template (`chat_template.render`;
        the one named "tool_use" when tools are given and the model has one). `extra` reaches the template as
        variables (`tools=[{"type": "function", "function": {...}}]`)."""
        if not self.chat_template:
            raise ModelError("this model has no chat template; pass raw text to generate instead")
        held = extra.pop("_tools_held", None)  # id(tool) -> index: render those tools as placeholders
        # a reasoning model answers (or calls) at once: its decision is read from the reply's first token, and a
        # template that can open the reply with thinking (Qwen3's) closes it empty when asked so
        extra.setdefault("enable_thinking", False)
        source = self.tool_template if extra.get("tools") and self.tool_template else self.chat_template
        return render(source, messages, self._specials, held, add_generation_prompt=add_generation_prompt,
                      bos_token=self.bos_token, eos_token=self.eos_token, **extra)

    @functools.cached_property
    def _specials(self) -> tuple[str, ...]:
        """The special tokens' texts (longer than one character): escaped where `tojson` writes them."""
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
        `chat_template.tojson`, so a tool description cannot open a turn): the same tool gives the same tokens
        wherever it stands, which is what lets a cached block of it be spliced (`nexus_agent.turn.decide`).
        """
        extra = {"tools": tools} if tools else {}
        marked = [dict(m, content=CONTENT_PLACEHOLDER.format(i)) if m.get("content") else m
                  for i, m in enumerate(messages)]
        held = {id(t): i for i, t in enumerate(tools or [])}
        pieces = PIECE_RE.split(self.apply_chat_template(marked, add_generation_prompt, _tools_held=held, **extra))
        texts = [messages[int(p[1:])]["content"] if p[0] == "m" else self._tool_json(tools[int(p[1:])])
                 for p in pieces[1::2]]
        rendered = self.apply_chat_template(messages, add_generation_prompt, **extra)
        if "".join(p if k % 2 == 0 else texts[k // 2] for k, p in enumerate(pieces)) != rendered:
            texts = rendered_contents(pieces, texts, rendered)  # trimmed, cut, or written as JSON strings
            if texts is None:
                raise ModelError("this chat template changes message contents beyond trimming, cutting or quoting "
                                 "them, so markup and text cannot be told apart safely; use a template that inserts "
                                 "contents verbatim")
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
        return tojson(tool, specials=self._specials)

# Control tokens that end a turn in the chat templates of the supported families; generation stops on them as
# on the GGUF's eos (llama.cpp's end-of-generation set does the same).
END_OF_TURN = frozenset({"<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|endoftext|>",
                         "<|end_of_text|>"})
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
    if kind == "gpt2" and pre in UNSUPPORTED_PRE:
        raise ModelError(f"{path}: unsupported pre-tokenizer tokenizer.ggml.pre={pre!r} "
                         f"(supported: {', '.join(PRE_TOKENIZERS)})")
    if kind == "gpt2" and pre not in PRE_TOKENIZERS:  # as newer llama.cpp versions do with a name they do not know
        log.warning("%s: unknown pre-tokenizer tokenizer.ggml.pre=%r: text is split as llama.cpp's 'default' "
                    "(word splits may differ from the model's own)", path, pre)
        pre = "default"
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
    template, tool_template = dir_templates(path, cfg)
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


def load_tokenizer(model: str | None = None) -> Tokenizer:
    """The tokenizer of `model` (a GGUF file or model directory; None: the packaged SmolLM2)."""
    from native.gguf_header import read_gguf_header
    from native.model_files import resolve_model

    src = resolve_model(model)
    if src.format == "mlx-dir":
        return tokenizer_from_dir(src.path)
    return tokenizer_from_gguf(read_gguf_header(src.path).metadata, src.path)
