"""Real agent frameworks through `nexus serve` over the packaged Qwen2.5-Coder-0.5B, each on the real time and git
MCP servers from PyPI: pydantic-ai's `Agent` with the toolsets `load_mcp_toolsets` reads from an `mcpServers`
file (it prefixes each tool with its server's name: `time_get_current_time`, `git_git_log`), and the OpenAI
Agents SDK's `Agent` with `MCPServerStdio` servers and server names in the tool names (`mcp_git__git_log`).
A two-step task each (the time in Tokyo, then a repository's last commits), checked on the calls the framework
made, read from its own run result (each once, with the request's values), and on the run ending within 4
requests (a repeated call used to loop) in a text answer that reports the results: it names Tokyo and one of
the repository's last commits (hash or message), and is not a call written out as text (which the 0.5B wrote
under its template's tools section: `prompts.results_answer_messages`). Both frameworks send non-streaming requests
without parallel_tool_calls (pydantic-ai with tool_choice "auto", the SDK without one); the bodies are recorded
for the assertions."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from serve_helpers import API_KEY

# serial: under pytest-xdist the repository's path is longer (.../popen-gw0/frameworks0/repo) and the 0.5B's two-step
# decision changes with it (README, "Serving an agent"); `make test` runs these in one process after the rest
pytestmark = [pytest.mark.slow, pytest.mark.serial]

COMMITS = ["Add the frobnicator", "Teach the frobnicator to whistle", "Fix the whistle pitch"]
SERVERS = {"time": [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"],
           "git": [sys.executable, "-m", "mcp_server_git"]}
MAX_REQUESTS = 4  # the calls, the answer, and one request to spare: a run that loops on its calls fails


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> str:
    """A git repository with three commits."""
    path = tmp_path_factory.mktemp("frameworks") / "repo"
    env = dict(os.environ, GIT_AUTHOR_NAME="Nexus", GIT_AUTHOR_EMAIL="nexus@example.org",
               GIT_COMMITTER_NAME="Nexus", GIT_COMMITTER_EMAIL="nexus@example.org")
    subprocess.run(["git", "init", "-q", str(path)], check=True, env=env)
    for i, message in enumerate(COMMITS):
        (path / f"note{i}.txt").write_text(message + "\n")
        subprocess.run(["git", "-C", str(path), "add", "."], check=True, env=env)
        subprocess.run(["git", "-C", str(path), "commit", "-qm", message], check=True, env=env)
    return str(path)


def last_commits(repo: str, n: int) -> list[str]:
    """The hashes and messages of the repository's `n` newest commits."""
    out = subprocess.run(["git", "-C", repo, "log", f"-{n}", "--format=%H%n%s"], check=True, capture_output=True,
                         text=True).stdout
    return [line for line in out.splitlines() if line]


@pytest.fixture()
def recorded(qwen_serve_url):
    """(an AsyncOpenAI client on the Qwen server, the chat-completions bodies it sent)."""
    openai = pytest.importorskip("openai")
    import httpx2

    bodies: list[dict] = []

    async def record(request):
        if request.url.path.endswith("/chat/completions"):
            bodies.append(json.loads(request.content))

    http = httpx2.AsyncClient(event_hooks={"request": [record]}, timeout=600)
    return openai.AsyncOpenAI(base_url=f"{qwen_serve_url}/v1", api_key=API_KEY, max_retries=0, timeout=600,
                              http_client=http), bodies


async def first_model(client) -> str:
    return (await client.models.list()).data[0].id


def task(repo: str, n: int) -> str:  # the path ends the request: a period after it was copied into repo_path
    return (f"What time is it in Tokyo (Asia/Tokyo) right now? Then show the last {n} commits of the repository at "
            f"{repo}")


def check_run(calls: list[tuple[str, dict]], bodies: list[dict], answer: str, prefix: str, repo: str, n: int):
    sent = [{k: v for k, v in b.items() if k not in ("messages", "tools")} for b in bodies]
    print(f"{len(bodies)} requests {sent}; calls: {calls}; answer: {answer!r}")  # shown by pytest -rA
    names = [name for name, _ in calls]
    assert (f"{prefix('time')}get_current_time", {"timezone": "Asia/Tokyo"}) in calls, calls
    logs = [args for name, args in calls if name == f"{prefix('git')}git_log"]
    assert logs and logs[0]["repo_path"] == repo and logs[0].get("max_count") == n, calls
    assert len(names) == len(set(names)), f"a call was repeated: {calls}"
    assert len(bodies) <= MAX_REQUESTS, f"{len(bodies)} requests: {calls}"
    assert all(not b.get("stream") and b.get("tool_choice", "auto") == "auto" for b in bodies)
    assert "Tokyo" in answer and any(c in answer or c[:7] in answer for c in last_commits(repo, n)), answer
    assert '"name"' not in answer and "Calling " not in answer and "<tool_" not in answer, answer


def test_pydantic_ai_agent_with_toolsets_from_an_mcp_servers_file(recorded, repo, tmp_path):
    pytest.importorskip("pydantic_ai")
    pytest.importorskip("mcp_server_time")
    from pydantic_ai import Agent
    from pydantic_ai.mcp import load_mcp_toolsets
    from pydantic_ai.messages import ToolCallPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    client, bodies = recorded
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {name: {"command": argv[0], "args": argv[1:]}
                                                 for name, argv in SERVERS.items()}}))

    async def run():  # one event loop for the client's connections
        agent = Agent(OpenAIChatModel(await first_model(client), provider=OpenAIProvider(openai_client=client)),
                      toolsets=load_mcp_toolsets(config))
        async with agent:
            return await agent.run(task(repo, 3))

    result = asyncio.run(run())
    calls = [(p.tool_name, p.args_as_dict()) for m in result.all_messages() for p in m.parts
             if isinstance(p, ToolCallPart)]
    assert bodies[0]["tools"][0]["function"]["name"] == "time_get_current_time"  # pydantic-ai's own prefix
    check_run(calls, bodies, result.output, lambda server: f"{server}_", repo, 3)


def test_openai_agents_sdk_with_mcp_stdio_servers(recorded, repo):
    pytest.importorskip("agents")
    pytest.importorskip("mcp_server_time")
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from agents.items import ToolCallItem
    from agents.mcp import MCPServerStdio

    set_tracing_disabled(True)  # no trace export from a test
    client, bodies = recorded

    async def run():  # one event loop for the client's connections
        model_id = await first_model(client)
        params = {name: {"command": argv[0], "args": argv[1:]} for name, argv in SERVERS.items()}
        async with MCPServerStdio(params["time"], name="time") as time_server, \
                MCPServerStdio(params["git"], name="git", client_session_timeout_seconds=30) as git_server:
            agent = Agent(name="assistant", model=OpenAIChatCompletionsModel(model=model_id, openai_client=client),
                          mcp_servers=[time_server, git_server], mcp_config={"include_server_in_tool_names": True})
            return await Runner.run(agent, task(repo, 2))

    result = asyncio.run(run())
    calls = [(i.raw_item.name, json.loads(i.raw_item.arguments or "{}")) for i in result.new_items
             if isinstance(i, ToolCallItem)]
    assert bodies[0]["tools"][0]["function"]["name"] == "mcp_time__get_current_time"  # the SDK's prefix
    check_run(calls, bodies, str(result.final_output), lambda server: f"mcp_{server}__", repo, 2)
