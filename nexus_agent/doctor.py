"""`nexus doctor`: check each piece the agent needs and say what to do when one is missing."""

from __future__ import annotations


def run_checks(backend_name: str = "llamacpp") -> list[tuple[str, bool, str]]:
    """(check, passed, detail) for: model, llguidance, registry, router buffer, each server's start."""
    out: list[tuple[str, bool, str]] = []
    try:
        from native import load_backend

        backend = load_backend(backend_name)
        out.append(("model", True, f"{backend.info.path} on {backend_name}"))
    except Exception as e:
        return out + [("model", False, f"{e}")]
    try:
        from nexus_agent.constrained import generate_json, ll_tokenizer

        ll_tokenizer(backend.tokenizer)
        s = backend.new_session(512)
        r = generate_json(s, backend.tokenizer.encode("x="), {"type": "object", "properties": {"n": {"type": "integer"}},
                                                              "required": ["n"]}, backend.tokenizer, 16)
        s.close()
        out.append(("llguidance", r.complete, f"constrained sample {r.text!r}"))
    except Exception as e:
        out.append(("llguidance", False, f"{e} (pip install llguidance)"))
    from registry.store import RegistryStore

    store = RegistryStore()
    n = store.tool_count()
    out.append(("registry", n > 0, f"{n} tools in {store.path}" + ("" if n else "; run `nexus register --bundled calculator`")))
    if n:
        from registry.client import ServerCommand, list_server_tools

        for srv in store.list_servers():
            try:
                name, tools = list_server_tools(ServerCommand.parse(srv.command, srv.cwd), 20)
                out.append((f"server {srv.name}", True, f"{len(tools)} tools"))
            except Exception as e:
                out.append((f"server {srv.name}", False, str(e).splitlines()[0]))
    return out
