"""Fixtures the native tests share: the tiny random-weight GGUFs of `tests/tiny_models.py`, written once."""

from __future__ import annotations

import pytest
from tiny_models import SPECS, write_tiny_gguf

from native import load_backend
from native.model_files import default_model_path, gemma3_path


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """`get(name)`: (path, MLX backend, llama.cpp backend) of the tiny GGUF `name`, written and loaded once."""
    made = {}

    def get(name: str):
        if name not in made:
            spec = SPECS[name]
            vocab = gemma3_path() if spec.vocab == "spm" else default_model_path()
            path = write_tiny_gguf(tmp_path_factory.mktemp(name) / f"{name}.gguf", spec, vocab)
            made[name] = (path, load_backend("mlx", path), load_backend("llamacpp", path))
        return made[name]

    yield get
    for _, m, lc in made.values():
        m.close()
        lc.close()
