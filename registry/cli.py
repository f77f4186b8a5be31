"""`nexus register` (a stdio server, a remote URL, an MCP client config file, a tool file or a bundled server),
`nexus tools list|show|remove|stats|examples`, `nexus servers list`: a thin layer over registry/.

Listing commands take `--json` (machine-readable, on stdout); otherwise they print rich tables.
"""

from __future__ import annotations

import json
import sys

# Checks that layers above the registry add to `nexus register` (e.g. slb: near-duplicate tools): each is called
# as check(store, report) after a registration and returns warning lines printed on stderr.
AFTER_REGISTER: list = []


def register(subparsers) -> None:
    p = subparsers.add_parser("register", help="register MCP tools from a server (stdio or remote), an MCP client "
                              "config file, a JSON/JSONL file or a bundled server")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--server", metavar="CMD",
                     help='stdio server command line, e.g. "python -m registry.servers.catalog"')
    src.add_argument("--url", metavar="URL", help="a remote server, e.g. http://127.0.0.1:8000/mcp")
    src.add_argument("--config", metavar="PATH", help="every server of an MCP client config file: "
                     "claude_desktop_config.json, .cursor/mcp.json, .mcp.json, .vscode/mcp.json")
    src.add_argument("--file", metavar="PATH", help="JSON or JSONL file of MCP tool objects")
    src.add_argument("--bundled", metavar="NAME",
                     help="a bundled server: calculator, clock, files, notes, units, catalog")
    p.add_argument("--name", help="server name to record (default: the name the server reports)")
    p.add_argument("--transport", choices=("http", "sse"), default="http",
                   help="--url only: streamable HTTP (default) or the legacy SSE transport")
    p.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="--url only: an HTTP header to send (repeatable); ${VAR} is read from the environment at "
                   "each connection and stored unexpanded")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="--server only: an environment variable the server starts with (repeatable); ${VAR} is read "
                   "from the environment at each start and stored unexpanded")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for the server (default 20)")
    p.add_argument("--json", action="store_true", help="print the registration report as JSON")
    p.set_defaults(func=cmd_register)

    tools_parser = subparsers.add_parser("tools", help="inspect the registered tools")
    tools = tools_parser.add_subparsers(dest="tools_command", required=True)
    tools_parser.commands = tools  # layers above add `nexus tools ...` commands here (slb: duplicates)
    p = tools.add_parser("list", help="list registered tools")
    p.add_argument("--server", help="only tools of this server")
    p.add_argument("--json", action="store_true", help="print a JSON array of tool objects")
    p.set_defaults(func=cmd_tools_list)
    p = tools.add_parser("show", help="show one tool: IR, version, schema")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tools_show)
    p = tools.add_parser("remove", help="remove tools by name")
    p.add_argument("names", nargs="+")
    p.set_defaults(func=cmd_tools_remove)
    ex = tools.add_parser("examples", help="example requests of a tool (the router matches user and learned ones)")
    ex = ex.add_subparsers(dest="examples_command", required=True)
    p = ex.add_parser("add", help="add example requests to a tool (kept until its schema changes)")
    p.add_argument("name")
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.set_defaults(func=cmd_examples_add)
    p = ex.add_parser("list", help="list a tool's example requests and their sources")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_examples_list)
    p = ex.add_parser("remove", help="remove example requests of a tool (all of a source with --source)")
    p.add_argument("name")
    p.add_argument("texts", nargs="*", metavar="TEXT")
    p.add_argument("--source", choices=("template", "user", "learned"), default=None)
    p.set_defaults(func=cmd_examples_remove)
    p = tools.add_parser("stats", help="IR token lengths (SmolLM2) and required-parameter coverage")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tools_stats)

    servers = subparsers.add_parser("servers", help="inspect registered MCP servers").add_subparsers(
        dest="servers_command", required=True)
    p = servers.add_parser("list", help="list registered servers and how to start them")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_servers_list)


def _store():
    from registry.store import RegistryStore

    return RegistryStore()


def _console():
    from rich.console import Console

    return Console()


