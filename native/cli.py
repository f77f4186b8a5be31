"""`nexus generate`: a streamed chat answer from any backend in `native.registry.BACKENDS`; `nexus convert`: a GGUF
as an MLX/Hugging Face model folder."""

from __future__ import annotations

import argparse
import sys

from native.registry import list_backends


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=list_backends(), default="llamacpp",
                   help="model backend (default: llamacpp; openai: an OpenAI-compatible server, see --base-url)")
    p.add_argument("--model", default=None,
                   help="GGUF file, MLX/HF model directory or packaged model name (default: smollm2; gemma3 where "
                        "installed); with --backend openai, "
                        "the served model name (default: $NEXUS_OPENAI_MODEL or the server's first)")
    p.add_argument("--base-url", default=None,
                   help="--backend openai: API root such as http://127.0.0.1:8000/v1 (default: $NEXUS_OPENAI_BASE_URL)")


def register(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="stream a chat answer from the model")
    add_model_arguments(g)
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--raw", action="store_true", help="do not apply the chat template")
    g.add_argument("prompt")
    g.set_defaults(func=_generate)
    c = sub.add_parser("convert", help="write a GGUF as an MLX/Hugging Face model folder (config.json + safetensors)")
    c.add_argument("model", help="GGUF file (any architecture the MLX backend reads)")
    c.add_argument("out", help="output folder")
    c.set_defaults(func=_convert)


def _convert(args) -> int:
    from native.convert import convert

    print(convert(args.model, args.out))
    return 0


def backend_options(args) -> dict:
    """Backend keyword options from the CLI (only --base-url, for the openai backend)."""
    return {"base_url": args.base_url} if getattr(args, "base_url", None) else {}


def stream_answer(backend_name: str, model: str | None, prompt, max_tokens: int, sampler=None, out=sys.stdout,
                  **options) -> dict:
    """Stream an answer to `out`; return timings."""
    from native import load_backend
    from native.generate import stream_generate

    backend = load_backend(backend_name, model, **options)
    last = None
    try:
        for r in stream_generate(backend, prompt, max_tokens=max_tokens, sampler=sampler):
            out.write(r.text)
            out.flush()
            last = r
    finally:
        backend.close()
    out.write("\n")
    if last is None:
        return {}
    return {
        "prompt_tokens": last.prompt_tokens, "generated": last.generation_tokens, "ttft_s": last.ttft_s,
        "prompt_tps": last.prompt_tps, "decode_tps": last.generation_tps, "finish": last.finish_reason,
    }


def format_stats(s: dict) -> str:
    return (f"[{s['prompt_tokens']} prompt tokens, {s['prompt_tps']:.0f} tok/s | {s['generated']} generated, "
            f"{s['decode_tps']:.1f} tok/s | TTFT {s['ttft_s'] * 1000:.0f} ms | {s['finish']}]")


def _generate(args) -> int:
    from native.generate import SamplerConfig

    prompt = args.prompt if args.raw else [{"role": "user", "content": args.prompt}]
    stats = stream_answer(args.backend, args.model, prompt, args.max_tokens,
                          SamplerConfig(args.temperature, args.top_p, args.seed), **backend_options(args))
    if stats:
        print(format_stats(stats), file=sys.stderr)
    return 0
