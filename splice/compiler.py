"""Compile tool-schema segments into KV block files: prefill at the anchor (after the system prompt), export.

One file per (backend, model fingerprint, tool, schema hash): `blocks/<fp>/<backend>/<tool>@<hash16>.kvb`.
The preamble is prefilled once per run and every tool's segment is compiled right after it (anchor m0 =
preamble length), so each block's hidden states saw the attention sink and the system text (DESIGN section 6).
Incremental through the registry's staleness API (artefact kind `kv_block:<backend>`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from tqdm import tqdm

from nexus_agent.home import home_path
from registry.model import Tool
from splice.block import BlockKey, write_block
from splice.prompt import DEFAULT_SYSTEM, preamble_tokens, segment_tokens, tokens_hash


def artefact_kind(backend) -> str:
    return f"kv_block:{backend.name}"


def block_key(backend, tool: Tool) -> BlockKey:
    return BlockKey(backend=backend.name, fingerprint=backend.info.fingerprint, tokenizer=backend.tokenizer.digest,
                    tool=tool.name, schema_hash=tool.schema_hash)


def block_path(backend, tool: Tool, root: Path | None = None) -> Path:
    """Where the block of `tool` for this backend and model lives (under NEXUS_HOME/blocks unless `root`)."""
    name = f"{tool.name}@{tool.schema_hash[:16]}.kvb"
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


def header_for(backend, tool: Tool, anchor: int, preamble: list[int]) -> dict:
    i = backend.info
    return {
        **vars(block_key(backend, tool)),
        "anchor": anchor, "preamble_hash": tokens_hash(preamble),
        "layout": {"n_layers": i.n_layers, "n_kv_heads": i.n_kv_heads, "head_dim": i.head_dim},
        "rope": {"type": "interleaved" if i.rope_traditional else "half-split", "base": i.rope_base, "scale": 1.0},
    }


def compile_blocks(backend, tools: Iterable[Tool], config: CompileConfig | None = None, progress: bool = True) -> list[Path]:
    """Compile one block per tool; returns the written paths in order. Raises ValueError for oversized tools."""
    config = config or CompileConfig()
    tools = list(tools)
    pre = preamble_tokens(backend.tokenizer, config.system)
    segs = [segment_tokens(backend.tokenizer, t) for t in tools]
    for t, s in zip(tools, segs):
        if len(s) > config.max_tokens:
            raise ValueError(f"tool {t.name}: schema segment is {len(s)} tokens > max_tokens={config.max_tokens}")
    longest = max((len(s) for s in segs), default=0)
    out = []
    if not tools:
        return out
    session = backend.new_session(n_ctx=len(pre) + longest + 16)
    try:
        session.prefill(pre)
        m0 = session.n_past
        for tool, seg in tqdm(list(zip(tools, segs)), desc="compile", unit="block", disable=not progress):
            session.prefill(seg)
            kv = session.export_kv(m0, m0 + len(seg))
            session.remove(m0, session.n_past)
            root = Path(config.root) if config.root else None
            out.append(write_block(block_path(backend, tool, root), header_for(backend, tool, m0, pre), kv))
    finally:
        session.close()
    return out


def compile_stale(backend, store, config: CompileConfig | None = None, names: list[str] | None = None,
                  force: bool = False, progress: bool = True) -> list[Path]:
    """Compile the registry's tools whose block is missing or stale (or all of `names`/all with `force`)."""
    kind = artefact_kind(backend)
    if names:
        tools = [store.get_tool(n) for n in names]
        missing = [n for n, t in zip(names, tools) if t is None]
        if missing:
            raise ValueError(f"not in the registry: {', '.join(missing)} (see `nexus tools list`)")
    else:
        stale = {t.name for t in store.stale_tools(kind)}
        tools = [t for t in store.list_tools() if force or t.name in stale
                 or not block_path(backend, t, Path(config.root) if config and config.root else None).exists()]
    if names and not force:
        stale = {t.name for t in store.stale_tools(kind)}
        tools = [t for t in tools if t.name in stale or not block_path(backend, t, config and config.root).exists()]
    paths = compile_blocks(backend, tools, config, progress)
    for tool in tools:
        store.mark_fresh(tool.name, kind, tool.schema_hash)
    return paths
