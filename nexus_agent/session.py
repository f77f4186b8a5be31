"""Open an agent over the registry in the Nexus home: backend, router (SLB, rebuilt when stale), servers.

This is the library entry point `nexus run` / `nexus chat` call; tests and evals call it directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from nexus_agent.loop import Agent, AgentConfig
from nexus_agent.memory import MemoryConfig
from nexus_agent.servers import ServerPool, ServerPoolConfig
from nexus_agent.trace import Trace


@dataclass
class SessionConfig:
    """backend: llamacpp | mlx | openai (an HTTP server configured by NEXUS_OPENAI_*); model: a GGUF/MLX path
    (None: the packaged SmolLM2; openai: the served model name); route_mode: gate | embed | rerank (slb.router);
    trace_path: JSONL trace file (None: in memory only)."""

    backend: str = "llamacpp"
    model: str | None = None
    route_mode: str = "gate"
    trace_path: str | None = None
    chat_template: str | None = None  # a Jinja file's path or text rendered instead of the model's own

    def __post_init__(self):
        if self.route_mode not in ("gate", "embed", "rerank"):
            raise ValueError(f"unknown route mode {self.route_mode!r}; choose gate, embed or rerank")


def ensure_router(store, mode: str = "gate", log=None):
    """A Router over the home SLB buffer, (re)built first (incrementally) when a registered tool is not embedded
    yet or examples were added since the last build. `log(line)`: told what a build embedded and how long it took."""
    import time

    from slb.service import FRESH_KIND, buffer_is_current, build, open_router

    def rebuild():
        t0 = time.perf_counter()
        r = build(store)
        if log is not None:
            log(f"{r.count} tools: {r.embedded} embedded, {r.from_store} from the embedding store, {r.reused} "
                f"reused from the buffer, {time.perf_counter() - t0:.2f} s")

    if store.stale_tools(FRESH_KIND) or not buffer_is_current(store):  # new tools, or examples learned since
        rebuild()
    try:
        return open_router(mode)
    except (ValueError, FileNotFoundError):  # buffer missing or naming removed tools: rebuild once
        rebuild()
        return open_router(mode)


def open_agent(session: SessionConfig | None = None, agent: AgentConfig | None = None,
               memory: MemoryConfig | None = None, servers: ServerPoolConfig | None = None,
               on_text=None, on_event=None, store=None, backend=None) -> Agent:
    """An Agent over the registered tools; close it with `.close()` (stops its servers)."""
    from native import load_backend
    from registry.store import RegistryStore

    session = session or SessionConfig()
    store = store or RegistryStore()
    tools = {t.name: t for t in store.list_tools()}
    if not tools:
        raise ValueError("no tools are registered: run `nexus register --bundled calculator` (or --server CMD) first")
    router = ensure_router(store, session.route_mode)
    pool = ServerPool.from_store(store, servers)
    backend = backend or load_backend(session.backend, session.model, chat_template=session.chat_template)
    trace = Trace(session.trace_path, on_event)
    from slb.learn import ExampleLearner, LearnConfig

    learner = ExampleLearner(store, LearnConfig.from_env())  # opt out: NEXUS_LEARN=0
    return Agent(backend, router, tools, pool, agent, memory, trace, on_text,
                 on_confirmed=learner.confirm if learner.config.enabled else None)
