"""A real `nexus serve` subprocess on a free 127.0.0.1 port over the packaged SmolLM2 and MiniLM, started once per
test session (with an API key and a 1 MB body limit) and stopped by its PID; `qwen_serve_url` is one over the
packaged tool-trained Qwen2.5-Coder-0.5B, shared by the decision and agent-framework tests;
`serve_helpers.running_serve` starts others."""

from __future__ import annotations

import pytest
from serve_helpers import API_KEY, running_serve


@pytest.fixture(scope="session")
def serve_url(tmp_path_factory):
    """The server's root URL, e.g. http://127.0.0.1:PORT (its API is under /v1)."""
    with running_serve(tmp_path_factory.mktemp("serve-home"), "--max-body-mb", "1", "--n-ctx", "4096") as url:
        yield url


@pytest.fixture(scope="session")
def client(serve_url):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{serve_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)




@pytest.fixture(scope="session")
def qwen_serve_url(tmp_path_factory, qwen_gguf):
    """Root URL of a `nexus serve` over Qwen2.5-Coder-0.5B with an 8k context, started once per session. Without
    compiling between requests: a 250-tool list would keep a core busy for minutes under the other tests
    (`test_idle_blocks` runs a server that does)."""
    with running_serve(tmp_path_factory.mktemp("qwen-serve"), "--model", qwen_gguf, "--n-ctx", "8192",
                       "--no-idle-compile") as url:
        yield url
