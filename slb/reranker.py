"""Cross-encoder reranker over (query, tool text) pairs for the top-k candidates of the scan.

No package here ships cross-encoder weights, so `train_reranker` fine-tunes one from the packaged MiniLM
(a fresh 1-logit head on the bi-encoder's transformer) on queries synthesized from the registry's tools plus
any labelled (query, gold tool) pairs, with hard negatives taken from the embedding scan itself. The result
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

from nexus_agent.atomic import write_atomic
from slb.embedder import Embedder, packaged_minilm_path, quiet_model_loading, text_fingerprint
from slb.scan import scan_batch
from slb.buffer import quantize_rows
from slb.synth import synthesize_queries
from slb.tools import ToolEntry, tool_text

META = "nexus_reranker.json"


@dataclass
class RerankerTrainConfig:
    """Fine-tuning knobs. Steps are optimizer steps of `batch_size` pairs; pairs are (1 pos + negatives)."""

    queries_per_tool: int = 2
    negatives: int = 3
    batch_size: int = 16
    max_steps: int = 400
    lr: float = 5e-5
    max_length: int = 96
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        for k in ("queries_per_tool", "negatives", "batch_size", "max_steps", "max_length", "threads"):
            if getattr(self, k) < 1:
                raise ValueError(f"RerankerTrainConfig.{k} must be >= 1, got {getattr(self, k)}")
        if not 0 < self.lr < 1:
            raise ValueError(f"lr must be in (0, 1), got {self.lr}")


def registry_fingerprint(tools: list[ToolEntry], recipe: str, labelled: list[tuple[str, str]] = ()) -> str:
    """Fingerprint of what a trained reranker depends on: tool texts and the labelled set."""
    return text_fingerprint([tool_text(t, recipe) for t in tools] + [f"{q}\t{g}" for q, g in labelled])


def build_pairs(
    tools: list[ToolEntry], embedder: Embedder, labelled: list[tuple[str, str]], cfg: RerankerTrainConfig
) -> list[tuple[str, str, float]]:
    """(query, tool text, label 0/1) pairs: synthesized + labelled queries, hard negatives from the scan."""
    rng = random.Random(cfg.seed)
    by_name = {t.name: t for t in tools}
    queries: list[tuple[str, str]] = []
    for t in tools:
        queries += [(q, t.name) for q in synthesize_queries(t, cfg.queries_per_tool, rng)]
    queries += [(q, g) for q, g in labelled if g in by_name]
    texts = {t.name: tool_text(t, embedder.config.recipe) for t in tools}
    m8, scales = quantize_rows(embedder.embed_tools(tools))
    names = [t.name for t in tools]
    qv = embedder.embed_texts([q for q, _ in queries])
    _, ids = scan_batch(m8, scales, qv, k=cfg.negatives + 8)
    pairs = []
    for (q, gold), row in zip(queries, ids):
        pairs.append((q, texts[gold], 1.0))
        hard = [names[i] for i in row if i >= 0 and names[i] != gold][: cfg.negatives]
        rand = rng.choice(names)  # one easy negative keeps the score calibrated far from the query
        if cfg.negatives > 1 and rand != gold and rand not in hard:
            hard = hard[: cfg.negatives - 1] + [rand]
        pairs += [(q, texts[n], 0.0) for n in hard]
    rng.shuffle(pairs)
    return pairs


def train_reranker(
    tools: list, embedder: Embedder, out_dir: str | Path, labelled: list[tuple[str, str]] = (),
    cfg: RerankerTrainConfig | None = None, progress: bool = True,
) -> dict:
    """Fine-tune a cross-encoder from the packaged MiniLM and save it (with its meta) to out_dir.

    tools: the registry (ToolEntry or anything `as_entry` accepts); labelled: (query, gold tool name) pairs.
    Returns the meta dict (fingerprint, steps, pairs, train_s).
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
    pairs = build_pairs(tools, embedder, labelled, cfg)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ce = CrossEncoder(str(packaged_minilm_path()), num_labels=1, max_length=cfg.max_length, device="cpu")
    model, tok = ce.model, ce.tokenizer
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    steps = cfg.max_steps  # batches cycle over the shuffled pairs (several epochs on small registries)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, steps // 10)) * max(0.0, 1 - s / steps))
    loss_fn = torch.nn.BCEWithLogitsLoss()
    bar = tqdm(range(steps), desc="train-reranker", disable=not progress, unit="step")
    losses = []
    for step in bar:
        batch = [pairs[(step * cfg.batch_size + j) % len(pairs)] for j in range(cfg.batch_size)]
        enc = tok([p[0] for p in batch], [p[1] for p in batch], padding=True, truncation=True,
                  max_length=cfg.max_length, return_tensors="pt")
        logits = model(**enc).logits.view(-1)
        loss = loss_fn(logits, torch.tensor([p[2] for p in batch]))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
        if step % 10 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
    model.eval()
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + f".{os.getpid()}.tmp")
    ce.save(str(tmp))
    meta = {
        "fingerprint": registry_fingerprint(tools, embedder.config.recipe, labelled),
        "recipe": embedder.config.recipe, "tools": len(tools), "labelled": len(labelled), "pairs": len(pairs),
        "steps": steps, "final_loss": float(np.mean(losses[-20:])), "train_s": time.perf_counter() - t0,
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


class Reranker:
    """A sentence-transformers CrossEncoder scoring (query, tool text) pairs; higher = better match."""

    def __init__(self, path: str | Path, max_length: int = 128, threads: int | None = None):
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"no cross-encoder at {path}: train one with `nexus slb train-reranker` or pass a CrossEncoder folder")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import CrossEncoder

        if threads:
            torch.set_num_threads(threads)
        self.path = path
        self.meta = reranker_meta(path)
        quiet_model_loading()
        self.model = CrossEncoder(str(path), max_length=max_length, device="cpu")

    def score(self, query: str, texts: list[str]) -> np.ndarray:
        """(k,) float32 logits for query against each of k tool texts."""
        if not texts:
            return np.zeros(0, np.float32)
        s = self.model.predict([(query, t) for t in texts], batch_size=len(texts), show_progress_bar=False,
                               activation_fn=None, convert_to_numpy=True)
        return np.asarray(s, np.float32).reshape(-1)
