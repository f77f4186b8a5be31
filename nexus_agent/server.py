"""`nexus serve`: an OpenAI-compatible HTTP server (Starlette + uvicorn) over the Nexus agent.

Routes: `GET /v1/models`, `POST /v1/chat/completions` (non-streamed, or server-sent events with `stream: true`),
`GET /health` and `GET /v1/nexus/stats` (requests running and queued, contexts, caches). The wire format is
`nexus_agent.openai_api`; the model side is `nexus_agent.serve_engine.Engine`.

The model is one resource. Every accepted request becomes a `Job`; jobs take an asyncio lock in arrival order
and run on one worker thread (so the model, its contexts and the caches are only ever touched from that
thread), sending their events back through an asyncio queue. A client that disconnects sets its job's cancel
flag: generation stops at the next token, the lock passes to the next job. A streamed reply starts (HTTP 200)
only once its job is accepted, so every request error keeps its status; an error after that arrives as an
SSE `data: {"error": ...}` event. Bodies beyond `max_body_bytes` get 413; `--api-key` requires
`Authorization: Bearer KEY` on /v1 routes (401 otherwise).

Every request gets an answer: the queue has no limit (a waiting request whose client leaves is dropped within
POLL_S), an exception inside one request is that request's 500 (`failed` in the stats) and the worker goes on,
and a model's miss is not an exception at all: the engine answers in text naming the missing value
(`nexus_agent.arguments.decoder`). Tool-call arguments and text reach the client as the engine decodes them
(events `tool_call`, `arguments`, `content`); which arguments may stream live is the decoder's rule.

Between requests the worker compiles the schema blocks of the tool lists it has seen (`Engine.idle_step`, about
64 tokens of one tool's prefill at a time, under the same lock: a request that arrives waits at most that
long), so the candidates of later requests splice instead of prefilling their schemas as text.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from native.base import TemplateRefusal
from nexus_agent.openai_api import ApiError, ToolCache, bad, chunk, completion, new_id, now, parse_request
from nexus_agent.serve_engine import Engine, EngineConfig

log = logging.getLogger("nexus.serve")
DRAIN_BYTES = 64 << 20  # an oversized body is read this far before the 413, then dropped
POLL_S = 0.25  # how often a waiting request checks that its client is still there
IDLE_AFTER_S = 0.5  # idle work starts after this long without a request (an agent's tool call is often quicker)


@dataclass
class ServeConfig:
    """host/port: where to listen (127.0.0.1 by default: not reachable from other machines); api_key: required
    as a Bearer token when set; max_body_bytes: larger request bodies get HTTP 413."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_body_bytes: int = 8 << 20
    log_level: str = "warning"
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self):
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0-65535, got {self.port}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")


class Job:
    """One request in flight: its events (from the worker thread) and its cancel flag (from the client side)."""

    def __init__(self, req, loop: asyncio.AbstractEventLoop):
        self.req, self.loop = req, loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancel = threading.Event()

    def emit(self, event: tuple) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class Scheduler:
    """The lock in front of the model, the worker thread behind it, and the counts /v1/nexus/stats shows."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.lock = asyncio.Lock()
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="nexus-model")
        self.jobs = self.queued = self.active = 0
        self.requests = self.cancelled = self.failed = 0
        self.idle: asyncio.Task | None = None

    def submit(self, req) -> Job:
        job = Job(req, asyncio.get_running_loop())
        self.jobs += 1
        self.requests += 1
        asyncio.get_running_loop().create_task(self._run(job))
        return job

    async def _run(self, job: Job) -> None:
        self.queued += 1
        queued = True
        try:
            async with self.lock:
                self.queued, queued = self.queued - 1, False
                if job.cancel.is_set():
                    self.cancelled += 1
                    return
                self.active += 1
                try:
                    await asyncio.get_running_loop().run_in_executor(self.worker, self._work, job)
                finally:
                    self.active -= 1
                    self.cancelled += job.cancel.is_set()
        finally:
            self.queued -= queued
            self.jobs -= 1
            job.events.put_nowait(("end",))
            self.kick()

    def kick(self) -> None:
        """Start the idle work unless it runs already."""
        if self.idle is None or self.idle.done():
            self.idle = asyncio.get_running_loop().create_task(self._idle())

    async def _idle(self) -> None:
        """Idle work one step at a time while no request is waiting or running."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(IDLE_AFTER_S)
        more = True
        while more and not self.jobs:
            async with self.lock:
                if self.jobs:  # a request came while this waited for the lock: it goes first
                    return
                try:
                    more = await loop.run_in_executor(self.worker, self.engine.idle_step, lambda: self.jobs > 0)
                except Exception:  # idle work must never take the server down
                    log.exception("idle work failed")
                    return

    def _work(self, job: Job) -> None:
        try:
            self.engine.run(job.req, job.emit, job.cancel.is_set)
        except ApiError as e:
            self.failed += e.status >= 500
            job.emit(("error", e))
        except TemplateRefusal as e:  # the request, not the server: this model cannot be given such a conversation
            job.emit(("error", ApiError(400, str(e), "invalid_request_error", "messages")))
        except Exception as e:  # a bug or a backend failure: the client gets a 500, the server keeps serving
            log.exception("request failed")
            self.failed += 1
            job.emit(("error", ApiError(500, f"internal error: {type(e).__name__}: {e}", "server_error")))

    def stats(self) -> dict:
        return {"jobs": self.jobs, "active": self.active, "queued": self.queued, "requests": self.requests,
                "cancelled": self.cancelled, "failed": self.failed, **self.engine.stats()}

    def close(self) -> None:
        if self.idle is not None:
            self.idle.cancel()
        self.worker.shutdown(wait=True)


