"""The routing eval's protocols over a sampled registry: every query routed once (`route_all`), the sequential
protocol of learning from confirmed calls (`route_learned`: each query scored before it is learned from), and
the timed whole decision and query embedding (`decision_latency`, `embed_latency`)."""

from __future__ import annotations

import time


def route_all(emb, scored, qv, golds, res, gates, folds, rr, tools, names, cat, lexical, chosen=None):
    """Route every scored query over its registry res[i][3]: (correct, paths, total ms) lists; the chosen
    tool names are appended to `chosen` when given."""

    from slb.index import ScanIndex
    from slb.router import Router

    routed, paths, lat = [], [], []
    for q, v, g, r, gate, f in zip(scored, qv, golds, res, gates, folds):
        idx = r[3]
        m8, sc, _, row_tool = cat.registry(idx)
        router = Router(emb, ScanIndex(m8, sc, row_tool=row_tool), [tools[i] for i in idx], gate, rr[f],
                        lexical=lexical.subset(idx), duplicates=cat.registry_duplicates(idx))
        d = router.route(q["query"], v)
        routed.append(d.tool == names[g])
        paths.append(d.path)
        lat.append(d.timings["total_ms"])
        if chosen is not None:
            chosen.append(d.tool)
    return routed, paths, lat


def decision_latency(emb, scored, res, gates, folds, rr, tools, cat, lexical, n: int) -> list[float]:
    """Milliseconds of whole route decisions (embedding the query text included) for the first n queries."""
    from slb.index import ScanIndex
    from slb.router import Router

    out = []
    for q, r, gate, f in list(zip(scored, res, gates, folds))[:n]:
        idx = r[3]
        m8, sc, _, row_tool = cat.registry(idx)
        router = Router(emb, ScanIndex(m8, sc, row_tool=row_tool), [tools[i] for i in idx], gate, rr[f],
                        lexical=lexical.subset(idx), duplicates=cat.registry_duplicates(idx))
        out.append(router.route(q["query"]).timings["total_ms"])
    return out


def route_learned(emb, scored, qv, golds, res, gates, folds, rr, tools, names, cat, lexical, cap: int):
    """Sequential protocol of learning from confirmed calls: queries in file order (so each tool's queries in
    a fixed order); each is routed over its registry res[i][3] with the learned rows of every tool in it
    (the embeddings of the earlier queries confirmed for that tool, at most `cap`, deduplicated by text), then
    confirmed (its query becomes a learned row of its gold tool). Every query is scored once, before it is
    learned from. Returns the (Q,) correctness list."""
    import numpy as np

    from slb.index import ScanIndex
    from slb.router import Router

    seen: dict[int, list[tuple[str, np.ndarray]]] = {}
    routed = []
    try:
        for q, v, g, r, gate, f in zip(scored, qv, golds, res, gates, folds):
            idx = r[3]
            cat.learned = {i: np.stack([x for _, x in seen[i]]) for i in idx if i in seen}
            m8, sc, _, row_tool = cat.registry(idx)
            router = Router(emb, ScanIndex(m8, sc, row_tool=row_tool), [tools[i] for i in idx], gate, rr[f],
                            lexical=lexical.subset(idx), duplicates=cat.registry_duplicates(idx))
            routed.append(router.route(q["query"], v).tool == names[g])
            rows = seen.setdefault(int(g), [])
            if all(t != q["query"] for t, _ in rows):
                rows.append((q["query"], v))
                del rows[:-cap]
    finally:
        cat.learned = {}
    return routed


def embed_latency(emb, scored, result) -> None:
    """p50 ms to embed one query (the router's first stage; excluded from route_ms above)."""
    import numpy as np

    ts = []
    for q in scored[:30]:
        t = time.perf_counter()
        emb.embed_query(q["query"])
        ts.append((time.perf_counter() - t) * 1e3)
    result["embed_query_ms_p50"] = float(np.percentile(ts, 50)) if ts else None
