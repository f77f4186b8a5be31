"""`nexus doctor` on a real home: healthy, then with a stale and a corrupted artefact of each kind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nexus_agent.doctor import check_blocks, check_buffer, check_install, check_registry
from registry.servers.calculator import FUNCTIONS as CALCULATOR
from registry.sources import register_functions
from registry.store import RegistryStore
from slb.build import build_buffer
from slb.embedder import Embedder
from slb.service import buffer_path
from splice.compiler import compile_stale
from splice.prompt import CONTEXTS

NEXUS = Path(sys.executable).with_name("nexus")


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _rows(store):
    return {name: (ok, detail)
            for name, ok, detail in check_registry(store) + check_buffer(store) + check_blocks(store)}


@pytest.mark.slow
def test_doctor_reports_stale_and_corrupted_artefacts(llamacpp_backend, nexus_home, fault):
    f = fault("stale + corrupted artefacts in a home", "nexus_agent.doctor",
              "doctor flags each (stale buffer, stale block, broken block) with the command that fixes it; exit 1")
    with RegistryStore() as store:
        register_functions(CALCULATOR, store)
        build_buffer(store.list_tools(), Embedder(), buffer_path())
        blocks = compile_stale(llamacpp_backend, store, progress=False)
        healthy = _rows(store)
        assert all(ok for ok, _ in healthy.values()), healthy
        assert healthy["kv blocks"][1].startswith(f"{len(blocks)} ok, 0 stale, 0 broken")

        add = store.get_tool("add").to_mcp()  # a schema change: buffer row and block of `add` are now stale
        store.add_tools([dict(add, description=add["description"] + " Works on floats.")])
        broken_block = next(p for p in blocks if not p.name.startswith("add@"))
        _flip(broken_block, broken_block.stat().st_size - 100)
        rows = _rows(store)
        assert not rows["slb buffer"][0] and "1 changed (add)" in rows["slb buffer"][1]
        assert "nexus slb build" in rows["slb buffer"][1]
        n = len(CONTEXTS)  # blocks per tool: all of `add`'s are stale
        assert rows["kv blocks"][1].startswith(f"{len(blocks) - n - 1} ok, {n} stale, 1 broken")
        assert broken_block.name in rows["kv blocks broken"][1] and "checksum" in rows["kv blocks broken"][1]
        assert "add@" in rows["kv blocks stale"][1] and "nexus compile" in rows["kv blocks stale"][1]

        _flip(buffer_path(), buffer_path().stat().st_size - 1)  # now the buffer itself is corrupted
        assert "checksum" in check_buffer(store)[0][2]
        (broken_block.parent / ".x.kvb.123.tmp").write_bytes(b"partial")
        assert "leftover temp" in _rows(store)["kv blocks temp files"][1]

    env = dict(os.environ, NEXUS_HOME=str(nexus_home), NEXUS_THREADS="1")
    cli = subprocess.run([str(NEXUS), "doctor", "--no-servers"], env=env, capture_output=True, text=True, timeout=240)
    assert cli.returncode == 1, cli.stdout + cli.stderr
    for needle in ("[ok] model", "[ok] llguidance", "[ok] re-anchor: keys rotated in the block",
                   "[ok] registry", "[FAIL] slb buffer", "[FAIL] kv blocks broken",
                   "[FAIL] kv blocks stale", "nexus compile", "nexus slb build"):
        assert needle in cli.stdout, cli.stdout
    f.observe("healthy home all ok; then stale buffer/block, broken block and buffer, temp file each flagged "
              "with its fix; CLI exit 1", lost=0)


def test_install_checks_name_the_packaged_models():
    rows = {n: (ok, d) for n, ok, d in check_install("llamacpp")}
    assert rows["model files"][0] and rows["model files"][1].endswith(".gguf")
    assert rows["embedder files"][0]


def test_doctor_says_what_tool_batches_run_in(monkeypatch):
    from slb.embedder import native_bf16

    ok, detail = {n: (ok, d) for n, ok, d in check_install("llamacpp")}["embedder batches"]
    want = "bfloat16 (the CPU multiplies" if native_bf16() else "float32 (no native bfloat16"
    assert ok and want in detail, detail
    monkeypatch.setenv("NEXUS_EMBED_DTYPE", "float32")
    assert {n: d for n, _, d in check_install("llamacpp")}["embedder batches"].endswith("float32 (NEXUS_EMBED_DTYPE)")
    monkeypatch.setenv("NEXUS_EMBED_DTYPE", "half")
    ok, detail = {n: (ok, d) for n, ok, d in check_install("llamacpp")}["embedder batches"]
    assert not ok and "NEXUS_EMBED_DTYPE='half'" in detail


def test_candidate_blocks_are_checked_but_never_stale(llamacpp_backend, nexus_home):
    from nexus_agent.turn.blocks import ToolBlocks

    b = llamacpp_backend
    folder = nexus_home / "blocks" / b.info.fingerprint / b.name / "tools"  # where decider_for keeps them
    blocks = ToolBlocks(b, folder=folder)
    tok = b.tokenizer
    blocks.compile(tok.encode("Tools:\n"), [tok.encode('{"name": "add"}'), tok.encode('{"name": "multiply"}')])
    assert blocks.save() == 2
    with RegistryStore() as store:  # an empty registry: no tool of theirs to be stale against
        rows = _rows(store)
        assert rows["kv blocks"] == (True, f"0 ok, 0 stale, 0 broken in {nexus_home / 'blocks'}")
        assert rows["candidate blocks"][0] and rows["candidate blocks"][1].startswith("2 ok, 0 broken")
        victim = sorted(folder.glob("*.kvb"))[0]
        _flip(victim, victim.stat().st_size - 1)
        ok, detail = _rows(store)["candidate blocks"]
    assert not ok and detail.startswith("1 ok, 1 broken") and victim.name in detail and "checksum" in detail
