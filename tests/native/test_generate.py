"""The layered generation API and the `nexus generate` command on the packaged model."""

import os
import subprocess
import sys

import numpy as np
import pytest

from native.generate import Sampler, SamplerConfig, generate, generate_step, stream_generate
from native.registry import list_backends

MSG = [{"role": "user", "content": "Name three primary colors."}]


def test_stream_pieces_join_to_generate(backend):
    pieces = list(stream_generate(backend, MSG, max_tokens=24))
    text = "".join(p.text for p in pieces)
    assert text == generate(backend, MSG, max_tokens=24)
    assert "red" in text.lower()
    assert pieces[-1].finish_reason in ("stop", "length") and all(p.finish_reason is None for p in pieces[:-1])
    assert pieces[-1].prompt_tokens == len(backend.tokenizer.encode_chat(MSG))
    assert pieces[0].ttft_s > 0 and pieces[-1].prompt_tps > 0


def test_max_tokens_and_stop(backend):
    short = list(stream_generate(backend, MSG, max_tokens=3))
    assert short[-1].finish_reason == "length" and short[-1].generation_tokens == 3
    full = list(stream_generate(backend, MSG, max_tokens=200))
    assert full[-1].finish_reason == "stop" and full[-1].token in backend.tokenizer.eos_ids
    assert "<|im_end|>" not in "".join(p.text for p in full)


def test_sampling_is_seeded(mlx_backend):
    cfg = SamplerConfig(temperature=0.9, top_p=0.9, seed=7)
    a = generate(mlx_backend, MSG, max_tokens=16, sampler=cfg)
    assert a == generate(mlx_backend, MSG, max_tokens=16, sampler=SamplerConfig(0.9, 0.9, 7))
    with pytest.raises(ValueError):
        SamplerConfig(temperature=-1)


@pytest.mark.parametrize("name", list_backends(text_only=False))
def test_cli_generate_on_packaged_model(name, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", NEXUS_HOME=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "nexus_agent.cli", "generate", "--backend", name, "--max-tokens", "16",
                        "Name three primary colors."], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "red" in r.stdout.lower()
    assert "tok/s" in r.stderr


class _Force:
    """Forces `plan` after the first (free) token; at step `refuse` it forces another token instead, as a grammar
    that does not allow the planned one would."""

    def __init__(self, plan, refuse=None):
        self.plan, self.refuse = plan, refuse

    def __call__(self, tokens, logits):
        j = len(tokens) - 1
        if 0 <= j < len(self.plan):
            want = self.plan[j] if j != self.refuse else self.plan[j] + 1
            logits = np.full_like(logits, -np.inf)
            logits[want] = 0.0
        return logits


class _ForceAhead(_Force):
    def ahead(self, tokens):
        return list(self.plan) if len(tokens) == 1 else []


@pytest.mark.parametrize("refuse", [None, 2])
def test_tokens_planned_ahead_are_fed_in_one_pass_with_the_same_result(backend, refuse):
    """A processor's `ahead` tokens go into the session in one forward pass: the same tokens come out as when each
    is decoded alone, the logits after them agree to float rounding (a batch of tokens runs other kernels than
    one token), and the session holds exactly what the one-by-one loop holds (a planned token the processors
    do not take is removed again)."""
    tok = backend.tokenizer
    prompt = tok.encode_chat(MSG)
    plan = tok.encode(" red, green and blue")
    n = len(plan) + 3  # the free first token, the plan, two free tokens after it
    runs = []
    for proc in (_Force(plan, refuse), _ForceAhead(plan, refuse)):
        s = backend.new_session(1024)
        try:
            steps = list(generate_step(s, prompt, Sampler(SamplerConfig()), n, frozenset(), [proc]))
            runs.append(([t for t, _ in steps], s.n_past, steps[len(plan) + 1][1]))
        finally:
            s.close()
    (one, held, logits), (fed, held_fed, logits_fed) = runs
    assert one == fed and held == held_fed == len(prompt) + n - 1  # every yielded token but the last
    assert one[1:1 + len(plan)] == (plan if refuse is None else plan[:2] + [plan[2] + 1] + plan[3:])
    diff = float(np.max(np.abs(logits - logits_fed)))
    assert diff < 2.0  # measured: 0.49 on llama.cpp (Q4 GEMM vs GEMV), 3e-5 on MLX; the logits of another
    # position differ by tens


def test_a_probe_reads_another_continuation_and_leaves_the_live_sequence_as_it_was(backend):
    """`Session.probe(prefix, tokens)` (llama.cpp): the logits after the live prefix and other tokens, computed on
    the scratch sequence; they match the same tokens prefilled after the same prefix, and the live sequence decodes
    on unchanged. Each is compared with the same computation on a second session (the same batches: a prefill of
    many tokens and a decode of one differ by a kernel, KL 0.003 on one CPU), so a bound far below what a probe left
    in the live sequence or a wrong prefix would cost holds on any CPU."""
    from logits import kl

    ids = backend.tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    head, tail = ids[:6], ids[6:]
    other = list(reversed(tail))  # any other continuation of the same head
    live, ref = backend.new_session(256), backend.new_session(256)
    if not hasattr(live, "probe"):
        live.close(), ref.close()
        pytest.skip("this backend has no scratch-sequence probe")
    try:
        live.prefill(head + tail[:-1])
        n = live.n_past
        probed = live.probe(len(head), other)
        assert live.n_past == n
        ref.prefill(head + tail[:-1])
        ref.remove(len(head), ref.n_past)
        assert kl(ref.prefill(other), probed) < 1e-3  # measured 0.0 (the same batches); after another token: 12
        ref.remove(len(head), ref.n_past)
        ref.prefill(tail[:-1])
        assert kl(ref.decode(tail[-1]), live.decode(tail[-1])) < 1e-3
    finally:
        live.close()
        ref.close()
