"""`nexus convert`: a GGUF (any architecture in `native.models`) as an MLX / Hugging Face model folder.

The folder holds config.json in the architecture's Hugging Face form, model.safetensors (float32, Hugging
Face's conventions: half-split Q/K rows, Gemma's norm weights without the GGUF's + 1) and tokenizer.json +
tokenizer_config.json. mlx-lm's own model classes load it as they are (`nexus eval backends` compares
against them on the same weights), and so does our MLX backend.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from native.base import ModelError
from native.mlx_weights import load_model
from native.model_files import resolve_model
from native.models import ARCHITECTURES, architecture
from native.tokenizer import load_tokenizer


def convert(model: str | None, out_dir: str | os.PathLike) -> Path:
    """Write `model` (a GGUF; None: the packaged SmolLM2) as a model folder at `out_dir`; returns its path."""
    src = resolve_model(model)
    loaded, info, _ = load_model(src, quantized=False)
    arch = architecture(info.architecture, src.path, "general.architecture")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights = arch.hf_weights(dict(tree_flatten(loaded.parameters())), loaded.args)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    try:
        cfg = arch.hf_config(loaded.args)
    except ValueError as e:
        raise ModelError(f"{src.path}: cannot write a config.json for this model ({e})") from None
    assert ARCHITECTURES.get(cfg["model_type"]) == arch.__name__.rsplit(".", 1)[1]
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    tok = load_tokenizer(src.path)
    tok._special.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": tok.chat_template if not tok.tool_template else [
            {"name": "default", "template": tok.chat_template}, {"name": "tool_use", "template": tok.tool_template}],
        "bos_token": tok.bos_token, "eos_token": tok.eos_token,
        "add_bos_token": tok.add_bos}, indent=2))
    return out


def converted_folder(model: str | None) -> Path:
    """`model` (a GGUF) as a model folder cached in the Nexus home (`models/mlx/<fingerprint>`), converted on first use;
    a folder is written under a temporary name and renamed, so a half-written one is never found."""
    import shutil
    import tempfile

    from native.model_files import fingerprint, models_dir

    src = resolve_model(model)
    if src.format != "gguf":
        return Path(src.path)
    target = models_dir() / "mlx" / fingerprint(src.path)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        convert(src.path, tmp)
        tmp.rename(target)
    except OSError:
        if not (target / "config.json").is_file():  # not another process's finished folder
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
