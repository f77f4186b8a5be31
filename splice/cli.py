"""`nexus compile` and `nexus splice calibrate`: thin wrappers over splice.compiler and splice.calibrate."""

from __future__ import annotations

import argparse

from native.registry import list_backends


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compile", help="compile tool-schema KV blocks for splicing (only stale ones)")
    p.add_argument("--tools", default=None, help="comma-separated tool names (default: every stale tool)")
    p.add_argument("--backend", default="llamacpp", choices=list_backends(can_splice=True))
    p.add_argument("--model", default=None,
                   help="GGUF file, model folder or packaged model name (default: smollm2; gemma3 where installed)")
    p.add_argument("--force", action="store_true", help="recompile even fresh blocks")
    p.set_defaults(func=_compile)
    s = sub.add_parser("splice", help="splice profiles").add_subparsers(dest="splice_cmd", required=True)
    c = s.add_parser("calibrate", help="measure splice fidelity per depth and write the model's repair profile")
    c.add_argument("--backend", default="llamacpp", choices=list_backends(can_splice=True))
    c.add_argument("--model", default=None)
    c.add_argument("--tool-file", default=None,
                   help="JSON/JSONL tools to calibrate on (default: the registry's tools)")
    c.add_argument("--n-tools", type=int, default=4, help="calibration tools (more: a safer profile, slower)")
    c.add_argument("--depths", default="0,64,256,512,1024,2048")
    c.add_argument("--heads", default="0,16,32,64,96,128,192", help="head lengths tried (tokens decoded as text)")
    c.add_argument("--tails", default="4", help="block-end tokens decoded as text, tried with every head")
    c.add_argument("--min-speedup", type=float, default=1.9,
                   help="TTFT speedup over text to keep at depth <= 256; faster plans spend the rest on fidelity "
                        "(0: cheapest plan)")
    c.add_argument("--min-speedup-deep", type=float, default=1.45,
                   help="the same floor beyond depth 256")
    c.add_argument("--seed", type=int, default=0)
    c.set_defaults(func=_calibrate)


def _compile(args) -> int:
    from native import load_backend
    from registry.store import RegistryStore
    from splice.compiler import compile_stale

    backend = load_backend(args.backend, args.model)
    with RegistryStore() as store:
        names = [n for n in (args.tools or "").split(",") if n] or None
        paths = compile_stale(backend, store, names=names, force=args.force)
    print(f"compiled {len(paths)} block(s) for {backend.name} {backend.info.fingerprint[:12]}")
    return 0


def calibration_tools(backend, path: str | None, n: int, seed: int):
    """`n` tools with realistic full schemas from `path`, or from the home registry when `path` is None."""
    from registry.store import RegistryStore
    from splice.fidelity import sample_tools

    if path is None:
        with RegistryStore() as store:
            source = [t.to_mcp() for t in store.list_tools()]
    else:
        source = path
    tools = sample_tools(source, backend.tokenizer, n, seed=10_000 + seed)  # disjoint from the eval's seeds
    if len(tools) < n:
        where = path or "the registry"
        raise SystemExit(f"nexus splice calibrate: {where} has {len(tools)} tools with a 150-400-token schema, "
                         f"{n} needed; register more tools, pass --tool-file FILE or a smaller --n-tools")
    return tools


def _calibrate(args) -> int:
    from native import load_backend
    from splice.calibrate import CalibrationConfig, calibrate

    backend = load_backend(args.backend, args.model)
    config = CalibrationConfig(depths=tuple(int(d) for d in args.depths.split(",")),
                               heads=tuple(int(h) for h in args.heads.split(",")),
                               tails=tuple(int(t) for t in args.tails.split(",") if t), min_speedup=args.min_speedup,
                               min_speedup_deep=args.min_speedup_deep,
                               seed=args.seed)
    profile = calibrate(backend, calibration_tools(backend, args.tool_file, args.n_tools, args.seed), config)
    path = profile.save()
    print(f"wrote {path}: curve {profile.curve}, splice up to depth {profile.max_depth}, text beyond")
    print("plans by block length:\n  " + "\n  ".join(profile.describe()))
    return 0
