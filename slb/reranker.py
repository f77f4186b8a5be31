"""Cross-encoder reranker over (query, tool text) pairs for the top-k candidates of the scan.

No package here ships cross-encoder weights, so `train_reranker` fine-tunes one from the packaged MiniLM
(a fresh 1-logit head on the bi-encoder's transformer) on queries synthesized from the registry's tools plus
any labelled (query, gold tool) pairs. Each training query brings a group of tool texts (its gold tool, hard
negatives from the embedding scan itself, one random tool) and the loss is mainly listwise: softmax
cross-entropy over the group's logits, which trains exactly the decision the router makes (which candidate
wins), with a small pointwise term that keeps logits comparable across queries. The result
is saved with a meta file naming the registry fingerprint it was trained for, so it is reused when it
matches. A user-given sentence-transformers CrossEncoder folder is used as is.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from registry.atomic import write_atomic
from slb.buffer import quantize_rows
from slb.embedder import Embedder, packaged_minilm_path, quiet_model_loading, text_fingerprint
from slb.scan import scan_batch
from slb.synth import synthesize_queries
from slb.tools import ToolEntry, tool_text

META = "nexus_reranker.json"


@dataclass
class RerankerTrainConfig:
    """Fine-tuning knobs. A step takes `batch_size` training queries, each with a group of 1 + `negatives`
    tool texts (the gold tool, `negatives` − 1 hard negatives from the embedding scan, 1 random tool).

    loss = listwise * softmax cross-entropy over each group's logits (the gold must win its group: what top-1
    routing needs) + pointwise * binary cross-entropy on every (query, text) pair (keeps the logits usable as
    an absolute score). labelled_repeats: how often each labelled query is used per synthesized one.
    """

    queries_per_tool: int = 1
    negatives: int = 7
    batch_size: int = 2
    max_steps: int = 400
    lr: float = 5e-5
    max_length: int = 192  # query + tool text tokens; shorter cuts off the schema text's parameters
    listwise: float = 1.0
    pointwise: float = 0.1
    labelled_repeats: int = 1
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        for k in ("queries_per_tool", "negatives", "batch_size", "max_steps", "max_length", "labelled_repeats",
                  "threads"):
            if getattr(self, k) < 1:
                raise ValueError(f"RerankerTrainConfig.{k} must be >= 1, got {getattr(self, k)}")
        if not 0 < self.lr < 1:
            raise ValueError(f"lr must be in (0, 1), got {self.lr}")
        if self.listwise < 0 or self.pointwise < 0 or self.listwise + self.pointwise == 0:
            raise ValueError("loss weights must be >= 0 and not both 0, "
                             f"got listwise={self.listwise} pointwise={self.pointwise}")


def registry_fingerprint(tools: list[ToolEntry], recipe: str, labelled: list[tuple[str, str]] = ()) -> str:
    """Fingerprint of what a trained reranker depends on: tool texts and the labelled set."""
    return text_fingerprint([tool_text(t, recipe) for t in tools] + [f"{q}\t{g}" for q, g in labelled])


def build_groups(
    tools: list[ToolEntry], embedder: Embedder, labelled: list[tuple[str, str]], cfg: RerankerTrainConfig
) -> list[tuple[str, list[str]]]:
    """(query, [gold text, negative texts...]) per training query: synthesized + labelled (repeated
    `labelled_repeats` times), negatives the query's nearest non-gold tools in the whole registry's INT8 scan
    plus one random tool (keeps the score calibrated far from the query). Groups are shuffled."""
    rng = random.Random(cfg.seed)
    by_name = {t.name: t for t in tools}
    queries: list[tuple[str, str]] = []
    for t in tools:
        queries += [(q, t.name) for q in synthesize_queries(t, cfg.queries_per_tool, rng)]
    queries += [(q, g) for q, g in labelled if g in by_name] * cfg.labelled_repeats
    texts = {t.name: tool_text(t, embedder.config.recipe) for t in tools}
    m8, scales = quantize_rows(embedder.embed_tools(tools))
    names = [t.name for t in tools]
    qv = embedder.embed_texts([q for q, _ in queries])
    _, ids = scan_batch(m8, scales, qv, k=min(len(names), cfg.negatives + 1))
    groups = []
    for (q, gold), row in zip(queries, ids):
        near = [names[i] for i in row if i >= 0 and names[i] != gold]
        rand = [n for n in rng.sample(names, min(len(names), 3))
                if n != gold and n not in near[: cfg.negatives - 1]][:1]
        hard = near[: cfg.negatives - len(rand)]  # no random tool found (tiny registries): one more hard negative
        groups.append((q, [texts[n] for n in [gold] + hard + rand]))
    rng.shuffle(groups)
    return groups


def group_loss(logits, sizes: list[int], cfg: RerankerTrainConfig):
    """Loss of a batch of groups: logits (sum(sizes),) concatenated per group, each group's gold first."""
    import torch

    loss = logits.new_zeros(())
    groups = torch.split(logits, sizes)
    if cfg.listwise:
        ce = torch.stack([torch.nn.functional.cross_entropy(g.view(1, -1), g.new_zeros(1, dtype=torch.long))
                          for g in groups])
        loss = loss + cfg.listwise * ce.mean()
    if cfg.pointwise:
        target = torch.zeros_like(logits)
        target[np.cumsum([0, *sizes[:-1]])] = 1.0  # each group's first text is its gold
        loss = loss + cfg.pointwise * torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
    return loss


