"""Generation on any OpenAI-compatible server (vLLM, SGLang, llama.cpp's server, llama-cpp-python's server).

Routing, the registry and signatures stay local; only text generation moves to the server. The server owns its
KV cache, so this backend is *text only*: `capabilities.text_only` is True, every KV capability is False, and
`new_session()` raises `BackendError`: callers ask the flag and generate through `stream_text` (the
`native.base.TextBackend` protocol) or `chat` / `complete` instead of prefill/decode. Chat messages go to
`/v1/chat/completions`, raw text to `/v1/completions`, streamed as server-sent events. Arguments under a JSON
Schema use the server's `response_format` (llama.cpp's `{"type": "json_object", "schema": ...}`, or OpenAI's
`json_schema` form); the caller still validates them.

Standard library only (`urllib`). Configuration, first match wins: keyword options, then the environment
(`NEXUS_OPENAI_BASE_URL`, `NEXUS_OPENAI_MODEL`, `NEXUS_OPENAI_API_KEY`, `NEXUS_OPENAI_SCHEMA_FORMAT`); without a
model name the server's first `/v1/models` entry is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Iterator

from native.base import BackendError, ModelInfo
from native.generate import GenerationResponse, SamplerConfig
from native.registry import BACKENDS, list_backends

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
SCHEMA_FORMATS = ("json_object", "json_schema", "none")


@dataclass
class OpenAIConfig:
    """base_url: the server's API root, ending in /v1; model: the served model name (None: ask /v1/models);
    api_key: sent as a Bearer token when set; timeout_s: per request; schema_format: how a JSON Schema is sent
    (json_object: llama.cpp's `{"type":"json_object","schema":S}`; json_schema: OpenAI/vLLM/SGLang's
    `{"type":"json_schema","json_schema":{"name","schema"}}`; none: only the prompt asks for JSON)."""

    base_url: str = DEFAULT_BASE_URL
    model: str | None = None
    api_key: str | None = None
    timeout_s: float = 120.0
    schema_format: str = "json_object"

    def __post_init__(self):
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base URL must start with http:// or https://, got {self.base_url!r} "
                             "(set --base-url or NEXUS_OPENAI_BASE_URL, e.g. http://127.0.0.1:8000/v1)")
        self.base_url = self.base_url.rstrip("/")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.schema_format not in SCHEMA_FORMATS:
            raise ValueError(f"schema_format must be one of {SCHEMA_FORMATS}, got {self.schema_format!r}")

    @classmethod
    def from_env(cls, model: str | None = None, **options) -> "OpenAIConfig":
        env = os.environ
        return cls(base_url=options.pop("base_url", None) or env.get("NEXUS_OPENAI_BASE_URL") or DEFAULT_BASE_URL,
                   model=model or options.pop("model_name", None) or env.get("NEXUS_OPENAI_MODEL") or None,
                   api_key=options.pop("api_key", None) or env.get("NEXUS_OPENAI_API_KEY") or None,
                   schema_format=options.pop("schema_format", None) or env.get("NEXUS_OPENAI_SCHEMA_FORMAT")
                   or "json_object", **options)


@dataclass
class TextResult:
    """One non-streamed generation: text, finish_reason ("stop" | "length" | ...), token counts from the
    server's `usage` (0 when it sends none), seconds end to end."""

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    total_s: float


