"""The layered generation API and the `nexus generate` command on the packaged model."""

import os
import subprocess
import sys

import pytest

from native.generate import SamplerConfig, generate, stream_generate
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
