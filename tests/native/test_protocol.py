"""The backend table and the session protocol: BACKENDS drives selection by capability and the CLI choices,
every local backend's sessions implement the protocol they declare, and unsupported operations have defaults."""

import argparse

import numpy as np
import pytest

from native import BACKENDS, BackendError, KVSession, Session, list_backends

TEXT = "The quick brown fox jumps over the lazy dog. It was fast."


def test_list_backends_selects_by_capability():
    assert list_backends() == list(BACKENDS)
    local = list_backends(text_only=False)
    assert local == ["llamacpp", "mlx"] and list_backends(text_only=True) == ["openai"]
    assert list_backends(can_splice=True) == local
    assert list_backends(can_recompute_kv=True) == list_backends(can_skip_reanchor=True) == ["mlx"]
    with pytest.raises(ValueError, match="unknown capability can_fly"):
        list_backends(can_fly=True)


def test_loaded_backend_carries_its_table_entry(backend):
    spec = BACKENDS[backend.name]
    assert backend.capabilities is spec.capabilities
    assert type(backend).__name__ == spec.target.split(":")[1]


def test_sessions_implement_the_protocol_their_capabilities_declare(backend):
    s = backend.new_session(256)
    try:
        assert isinstance(s, Session)
        assert isinstance(s, KVSession) == backend.capabilities.can_splice
        ids = backend.tokenizer.encode(TEXT)
        logits = s.prefill(ids)
        s.begin_answer()  # a backend session keeps no per-answer state
        s.begin_answer(first_step=3)
        assert s.n_past == len(ids)
        assert s.decode(int(logits.argmax())).shape == logits.shape and s.n_past == len(ids) + 1
    finally:
        s.close()


def test_recompute_and_bare_import_follow_the_capabilities(backend):
    ids = backend.tokenizer.encode(TEXT)
    src, dst = backend.new_session(256), backend.new_session(256)
    try:
        src.prefill(ids)
        kv = src.export_kv(4, len(ids))
        dst.prefill(ids[:2])
        if backend.capabilities.can_skip_reanchor:
            dst.import_kv(kv, rotate=False)
            dst.remove(2, dst.n_past)
        else:
            with pytest.raises(BackendError, match="can_skip_reanchor"):
                dst.import_kv(kv, rotate=False)
            assert dst.n_past == 2  # rejected before anything was imported
        dst.import_kv(kv, span=(1, len(kv)))
        assert dst.n_past == 2 + len(kv) - 1
        picked = dst.recompute_kv(2, dst.n_past, 0.5)
        if backend.capabilities.can_recompute_kv:
            assert len(picked) == int(np.ceil(0.5 * (len(kv) - 1))) and picked.min() >= 2
        else:
            assert picked.dtype == np.int64 and len(picked) == 0  # the protocol's default: nothing recomputed
    finally:
        src.close()
        dst.close()


def _backend_choices(parser: argparse.ArgumentParser, path: str = "") -> dict[str, list[str]]:
    """`--backend` choices of every (sub)command, by command path ("generate", "splice calibrate", ...)."""
    found = {}
    for action in parser._actions:
        if "--backend" in action.option_strings and action.choices is not None:
            found[path.strip()] = list(action.choices)
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(_backend_choices(sub, f"{path} {name}"))
    return found


def test_cli_backend_choices_come_from_the_table():
    from nexus_agent.cli import build_parser

    choices = _backend_choices(build_parser())
    every, local, splice = list_backends(), list_backends(text_only=False), list_backends(can_splice=True)
    want = {"generate": every, "run": every, "chat": every, "doctor": local, "demo": local, "eval agent": local,
            "compile": splice, "splice calibrate": splice}
    assert {k: choices.get(k) for k in want} == want


def test_evicting_session_satisfies_the_session_protocol(mlx_backend):
    """The agent's budgeted MLX context wraps its session in `EvictingSession`; the loop drives it through the
    `Session` protocol alone (begin_answer included), and only a wrapped session yields a certificate."""
    from nexus_agent.memory import LiveContext, MemoryConfig, certify_answer

    ids = mlx_backend.tokenizer.encode(" ".join(f"word{i}" for i in range(60)))
    live = LiveContext(mlx_backend, MemoryConfig(kv_budget=64), 1024)
    plain = LiveContext(mlx_backend, MemoryConfig(), 1024)
    try:
        assert isinstance(live.session, Session) and live.manager["kind"] == "scored"
        for ctx in (live, plain):
            logits = ctx.prefill(ids)
            ctx.begin_answer()
            ctx.session.decode(int(logits.argmax()))
        cert = certify_answer(live)
        assert set(cert) == {"certificate", "red_flag", "recalled"} and cert["certificate"] >= 0
        assert certify_answer(plain) is None
    finally:
        live.close()
        plain.close()