def train_reranker(
    tools: list, embedder: Embedder, out_dir: str | Path, labelled: list[tuple[str, str]] = (),
    cfg: RerankerTrainConfig | None = None, progress: bool = True,
) -> dict:
    """Fine-tune a cross-encoder from the packaged MiniLM and save it (with its meta) to out_dir.

    tools: the registry (ToolEntry or anything `as_entry` accepts); labelled: (query, gold tool name) pairs.
    Returns the meta dict (fingerprint, steps, groups, pairs seen, train_s).
    """
    import torch
    from sentence_transformers import CrossEncoder

    quiet_model_loading()
    from tqdm.auto import tqdm

    from slb.tools import as_entry

    cfg = cfg or RerankerTrainConfig()
    tools = [as_entry(t) for t in tools]
    labelled = list(labelled)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    groups = build_groups(tools, embedder, labelled, cfg)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ce = CrossEncoder(str(packaged_minilm_path()), num_labels=1, max_length=cfg.max_length, device="cpu")
    model, tok = ce.model, ce.tokenizer
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    steps = cfg.max_steps  # batches cycle over the shuffled groups (several epochs on small registries)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, steps // 10)) * max(0.0, 1 - s / steps))
    bar = tqdm(range(steps), desc="train-reranker", disable=not progress, unit="step")
    losses, pairs = [], 0
    for step in bar:
        batch = [groups[(step * cfg.batch_size + j) % len(groups)] for j in range(cfg.batch_size)]
        enc = tok([q for q, ts in batch for _ in ts], [t for _, ts in batch for t in ts], padding=True,
                  truncation=True, max_length=cfg.max_length, return_tensors="pt")
        loss = group_loss(model(**enc).logits.view(-1), [len(ts) for _, ts in batch], cfg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
        pairs += len(enc["input_ids"])
        if step % 10 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
    model.eval()
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + f".{os.getpid()}.tmp")
    ce.save(str(tmp))
    meta = {
        "fingerprint": registry_fingerprint(tools, embedder.config.recipe, labelled),
        "recipe": embedder.config.recipe, "tools": len(tools), "labelled": len(labelled), "groups": len(groups),
        "pairs": pairs, "steps": steps, "final_loss": float(np.mean(losses[-20:])), "train_s": time.perf_counter() - t0,
        "config": asdict(cfg),
    }
    write_atomic(tmp / META, json.dumps(meta, indent=2))
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return meta


def reranker_meta(path: str | Path) -> dict | None:
    """The meta of a Nexus-trained reranker folder, or None (missing or user-supplied model)."""
    f = Path(path) / META
    return json.loads(f.read_text()) if f.exists() else None


def trained_for(path: str | Path, tools: list[ToolEntry], recipe: str, labelled: list[tuple[str, str]],
                cfg: RerankerTrainConfig) -> dict | None:
    """The meta of the reranker at `path` when it was trained on exactly these tools, labelled queries and
    config (so it can be reused), else None."""
    meta = reranker_meta(path)
    if meta and meta.get("fingerprint") == registry_fingerprint(tools, recipe, list(labelled)) \
            and meta.get("config") == asdict(cfg):
        return meta
    return None


class Reranker:
    """A sentence-transformers CrossEncoder scoring (query, tool text) pairs; higher = better match."""

    def __init__(self, path: str | Path, max_length: int | None = None, threads: int | None = None):
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"no cross-encoder at {path}: train one with `nexus slb train-reranker` "
                                    "or pass a CrossEncoder folder")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import CrossEncoder

        if threads:
            torch.set_num_threads(threads)
        self.path = path
        self.meta = reranker_meta(path)
        if max_length is None:  # score with the length it was trained at (tokens cost CPU time)
            max_length = (self.meta or {}).get("config", {}).get("max_length", 128)
        quiet_model_loading()
        self.model = CrossEncoder(str(path), max_length=max_length, device="cpu")

    def score(self, query: str, texts: list[str]) -> np.ndarray:
        """(k,) float32 logits for query against each of k tool texts."""
        if not texts:
            return np.zeros(0, np.float32)
        s = self.model.predict([(query, t) for t in texts], batch_size=len(texts), show_progress_bar=False,
                               activation_fn=None, convert_to_numpy=True)
        return np.asarray(s, np.float32).reshape(-1)
