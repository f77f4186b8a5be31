"""Compile tool-schema segments into KV block files: prefill after the system prompt and a context, export.

One file per (backend, model fingerprint, tool, schema hash, context):
`blocks/<fp>/<backend>/<tool>@<hash16>.c<context>.kvb`. For each context c in `CONTEXTS` the preamble and c
tokens of a generic conversation (`splice.prompt.context_tokens`) are prefilled once per run and every tool's
segment is compiled right after them (anchor m0 = preamble length + c), so each block's hidden states saw the
attention sink, the system text (DESIGN section 6) and, for c > 0, a conversation like the one it is spliced
into at depth (the splicer picks the context per depth: `splice.prompt.context_for`).
Incremental through the registry's staleness API (artefact kind `kv_block:<backend>`) and the block headers.
Reference: Prompt Cache (precomputed attention states of prompt modules, reused at other positions).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from tqdm import tqdm

from registry.home import home_path
from registry.model import Tool
from splice.block import BlockError, BlockKey, read_header, write_block
from splice.prompt import CONTEXTS, DEFAULT_SYSTEM, context_tokens, preamble_tokens, segment_tokens, tokens_hash


def artefact_kind(backend) -> str:
    return f"kv_block:{backend.name}"


def block_key(backend, tool: Tool, context: int = 0) -> BlockKey:
    return BlockKey(backend=backend.name, fingerprint=backend.info.fingerprint, tokenizer=backend.tokenizer.digest,
                    tool=tool.name, schema_hash=tool.schema_hash, context=context)


def block_path(backend, tool: Tool, root: Path | None = None, context: int = 0) -> Path:
    """Where the block of `tool` compiled after `context` generic conversation tokens lives for this backend and
    model (under NEXUS_HOME/blocks unless `root`)."""
    name = f"{tool.name}@{tool.schema_hash[:16]}.c{context}.kvb"
    if root is not None:
        return Path(root) / backend.info.fingerprint / backend.name / name
    return home_path("blocks", backend.info.fingerprint, backend.name, name)


@dataclass
class CompileConfig:
    system: str = DEFAULT_SYSTEM  # the system prompt the blocks are anchored after
    max_tokens: int = 2048  # refuse segments longer than this (a schema that large belongs in text)
    root: str | None = None  # block folder (default: NEXUS_HOME/blocks)

    def __post_init__(self):
        if not self.system.strip():
            raise ValueError("CompileConfig.system must be the real system prompt, not empty")
        if self.max_tokens < 1:
            raise ValueError(f"CompileConfig.max_tokens must be >= 1, got {self.max_tokens}")


def header_for(backend, tool: Tool, anchor: int, preamble: list[int], context: list[int] = ()) -> dict:
    i = backend.info
    return {
        **vars(block_key(backend, tool, len(context))),
        "anchor": anchor, "preamble_hash": tokens_hash(preamble), "context_hash": tokens_hash(list(context)),
        "layout": {"n_layers": i.n_layers, "n_kv_heads": i.n_kv_heads, "head_dim": i.head_dim},
        "rope": {"type": "interleaved" if i.rope_traditional else "half-split", "base": i.rope_base, "scale": 1.0},
    }


def compile_blocks(backend, tools: Iterable[Tool], config: CompileConfig | None = None,
                   progress: bool = True) -> list[Path]:
    """Compile the blocks of each tool, one per context; returns the written paths (tool-major order).
    Raises ValueError for oversized tools."""
    config = config or CompileConfig()
    tools = list(tools)
    pre = preamble_tokens(backend.tokenizer, config.system)
    segs = [segment_tokens(backend.tokenizer, t) for t in tools]
    for t, s in zip(tools, segs):
        if len(s) > config.max_tokens:
            raise ValueError(f"tool {t.name}: schema segment is {len(s)} tokens > max_tokens={config.max_tokens}")
    if not tools:
        return []
    root = Path(config.root) if config.root else None
    session = backend.new_session(n_ctx=len(pre) + max(CONTEXTS) + max(len(s) for s in segs) + 16)
    written: dict[tuple[int, int], Path] = {}
    bar = tqdm(total=len(tools) * len(CONTEXTS), desc="compile", unit="block", disable=not progress)
    try:
        for c in CONTEXTS:
            ctx = context_tokens(backend.tokenizer, c)
            session.remove(0, session.n_past)
            session.prefill(pre + ctx)
            m0 = session.n_past
            for i, (tool, seg) in enumerate(zip(tools, segs)):
                session.prefill(seg)
                kv = session.export_kv(m0, m0 + len(seg))
                session.remove(m0, session.n_past)
                written[i, c] = write_block(block_path(backend, tool, root, c),
                                            header_for(backend, tool, m0, pre, ctx), kv)
                bar.update()
    finally:
        bar.close()
        session.close()
    return [written[i, c] for i in range(len(tools)) for c in CONTEXTS]


def blocks_current(backend, tool: Tool, config: CompileConfig | None = None) -> bool:
    """Whether every block of `tool` exists with a header matching the current key (format, model, tokenizer,
    schema, context). Reads headers only; the checksum is verified when a block is loaded."""
    root = Path(config.root) if config and config.root else None
    for c in CONTEXTS:
        path = block_path(backend, tool, root, c)
        try:
            header, _ = read_header(path)
        except BlockError:  # missing, unreadable or another format
            return False
        if any(header.get(k) != v for k, v in vars(block_key(backend, tool, c)).items()):
            return False
    return True


def compile_stale(backend, store, config: CompileConfig | None = None, names: list[str] | None = None,
                  force: bool = False, progress: bool = True) -> list[Path]:
    """Compile the registry's tools (or just `names`) whose blocks are stale in the registry, missing or
    outdated on disk; all of them with `force`."""
    kind = artefact_kind(backend)
    if names:
        tools = [store.get_tool(n) for n in names]
        missing = [n for n, t in zip(names, tools) if t is None]
        if missing:
            raise ValueError(f"not in the registry: {', '.join(missing)} (see `nexus tools list`)")
    else:
        tools = store.list_tools()
    if not force:
        stale = {t.name for t in store.stale_tools(kind)}
        tools = [t for t in tools if t.name in stale or not blocks_current(backend, t, config)]
    paths = compile_blocks(backend, tools, config, progress)
    for tool in tools:
        store.mark_fresh(tool.name, kind, tool.schema_hash)
    return paths
