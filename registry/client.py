"""A client for MCP servers: connect to one (a stdio command or a remote URL), list its tools, call them.

`ToolClient` is the async form (an async context manager over the SDK's transport client + `ClientSession`);
`SyncToolClient` runs one in a background event loop for synchronous callers such as the agent loop;
`list_server_tools` is the one-shot form used by registration. Every network-shaped step has a timeout in
seconds, and a server that exits, refuses the connection or never answers becomes a `ServerError` quoting a
stdio server's last stderr lines (its stderr goes to a temporary file while it runs, so a server that dies at
start, e.g. on an import error, says why). How a server is reached lives in registry.transports.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Any

from registry.transports import PASSED_ENV, RemoteServer, ServerCommand, ServerSpec

__all__ = ["PASSED_ENV", "CallResult", "RemoteServer", "ServerCommand", "ServerError", "ServerSpec", "ToolClient",
           "SyncToolClient", "list_server_tools"]

DEFAULT_TIMEOUT_S = 20.0
STDERR_LINES = 10  # a stdio server's last non-blank stderr lines quoted in its ServerError ...
STDERR_LINE_CHARS = 240  # ... each cut to this many characters (indentation kept: a traceback stays readable)
STDERR_TAIL_BYTES = 64 * 1024  # read from the end of its stderr file (a long-running server may have logged a lot)


class ServerError(RuntimeError):
    """An MCP server could not be started, did not answer in time, or broke the protocol. `stderr`: a stdio
    server's last stderr lines (trimmed, at most STDERR_LINES; empty when it wrote none), quoted in the message."""

    def __init__(self, message: str, stderr: list[str] | None = None):
        self.stderr = list(stderr or [])
        quoted = "".join(f"\n    {line}" for line in self.stderr)
        super().__init__(f"{message}\n  server stderr (last lines):{quoted}" if self.stderr else message)

    def brief(self) -> str:
        """One line for a table or a model's observation: the reason, and the last stderr line if any."""
        first = str(self).splitlines()[0]
        return f"{first} (server stderr: {self.stderr[-1]})" if self.stderr else first


@dataclass
class CallResult:
    """A tool call's outcome: text content joined, structured content if any, and the server's error flag."""

    text: str
    structured: Any = None
    is_error: bool = False


