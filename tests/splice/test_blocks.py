"""Block files: round trip, and a corrupted, truncated, foreign or stale block is never spliced."""

from __future__ import annotations

import numpy as np
import pytest
from splice_fixtures import TOOL

from registry.model import Tool
from splice.block import BlockError, BlockKey, load_block
from splice.compiler import block_key, block_path, compile_blocks
from splice.profile import RepairPlan, SpliceProfile
from splice.prompt import segment_tokens
from splice.splicer import splice_tool


@pytest.fixture
def mlx_block(mlx_backend, nexus_home):
    return compile_blocks(mlx_backend, [TOOL], progress=False)[0]


def test_round_trip_matches_session_export(mlx_backend, mlx_block):
    header, kv = load_block(mlx_block, block_key(mlx_backend, TOOL))
    seg = segment_tokens(mlx_backend.tokenizer, TOOL)
    assert list(kv.tokens) == seg and header["n_tokens"] == len(seg)
    assert header["anchor"] > 0 and header["rope"]["type"] == "interleaved"
    assert kv.keys.shape == (30, 3, len(seg), 64) and not kv.keys.flags.writeable  # a view of the mapping
    s = mlx_backend.new_session(n_ctx=1024)
    from splice.prompt import preamble_tokens

    s.prefill(preamble_tokens(mlx_backend.tokenizer))
    s.prefill(seg)
    ref = s.export_kv(header["anchor"], s.n_past)
    np.testing.assert_array_equal(ref.keys, kv.keys)
    np.testing.assert_array_equal(ref.values, kv.values)


def _corrupt(path, at):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["payload_bit", "header_field", "truncated", "magic"])
def test_damaged_block_is_refused(mlx_backend, mlx_block, damage):
    size = mlx_block.stat().st_size
    if damage == "payload_bit":
        _corrupt(mlx_block, size - 1000)
    elif damage == "header_field":
        text = mlx_block.read_bytes()
        mlx_block.write_bytes(text.replace(b'"anchor": ', b'"anchor": 1', 1))
    elif damage == "truncated":
        mlx_block.write_bytes(mlx_block.read_bytes()[: size // 2])
    else:
        _corrupt(mlx_block, 0)
    with pytest.raises(BlockError):
        load_block(mlx_block, block_key(mlx_backend, TOOL))


@pytest.mark.parametrize("field", ["fingerprint", "tokenizer", "tool", "schema_hash", "backend", "context"])
def test_foreign_block_is_refused(mlx_backend, mlx_block, field):
    key = vars(block_key(mlx_backend, TOOL)) | {field: "something-else"}
    with pytest.raises(BlockError, match=field):
        load_block(mlx_block, BlockKey(**key))


def test_splice_falls_back_to_text_on_a_bad_block(mlx_backend, mlx_block):
    """A corrupted block is not used: the segment is prefilled as text, giving exactly the text logits."""
    _corrupt(mlx_block, mlx_block.stat().st_size - 10)
    profile = SpliceProfile("mlx", mlx_backend.info.fingerprint, curve=[[4096, 0]], max_depth=4096)
    s = mlx_backend.new_session(n_ctx=1024)
    s.prefill([1, 2, 3])
    res = splice_tool(s, mlx_backend, TOOL, depth=3, profile=profile)
    assert res.fallback and "checksum" in res.fallback and res.plan == RepairPlan("text", res.n_tokens)
    t = mlx_backend.new_session(n_ctx=1024)
    t.prefill([1, 2, 3])
    t.prefill(segment_tokens(mlx_backend.tokenizer, TOOL))
    assert s.tokens == t.tokens
    np.testing.assert_array_equal(s.decode(5), t.decode(5))


def test_stale_schema_is_not_spliced(mlx_backend, mlx_block):
    changed = Tool.from_mcp(TOOL.to_mcp() | {"description": "Read a file (v2)."})
    assert changed.schema_hash != TOOL.schema_hash and not block_path(mlx_backend, changed).exists()
    s = mlx_backend.new_session(n_ctx=1024)
    s.prefill([1, 2])
    res = splice_tool(s, mlx_backend, changed, depth=2)
    assert res.fallback and res.redecoded == res.n_tokens


def test_a_backend_that_cannot_splice_the_model_prefills_text(llamacpp_backend):
    """llama.cpp clears `can_splice` for a model whose cache cannot K-shift (no RoPE): the segment is prefilled
    as text and the reason is returned for the trace. The flag is cleared by hand here: no such model is packaged."""
    from dataclasses import replace

    caps = llamacpp_backend.capabilities
    llamacpp_backend.capabilities = replace(caps, can_splice=False)
    try:
        s = llamacpp_backend.new_session(n_ctx=1024)
        s.prefill([1, 2, 3])
        res = splice_tool(s, llamacpp_backend, TOOL, depth=3)
    finally:
        llamacpp_backend.capabilities = caps
    assert res.fallback == "llamacpp cannot splice a llama model" and res.redecoded == res.n_tokens
    assert s.n_past == 3 + len(segment_tokens(llamacpp_backend.tokenizer, TOOL))
