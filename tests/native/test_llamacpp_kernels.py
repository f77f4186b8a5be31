"""Which llama.cpp kernels we ask for: weight repacking off on CPUs with AMX (`extra_buffers_allowed`)."""

from __future__ import annotations

from native.llamacpp_backend import cpu_has_amx, extra_buffers_allowed

AMX = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f amx_bf16 amx_tile amx_int8\n"
NO_AMX = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\nbugs\t\t: amx_tile_lookalike\n"


def test_amx_is_read_from_the_flags_line_only():
    assert cpu_has_amx(AMX)
    assert not cpu_has_amx(NO_AMX)  # a word on another line, or one that only starts with amx_tile, is not it
    assert not cpu_has_amx("")


def test_repacking_is_off_with_amx_unless_forced(monkeypatch):
    monkeypatch.delenv("NEXUS_LLAMA_EXTRA_BUFTS", raising=False)
    assert not extra_buffers_allowed(AMX)
    assert extra_buffers_allowed(NO_AMX)
    monkeypatch.setenv("NEXUS_LLAMA_EXTRA_BUFTS", "1")
    assert extra_buffers_allowed(AMX)
    monkeypatch.setenv("NEXUS_LLAMA_EXTRA_BUFTS", "0")
    assert not extra_buffers_allowed(NO_AMX)