def cmd_register(args) -> int:
    from registry.client import ServerError
    from registry.servers import command_for
    from registry.sources import register_file, register_remote, register_server

    if args.config:
        return _register_config(args)
    with _store() as store:
        try:
            if args.file:
                report = register_file(args.file, store)
            elif args.url:
                report = register_remote(args.url, store, args.transport, _headers(args.header), args.timeout,
                                         args.name)
            else:
                command = args.server or command_for(args.bundled)
                report = register_server(command, store, timeout_s=args.timeout, name=args.name,
                                         env=_env(args.env))
        except (ServerError, ValueError) as e:
            print(f"nexus register: error: {e}", file=sys.stderr)
            if args.json:  # the failure as JSON too, for a script reading stdout
                print(json.dumps({"error": str(e)}, indent=2))
            return 1
        warnings = _after_register(store, report) if report.added or report.updated else []
    for w in warnings:
        print(f"nexus register: warning: {w}", file=sys.stderr)
    if args.json:
        print(json.dumps(report.as_dict() | {"warnings": warnings}, indent=2))
    else:
        where = f"server {report.server!r}" if report.server else "file"
        print(
            f"{where}: {len(report.added)} added, {len(report.updated)} updated (new version), "
            f"{len(report.unchanged)} unchanged, {len(report.removed)} removed, {len(report.rejected)} rejected"
        )
        for e in report.rejected:
            print(f"  rejected {e}", file=sys.stderr)
        for line in _renamed_lines(report):
            print(f"  {line}")
    return 0 if report.ok else 3


def _renamed_lines(report) -> list[str]:
    """One line per tool registered under its server's name, as `RegisterReport.renamed` records them."""
    return [f"{name!r} is registered as {qualified!r}: {'server ' + repr(owner) if owner else 'a file'} has a tool "
            f"named {name!r} (its server is still called with {name!r})" for name, qualified, owner in report.renamed]


def _env(items: list[str]) -> dict[str, str]:
    """`--env NAME=VALUE` options as a dict; an item without "=" or with a bad name is a ValueError."""
    return _pairs(items, "--env", "=", "NAME=VALUE, e.g. OBSIDIAN_API_KEY=${OBSIDIAN_API_KEY}", str.isidentifier)


def _headers(lines: list[str]) -> dict[str, str]:
    """`--header 'Name: value'` options as a dict; a line without a colon is a ValueError."""
    return _pairs(lines, "--header", ":", "'Name: value', e.g. 'Authorization: Bearer ${TOKEN}'", bool)


def _pairs(items: list[str], flag: str, sep: str, expected: str, valid) -> dict[str, str]:
    out = {}
    for item in items:
        name, found, value = item.partition(sep)
        if not found or not valid(name.strip()):
            raise ValueError(f"{flag} {item!r}: expected {expected}")
        out[name.strip()] = value.strip()
    return out


def _register_config(args) -> int:
    """`nexus register --config PATH`: a table (server, transport, tools, status); exit 0 when every enabled
    entry registered, 3 when some failed, 1 when none registered."""
    from registry.mcp_config import register_config

    with _store() as store:
        outcomes = register_config(args.config, store, timeout_s=args.timeout)
        warnings = []
        for o in outcomes:
            if o.report is not None and (o.report.added or o.report.updated):
                warnings += _after_register(store, o.report)
    for w in warnings:
        print(f"nexus register: warning: {w}", file=sys.stderr)
    failed = [o for o in outcomes if o.status == "failed"]
    registered = [o for o in outcomes if o.status == "registered"]
    if args.json:
        print(json.dumps({"servers": [o.as_dict() for o in outcomes], "warnings": warnings}, indent=2))
    else:
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"servers of {args.config}")
        for col in ("server", "transport", "tools", "status"):
            table.add_column(col, overflow="fold")
        for o in outcomes:  # a failure's first line here; in full (with the server's stderr) below the table
            status = f"{o.status}: {o.detail.splitlines()[0]}" if o.detail else o.status
            table.add_row(Text(o.name), o.transport, str(o.tools) if o.status == "registered" else "-", Text(status))
        _console().print(table)
        print(f"{len(registered)} registered, {len(failed)} failed, "
              f"{len(outcomes) - len(registered) - len(failed)} disabled")
        for o in failed:
            print(f"nexus register: {o.name}: {o.detail}", file=sys.stderr)
    if failed and not registered:
        return 1
    return 3 if failed or any(not o.report.ok for o in registered) else 0


def _after_register(store, report) -> list[str]:
    """Warnings of the AFTER_REGISTER checks; a check that fails gives a warning, the registration stands."""
    out = []
    for check in AFTER_REGISTER:
        try:
            out += check(store, report)
        except Exception as e:  # noqa: BLE001 - a failed check must not undo a registration that succeeded
            out.append(f"{getattr(check, '__name__', 'check')} did not run: {e}")
    return out