def error_response(e: ApiError):
    from starlette.responses import JSONResponse

    return JSONResponse(e.body(), status_code=e.status)


async def _read_body(request, limit: int) -> bytes:
    """The body, or ApiError 413 beyond `limit` bytes. An oversized body is read to its end (kept: nothing) up to
    DRAIN_BYTES, so that a client still sending it gets the 413 instead of a broken pipe."""
    body, size = bytearray(), 0
    async for part in request.stream():
        size += len(part)
        if size <= limit:
            body += part
        elif size > DRAIN_BYTES:
            break
    if size > limit:
        raise ApiError(413, f"the request body exceeds {limit} bytes, the most this server accepts "
                            "(nexus serve --max-body-mb)", code="request_too_large")
    return bytes(body)


async def _next(job: Job, request) -> tuple | None:
    """The job's next event; None (and the job cancelled) when the client disconnects while waiting."""
    while True:
        try:
            return await asyncio.wait_for(job.events.get(), POLL_S)
        except TimeoutError:
            if await request.is_disconnected():
                job.cancel.set()
                return None


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def create_app(engine: Engine, config: ServeConfig):
    """The Starlette app over a loaded engine (tests and `serve` both use it)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    from nexus_agent.openai_api import usage as usage_of

    cache = ToolCache()
    parser = ThreadPoolExecutor(1, thread_name_prefix="nexus-parse")  # tool validation off the event loop
    model_ids = {engine.model_id}
    state: dict = {}

    class EventStream(StreamingResponse):
        """SSE that watches for the client's disconnect on any ASGI version and always closes its iterator (the
        iterator's `finally` cancels the job)."""

        async def __call__(self, scope, receive, send):
            import anyio

            try:
                async with anyio.create_task_group() as tg:
                    async def stream():
                        try:
                            await self.stream_response(send)
                        except OSError:
                            pass
                        tg.cancel_scope.cancel()

                    tg.start_soon(stream)
                    await self.listen_for_disconnect(receive)
                    tg.cancel_scope.cancel()
            finally:
                await self.body_iterator.aclose()

    def authorized(request) -> bool:
        if not config.api_key or not request.url.path.startswith("/v1"):
            return True
        got = request.headers.get("authorization", "")
        return hmac.compare_digest(got.encode(), f"Bearer {config.api_key}".encode())

    def unauthorized():
        return error_response(ApiError(401, "missing or incorrect API key: send Authorization: Bearer KEY",
                                       code="invalid_api_key"))

    async def models(request):
        if not authorized(request):
            return unauthorized()
        return JSONResponse({"object": "list", "data": [
            {"id": m, "object": "model", "created": state["started"], "owned_by": "nexus"} for m in model_ids]})

    async def stats(request):
        if not authorized(request):  # /health is open; /v1/nexus/stats needs the key like every /v1 route
            return unauthorized()
        return JSONResponse({"status": "ok", "model": engine.model_id, **scheduler().stats()})

    def scheduler() -> Scheduler:
        if "scheduler" not in state:  # created inside the running loop (its lock belongs to that loop)
            state["scheduler"] = Scheduler(engine)
        return state["scheduler"]

    async def chat(request):
        if not authorized(request):
            return unauthorized()
        try:
            raw = await _read_body(request, config.max_body_bytes)
            try:
                body = json.loads(raw)
            except ValueError as e:
                raise bad(f"the request body is not valid JSON: {e}", code="invalid_json") from None
            loop = asyncio.get_running_loop()
            req = await loop.run_in_executor(parser, parse_request, body, model_ids, cache)
        except ApiError as e:
            return error_response(e)
        job = scheduler().submit(req)
        first = await _next(job, request)
        if first is None or first[0] == "end":
            return JSONResponse({}, status_code=499)  # the client is gone; nobody reads this
        if first[0] == "error":
            return error_response(first[1])
        cid, created = new_id("chatcmpl-"), now()
        if req.stream:
            return EventStream(_stream(job, req, cid, created), media_type="text/event-stream",
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        content, calls, finish, use = [], {}, "stop", usage_of(0, 0)
        while (ev := await _next(job, request)) is not None and ev[0] != "end":
            if ev[0] == "error":
                return error_response(ev[1])
            if ev[0] == "content":
                content.append(ev[1])
            elif ev[0] == "tool_call":
                calls[ev[1]] = {"id": ev[2], "type": "function", "function": {"name": ev[3], "arguments": ""}}
            elif ev[0] == "arguments":
                calls[ev[1]]["function"]["arguments"] += ev[2]
            elif ev[0] == "finish":
                finish, use = ev[1], ev[2]
        text = "".join(content) if not calls else None
        return JSONResponse(completion(cid, req.model, created, text, list(calls.values()), finish, use))

    async def _stream(job: Job, req, cid: str, created: int):
        def out(delta, finish=None):
            return _sse(chunk(cid, req.model, created, delta, finish, None, req.include_usage))

        try:
            yield out({"role": "assistant", "content": ""})
            while True:
                ev = await job.events.get()
                if ev[0] == "content":
                    yield out({"content": ev[1]})
                elif ev[0] == "tool_call":
                    yield out({"tool_calls": [{"index": ev[1], "id": ev[2], "type": "function",
                                               "function": {"name": ev[3], "arguments": ""}}]})
                elif ev[0] == "arguments":
                    yield out({"tool_calls": [{"index": ev[1], "function": {"arguments": ev[2]}}]})
                elif ev[0] == "finish":
                    yield out({}, ev[1])
                    if req.include_usage:
                        yield _sse(chunk(cid, req.model, created, None, None, ev[2], True))
                elif ev[0] == "error":
                    yield _sse(ev[1].body())
                elif ev[0] == "end":
                    break
            yield "data: [DONE]\n\n"
        finally:
            job.cancel.set()  # a no-op after the end; on a disconnect it stops the generation

    async def not_found(request, exc):
        status = getattr(exc, "status_code", 404)
        return error_response(ApiError(status, f"{request.method} {request.url.path}: "
                                               f"{'no such route' if status == 404 else exc.detail}",
                                       code="not_found" if status == 404 else None))

    async def startup():
        state["started"] = now()
        scheduler()

    async def shutdown():
        if "scheduler" in state:
            state["scheduler"].close()
        parser.shutdown(wait=False)

    routes = [Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/health", stats), Route("/v1/nexus/stats", stats)]
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        await startup()
        yield
        await shutdown()

    return Starlette(routes=routes, exception_handlers={HTTPException: not_found}, lifespan=lifespan)


def serve(config: ServeConfig) -> int:
    """Load the model, listen until interrupted, then close everything."""
    import uvicorn

    engine = Engine(config.engine)
    try:
        app = create_app(engine, config)
        print(f"nexus serve: {engine.model_id} on http://{config.host}:{config.port}/v1", file=sys.stderr, flush=True)
        uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level)
    finally:
        engine.close()
    return 0
