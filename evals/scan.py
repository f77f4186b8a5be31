"""Scan latency: the Numba INT8 kernel vs the NumPy float32 matmul (+ top-k) on the same data, one thread.

Sizes count tools; with `--rows-per-tool R` each tool has R rows (its text plus example rows) and the grouped
kernels score a tool by its best row. `numba_us_p50` is the path a buffer of that size uses (`path`: plain
single pass below slb.twostage.TWO_STAGE_MIN_ROWS rows, two_stage above); both paths are reported (`plain_us_p50`,
`two_stage_us_p50`, the latter including the per-query 384x384 rotation).
Rows are random unit vectors (the scan's cost does not depend on their content); the same query set is
timed on both paths in the same process.
"""

from __future__ import annotations

import argparse
import os

from evals.render import Figure, log_ticks, md_table, pyplot


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default="250,10000,100000")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--repeats", type=int, default=200, help="timed calls per size and path (fewer at large N)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows-per-tool", type=int, default=1,
                   help="buffer rows per tool (tool text + example rows); >1 times the grouped best-row kernels")


def _p50_us(fn, q, repeats: int) -> float:
    import time

    import numpy as np

    fn(q[0])  # warm (JIT, caches)
    ts = []
    for r in range(repeats):
        x = q[r % len(q)]
        t = time.perf_counter()
        fn(x)
        ts.append(time.perf_counter() - t)
    return float(np.percentile(ts, 50) * 1e6)


def run(args: argparse.Namespace) -> dict:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    import numpy as np
    from threadpoolctl import threadpool_limits

    from slb.buffer import quantize_rows
    from slb.scan import scan
    from slb.twostage import COARSE_DIM, TWO_STAGE_MIN_ROWS, fit_rotation

    with threadpool_limits(1):
        return _run(args, np, quantize_rows, scan, (COARSE_DIM, TWO_STAGE_MIN_ROWS, fit_rotation))


def _run(args, np, quantize_rows, scan, two) -> dict:
    from slb.index import ScanIndex

    kc, min_rows, fit_rotation = two
    rng = np.random.default_rng(args.seed)
    if args.rows_per_tool < 1:
        raise ValueError(f"--rows-per-tool must be >= 1, got {args.rows_per_tool}")
    per = args.rows_per_tool
    result = {"sizes": {}, "dim": args.dim, "k": args.k, "threads": 1, "rows_per_tool": per}
    print(f"{'N':>8} {'used':>10} {'plain us':>9} {'2-stage us':>10} {'numpy f32 us':>13} {'speedup':>8}")
    for t in (int(s) for s in args.sizes.split(",")):  # t tools, n rows
        n = t * per
        row_tool = None if per == 1 else np.repeat(np.arange(t, dtype=np.int32), per)
        x = rng.standard_normal((n, args.dim)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        m8, sc = quantize_rows(x)
        q = np.ascontiguousarray(x[rng.integers(0, n, 16)]
                                 + 0.1 * rng.standard_normal((16, args.dim)).astype(np.float32))
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        reps = max(20, args.repeats if n <= 10000 else args.repeats // 4)
        plain = ScanIndex(m8, sc, row_tool=row_tool)
        rot = fit_rotation(x)  # the build-time PCA rotation; the query rotation is inside the timed call
        y8, ys = quantize_rows(x @ rot.T)
        two_stage = ScanIndex(np.ascontiguousarray(y8[:, :kc]), ys, np.ascontiguousarray(y8[:, kc:]), rot,
                              row_tool=row_tool)
        r_small = reps * (10 if n <= 1000 else 1)
        pl = _p50_us(lambda v: plain.scan(v, args.k), q, r_small)
        ts = _p50_us(lambda v: two_stage.scan(v, args.k), q, r_small)
        npf = _p50_us(lambda v: scan(m8, sc, v, args.k, "numpy", f32=x, row_tool=row_tool), q, reps)
        used = "two_stage" if n >= min_rows else "plain"
        nb = ts if used == "two_stage" else pl
        result["sizes"][str(t)] = {"rows": n, "numba_us_p50": nb, "numpy_f32_us_p50": npf, "speedup": npf / nb,
                                   "path": used, "plain_us_p50": pl, "two_stage_us_p50": ts, "coarse_dim": kc}
        print(f"{t:>8} {used:>10} {pl:9.1f} {ts:10.1f} {npf:13.1f} {npf / nb:8.1f}x")
    return result


def table(r: dict) -> str:
    """Markdown: p50 scan time per registry size, Numba INT8 vs NumPy float32, and the speedup."""
    return md_table(["registry size", "Numba INT8 p50 (µs)", "NumPy float32 p50 (µs)", "speedup"],
                    [[n, s["numba_us_p50"], s["numpy_f32_us_p50"], f"{s['speedup']:.1f}×"]
                     for n, s in sorted(r["sizes"].items(), key=lambda kv: int(kv[0]))])


def time_figure(r: dict):
    """p50 scan time (µs per query) vs registry size, Numba INT8 and NumPy float32."""
    sizes = sorted(int(s) for s in r.get("sizes", {}))
    if not sizes:
        return None
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for key, label in (("numba_us_p50", "Numba INT8 scan"), ("numpy_f32_us_p50", "NumPy float32 scan")):
        ax.plot(sizes, [r["sizes"][str(s)][key] for s in sizes], marker="o", label=label)
    log_ticks(ax, sizes)
    ax.set(yscale="log", xlabel="registry size (tools, log scale)",
           ylabel="scan time per query, p50 (µs, log scale)", title=f"Top-{r.get('k', 5)} scan time, 1 thread")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return fig


FIGURES = (Figure("scan_time.png", time_figure),)
