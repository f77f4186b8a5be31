"""Splice fidelity and TTFT vs depth: bare / re-anchored / repaired (calibrated profile) / text, per backend.

For each backend, depth and eval tool: KL(one-shot text prefill || variant) and top-1 agreement over the 8
teacher-forced positions after the user turn, TTFT (segment + user turn) and the share of block tokens decoded
as text, averaged over tools. `text` prefills the same segment again in one-token batches (the decode path, the
batch shape that changes llama.cpp's numerics): the backend's noise floor. Its TTFT is that of the segment in one
batch, the speed baseline, whose own fidelity (bit-exact on llama.cpp, ~1e-11 nats on MLX) is `batched_kl` /
`batched_top1`. `suffix` (the reference design: re-decode the last 25%) and `blend` (CacheBlend-style: recompute
the 15% of block tokens whose layer-1 K/V deviate most, on backends with `can_recompute_kv`) are reported too.
`roundtrip` is the floor of any splice that is not bit-exact: the segment's exact KV (prefilled in the case's own
context) re-anchored one position later and back, which perturbs only the rounding of its keys (no TTFT). `top1_decisive` is the top-1
agreement on the positions where the reference's top-1 leads by >= 0.5 logit (a flip at a near-tie says little).
Eval tools are sampled with a seed disjoint from calibration. `--calibrate` runs `nexus splice calibrate` first.
"""

from __future__ import annotations

import argparse
from pathlib import Path

VARIANTS = ("bare", "reanchored", "repaired", "suffix", "blend", "text", "roundtrip")
BLEND_FRAC = 0.15  # CacheBlend recomputes ~15% of a chunk


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="llamacpp,mlx", help="comma-separated: llamacpp, mlx")
    p.add_argument("--depths", default="0,64,256,512,1024,2048")
    p.add_argument("--tool-file", required=True, help="JSON/JSONL tools to sample eval (and calibration) tools from")
    p.add_argument("--n-tools", type=int, default=16,
                   help="eval tools (16 x 8 positions: one flip = 0.008 of top-1, against the target's 0.02 slack)")
    p.add_argument("--calib-tools", type=int, default=4, help="calibration tools (with --calibrate)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calibrate", action="store_true", help="calibrate the profile first (else use the saved one)")
    p.add_argument("--plot", default=None, help="write a PNG of KL and speedup vs depth")