def cmd_tools_list(args) -> int:
    from registry.signature import compress

    with _store() as store:
        tools = store.list_tools(server=args.server)
    if args.json:
        print(json.dumps([t.to_json() for t in tools], indent=1, ensure_ascii=False))
        return 0
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{len(tools)} tools")
    for col in ("name", "server", "signature"):
        table.add_column(col, overflow="fold")
    for t in tools:  # Text cells: tool text is untrusted and never parsed as rich markup
        table.add_row(Text(t.name), Text(t.server or "-"), Text(compress(t).split(" — ")[0]))
    _console().print(table)
    return 0


def cmd_tools_show(args) -> int:
    from registry.signature import compress

    with _store() as store:
        tool = store.get_tool(args.name)
        version = store.tool_version(args.name)
        examples = store.examples(args.name).get(args.name, [])
    if tool is None:
        print(f"nexus tools show: no tool named {args.name!r}; see `nexus tools list`", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**tool.to_json(), "version": version, "ir": compress(tool),
                          "examples": [{"text": e.text, "source": e.source} for e in examples]},
                         indent=2, ensure_ascii=False))
        return 0
    from rich.markup import escape
    from rich.syntax import Syntax

    console = _console()
    console.print(f"[bold]{escape(tool.name)}[/bold]  server={escape(tool.server or '-')}  version={version}  "
                  f"hash={tool.schema_hash[:12]}")
    console.print(f"IR: {compress(tool)}", markup=False)
    console.print(tool.description, markup=False)
    console.print(Syntax(json.dumps(tool.input_schema, indent=2), "json"))
    console.print(f"examples ({len(examples)}):")
    for e in examples:
        console.print(f"  [{e.source}] {e.text}", markup=False)
    return 0


def cmd_examples_add(args) -> int:
    with _store() as store:
        try:
            n = store.add_examples(args.name, args.texts, "user")
        except (KeyError, ValueError) as e:
            print(f"nexus tools examples add: {e.args[0]}", file=sys.stderr)
            return 1
    print(f"{args.name}: {n} example(s) added, {len(args.texts) - n} already present; "
          "run `nexus slb build` to route on them")
    return 0


def cmd_examples_list(args) -> int:
    with _store() as store:
        if store.get_tool(args.name) is None:
            print(f"nexus tools examples list: no tool named {args.name!r}; see `nexus tools list`", file=sys.stderr)
            return 1
        examples = store.examples(args.name).get(args.name, [])
    if args.json:
        print(json.dumps([{"text": e.text, "source": e.source} for e in examples], indent=1, ensure_ascii=False))
        return 0
    for e in examples:
        print(f"[{e.source}] {e.text}")
    return 0


def cmd_examples_remove(args) -> int:
    with _store() as store:
        n = store.remove_examples(args.name, args.texts or None, args.source)
    print(f"{args.name}: {n} example(s) removed")
    return 0


def cmd_tools_remove(args) -> int:
    code = 0
    with _store() as store:
        for name in args.names:
            try:
                store.remove_tool(name)
                print(f"removed {name}")
            except KeyError as e:
                print(f"nexus tools remove: {e.args[0]}", file=sys.stderr)
                code = 1
    return code


def cmd_tools_stats(args) -> int:
    from registry.signature import ir_stats

    with _store() as store:
        stats = ir_stats(store.list_tools())
    if args.json:
        print(json.dumps(stats))
        return 0
    from rich.table import Table

    table = Table(title="compressed signatures (SmolLM2 tokens)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("tools", str(stats["tools"]))
    table.add_row("IR median tokens", f"{stats['median_tokens']:g}")
    table.add_row("IR p90 tokens", str(stats["p90_tokens"]))
    table.add_row("IR max tokens", str(stats["max_tokens"]))
    table.add_row("required params all in IR", f"{100 * stats['required_coverage']:.1f}%")
    _console().print(table)
    return 0


def cmd_servers_list(args) -> int:
    with _store() as store:
        servers = store.list_servers()
    if args.json:
        print(json.dumps([vars(s) | {"headers": _shown_headers(s.headers), "env": _shown_headers(s.env)}
                          for s in servers], indent=1))
        return 0
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{len(servers)} servers")
    for col in ("name", "transport", "tools", "command / url", "cwd / headers"):
        table.add_column(col, overflow="fold")
    for s in servers:
        where = (s.cwd or "-") if s.transport == "stdio" else (", ".join(s.headers) or "-")
        table.add_row(Text(s.name), s.transport, str(s.tool_count), Text(s.target), Text(where))
    _console().print(table)
    return 0


def _shown_headers(values: dict[str, str]) -> dict[str, str]:
    """Header (or env) values for a listing: `${VAR}` references as written, literal values hidden (secrets)."""
    return {k: v if "${" in v else "<set>" for k, v in values.items()}
