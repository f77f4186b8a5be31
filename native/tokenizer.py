"""Tokenizer and chat template from a model's own files, identical for every backend.

A GGUF carries its vocabulary (`tokenizer.ggml.tokens`, `.merges`, `.token_type`), its pre-tokenizer name
(`tokenizer.ggml.pre`) and its Jinja chat template; we rebuild a byte-level BPE with the `tokenizers`
library from these and render the template with jinja2, so MLX and llama.cpp sessions see the same ids.
An MLX/HF directory brings tokenizer.json and tokenizer_config.json instead.

Text is encoded with `special=False` by default: "<|im_start|>" inside a tool description or a user message
stays plain text and cannot open a new chat turn. Only the chat template's own markup parses special tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Sequence

import jinja2
import jinja2.sandbox
from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from native.base import ModelError

# GGUF pre-tokenizer name -> the split regexes applied before byte-level BPE (llama.cpp's table, restated).
_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_LLAMA3 = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)
PRE_TOKENIZERS: dict[str, tuple[bool, str]] = {  # name -> (split digits one by one first, regex)
    "default": (False, _GPT2),
    "gpt2": (False, _GPT2),
    "smollm": (True, _GPT2),
    "starcoder": (True, _GPT2),
    "refact": (True, _GPT2),
    "llama3": (False, _LLAMA3),
    "llama-bpe": (False, _LLAMA3),
}
CONTROL, USER_DEFINED = 3, 4  # GGUF token types that are matched as whole special tokens


def _byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], pre: str) -> HFTokenizer:
    split_digits, pattern = PRE_TOKENIZERS[pre]
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    steps = []
    if split_digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    steps.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    return tok


@dataclass
class Tokenizer:
    """Byte-level BPE with special tokens and a chat template.

    `_plain` never matches special tokens (user text); `_special` matches them (template markup).
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
        """Render chat `messages` ([{"role", "content"}]) with the model's Jinja template (sandboxed)."""
        if not self.chat_template:
            raise ModelError("this model has no chat template; pass raw text to generate instead")
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_template_error
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token, eos_token=self.eos_token, **extra,
        )

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a chat: template markup parses special tokens, message contents never do.

        The template is rendered once with each content replaced by a placeholder, so the markup and the
        contents are told apart by construction (searching the rendered text for a content could match inside
        the markup, e.g. a request "r" inside "<|im_start|>", and split a role marker).
        """
        marked = [dict(m, content=_PLACEHOLDER.format(i)) if m.get("content") else m for i, m in enumerate(messages)]
        pieces = _PLACEHOLDER_RE.split(self.apply_chat_template(marked, add_generation_prompt))
        contents = [messages[int(p)]["content"] for p in pieces[1::2]]
        rendered = self.apply_chat_template(messages, add_generation_prompt)
        if "".join(p if k % 2 == 0 else contents[k // 2] for k, p in enumerate(pieces)) != rendered:
            raise ModelError("this chat template changes message contents (e.g. trims them), so markup and text "
                             "cannot be told apart safely; use a template that inserts contents verbatim")
        ids: list[int] = []
        for k, piece in enumerate(pieces):
            ids += self.encode(piece, special=True) if k % 2 == 0 else self.encode(contents[k // 2], special=False)
        return ids


_PLACEHOLDER = "\ue000{}\ue001"  # private-use code points: never in a chat template's own markup
_PLACEHOLDER_RE = re.compile("\ue000([0-9]+)\ue001")


def _raise_template_error(message: str):
    raise ModelError(f"chat template error: {message}")


def _digest(*parts) -> str:
    h = hashlib.blake2b(digest_size=12)
    for p in parts:
        h.update(json.dumps(p, ensure_ascii=False).encode())
    return h.hexdigest()


def tokenizer_from_gguf(meta: dict, path: str = "<gguf>") -> Tokenizer:
    """Build the tokenizer from GGUF metadata (see `native.gguf_header`)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelError(f"{path}: unsupported tokenizer model {kind!r} (supported: byte-level BPE 'gpt2')")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ModelError(f"{path}: unsupported pre-tokenizer {pre!r} (supported: {', '.join(PRE_TOKENIZERS)})")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab = {t: i for i, t in enumerate(tokens)}
    specials = [t for t, ty in zip(tokens, types) if int(ty) in (CONTROL, USER_DEFINED)]
    plain = _byte_level_bpe(vocab, merges, pre)
    special = _byte_level_bpe(vocab, merges, pre)
    special.add_special_tokens(specials)
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos = {int(meta["tokenizer.ggml.eos_token_id"])} if "tokenizer.ggml.eos_token_id" in meta else set()
    if "tokenizer.ggml.eot_token_id" in meta:
        eos.add(int(meta["tokenizer.ggml.eot_token_id"]))
    eos_token = tokens[min(eos)] if eos else ""
    return Tokenizer(
        _plain=plain, _special=special,
        special_ids=frozenset(vocab[t] for t in specials),
        bos_id=None if bos is None else int(bos),
        eos_ids=frozenset(eos), chat_template=meta.get("tokenizer.chat_template"),
        bos_token=tokens[int(bos)] if bos is not None else "", eos_token=eos_token,
        digest=_digest(tokens, meta.get("tokenizer.ggml.merges", []), specials, pre),
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
    vocab = special.get_vocab(with_added_tokens=True)
    eos_ids = {vocab[eos_t]} if eos_t in vocab else set()
    return Tokenizer(
        _plain=plain, _special=special, special_ids=frozenset(specials),
        bos_id=vocab.get(bos_t), eos_ids=frozenset(eos_ids), chat_template=cfg.get("chat_template"),
        bos_token=bos_t, eos_token=eos_t, digest=_digest(special.to_str()),
    )


def load_tokenizer(model: str | None = None) -> Tokenizer:
    """The tokenizer of `model` (a GGUF file or model directory; None: the packaged SmolLM2)."""
    from native.gguf_header import read_gguf_header
    from native.model_files import resolve_model

    src = resolve_model(model)
    if src.format == "mlx-dir":
        return tokenizer_from_dir(src.path)
    return tokenizer_from_gguf(read_gguf_header(src.path).metadata, src.path)
