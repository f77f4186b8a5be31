"""Chat templates of the other families: how a call is written, read from those with a tools section, and the
conversations a framework sends that they refuse as sent. The templates are written here in the families' formats
(Llama 3.1: a call is `{"name", "parameters"}` and a message holds one call; Mistral v0.3: `[TOOL_CALLS] [...]`,
the tools before the last user turn, call ids of nine letters or digits; Gemma: no tools section, a system message
only first, user and model turns in alternation) over the packaged SmolLM2's real tokenizer, and served by a real
`nexus serve` over tiny random-weight GGUFs that carry them."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from native.base import ModelError, TemplateRefusal
from native.tokenizer import load_tokenizer
from nexus_agent.openai_api import render_messages, template_messages
from nexus_agent.turn.call_format import probe_call_format

LLAMA31 = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'user' and loop.first and tools %}<|start_header_id|>user<|end_header_id|>\n\n"
    "Given the following functions, reply with a JSON function call.\n"
    "{% for t in tools %}{{ t | tojson(indent=4) }}\n\n{% endfor %}{{ m.content }}<|eot_id|>"
    "{% elif m.tool_calls %}{% if m.tool_calls | length != 1 %}{{ raise_exception('one call per message') }}{% endif %}"
    "{% set c = m.tool_calls[0].function %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    '{"name": "{{ c.name }}", "parameters": {{ c.arguments | tojson }}}<|eot_id|>'
    "{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
MISTRAL = (
    "{{ bos_token }}{% set users = messages | selectattr('role', 'equalto', 'user') | list %}"
    "{% for m in messages %}{% if m.role == 'user' %}"
    "{% if tools and m == users[-1] %}[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "[INST] {{ m.content }}[/INST]"
    "{% elif m.tool_calls %}[TOOL_CALLS] [{% for c in m.tool_calls %}"
    "{% if c.id is not string or c.id | length != 9 %}{{ raise_exception('call ids must be 9 characters') }}"
    '{% endif %}{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}, '
    '"id": "{{ c.id }}"}{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}'
    "{% elif m.role == 'tool' %}[TOOL_RESULTS] {\"call_id\": \"{{ m.tool_call_id }}\", \"content\": "
    "{{ m.content | tojson }}}[/TOOL_RESULTS]{% else %}{{ m.content }}{% endif %}{% endfor %}")

MISTRAL_ALTERNATING = MISTRAL.replace("{% for m in messages %}", (  # Mistral 3's: turns alternate, calls aside
    "{% for m in messages | rejectattr('role', 'equalto', 'tool') | rejectattr('tool_calls') %}"
    "{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('roles must alternate') }}"
    "{% endif %}{% endfor %}{% for m in messages %}"), 1)

GEMMA = (
    "{{ bos_token }}{% if messages[0].role == 'system' %}{% set first = messages[0].content + '\n\n' %}"
    "{% set rest = messages[1:] %}{% else %}{% set first = '' %}{% set rest = messages %}{% endif %}"
    "{% for m in rest %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n"
    "{{ (first if loop.first else '') + m.content }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def _call(cid: str, name: str, arguments: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


OSLO, ROME = "call_Qk2vX8pLm3NaT0", "call_Zr7bW1cYd5EeU9"
SENT = [  # as a framework sends it back after two parallel calls (its own call ids, both calls in one message)
    {"role": "user", "content": "Weather in Oslo and in Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [_call(OSLO, "get_weather", '{"city": "Oslo"}'),
                                                          _call(ROME, "get_weather", '{"city": "Rome"}')]},
    {"role": "tool", "tool_call_id": OSLO, "content": "3 C"},
    {"role": "tool", "tool_call_id": ROME, "content": "18 C"},
    {"role": "user", "content": "Thanks!"},
]
HELD = [dict(m, content=m["content"] or "") for m in SENT]  # as the server holds it (`openai_api.parse_request`)
CONVERSATION = template_messages(HELD)  # as the server renders it for a template with a tools section
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def test_each_familys_call_format_is_read_from_its_template(tok):
    llama = probe_call_format(replace(tok, chat_template=LLAMA31))
    assert (llama.opener, llama.between, llama.closer, llama.template_tools) == (
        '{"name": "', '", "parameters": ', "}", True)
    # the message ends between two calls; the closer's "}" is not the arguments' own
    assert llama.separator == "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    mistral = probe_call_format(replace(tok, chat_template=MISTRAL))  # its probe call needs a nine-character id
    assert (mistral.opener, mistral.between, mistral.template_tools) == (
        '[TOOL_CALLS] [{"name": "', '", "arguments": ', True)
    assert re.fullmatch(r', "id": "[0-9a-f]{9}"\}\]', mistral.closer)


def test_a_frameworks_call_ids_reach_a_template_as_nine_characters(tok):
    """Mistral's template refuses any other id: each call and its result get the same nine hex digits, the same
    on every request (the conversation's prefix stays cached); an id that already qualifies is kept."""
    mistral = replace(tok, chat_template=MISTRAL)
    text = mistral.apply_chat_template(CONVERSATION, True, tools=TOOLS)
    calls = re.findall(r'"id": "(\w+)"', text)
    results = re.findall(r'"call_id": "(\w+)"', text)
    assert len(calls) == 2 and calls == results and all(re.fullmatch(r"[0-9a-f]{9}", i) for i in calls)
    assert calls[0] != calls[1] and mistral.apply_chat_template(CONVERSATION, True, tools=TOOLS) == text
    assert "[AVAILABLE_TOOLS]" in text and text.index("[AVAILABLE_TOOLS]") > text.index("[TOOL_RESULTS]")
    kept = template_messages([dict(CONVERSATION[1], tool_calls=[_call("a1B2c3D4e", "get_weather", "{}")]),
                              {"role": "tool", "tool_call_id": "a1B2c3D4e", "content": "3 C"}])
    assert '"id": "a1B2c3D4e"' in mistral.apply_chat_template(CONVERSATION[:1] + kept, False)
    ids, _ = mistral.encode_chat_tools(CONVERSATION, True, TOOLS)  # the server's path: contents as text
    assert mistral.decode(ids) == text


def test_calls_sent_in_one_message_render_one_per_message_where_the_template_takes_one(tok):
    llama = replace(tok, chat_template=LLAMA31)
    text = llama.apply_chat_template(CONVERSATION, True, tools=TOOLS)
    assert '{"name": "get_weather", "parameters": {"city": "Oslo"}}<|eot_id|>' in text
    assert '{"name": "get_weather", "parameters": {"city": "Rome"}}<|eot_id|>' in text
    assert text.count("<|start_header_id|>assistant<|end_header_id|>") == 3  # two calls, then the reply's header
    assert text.index('"Oslo"}') < text.index('"Rome"}') < text.index("18 C")
    broken = LLAMA31.replace("{{ bos_token }}", "{{ raise_exception('no such template') }}")
    with pytest.raises(ModelError, match="no such template"):  # any other refusal is the template's error
        replace(tok, chat_template=broken).apply_chat_template(CONVERSATION, True)


def test_turns_reach_a_template_that_takes_them_in_alternation_as_it_takes_them(tok):
    """Gemma's template refuses two user turns in a row, a second system message, an assistant turn first: such a
    conversation is rendered with consecutive turns of one role joined, a later system message as a user turn and an
    empty user turn first; a conversation a template takes is rendered as sent."""
    gemma = replace(tok, chat_template=GEMMA)
    two_results = render_messages(HELD)  # for a model with no tools section: tool results as user turns
    text = gemma.apply_chat_template(two_results, True)
    assert "<start_of_turn>user\nTool get_weather returned: 3 C\n\nTool get_weather returned: 18 C\n\nThanks!" in text
    text = gemma.apply_chat_template([{"role": "system", "content": "Be brief."},
                                      {"role": "system", "content": "Be kind."},
                                      {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Hi"}])
    assert text == tok.bos_token + (
        "<start_of_turn>user\nBe brief.\n\nBe kind.\n\n<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n")
    ids, _ = gemma.encode_chat_tools(two_results)  # the server's path: contents as text, markup as markup
    assert gemma.decode(ids) == gemma.apply_chat_template(two_results, True)
    assert tok.apply_chat_template(two_results).count("<|im_start|>user") == 4  # SmolLM2's own takes them as sent
    gemma2 = replace(tok, chat_template=GEMMA.replace("{{ bos_token }}", "{{ bos_token }}{% for m in messages %}"
                     "{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
                     "{% endfor %}"))  # Gemma 2's takes no system message at all: its text opens the next user turn
    text = gemma2.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                                       {"role": "assistant", "content": "Hello!"},
                                       {"role": "system", "content": "Be kind."}, {"role": "user", "content": "Bye"}])
    assert text.endswith("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!"
                         "<end_of_turn>\n<start_of_turn>user\nBe kind.\n\nBye<end_of_turn>\n<start_of_turn>model\n")
    with pytest.raises(TemplateRefusal, match="must alternate"):  # what no shape fixes stays the template's error
        gemma.apply_chat_template([{"role": "user", "content": "Hi"}, {"role": "tool", "content": "3 C"},
                                   {"role": "tool", "content": "18 C"}])  # results are never joined


def test_a_follow_up_right_after_tool_results_reaches_a_template_that_counts_turns(tok):
    """Mistral's templates check that user and assistant turns alternate, calls and results aside: a user turn
    right after tool results (no answer between: the doctor's conversation, a client that drops the answer) was
    refused (HTTP 400). Where the template refuses it, an empty assistant turn stands between."""
    import jinja2

    chat = template_messages(HELD[:-1] + [{"role": "user", "content": "And in Paris?"}])

    def refuse(message):
        raise ValueError(message)

    plain = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    plain.globals["raise_exception"] = refuse
    with pytest.raises(ValueError, match="roles must alternate"):  # as sent, the template refuses it
        plain.from_string(MISTRAL_ALTERNATING).render(messages=chat, tools=TOOLS, bos_token="", eos_token="")
    text = replace(tok, chat_template=MISTRAL_ALTERNATING).apply_chat_template(chat, True, tools=TOOLS)
    assert text.count("[TOOL_RESULTS]") == 2 and text.endswith("[/AVAILABLE_TOOLS][INST] And in Paris?[/INST]")


def test_what_templates_call_beside_jinja_is_there(tok):
    """Hugging Face's renderer gives templates `{% break %}`, `{% generation %}` and `strftime_now`, and published
    templates use them; without them such a template could not be compiled, and every request failed."""
    from datetime import datetime

    src = ("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{% generation %}{{ m.content }}"
           "{% endgeneration %}{% endfor %}|{{ strftime_now('%Y') }}")
    years = {str(datetime.now().year)}
    text = replace(tok, chat_template=src).apply_chat_template([{"role": "user", "content": "a"},
                                                                {"role": "user", "content": "b"}])
    assert text.split("|")[0] == "a" and text.split("|")[1] in years | {str(datetime.now().year)}


def test_a_reasoning_template_opens_the_reply_with_its_thinking_closed(tok):
    """Qwen3's template opens the reply with an empty think block when `enable_thinking` is false; the decision is
    read from the reply's first token, so Nexus renders it so (a thinking model's first token is always `<think>`:
    it would never be read as a call)."""
    qwen3 = replace(tok, chat_template=(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking "
        "is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"))
    hi = [{"role": "user", "content": "Hi"}]
    assert qwen3.apply_chat_template(hi).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert qwen3.apply_chat_template(hi, enable_thinking=True).endswith("<|im_start|>assistant\n")


def test_a_model_whose_template_ends_the_message_between_calls_makes_one_call_per_reply(llamacpp_backend):
    """Between two calls Llama 3.1's template ends the message (its end-of-turn token): the token that would begin
    another call in the same message is the end of the reply, so no further call is read from it. Here with the
    model's own end of turn (SmolLM2's `<|im_end|>`, an eos) in that place."""
    from nexus_agent.turn.decide import Decider
    from nexus_agent.turn.profile import DecideProfile

    tok = llamacpp_backend.tokenizer
    one = probe_call_format(replace(tok, chat_template=LLAMA31.replace("<|eot_id|>", "{{ eos_token }}")))
    assert one.separator.startswith(tok.eos_token) and one.template_tools
    assert Decider(llamacpp_backend, DecideProfile(), one).next_call == []
    several = probe_call_format(replace(tok, chat_template=MISTRAL))  # no end of turn between calls
    assert Decider(llamacpp_backend, DecideProfile(), several).next_call == tok.encode("\n")


@pytest.mark.parametrize("family", ["llama3.1", "mistral", "gemma"])
def test_a_frameworks_conversation_is_served_under_each_familys_template(tmp_path, family):
    """The conversation a framework sends back after two parallel calls, through `nexus serve` and the official
    client, over a model whose template refuses its call ids, its two calls in one message or its two results in a
    row: a reply, not an error (a call or text: the weights are random)."""
    openai = pytest.importorskip("openai")
    from serve_helpers import API_KEY, running_serve
    from tiny_models import SPECS, write_tiny_gguf

    from native.model_files import default_model_path, gemma3_path

    template = {"llama3.1": LLAMA31.replace("<|eot_id|>", "{{ eos_token }}"), "mistral": MISTRAL,
                "gemma": GEMMA}[family]
    spec, vocab = (SPECS["gemma3"], gemma3_path()) if family == "gemma" else (SPECS["llama3"], default_model_path())
    path = write_tiny_gguf(tmp_path / f"{family}.gguf", spec, vocab, chat_template=template)
    raw = SENT[:-1] + [{"role": "user", "content": "And in Paris?"}]
    home = tmp_path / "home"
    home.mkdir()
    with running_serve(home, "--model", path, "--n-ctx", "2048", "--no-idle-compile") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
        r = client.chat.completions.create(model=family, messages=raw, tools=TOOLS, max_tokens=8)
        assert r.choices[0].finish_reason in ("tool_calls", "stop", "length")
        assert r.choices[0].message.tool_calls or r.choices[0].message.content is not None
        r = client.chat.completions.create(model=family, messages=raw, max_tokens=4)  # no tools offered
        assert r.choices[0].message.content is not None


def test_a_conversation_the_template_refuses_in_every_shape_is_the_requests_error(tmp_path):
    """HTTP 400 with the template's own words, not a server error (500): the same conversation would fail again."""
    openai = pytest.importorskip("openai")
    from serve_helpers import API_KEY, running_serve
    from tiny_models import SPECS, write_tiny_gguf

    from native.model_files import gemma3_path

    refusing = GEMMA.replace("{% for m in rest %}", "{% for m in rest %}{% if m.content == 'Open the pod bay doors' %}"
                             "{{ raise_exception('I cannot do that') }}{% endif %}")
    path = write_tiny_gguf(tmp_path / "refusing.gguf", SPECS["gemma3"], gemma3_path(), chat_template=refusing)
    home = tmp_path / "home"
    home.mkdir()
    with running_serve(home, "--model", path, "--n-ctx", "2048", "--no-idle-compile") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
        with pytest.raises(openai.BadRequestError, match="I cannot do that") as e:
            client.chat.completions.create(model="refusing", max_tokens=4,
                                           messages=[{"role": "user", "content": "Open the pod bay doors"}])
        assert e.value.status_code == 400 and e.value.body["param"] == "messages"
        r = client.chat.completions.create(model="refusing", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        assert r.choices[0].finish_reason == "length"  # the server goes on serving


def test_a_template_saved_beside_the_tokenizer_or_named_for_tools_is_found(tmp_path, tok):
    """Newer Hugging Face tokenizers save the template as chat_template.jinja, not in tokenizer_config.json; some
    models carry templates by name (a "tool_use" one beside the default, as a list in tokenizer_config.json or as
    `tokenizer.chat_template.tool_use` in a GGUF): rendered with tools, the tool_use one, as Hugging Face does."""
    import json

    from tiny_models import SPECS, write_tiny_gguf

    from native.model_files import default_model_path
    from native.tokenizer import tokenizer_from_dir

    folder = tmp_path / "model"
    folder.mkdir()
    tok._special.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}))
    (folder / "chat_template.jinja").write_text(LLAMA31)
    assert tokenizer_from_dir(str(folder)).chat_template == LLAMA31
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
        "chat_template": [{"name": "default", "template": GEMMA}, {"name": "tool_use", "template": MISTRAL}]}))
    gguf = load_tokenizer(write_tiny_gguf(tmp_path / "named.gguf", SPECS["llama3"], default_model_path(),
                                          chat_template=GEMMA, strings={"tokenizer.chat_template.tool_use": MISTRAL}))
    for named in (tokenizer_from_dir(str(folder)), gguf):
        assert (named.chat_template, named.tool_template) == (GEMMA, MISTRAL)
        hi = [{"role": "user", "content": "Hi"}]
        assert "<start_of_turn>user" in named.apply_chat_template(hi)
        assert named.apply_chat_template(hi, tools=TOOLS).endswith("[/AVAILABLE_TOOLS][INST] Hi[/INST]")
        assert probe_call_format(named).opener == '[TOOL_CALLS] [{"name": "'


