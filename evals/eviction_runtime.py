"""Runtime parts of the eviction eval on the real MLX session (DESIGN §8 b–d): needle survival over repeated
evictions, fact recall relative to the full cache with certificate red-flag recall, and overhead."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from native.generate import Sampler, SamplerConfig, generate_step
from nexus_agent.eviction import EvictingSession, EvictionConfig, make_policy


def needle_survival(backend, prefill: list[int], needles: list[int], stream: list[int], policy, budget: int,
                    chunk: int = 32, seed: int = 0) -> dict:
    """Needle survival over repeated evictions (DESIGN §8 b). `prefill` (holding every needle position, fixed
    once) goes in first and is evicted down to the absolute `budget`; then `stream` is fed in `chunk`-token
    pieces, evicting whenever the cache passes budget + one block. After every eviction event (the first is
    the end of the prefill) record the share of the needles still cached, the logical length and the KV bytes.
    The denominator never changes: a needle, once evicted, counts as lost."""
    assert all(p < len(prefill) for p in needles), "needles must lie in the prefill"
    s = EvictingSession(backend.new_session(), policy, EvictionConfig(budget=budget, seed=seed))
    curve, nbytes, n_past, cache_tokens, seen = [], [], [], [], 0

    def record():
        cached = set(s.cache.positions.tolist())
        curve.append(float(np.mean([p in cached for p in needles])))
        nbytes.append(int(s.cache.nbytes))
        n_past.append(int(s.n_past))
        cache_tokens.append(int(s.cache.length))

    s.prefill(prefill)
    if not s.evict_ms:  # a prefill under budget + one block did not evict: make the end of it the first event
        s.evict()
    record()
    seen = len(s.evict_ms)
    for c0 in range(0, len(stream), chunk):
        s.forward_logits(stream[c0 : c0 + chunk])
        if len(s.evict_ms) > seen:
            seen = len(s.evict_ms)
            record()
    out = {"survival": curve, "kv_bytes": nbytes, "n_past": n_past, "cache_tokens": cache_tokens,
           "events": len(s.evict_ms),
           "n_needles": len(needles), "evict_ms": float(np.mean(s.evict_ms)) if s.evict_ms else 0.0}
    s.close()
    return out


def _answer(s, tok, fact, steps: int = 6, asked: int = 0) -> tuple[bool, float]:
    """Ask `fact` as a cloze and greedily generate `steps` answer tokens; the certificate covers those steps.

    The first answer step is the query at the last prompt token (it predicts the first answer token), so
    `begin_answer` starts there. Returns (exact match of the generated answer, NLL of the gold first token);
    the probe is then removed so the session is as before (apart from what eviction/recall did). `asked`: how
    many question tokens the session already holds (the aware condition)."""
    q, a = tok.encode(fact.question)[asked:], tok.encode(fact.answer)
    mark = s.n_past
    s.begin_answer(first_step=mark + len(q) - 1)
    logits = s.forward_logits(q)[-1]
    nll = float(np.logaddexp.reduce(logits.astype(np.float64)) - logits[a[0]])
    out = [t for t, _ in generate_step(s, q, Sampler(SamplerConfig()), max(steps, len(a)), logits=logits)]
    s.remove(mark, s.n_past)
    return out[: len(a)] == a, nll


def _clone(backend, kv, n: int):
    """A fresh MLX session holding the first `n` entries of `kv` (exported from a full prefill, no rotation)."""
    inner = backend.new_session()
    inner.import_kv(kv, span=(0, n))
    return inner


def _auc(scores: list[float], labels: list[bool]) -> float | None:
    """P(score of a positive > score of a negative) (ties count 1/2); None without both classes."""
    pos = [x for x, y in zip(scores, labels) if y]
    neg = [x for x, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return None
    return float(np.mean([(p > q) + 0.5 * (p == q) for p in pos for q in neg]))


def fact_recall(backend, traces: list, policy_names: list[str], budget: float, conditions=("stream", "aware"),
                recall_frac: float = 0.1, rank: str = "attention", seed: int = 0, window: int = 16) -> dict:
    """Fact recall relative to the full cache (DESIGN §8 c) over `traces` [(ids, facts)].

    Items are the facts the full cache answers (greedy cloze, exact match); each policy's `recall_rel` is its
    accuracy on those items. Conditions: "stream" evicts at the end of the trace, before any question (the
    scoring window is the trace's last `window` tokens), then asks every item in turn on the same session;
    "aware" evicts once per item after the question's tokens but its last (the window then holds the question).
    Both keep round(budget * trace length) tokens. After each answer the session recalls `recall_frac` of the
    trace from the disk tier (ranked by `rank`), answers again and releases the recall, so one run scores:
    `name` (no recall), `name+recall` (re-answer when the certificate flags: cert >= 1 over the first 6 answer
    steps), `name+recall_spill` (re-answer when the disk tier's flag fires: an answer head would attend to an
    evicted key with weight >= 0.9) and `name+recall_always` (re-answer every item: the disk tier's upper bound).
    The first answer generates 6 greedy tokens where the certificate needs them (certified) and 1 elsewhere
    (only the first token is scored). Also: flag rates, accuracy of the flagged items after recall, and the AUC of the
    certificate and of `evicted_attention` against induced failures (items the evicted cache gets wrong)."""
    tok = backend.tokenizer
    full_ok, runs = [], []
    for ids, facts in traces:  # one full prefill per trace, cloned for every policy and item
        base = backend.new_session()
        base.prefill(ids)
        kv = base.export_kv(0, len(ids))
        full = EvictingSession(base, make_policy("full"), EvictionConfig(budget=1.0))
        ok = [_answer(full, tok, f, steps=1)[0] for f in facts]  # only the first answer token is scored
        full.close()
        full_ok.append(ok)
        runs.append((ids, kv, [f for f, y in zip(facts, ok) if y]))
    out: dict = {"full": {"answered": int(sum(map(sum, full_ok))), "n_facts": int(sum(map(len, full_ok))),
                          "traces": len(traces)}, "budget": budget, "rank": rank, "recall_frac": recall_frac}
    with tempfile.TemporaryDirectory() as tmp:
        for cond in conditions:
            out[cond] = {}
            for name in policy_names:
                out[cond].update(_recall_one(backend, runs, name, cond, budget, recall_frac, rank, seed, window,
                                             Path(tmp)))
    return out


def _recall_one(backend, runs, name, cond, budget, recall_frac, rank, seed, window, tmp: Path) -> dict:
    tok = backend.tokenizer
    before, after, cert_flag, spill_flag, certs, spill_att, cache_tokens, recalled = [], [], [], [], [], [], [], []
    for ti, (ids, kv, items) in enumerate(runs):
        n_keep = EvictionConfig(budget=budget).tokens(len(ids))
        pol = make_policy(name)
        steps = 6 if pol.offset else 1  # the certificate's 6 answer steps; it is 0 without sampled keys

        def session(extra: list[int], tag: str):
            cfg = EvictionConfig(budget=n_keep, seed=seed + ti, window=window)
            spill = tmp / f"{cond}-{name}-{ti}-{tag}.spill"
            if "history" in pol.needs:  # H2O accumulates attention over every query: prefill it whole
                s = EvictingSession(backend.new_session(), pol, cfg, spill_path=spill)
                s.prefill(ids + extra)
            else:  # the same cache and the same last `window` queries as a whole prefill, at a fraction of the cost
                s = EvictingSession(_clone(backend, kv, len(ids) - window), pol, cfg, spill_path=spill)
                s.prefill(ids[len(ids) - window:] + extra)
            assert len(s.evict_ms) == 1, "expected one eviction at the end of the prefill"
            return s

        s = session([], "stream") if cond == "stream" else None
        for fi, f in enumerate(items):
            asked = 0
            if cond == "aware":
                asked = len(tok.encode(f.question)) - 1
                s = session(tok.encode(f.question)[:asked], str(fi))  # the question prefilled with the full cache
            ok, _ = _answer(s, tok, f, steps=steps, asked=asked)
            before.append(ok)
            cert_flag.append(s.red_flag)
            certs.append(s.certificate)
            spill_att.append(s.evicted_attention())
            spill_flag.append(spill_att[-1] >= s.spill_flag_at)
            cache_tokens.append(int(s.cache.length))
            recalled.append(len(s.recall(int(recall_frac * len(ids)), rank=rank)))
            after.append(_answer(s, tok, f, steps=1, asked=asked)[0])  # only correctness is needed now
            s.release()  # the recall allowance is per answer: the next item starts from the evicted cache
            if cond == "aware":
                s.close()
        if cond == "stream":
            s.close()
    n, fails = len(before), [not b for b in before]

    def row(hits: list[bool], flags: list[bool] | None) -> dict:
        r = {"recall_rel": float(np.mean(hits)) if n else None, "n_items": n, "hits": int(sum(hits)),
             "cache_tokens_mean": float(np.mean(cache_tokens)) if n else 0.0}
        if flags is not None:
            fl = [a for a, f in zip(after, flags) if f]
            r.update({"flag_rate": float(np.mean(flags)) if n else 0.0, "flagged": int(sum(flags)),
                      "recall_after_flag_acc": float(np.mean(fl)) if fl else None,
                      "recalled_tokens_per_flag":
                          float(np.mean([k for k, f in zip(recalled, flags) if f])) if fl else 0.0})
        return r

    pick = lambda flags: [a if f else b for a, b, f in zip(after, before, flags)]  # noqa: E731
    return {name: {**row(before, None), "red_flag_rate": float(np.mean(cert_flag)) if n else 0.0,
                   "cert_median": float(np.median(certs)) if n else None,
                   "cert_auc_failures": _auc(certs, fails),
                   "evicted_attention_auc_failures": _auc(spill_att, fails),
                   "spill_flag_rate": float(np.mean(spill_flag)) if n else 0.0},
            f"{name}+recall": row(pick(cert_flag), cert_flag),
            f"{name}+recall_spill": row(pick(spill_flag), spill_flag),
            f"{name}+recall_always": row(after, [True] * n)}


def decode_overhead(backend, ids: list[int], budget: int, rounds: int = 4, steps: int = 32,
                    policy: str = "certified") -> dict:
    """Added decode time per token of an evicting session kept at `budget`, relative to decoding with the full
    cache of `ids` (DESIGN §8 d), in one process, the sessions taking turns so the ratio holds under shared-CPU noise.

    Three sessions share one prefill of `ids`: `full` (plain, whole context), `small` (plain, a contiguous cache
    of the evicting session's size after its first eviction plus half a block) and the evicting session. Each
    of `rounds` rounds decodes `steps` tokens on each (the plain ones are rewound after every round, so their size
    stays put; the evicting one runs its own decode-time eviction events); the three take turns step by step.
    The overhead is (evicting − small) / full over the mean times per step: the hook, masks, per-slot state and
    the events at their real frequency, without the speed-up a smaller cache gives (per round too, for the
    spread). `evict_ms_per_event` is the mean of the events during decode (cache at budget + a block);
    `evict_ms_prefill` the one at the end of the prefill, a cost per prefill, not per token. Also the KV bytes
    of both caches."""
    full = backend.new_session()
    full.prefill(ids)
    kv = full.export_kv(0, len(ids))
    window = EvictionConfig().window
    s = EvictingSession(_clone(backend, kv, len(ids) - window), make_policy(policy), EvictionConfig(budget=budget))
    s.prefill(ids[len(ids) - window:])  # the same cache and last W queries as a whole prefill
    evict_prefill = s.evict_ms[-1]
    small = _clone(backend, kv, s.cache.length + s.config.block // 2)
    kv_bytes_full, kv_bytes_evicting = int(full.cache.nbytes), int(s.cache.nbytes)

    def step(session) -> float:
        t0 = time.perf_counter()
        session.decode(ids[-1])
        return 1e3 * (time.perf_counter() - t0)

    for x in (full, small, s):  # warm up
        step(x)
    n_events0 = len(s.evict_ms)
    t = np.zeros((rounds, steps, 3))  # (round, step, session): full, small, evicting
    for r in range(rounds):
        n0 = (full.n_past, small.n_past)
        for i in range(steps):  # one step each in turn: load noise hits all three alike
            t[r, i] = [step(full), step(small), step(s)]
        full.remove(n0[0], full.n_past)  # plain caches stay at their size (a rewind, no copy)
        small.remove(n0[1], small.n_past)
    events = s.evict_ms[n_events0:]
    tok_per_event = rounds * steps / len(events) if events else float("inf")
    per_round = t.mean(1)  # (rounds, 3); means: the evicting session's events are part of its time
    full_ms, small_ms, ev_ms = t.reshape(-1, 3).mean(0)
    out = {"context_tokens": len(ids), "budget_tokens": budget, "policy": policy, "rounds": rounds, "steps": steps,
           "decode_ms_full_cache": float(full_ms), "decode_ms_same_size_plain": float(small_ms),
           "decode_ms_evicting": float(ev_ms),
           "evict_ms_per_event": float(np.mean(events)) if events else 0.0, "evict_ms_prefill": evict_prefill,
           "events": len(events), "tokens_per_event": tok_per_event,
           "decode_overhead_frac": float((ev_ms - small_ms) / full_ms),
           "decode_overhead_frac_rounds": ((per_round[:, 2] - per_round[:, 1]) / per_round[:, 0]).tolist(),
           "events_frac": float(np.mean(events) / tok_per_event / full_ms) if events else 0.0,
           "net_time_frac_vs_full": float(ev_ms / full_ms),
           "kv_bytes_full": kv_bytes_full, "kv_bytes_evicting": kv_bytes_evicting}
    for x in (full, small, s):
        x.close()
    return out
