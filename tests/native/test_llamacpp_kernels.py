"""Which llama.cpp kernels we ask for: weight repacking off on CPUs with AMX (`extra_buffers_allowed`); what of its
log reaches stderr."""

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


def test_only_llama_cpps_errors_reach_stderr(capsys):
    """llama.cpp's warnings (each session's "model default pooling_type is [-1], but [0] was specified") stay out of
    a user's stderr; its errors do not."""
    from native import load_backend

    backend = load_backend("llamacpp", None)
    try:
        backend.new_session(256).close()
        assert "pooling_type" not in capsys.readouterr().err
    finally:
        backend.close()
    from native.llamacpp_backend import _log_errors

    _log_errors(3, b"a warning\n", None)  # ggml's WARN, then an ERROR and its continuation
    _log_errors(4, b"an error ", None)
    _log_errors(5, b"continued\n", None)
    assert capsys.readouterr().err == "an error continued\n"
