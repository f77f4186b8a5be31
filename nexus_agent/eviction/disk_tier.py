"""`DiskTier`: evicted tokens go to a spill file instead of vanishing, and come back bit for bit (DESIGN §7).

On every eviction the leaving slots' K/V (L, Hkv, E, D) are appended to a `SpillFile`. `recall` brings spilled
tokens back into the cache within an allowance on top of the eviction budget, ranked by the attention the last
question and answer steps would give them (`rank="attention"`) or by the certificate variance their retained
neighbours carried (`rank="neighbours"`, DESIGN §7); `release` undoes it. Keys were rotated at their original
positions, so a recalled key needs no re-anchoring. `evicted_attention` reads the spilled keys to tell whether
the answer would attend to something evicted, which the certificate (retained keys only) cannot see.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from native.models.attention import attention_weights
from nexus_agent.eviction.certifier import Certifier
from nexus_agent.eviction.hajek import clear_offsets
from nexus_agent.eviction.part import Part
from nexus_agent.eviction.spill import SpillFile

RANKS = ("attention", "neighbours")


class DiskTier(Part):
    """spill: the file; certifier: the session's (its answer steps and variance drive the ranking);
    flag_at: the `evicted_attention` threshold of `flag`."""

    def __init__(self, spill: SpillFile, certifier: Certifier, flag_at: float = 0.9):
        self.spill, self.certifier, self.flag_at = spill, certifier, flag_at
        self._recalled: tuple[np.ndarray, dict[int, tuple[float, int]]] | None = None  # positions, prior π/unit

    def on_evict(self, gone: np.ndarray) -> None:
        s = self.session
        kk, vv = s.cache.export(gone)
        self.spill.write(s.cache.positions[gone], np.array([s.inner.tokens[i] for i in gone]), kk, vv)

    @property
    def flag(self) -> bool:
        """Some head of the last question/answer would give an evicted key softmax weight >= `flag_at`."""
        return self.evicted_attention() >= self.flag_at

    def recall(self, budget_tokens: int, block: int | None = None, rank: str = "attention") -> np.ndarray:
        """Bring back up to `budget_tokens` spilled tokens, best first; returns their positions (T,). A previous
        recall is released first (the allowance is not cumulative). Afterwards π = 1 and no Hájek offsets: the
        enlarged cache is attended plainly. `block`: window span for "attention" (default 32), aligned block
        size for "neighbours" (default 64)."""
        if rank not in RANKS:
            raise ValueError(f"rank must be 'neighbours' or 'attention', got {rank!r}")
        s = self.session
        self.release()
        if not len(self.spill.available()):
            return np.zeros(0, dtype=np.int64)
        s.sync()
        avail = np.sort(self.spill.available())
        if rank == "attention":
            chosen = self._attention_windows(avail, budget_tokens, block or 32)
        else:
            chosen = self._neighbour_blocks(avail, budget_tokens, block or 64)
        positions = np.array(sorted(chosen), dtype=np.int64)
        if not len(positions):
            return positions
        k, v, toks = self.spill.read(positions)
        self._recalled = (positions, {int(p): (float(a), int(u)) for p, a, u in zip(s.cache.positions, s.pi, s.unit)})
        s.cache.insert(mx.array(k), mx.array(v), positions)
        s.inner.tokens += [int(t) for t in toks]
        s.budget += len(positions)  # the recall allowance sits on top of the eviction budget
        s.kept += len(positions)
        s.sync()
        s.pi[:] = 1.0
        s.unit[:] = -1
        clear_offsets(s.cache)
        return positions

    def release(self) -> None:
        """Undo the last `recall`: its tokens leave the cache (their bytes stay in the spill file), the budget
        drops back and the other slots get their π, sampling units and Hájek offsets again."""
        if self._recalled is None:
            return
        s = self.session
        positions, saved = self._recalled
        self._recalled = None
        s.sync()
        back = np.isin(s.cache.positions, positions)
        s.keep(np.nonzero(~back)[0])
        self.spill.release(positions)
        s.budget -= len(positions)  # recall raised it by all of them
        s.kept -= int(back.sum())  # an eviction since the recall may have taken some already
        for i, p in enumerate(s.cache.positions):
            if int(p) in saved:
                s.pi[i], s.unit[i] = saved[int(p)]
        s.reweight()

    def evicted_attention(self) -> float:
        """The largest softmax weight any (layer, query head, buffered query) cell of the last question and
        answer would give one spilled key next to the retained keys (`spilled_attention`); 0.0 before any
        certified answer step or with nothing spilled."""
        if not len(self.spill.available()) or not self.certifier.answered:
            return 0.0
        return float(self.spilled_attention(np.sort(self.spill.available())).max())

    def spilled_attention(self, avail: np.ndarray) -> np.ndarray:
        """(T,) for each spilled position in `avail`: the largest softmax weight any (layer, query head, query)
        cell would give it next to the retained keys. The queries are the session's last W buffered ones (the
        question's last tokens and the answer steps): a head that would look sharply at an evicted token marks
        it (a maximum, not a sum: diffuse heads would dominate a sum)."""
        s = self.session
        peak = np.zeros(len(avail))
        if not self.certifier.answered:
            return peak
        k_sp = self.spill.keys(avail)  # (L, Hkv, T, D)
        for li, layer in enumerate(s.cache.layers):
            q, qpos = s.window(li)  # (H, W, D), (W,)
            k, _ = layer.view()
            keys = np.concatenate([k_sp[li], np.array(k[0].astype(mx.float32))], axis=1)  # spilled, then retained
            kpos = np.concatenate([np.asarray(avail, np.int64), layer.positions])
            w = attention_weights(q, keys, s.info.scale, qpos, kpos, layer.window,
                                  softcap=s.info.attn_softcap)  # (H, W, T + S)
            peak = np.maximum(peak, w[:, :, : len(avail)].max(axis=(0, 1)))
        return peak

    def _attention_windows(self, avail: np.ndarray, budget_tokens: int, span: int) -> set[int]:
        """Spilled positions in windows of `span` centred on the spilled keys with the highest
        `spilled_attention`, best key first, until the allowance is full: a window centred on the peak keeps
        what the question matched (a fact's name, its value) with the tokens around it, wherever a block
        boundary falls."""
        chosen: set[int] = set()
        peak = self.spilled_attention(avail)
        for j in np.argsort(-peak, kind="stable"):
            p = int(avail[j])
            if p in chosen:
                continue
            lo, hi = np.searchsorted(avail, [p - span // 2, p - span // 2 + span])
            win = [int(x) for x in avail[lo:hi] if int(x) not in chosen]
            room = budget_tokens - len(chosen)
            if len(win) > room:  # the last window: the tokens nearest its key fill the allowance
                win = sorted(win, key=lambda x: (abs(x - p), x))[:room]
            chosen.update(win)
            if len(chosen) == budget_tokens:
                break
        return chosen

    def _neighbour_blocks(self, avail: np.ndarray, budget_tokens: int, block: int) -> set[int]:
        """Whole aligned `block`-token spilled blocks, ranked by the certificate variance their retained
        neighbours (the blocks either side) carried during the answer steps, while they fit the allowance."""
        chosen: set[int] = set()
        pos, var = self.session.cache.positions, self.certifier.var_contrib
        blocks = np.unique(avail // block)
        score = np.array([var[(pos >= (b - 1) * block) & (pos < (b + 2) * block)].sum() for b in blocks])
        for b in blocks[np.argsort(-score, kind="stable")]:
            members = avail[avail // block == b]
            if len(chosen) + len(members) <= budget_tokens:
                chosen.update(members.tolist())
        return chosen
