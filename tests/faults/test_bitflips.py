"""Any single flipped bit or cut anywhere in a block or buffer file is refused with the component's own error:
never a crash of another kind, never wrong data accepted (hypothesis over positions; real files)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from native.base import KVRange
from slb.buffer import BufferData, BufferMismatchError, SLBuffer, quantize_rows, write_buffer
from splice.block import BlockError, BlockKey, load_block, write_block

FAST = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
KEY = BlockKey(backend="mlx", fingerprint="f" * 32, tokenizer="t" * 16, tool="demo.tool", schema_hash="h" * 64)
RNG = np.random.default_rng(0)
KV = KVRange(positions=np.arange(10, 14), tokens=np.array([5, 6, 7, 8]),
             keys=RNG.standard_normal((2, 1, 4, 8)).astype(np.float32),
             values=RNG.standard_normal((2, 1, 4, 8)).astype(np.float32))
with tempfile.TemporaryDirectory() as _tmp:
    BLOCK = write_block(Path(_tmp) / "b.kvb", {**vars(KEY), "anchor": 10}, KV).read_bytes()
    _q, _s = quantize_rows(RNG.standard_normal((6, 16)))
    BUFFER = write_buffer(Path(_tmp) / "b.slb", BufferData("m", 16, [f"t{i}" for i in range(6)], ["h"] * 6, _q, _s)
                          ).read_bytes()


def _damage(data: bytes, at: int, bit: int, cut: bool) -> bytes:
    if cut:
        return data[:at]
    out = bytearray(data)
    out[at] ^= 1 << bit
    return bytes(out)


def test_damaged_block_is_always_refused(fault):
    f = fault("any bit flip or cut in a KV block (hypothesis)", "splice.block", "BlockError, never another exception")
    runs = []

    @FAST
    @given(at=st.integers(0, len(BLOCK) - 1), bit=st.integers(0, 7), cut=st.booleans())
    def prop(at, bit, cut):
        runs.append(cut)
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "b.kvb"
            p.write_bytes(_damage(BLOCK, at, bit, cut))
            try:
                load_block(p, KEY)
            except BlockError:
                return
            raise AssertionError(f"a block damaged at byte {at} (cut={cut}) was accepted")

    prop()
    f.observe(f"{len(runs)} damaged copies ({sum(runs)} cuts) of a {len(BLOCK)}-byte block: all BlockError")


def test_damaged_buffer_is_refused_or_identical(fault):
    f = fault("any bit flip or cut in an SLB buffer (hypothesis)", "slb.buffer",
              "BufferMismatchError, or (a flip in alignment padding only) identical data")
    runs, passed = [], []

    @FAST
    @given(at=st.integers(0, len(BUFFER) - 1), bit=st.integers(0, 7), cut=st.booleans())
    def prop(at, bit, cut):
        runs.append(cut)
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "b.slb"
            p.write_bytes(BUFFER)
            good = SLBuffer(p, model_id="m", dim=16)
            ref = (np.array(good.scales), list(good.names), good.header["checksum"])
            p.write_bytes(_damage(BUFFER, at, bit, cut))
            try:
                buf = SLBuffer(p, model_id="m", dim=16)
            except BufferMismatchError:
                return
            # only a flip in alignment padding (outside header and sections) may pass, and it changes nothing
            assert not cut
            assert np.array_equal(buf.scales, ref[0]) and buf.names == ref[1] and buf.header["checksum"] == ref[2]
            passed.append(at)

    prop()
    f.observe(f"{len(runs)} damaged copies ({sum(runs)} cuts): {len(runs) - len(passed)} refused, {len(passed)} "
              "padding-only flips read identical data")
