"""Runtime parts of the eviction eval on the real MLX session (DESIGN §8 b–d): needle survival over repeated
evictions, fact recall relative to the full cache with certificate red-flag recall, and overhead."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from nexus_agent.eviction import EvictingSession, EvictionConfig, make_policy


def needle_survival(backend, ids: list[int], needles: list[int], policy, budget: int, chunk: int = 32,
                    seed: int = 0) -> dict:
    """Feed `ids` in chunks through an evicting session with an absolute budget; after every eviction event
    record the fraction of needle tokens still cached, the logical length and the KV bytes."""
    s = EvictingSession(backend.new_session(), policy, EvictionConfig(budget=budget, seed=seed))
    s.prefill(ids[: 2 * budget])
    curve, nbytes, n_past, seen = [], [], [], 0
    for c0 in range(2 * budget, len(ids), chunk):
        s.forward_logits(ids[c0 : c0 + chunk])
        if len(s.evict_ms) > seen:
            seen = len(s.evict_ms)
            alive = [p for p in needles if p < s.n_past]
            cached = set(s.cache.positions.tolist())
            curve.append(float(np.mean([p in cached for p in alive])) if alive else float("nan"))
            nbytes.append(int(s.cache.nbytes))
            n_past.append(int(s.n_past))
    out = {"survival": curve, "kv_bytes": nbytes, "n_past": n_past, "events": len(s.evict_ms),
           "evict_ms": float(np.mean(s.evict_ms)) if s.evict_ms else 0.0}
    s.close()
    return out


def _answer(s, tok, fact) -> bool:
    q, a = tok.encode(fact.question), tok.encode(fact.answer)
    mark = s.n_past
    s.begin_answer()
    logits = s.forward_logits(q + a)
    pred = logits[len(q) - 1 : len(q) - 1 + len(a)].argmax(-1)
    s.remove(mark, s.n_past)
    return bool((pred == np.array(a)).all())


def fact_recall(backend, ids: list[int], facts, policy_names: list[str], budget: float, recall_frac: float = 0.1,
                seed: int = 0) -> dict:
    """Stream condition: prefill the trace (evicting to `budget` at its end), then ask every fact.

    Returns per policy: accuracy over the facts the full cache answers, recall_rel (= that accuracy, the full
    cache scoring 1 by construction), red-flag rate, and for `certified+recall` the accuracy after recalling
    `recall_frac` of the trace from the disk tier whenever the certificate flags (`+recall_always`: on every
    answer, the oracle-flag upper bound of the disk tier)."""
    tok = backend.tokenizer
    out: dict = {}
    full = EvictingSession(backend.new_session(), make_policy("full"), EvictionConfig(budget=1.0))
    full.prefill(ids)
    ok_full = [_answer(full, tok, f) for f in facts]
    full.close()
    items = [f for f, ok in zip(facts, ok_full) if ok]
    out["full"] = {"answered": int(sum(ok_full)), "n_facts": len(facts)}
    with tempfile.TemporaryDirectory() as tmp:
        for name in policy_names:
            with_recall = "+recall" in name
            always = name.endswith("+recall_always")  # oracle flag: recall before every answer
            pol = make_policy(name.split("+")[0])
            s = EvictingSession(backend.new_session(), pol, EvictionConfig(budget=budget, seed=seed),
                                spill_path=Path(tmp) / f"{name}.spill")
            s.prefill(ids)
            hits, flags, recalled = [], [], 0
            for f in items:
                ok = _answer(s, tok, f)
                flags.append(s.red_flag)
                if with_recall and (s.red_flag or always):
                    recalled += len(s.recall(int(recall_frac * len(ids))))
                    ok = _answer(s, tok, f)
                hits.append(ok)
            acc = float(np.mean(hits)) if hits else float("nan")
            out[name] = {"recall_rel": acc, "red_flag_rate": float(np.mean(flags)) if flags else 0.0,
                         "recalled_tokens": recalled, "cache_tokens": int(s.cache.length)}
            s.close()
    return out


def decode_overhead(backend, ids: list[int], budget: int, steps: int = 8) -> dict:
    """Decode time per token with the full cache vs an evicting session kept at `budget` (certified), with
    the eviction cost amortised over the block of tokens between two events."""
    def timed(session):
        session.prefill(ids)
        t0 = time.perf_counter()
        for _ in range(steps):
            session.decode(ids[-1])
        return 1e3 * (time.perf_counter() - t0) / steps

    plain_ms = timed(backend.new_session())
    s = EvictingSession(backend.new_session(), make_policy("certified"), EvictionConfig(budget=budget))
    hooked_ms = timed(s)  # decode over the reduced cache, hook buffering queries, no event in these steps
    evict_ms = float(np.mean(s.evict_ms))
    per_token = hooked_ms + evict_ms / s.config.block
    s.close()
    return {"context_tokens": len(ids), "decode_ms_full_cache": plain_ms, "decode_ms_evicting": hooked_ms,
            "evict_ms_per_event": evict_ms, "decode_overhead_frac": (per_token - hooked_ms) / plain_ms,
            "net_time_frac_vs_full": per_token / plain_ms}