@pytest.mark.parametrize("family", ["broken", "gemma", "mistral"])
def test_doctor_says_whether_the_template_renders_an_agents_conversation(tmp_path, family):
    """`nexus doctor --model M` renders a conversation with a call and its result as `nexus serve` would and names
    how the model writes a call; a template that does not compile is named there (every request would fail)."""
    from tiny_models import SPECS, write_tiny_gguf

    from native.model_files import default_model_path
    from nexus_agent.doctor import check_model

    template = {"broken": "{% for m in messages %}{{ m.content }", "gemma": GEMMA, "mistral": MISTRAL}[family]
    path = write_tiny_gguf(tmp_path / f"{family}.gguf", SPECS["llama3"], default_model_path(), chat_template=template)
    checks = {name: (ok, detail) for name, ok, detail in check_model("llamacpp", path)}
    ok, detail = checks["chat template"]
    if family == "broken":
        assert not ok and "does not compile" in detail
    else:
        assert ok and "renders a conversation with a call and its result" in detail
        assert ("[TOOL_CALLS]" in detail) == (family == "mistral")


def test_contents_a_template_trims_cuts_or_quotes_are_still_read_as_text(tok):
    """Templates do not all insert contents verbatim: Llama 3.1's trims them, Qwen3's cuts an earlier reply's
    reasoning off, Phi-4's writes a tool result as a JSON string. The prompt is the template's text exactly, and a
    content's text (here one holding the model's own end-of-turn marker) is never read as markup. A past reply's
    reasoning reaches no template (some show it again, with markup that depends on it: Laguna's, Bielik's)."""
    changing = replace(tok, chat_template=(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'tool' %}{{ m.content | tojson }}"
        "{% elif m.role == 'assistant' %}{{ m.content.split('</think>')[-1].lstrip('\n') }}"
        "{% else %}{{ m.content | trim }}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"))
    chat = [{"role": "system", "content": "  Be brief.\n"}, {"role": "user", "content": "Say <|im_end|> twice\n\n"},
            {"role": "assistant", "content": "<think>an easy one</think>\n\nDone."},
            {"role": "tool", "content": 'He said "hi"\nand left.'}]
    text = changing.apply_chat_template(chat)
    assert "Be brief.<|im_end|>" in text and "\nDone.<|im_end|>" in text and '"He said \\"hi\\"\\nand left."' in text
    ids = changing.encode_chat(chat)
    assert changing.decode(ids) == text
    end = tok.encode("<|im_end|>", special=True)
    assert len(end) == 1 and ids.count(end[0]) == 4  # the four turns' own; the user's "<|im_end|>" is text
    showing = replace(tok, chat_template=(  # Laguna's: other markup before a reply that holds reasoning
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if '</think>' in m.content %}"
        "{% set parts = m.content.split('</think>') %}{{ '<think>\n' + parts[0].split('<think>')[-1].strip() + "
        "'\n</think>\n' + parts[1].lstrip() }}{% else %}</think>\n{{ m.content }}{% endif %}<|im_end|>\n"
        "{% endfor %}"))
    text = showing.apply_chat_template(chat[2:3], False)  # shown as Qwen3's shows past replies: without it
    assert text == "<|im_start|>assistant\n</think>\nDone.<|im_end|>\n"
    assert showing.decode(showing.encode_chat(chat[2:3], False)) == text
    rewriting = replace(tok, chat_template=changing.chat_template.replace("| trim", "| upper"))
    with pytest.raises(ModelError, match="beyond trimming"):  # a content rewritten: no safe reading, as before
        rewriting.encode_chat(chat)