def _plans(backend, profile, depth, n_tokens):
    from splice.profile import RepairPlan

    return {
        "bare": RepairPlan("none", 0, rotate=False) if backend.name == "mlx" else None,  # llama.cpp always rotates
        "reanchored": RepairPlan("none", 0),
        "repaired": profile.plan_for(depth, n_tokens),
        "suffix": RepairPlan("suffix", n_tokens // 4),
        "blend": RepairPlan("blend", 0, frac=BLEND_FRAC) if backend.capabilities.can_recompute_kv else None,
        "text": RepairPlan("text", n_tokens),
    }


def run_backend(name: str, args) -> dict:
    import numpy as np

    from native import load_backend
    from splice.block import load_block
    from splice.calibrate import CalibrationConfig, calibrate
    from splice.cli import calibration_tools
    from splice.compiler import block_key, block_path, compile_blocks
    from splice.fidelity import CaseRunner, decisive, kl_top1, make_case, sample_tools
    from splice.profile import load_profile
    from splice.prompt import CONTEXTS, context_for

    backend = load_backend(name)
    depths = [int(d) for d in args.depths.split(",")]
    if args.calibrate:
        cal = calibration_tools(backend, args.tool_file, args.calib_tools, args.seed)
        calibrate(backend, cal, CalibrationConfig(depths=tuple(depths), seed=args.seed)).save()
    profile = load_profile(backend)
    tools = sample_tools(args.tool_file, backend.tokenizer, args.n_tools, seed=args.seed)
    compile_blocks(backend, tools, progress=False)
    out = {"profile": {"curve": profile.curve, "max_depth": profile.max_depth, "calibrated": bool(profile.measured),
                       "calibration_tools": args.calib_tools if args.calibrate else None, "block_contexts": list(CONTEXTS)},
           "tools": [t.name for t in tools], "depths": {}}
    for depth in depths:
        acc, batched = {v: [] for v in VARIANTS}, []
        for i, tool in enumerate(tools):
            c = context_for(depth)
            _, kv = load_block(block_path(backend, tool, context=c), block_key(backend, tool, c))
            n_tokens = len(kv)
            runner = CaseRunner(backend, make_case(backend.tokenizer, tool, depth, seed=args.seed + i))
            try:
                ref = runner.reference()
                keep = decisive(ref, CalibrationConfig.decisive_margin)  # the positions calibration checks
                runs = {v: runner.run(kv, plan) for v, plan in _plans(backend, profile, depth, n_tokens).items() if plan}
                runs["roundtrip"] = (runner.roundtrip(), np.nan, 0)  # the floor: no TTFT, nothing re-decoded
                # text: fidelity of the segment prefilled in one-token batches (the noise floor), TTFT of one batch
                batched.append(kl_top1(ref, runs["text"][0]))
                runs["text"] = (runner.text_in_batches(), *runs["text"][1:])
                for v, (logits, ms, red) in runs.items():
                    agree = ref.argmax(1) == logits.argmax(1)
                    acc[v].append((*kl_top1(ref, logits), ms, red / n_tokens, agree[keep].sum(), keep.sum()))
            finally:
                runner.close()
        row = {}
        for v, vals in acc.items():
            if not vals:
                row[v] = {"kl": None, "top1": None, "ttft_ms": None, "redecode_frac": None, "top1_decisive": None}
                continue
            a = np.array(vals, dtype=np.float64)
            kl, top1, ms, frac = a[:, :4].mean(0)
            row[v] = {"kl": float(kl), "top1": float(top1), "ttft_ms": float(ms) if ms == ms else None, "redecode_frac": float(frac),
                      "top1_decisive": float(a[:, 4].sum() / max(1.0, a[:, 5].sum())), "decisive_positions": int(a[:, 5].sum())}
        row["repaired"]["speedup"] = row["text"]["ttft_ms"] / row["repaired"]["ttft_ms"]
        row["text"]["batched_kl"], row["text"]["batched_top1"] = map(float, np.mean(batched, axis=0))
        out["depths"][str(depth)] = row
        print(f"{name:8s} depth {depth:5d}  " + "  ".join(
            f"{v}: " + ("n/a" if r["kl"] is None else f"kl={r['kl']:.4f} top1={r['top1']:.3f}"
                        + ("" if r["ttft_ms"] is None else f" {r['ttft_ms']:.0f}ms f={r['redecode_frac']:.2f}"))
            for v, r in row.items()), flush=True)
    backend.close()
    return out


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, res in result["backends"].items():
        ds = sorted(res["depths"], key=int)
        for v in ("bare", "reanchored", "repaired", "text"):
            ys = [res["depths"][d][v]["kl"] for d in ds]
            if ys[0] is not None:
                a.plot([int(d) for d in ds], ys, marker="o", label=f"{name} {v}")
        b.plot([int(d) for d in ds], [res["depths"][d]["repaired"]["speedup"] for d in ds], marker="o", label=name)
    a.set(xlabel="depth (tokens after system prompt)", ylabel="mean KL (nats)", yscale="symlog", title="fidelity")
    a.axhline(0.01, ls="--", c="gray")
    b.set(xlabel="depth", ylabel="TTFT text / repaired", title="speedup")
    b.axhline(1.3, ls="--", c="gray")
    a.legend(fontsize=7)
    b.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def run(args) -> dict:
    result = {"backends": {}, "config": {"depths": args.depths, "n_tools": args.n_tools, "calib_tools": args.calib_tools,
                                         "seed": args.seed}}
    for name in args.backend.split(","):
        result["backends"][name] = run_backend(name, args)
    if args.plot:
        plot(result, args.plot)
    return result