class OpenAIBackend:
    """A model served over HTTP. `model` is the served model's name (not a path); options: see OpenAIConfig."""

    name = "openai"
    capabilities = BACKENDS["openai"].capabilities
    tokenizer = None  # the server tokenizes; nothing local can count or splice its tokens

    def __init__(self, model: str | None = None, **options):
        self.config = OpenAIConfig.from_env(model, **options)
        if self.config.model is None:
            self.config.model = self._first_model()
        fp = hashlib.sha256(f"{self.config.base_url}|{self.config.model}".encode()).hexdigest()[:16]
        # The shape fields are unknown over HTTP (0): nothing text-only reads them.
        self.info = ModelInfo(path=f"{self.config.base_url}#{self.config.model}", format="openai", fingerprint=fp,
                              architecture="remote", n_layers=0, n_heads=0, n_kv_heads=0, head_dim=0, d_model=0,
                              vocab_size=0, n_ctx_train=0, rope_base=0.0, rope_traditional=False, rms_eps=0.0)

    # -- HTTP -------------------------------------------------------------------------------------------------
    def _request(self, path: str, body: dict | None = None):
        url = f"{self.config.base_url}{path}"
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, headers=headers, method="GET" if body is None else "POST")
        try:
            return urllib.request.urlopen(req, timeout=self.config.timeout_s)
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")[:500]
            raise BackendError(f"{url} answered HTTP {e.code}: {detail}") from e
        except (urllib.error.URLError, OSError) as e:
            raise BackendError(f"cannot reach the OpenAI-compatible server at {url} ({e}); start it, or set "
                               "--base-url / NEXUS_OPENAI_BASE_URL to where it listens") from e

    def _first_model(self) -> str:
        with self._request("/models") as r:
            models = json.load(r).get("data") or []
        if not models:
            raise BackendError(f"{self.config.base_url}/models lists no model; set NEXUS_OPENAI_MODEL")
        return str(models[0]["id"])

    def _body(self, max_tokens: int, sampler: SamplerConfig | None, schema: dict | None) -> dict:
        s = sampler or SamplerConfig()
        body = {"model": self.config.model, "max_tokens": int(max_tokens), "temperature": s.temperature,
                "top_p": s.top_p}
        if s.seed is not None:
            body["seed"] = s.seed
        if schema is not None and self.config.schema_format == "json_object":
            body["response_format"] = {"type": "json_object", "schema": schema}
        elif schema is not None and self.config.schema_format == "json_schema":
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "arguments", "schema": schema, "strict": True}}
        return body

    def _stream(self, path: str, body: dict) -> Iterator[tuple[str, str | None, dict]]:
        """(text piece, finish_reason, usage) per server-sent event until `data: [DONE]`."""
        with self._request(path, {**body, "stream": True}) as r:
            for raw in r:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue  # blank separators, comments, event names
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if "error" in event:
                    raise BackendError(f"{self.config.base_url}{path} streamed an error: {event['error']}")
                choice = (event.get("choices") or [{}])[0]
                piece = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
                yield piece or "", choice.get("finish_reason"), event.get("usage") or {}

    # -- text API -------------------------------------------------------------------------------------------
    def stream_text(self, prompt: str | list[dict], max_tokens: int = 128, sampler: SamplerConfig | None = None,
                    schema: dict | None = None) -> Iterator[GenerationResponse]:
        """Stream a completion of chat messages (`/v1/chat/completions`) or raw text (`/v1/completions`).

        GenerationResponse.token is -1 (the server sends text, not ids); generation_tokens counts streamed
        pieces until the server's `usage` says otherwise; ttft_s is seconds from the request to the first piece.
        """
        if isinstance(prompt, str):
            path, body = "/completions", {**self._body(max_tokens, sampler, schema), "prompt": prompt}
        elif isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
            path, body = "/chat/completions", {**self._body(max_tokens, sampler, schema), "messages": prompt}
        else:
            raise BackendError("the openai backend takes chat messages or text, not token ids: the server "
                               "tokenizes with its own vocabulary")
        t0 = time.perf_counter()
        t_first, n, finish, usage = None, 0, None, {}
        for piece, finish, u in self._stream(path, body):
            usage = u or usage
            if not piece and finish is None:
                continue  # role-only first delta
            now = time.perf_counter()
            t_first = t_first or now
            n += bool(piece)
            gen = now - t_first
            yield GenerationResponse(text=piece, token=-1, prompt_tokens=int(usage.get("prompt_tokens", 0)),
                                     generation_tokens=int(usage.get("completion_tokens", n)),
                                     prompt_tps=0.0, generation_tps=(n - 1) / gen if gen > 0 else 0.0,
                                     ttft_s=t_first - t0, finish_reason=finish)
            if finish:
                return

    def chat(self, messages: list[dict], max_tokens: int = 128, sampler: SamplerConfig | None = None,
             schema: dict | None = None) -> TextResult:
        """One non-streamed chat completion; `schema` constrains the reply on servers that support it."""
        t0 = time.perf_counter()
        body = {**self._body(max_tokens, sampler, schema), "messages": messages}
        with self._request("/chat/completions", body) as r:
            out = json.load(r)
        choice = (out.get("choices") or [{}])[0]
        usage = out.get("usage") or {}
        return TextResult((choice.get("message") or {}).get("content") or "", choice.get("finish_reason"),
                          int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)),
                          time.perf_counter() - t0)

    def complete(self, prompt: str, max_tokens: int = 128, sampler: SamplerConfig | None = None) -> TextResult:
        """One non-streamed raw-text completion (`/v1/completions`, no chat template)."""
        t0 = time.perf_counter()
        with self._request("/completions", {**self._body(max_tokens, sampler, None), "prompt": prompt}) as r:
            out = json.load(r)
        choice = (out.get("choices") or [{}])[0]
        usage = out.get("usage") or {}
        return TextResult(choice.get("text") or "", choice.get("finish_reason"), int(usage.get("prompt_tokens", 0)),
                          int(usage.get("completion_tokens", 0)), time.perf_counter() - t0)

    # -- the KV protocol does not apply -------------------------------------------------------------------------
    def new_session(self, n_ctx: int | None = None):
        raise BackendError("the openai backend is text only (capabilities.text_only): the server owns the KV "
                           "cache, so there is no session to prefill, decode, splice or evict; use "
                           f"chat()/complete()/stream_text(), or a local backend (--backend "
                           f"{'|'.join(list_backends(text_only=False))})")

    def close(self) -> None:
        """Nothing is held open between requests."""