def test_a_template_that_fails_on_tools_is_served_without_them(tok):
    """A template's own error (an undefined variable used, a filter's result it cannot write) is its failure on
    the conversation: the call-format probe reads such a template as having no tools section, and a request it
    fails on is the request's error naming the template (not a server error)."""
    failing = replace(tok, chat_template=(
        "{% if tools %}{{ 'Functions: ' + functions }}{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"))
    assert probe_call_format(failing).template_tools is False
    with pytest.raises(TemplateRefusal, match="chat template error: UndefinedError: 'functions' is undefined"):
        failing.apply_chat_template([{"role": "user", "content": "Hi"}], tools=TOOLS)
    assert failing.apply_chat_template([{"role": "user", "content": "Hi"}]) == "<|im_start|>user\nHi<|im_end|>\n"
    mapped = replace(tok, chat_template="{{ tools | map(attribute='function') | tojson }}|{{ nothing | tojson }}")
    assert mapped.apply_chat_template([], tools=TOOLS) == json.dumps([TOOLS[0]["function"]]) + "|null"


LONE_SYSTEM = {  # a conversation of only a system message rendered as a user turn, or not at all (GLM-4's)
    "as_user": ("{% for m in messages %}<|im_start|>"
                "{{ 'user' if messages | length == 1 else m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    "kept_back": ("{% for m in messages %}{% if m.role != 'system' or messages | length > 1 %}<|im_start|>"
                  "{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
}


@pytest.mark.parametrize("lone", LONE_SYSTEM)
def test_a_template_that_renders_a_lone_system_message_otherwise_is_served(tmp_path, lone):
    """Some templates render a message by what stands around it: a tool's schema segment then has no tokens of
    its own to splice, and the arguments are decoded on the whole prompt prefilled as text (a server error
    before). The tool's schema needs the full-schema path (a nested object), so every call decoded takes it."""
    from serve_helpers import post, running_serve
    from tiny_models import SPECS, write_tiny_gguf

    from native.model_files import default_model_path

    template = LONE_SYSTEM[lone]
    path = write_tiny_gguf(tmp_path / "lone.gguf", SPECS["llama3"], default_model_path(), chat_template=template)
    nested = {"type": "function", "function": {"name": "book", "description": "Book a trip", "parameters": {
        "type": "object", "properties": {"trip": {"type": "object", "properties": {
            "from": {"type": "object", "properties": {"city": {"type": "string"}, "day": {"type": "string"}}},
            "to": {"type": "string"}}}}, "required": ["trip"]}}}
    home = tmp_path / "home"
    home.mkdir()
    with running_serve(home, "--model", path, "--n-ctx", "2048", "--no-idle-compile") as url:
        for choice in ("required", {"type": "function", "function": {"name": "book"}}):
            status, body = post(url, {"model": "lone", "messages": [{"role": "user", "content": "Book Oslo to Rome"}],
                                      "tools": [nested], "tool_choice": choice, "max_tokens": 24})
            assert status == 200, body
            message = body["choices"][0]["message"]  # the call, or (random weights) why its arguments failed
            assert (message.get("tool_calls") or [{}])[0].get("function", {}).get("name") == "book" or \
                message["content"].startswith("I could not fill in the arguments of book")
        log = (home / "server.log").read_text()
        assert "Traceback" not in log


def test_a_reading_the_template_refuses_is_not_read(llamacpp_backend):
    """p(call) is also read on the conversation without its prose (`readings`); a template may refuse that one in
    every shape (here: calls with no answer after them; Mistral 3's refused it for its alternation before an empty
    assistant turn was given it). That reading is skipped, and the request is decided on the others (it was an
    HTTP 400 before)."""
    from nexus_agent.turn.decide import Candidate, Decider
    from nexus_agent.turn.engine import reading_prompts, readings
    from nexus_agent.turn.profile import DecideProfile
    from registry.model import Tool

    answered = ("{% if messages | selectattr('role', 'equalto', 'tool') | list and not messages | selectattr('role', "
                "'equalto', 'assistant') | rejectattr('tool_calls') | selectattr('content') | list %}"
                "{{ raise_exception('an answer must follow tool results') }}{% endif %}")
    tok = replace(llamacpp_backend.tokenizer, chat_template=answered + MISTRAL)
    decider = Decider(llamacpp_backend, DecideProfile(), probe_call_format(tok))
    decider.tok = tok  # the prompts are rendered with the Mistral-format template over the packaged model
    chat = HELD[:-1] + [{"role": "assistant", "content": "3 C in Oslo, 18 C in Rome."},
                        {"role": "user", "content": "And in Paris?"}]
    cands = [Candidate(Tool.from_mcp({"name": "get_weather", "description": "Weather for a city",
                                      "inputSchema": TOOLS[0]["function"]["parameters"]}), 0.5, 0)]
    assert len(readings(chat)) == 2
    prompts = list(reading_prompts(decider, chat, cands))
    assert len(prompts) == 1 and tok.decode(prompts[0]).count("[INST]") == 1  # the last exchange alone


def test_a_chat_template_given_at_start_replaces_the_models_own(tmp_path):
    """`--chat-template` (a file, as llama.cpp's and vLLM's servers take one): a model whose own template fails on
    every conversation is served with the one given, and doctor checks that one; a missing file or a template
    that does not compile stops the server at start, named."""
    openai = pytest.importorskip("openai")
    import os
    import subprocess
    import sys

    from serve_helpers import API_KEY, ROOT, running_serve
    from tiny_models import SPECS, write_tiny_gguf

    from native.model_files import default_model_path
    from nexus_agent.doctor import check_model

    failing = "{{ 'Functions: ' + functions }}{% for m in messages %}{{ m.content }}{% endfor %}"
    path = write_tiny_gguf(tmp_path / "failing.gguf", SPECS["llama3"], default_model_path(), chat_template=failing)
    given = tmp_path / "mistral.jinja"
    given.write_text(MISTRAL)
    checks = {name: (ok, detail) for name, ok, detail in check_model("llamacpp", path, str(given))}
    assert checks["chat template"][0] and "[TOOL_CALLS]" in checks["chat template"][1]
    assert not {name: ok for name, ok, _ in check_model("llamacpp", path)}["chat template"]
    home = tmp_path / "home"
    home.mkdir()
    with running_serve(home, "--model", path, "--chat-template", str(given), "--n-ctx", "2048",
                       "--no-idle-compile") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
        r = client.chat.completions.create(model="failing", messages=SENT[:-1] + [{"role": "user", "content": "Hi"}],
                                           tools=TOOLS, max_tokens=4)
        assert r.choices[0].message.tool_calls or r.choices[0].message.content is not None
    out = subprocess.run([sys.executable, "-m", "nexus_agent.cli", "serve", "--model", path, "--port", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, NEXUS_HOME=str(home),
                                                                                PYTHONPATH=str(ROOT)))
    assert out.returncode != 0 and "'functions' is undefined" in out.stderr and "--chat-template FILE" in out.stderr
    for bad, words in ((str(tmp_path / "missing.jinja"), "no such file"), ("{% if %}", "does not compile")):
        out = subprocess.run([sys.executable, "-m", "nexus_agent.cli", "serve", "--model", path, "--chat-template",
                              bad, "--port", "0"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, NEXUS_HOME=str(home), PYTHONPATH=str(ROOT)))
        assert out.returncode != 0 and words in out.stderr
