"""The routing eval's registries: the embedded catalogue (one or more rows per tool, templated example rows
optional), the registry sampled per query (its gold tool plus seeded distractors) and the scans over it."""

from __future__ import annotations

import hashlib

EXAMPLES = ("template", "none")


def build_catalogue(emb, tools, f32, examples: str) -> "Catalogue":
    """The catalogue's rows: tool texts `f32` (T, D) plus, with examples "template", one row per templated
    example request of each tool (embedded as queries; cached in the Nexus home by text fingerprint)."""
    import numpy as np

    from registry.atomic import write_atomic
    from registry.examples import template_examples
    from registry.home import home_path
    if examples == "none":
        return Catalogue(f32, [[i] for i in range(len(tools))])
    ex = [template_examples(t.name, t.description, t.input_schema) for t in tools]
    flat = [e for x in ex for e in x]
    key = hashlib.sha256("\0".join([emb.model_id, *flat]).encode()).hexdigest()[:16]  # ordered: rows follow it
    cache = home_path("slb", "eval-cache", f"examples-{key}.npy")
    xv = np.load(cache) if cache.exists() else emb.embed_texts(flat)
    if not cache.exists():
        write_atomic(cache, lambda f: np.save(f, xv))
    rows, at = [], len(tools)
    for i, x in enumerate(ex):
        rows.append([i, *range(at, at + len(x))])
        at += len(x)
    return Catalogue(np.concatenate([f32, xv]), rows)


def sample_registry(rng, n_cat: int, gold: int | None, size: int):
    """Indices into the catalogue: gold (if any) + size − 1 distractors, gold first."""
    import numpy as np

    size = min(size, n_cat)
    pick = rng.choice(n_cat, min(size + 1, n_cat), replace=False)
    if gold is None:
        return pick[:size]
    return np.concatenate([[gold], pick[pick != gold][: size - 1]])


class Catalogue:
    """The catalogue's buffer rows: f32 (R, D) float32 unit rows, m8/sc their INT8 form, tool_rows[i] the row
    indices of catalogue tool i (its tool text first, then its example rows). Without examples R = T and
    tool_rows[i] = [i]. `learned[i]`: (n, D) float32 rows added to tool i by confirmed calls (sequential eval)."""

    def __init__(self, f32, tool_rows):
        import numpy as np

        from slb.buffer import quantize_rows

        self.f32 = np.ascontiguousarray(f32, np.float32)
        self.m8, self.sc = quantize_rows(self.f32)
        self.tool_rows = [np.asarray(r, np.int64) for r in tool_rows]
        self.grouped = any(len(r) > 1 for r in self.tool_rows)
        self.learned: dict[int, np.ndarray] = {}
        from slb.duplicates import duplicate_map, duplicate_pairs

        # near-duplicate tools of the catalogue by their tool-text rows (slb.duplicates), catalogue ids
        self.dups = duplicate_map(duplicate_pairs(self.f32[[r[0] for r in self.tool_rows]]))

    def margin(self, scores, ids) -> float:
        """Scan margin as the router measures it: to the first candidate (catalogue ids) not a duplicate of
        the top-1."""
        from slb.duplicates import margin_to_distinct

        return margin_to_distinct(scores, ids, self.dups)

    def registry_duplicates(self, idx) -> list[tuple[int, int, float]]:
        """Near-duplicate pairs among the tools `idx`, as registry positions (for slb.router.Router)."""
        at = {int(i): j for j, i in enumerate(idx)}
        return [(at[a], at[b], c) for a in at for b, c in self.dups.get(a, {}).items() if b in at and at[a] < at[b]]

    def __len__(self) -> int:
        return len(self.tool_rows)

    def registry(self, idx):
        """(m8 (R', D) int8, scales (R',), f32 (R', D), row_tool (R',) int32 or None) of the tools `idx`."""
        import numpy as np

        from slb.buffer import quantize_rows

        if not self.grouped and not self.learned:
            return (np.ascontiguousarray(self.m8[idx]), np.ascontiguousarray(self.sc[idx]), self.f32[idx], None)
        rows = [self.tool_rows[i] for i in idx]
        m8, sc, f32 = self.m8[np.concatenate(rows)], self.sc[np.concatenate(rows)], self.f32[np.concatenate(rows)]
        counts = np.array([len(r) for r in rows])
        extra = [(j, self.learned[i]) for j, i in enumerate(idx) if i in self.learned]
        if extra:  # learned rows of tool j go right after its own rows (rows of a tool stay contiguous)
            parts_f, parts_t = [f32], [np.repeat(np.arange(len(idx)), counts)]
            for j, x in extra:
                parts_f.append(x)
                parts_t.append(np.full(len(x), j))
            f32 = np.concatenate(parts_f)
            order = np.argsort(np.concatenate(parts_t), kind="stable")
            f32 = np.ascontiguousarray(f32[order])
            m8, sc = quantize_rows(f32)
            row_tool = np.sort(np.concatenate(parts_t)).astype(np.int32)
        else:
            row_tool = np.repeat(np.arange(len(idx), dtype=np.int32), counts)
        return np.ascontiguousarray(m8), np.ascontiguousarray(sc), f32, row_tool


def float_top1(f32, row_tool, q) -> int:
    """Registry position of the best tool by float32 cosine (a tool scores its best row)."""
    import numpy as np

    s = f32 @ q
    if row_tool is not None:
        s = np.maximum.reduceat(s, np.flatnonzero(np.r_[True, np.diff(row_tool) != 0]))
    return int(np.argmax(s))


def scan_all(qv, golds, cat, size, seed, k):
    """Per query: float top-1, int8 top-k scores/ids (catalogue ids), registry indices (gold first)."""
    import numpy as np

    from slb.scan import scan

    rng = np.random.default_rng(seed)
    out = []
    for q, g in zip(qv, golds):
        idx = sample_registry(rng, len(cat), g, size)
        m8, sc, f32, row_tool = cat.registry(idx)
        top_f = int(idx[float_top1(f32, row_tool, q)])
        s, ids = scan(m8, sc, q, k, row_tool=row_tool)
        out.append((top_f, s, idx[ids], idx))
    return out
