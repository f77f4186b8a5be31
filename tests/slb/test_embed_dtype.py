"""A batch of tool texts in bfloat16 (`EmbedderConfig.batch_dtype`): the float32 vectors within rounding, only for
batches, and said in the embedding report; "auto" chooses it from the CPU's flags."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from registry.model import Tool
from slb.embedder import Embedder, EmbedderConfig, batch_dtype, native_bf16
from slb.tools import as_entry, tool_text

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "routing"
needs_catalogue = pytest.mark.skipif(not (DATA / "tools.jsonl").exists(), reason="public routing catalogue not present")


def _entries(n: int = 40) -> list:
    lines = (DATA / "tools.jsonl").read_text().splitlines()[:n]
    return [as_entry(Tool.from_mcp(json.loads(line))) for line in lines]


def test_native_bf16_reads_the_cpu_flags():
    assert native_bf16("processor\t: 0\nflags\t\t: fpu sse2 avx2 amx_bf16 amx_tile\n")
    assert native_bf16("flags\t\t: fpu avx512f avx512_bf16\n")
    assert not native_bf16("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n")
    assert not native_bf16("")


def test_config_refuses_an_unknown_dtype():
    with pytest.raises(ValueError, match="batch_dtype"):
        EmbedderConfig(batch_dtype="float16")


def test_the_environment_chooses_for_auto_only(monkeypatch):
    monkeypatch.setenv("NEXUS_EMBED_DTYPE", "float32")
    assert (batch_dtype("auto"), batch_dtype("bfloat16")) == ("float32", "bfloat16")
    monkeypatch.setenv("NEXUS_EMBED_DTYPE", "bfloat16")
    assert (batch_dtype("auto"), batch_dtype("float32")) == ("bfloat16", "float32")
    monkeypatch.setenv("NEXUS_EMBED_DTYPE", "fp8")
    with pytest.raises(ValueError, match="NEXUS_EMBED_DTYPE"):
        batch_dtype("auto")
    monkeypatch.delenv("NEXUS_EMBED_DTYPE")
    assert batch_dtype("auto") == ("bfloat16" if native_bf16() else "float32")


@needs_catalogue
def test_a_bfloat16_batch_gives_the_float32_vectors_within_rounding():
    texts = [tool_text(e) for e in _entries()]
    assert len(texts) > EmbedderConfig().batch_size
    f32 = Embedder(EmbedderConfig(batch_dtype="float32"))
    bf16 = Embedder(EmbedderConfig(batch_dtype="bfloat16"))
    x, y = f32.embed_texts(texts), bf16.embed_texts(texts)
    assert (f32.batch_name(len(texts)), bf16.batch_name(len(texts))) == ("float32", "bfloat16")
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), 1.0, atol=1e-5)
    cos = np.sum(x * y, axis=1)
    assert cos.min() > 0.999 and not np.array_equal(x, y), cos.min()  # rounded, not recomputed in float32
    # the same tool wins for every text
    assert (np.argmax(y @ x.T, axis=1) == np.argmax(x @ x.T, axis=1)).all()
    # a query, or a batch no larger than one model batch, stays float32
    few = texts[: EmbedderConfig().batch_size]
    assert bf16.batch_name(len(few)) == "float32"
    np.testing.assert_allclose(bf16.embed_texts(few), f32.embed_texts(few), atol=1e-6)  # bfloat16: ~1e-3 apart


@needs_catalogue
def test_the_embedding_report_says_what_the_tools_ran_in():
    e = Embedder(EmbedderConfig(batch_dtype="bfloat16"))
    entries = _entries()
    e.embed_tools(entries[:4])
    assert e.last.dtype == "float32" and e.last.line().endswith("s (float32)")
    e.embed_tools(entries)
    assert (e.last.embedded, e.last.memory, e.last.dtype) == (len(entries) - 4, 4, "bfloat16")
    e.embed_tools(entries)
    assert e.last.embedded == 0 and e.last.dtype is None and "(" not in e.last.line()
