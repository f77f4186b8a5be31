"""The openai backend against a real llama-cpp-python server on 127.0.0.1 (see conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from native.base import BackendError, Capabilities

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "Name three primary colors."}]


def test_capabilities_are_text_only_and_kv_operations_fail_clearly(openai_backend):
    caps = openai_backend.capabilities
    assert caps.text_only
    assert not (caps.can_splice or caps.can_bias_keys or caps.can_score_attention or caps.can_remove_positions)
    assert Capabilities().text_only is False  # local backends keep the default
    with pytest.raises(BackendError, match="text only"):
        openai_backend.new_session()
    from native.generate import stream_generate

    with pytest.raises(BackendError, match="not token ids"):
        list(stream_generate(openai_backend, [1, 2, 3], max_tokens=4))
    assert openai_backend.config.model.endswith(".gguf")  # discovered from /v1/models


def test_streamed_chat_matches_the_non_streamed_answer(openai_backend):
    from native.generate import stream_generate

    # The server reuses the KV of the longest prefix it already holds, so a first request and a repeat run the
    # prompt in other batch splits (greedy text may part at a near-tie). After one warm-up request, the streamed
    # and the plain request both reuse the same cached prompt: the same computation, so the same text.
    openai_backend.chat(MESSAGES, max_tokens=24)
    pieces = list(stream_generate(openai_backend, MESSAGES, max_tokens=24))
    text = "".join(p.text for p in pieces)
    assert len([p for p in pieces if p.text]) > 3  # really streamed, piece by piece
    assert pieces[-1].finish_reason in ("stop", "length") and all(p.finish_reason is None for p in pieces[:-1])
    assert pieces[-1].ttft_s > 0
    once = openai_backend.chat(MESSAGES, max_tokens=24)  # greedy: the same text without streaming
    assert once.text == text and once.completion_tokens > 0


def test_raw_completion_streams_and_matches(openai_backend):
    from native.generate import generate

    streamed = generate(openai_backend, "The capital of France is", max_tokens=6)
    once = openai_backend.complete("The capital of France is", max_tokens=6)
    assert streamed == once.text and "Paris" in streamed and once.finish_reason == "length"


def test_json_schema_reply_is_schema_valid(openai_backend):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
              "required": ["city", "days"], "additionalProperties": False}
    r = openai_backend.chat([{"role": "user", "content": "Weather in Paris for 3 days, as JSON."}], 48,
                            schema=schema)
    import json

    value = json.loads(r.text)
    jsonschema.validate(value, schema)


def test_unreachable_server_is_an_actionable_error():
    from native import load_backend

    with pytest.raises(BackendError, match="NEXUS_OPENAI_BASE_URL"):
        load_backend("openai", base_url="http://127.0.0.1:9/v1")  # discard port: nothing listens
    with pytest.raises(ValueError, match="http://"):
        load_backend("openai", model="m", base_url="127.0.0.1:8000")


def test_nexus_generate_cli(openai_server):
    env = {**os.environ, "NEXUS_OPENAI_BASE_URL": openai_server}
    p = subprocess.run([sys.executable, "-m", "nexus_agent.cli", "generate", "--backend", "openai", "--max-tokens",
                        "12", "Name three primary colors."], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert len(p.stdout.strip()) > 5 and "generated" in p.stderr and "TTFT" in p.stderr


def test_schema_format_from_env_and_validated(monkeypatch):
    from native.openai_backend import OpenAIConfig

    monkeypatch.setenv("NEXUS_OPENAI_SCHEMA_FORMAT", "json_schema")
    assert OpenAIConfig.from_env("m").schema_format == "json_schema"
    monkeypatch.setenv("NEXUS_OPENAI_SCHEMA_FORMAT", "grammar")
    with pytest.raises(ValueError, match="schema_format"):
        OpenAIConfig.from_env("m")