class ToolClient:
    """`async with ToolClient(spec) as c: await c.list_tools(); await c.call_tool(name, args)`; `spec` is a
    ServerCommand, a RemoteServer or a stdio command line."""

    def __init__(self, command: ServerSpec | str, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.command = ServerCommand.parse(command) if isinstance(command, str) else command
        if isinstance(self.command, RemoteServer):  # its HTTP connect timeout is ours
            self.command = RemoteServer(self.command.url, self.command.transport, self.command.headers, timeout_s)
        self.timeout_s = timeout_s
        self.server_name: str | None = None
        self._stack = None
        self._session = None
        self._errlog = None
        self._closing = None

    async def __aenter__(self) -> "ToolClient":
        from contextlib import AsyncExitStack

        import anyio

        self._errlog = tempfile.TemporaryFile()  # the server's stderr (its file descriptor, written directly)
        self._stack = AsyncExitStack()
        try:
            # The transport and the session run in a task of our own task group, so the timeout covers every
            # step of the start (an SSE server's stream opens on connect, the others answer `initialize`)
            # and a start that times out cancels that task without unbalancing the transports' task groups.
            tg = await self._stack.enter_async_context(anyio.create_task_group())
            self._closing = anyio.Event()
            self._stack.callback(self._closing.set)  # runs first on close: the task leaves its contexts
            with anyio.fail_after(self.timeout_s):
                self._session, init = await tg.start(self._run)
        except BaseException as e:
            await self._abort()
            raise self._error("start", e) from e
        self.server_name = init.server_info.name
        return self

    async def _run(self, task_status) -> None:
        from mcp import ClientSession

        async with self.command.connect(self._errlog) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                task_status.started((session, init))
                await self._closing.wait()

    async def __aexit__(self, *exc) -> None:
        await self._abort()

    async def _abort(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            try:
                await stack.aclose()
            except Exception:
                pass  # the server is already gone; nothing to clean up that we can act on

    def _error(self, what: str, e: BaseException) -> ServerError:
        if isinstance(e, TimeoutError):
            reason = f"no answer within {self.timeout_s:g} s (raise --timeout if the server is just slow)"
        else:
            reason = _reason(e)
        stderr = stderr_tail(self._errlog) if self._errlog is not None else []
        return ServerError(f"MCP server {self.command.describe()} failed to {what}: {reason}", stderr)

    async def list_tools(self, page_limit: int = 1000) -> list[dict[str, Any]]:
        """All tools as MCP JSON dicts (camelCase), following `nextCursor` pages."""
        import anyio
        import mcp_types as types

        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        try:
            with anyio.fail_after(self.timeout_s):
                for _ in range(page_limit):
                    params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
                    result = await self._session.list_tools(params=params)
                    tools += [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in result.tools]
                    cursor = result.next_cursor
                    if not cursor:
                        return tools
        except Exception as e:
            raise self._error("list its tools", e) from e
        raise self._error("list its tools", RuntimeError(f"more than {page_limit} pages"))

    async def call_tool(self, name: str, arguments: dict[str, Any], timeout_s: float | None = None) -> CallResult:
        """Call tool `name`; a tool-level failure comes back as `is_error=True`, a transport failure raises."""
        import anyio

        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            with anyio.fail_after(timeout):
                result = await self._session.call_tool(name, arguments)
        except Exception as e:
            raise self._error(f"answer a call to {name!r}", e) from e
        text = "\n".join(getattr(c, "text", "") for c in result.content)
        return CallResult(text=text, structured=result.structured_content, is_error=bool(result.is_error))


def stderr_tail(errlog, lines: int = STDERR_LINES) -> list[str]:
    """The last `lines` non-blank lines of a binary stderr file, each right-stripped and cut to STDERR_LINE_CHARS."""
    errlog.flush()
    size = errlog.seek(0, 2)
    errlog.seek(max(0, size - STDERR_TAIL_BYTES))
    text = errlog.read().decode("utf-8", errors="replace").splitlines()
    if size > STDERR_TAIL_BYTES:
        text = text[1:]  # the first line read may be cut
    kept = [line.rstrip() for line in text if line.strip()][-lines:]
    return [line if len(line) <= STDERR_LINE_CHARS else line[: STDERR_LINE_CHARS - 1] + "…" for line in kept]


def _reason(e: BaseException) -> str:
    """One line for an exception; an exception group (the transports' task groups) by its first leaf."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}"


def list_server_tools(command: ServerSpec | str, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[str, list[dict]]:
    """Start the server, list all its tools, stop it. Returns (server name from its handshake, tools)."""
    import anyio

    async def run():
        async with ToolClient(command, timeout_s) as client:
            return client.server_name, await client.list_tools()

    return anyio.run(run)


class SyncToolClient:
    """A blocking facade over ToolClient (its event loop lives in a background thread). Close it, or use it
    as a context manager; `close()` is idempotent."""

    def __init__(self, command: ServerSpec | str, timeout_s: float = DEFAULT_TIMEOUT_S):
        from anyio.from_thread import start_blocking_portal

        self._portal_cm = start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        self._client_cm = self._portal.wrap_async_context_manager(ToolClient(command, timeout_s))
        try:
            self.client: ToolClient = self._client_cm.__enter__()
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise

    def list_tools(self) -> list[dict[str, Any]]:
        return self._portal.call(self.client.list_tools)

    def call_tool(self, name: str, arguments: dict[str, Any], timeout_s: float | None = None) -> CallResult:
        return self._portal.call(self.client.call_tool, name, arguments, timeout_s)

    def close(self) -> None:
        if self._portal_cm is not None:
            try:
                self._client_cm.__exit__(None, None, None)
            finally:
                self._portal_cm.__exit__(None, None, None)
                self._portal_cm = None

    def __enter__(self) -> "SyncToolClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
