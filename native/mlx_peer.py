"""`python -m native.mlx_peer ARGS`: mlx-lm's OpenAI server (`python -m mlx_lm.server ARGS`) with MLX bound to
OpenBLAS (importing `native` first, see `native.blas`; started plainly on Linux it prefilled a 2,018-token prompt in
~12 minutes) and `--model` allowed to be a GGUF or a packaged model name: it is served from its float32 model folder
(`native.convert.converted_folder`, cached in the Nexus home by the GGUF's fingerprint). The rest of the command line
is mlx_lm.server's own; `evals/serve.py` starts the peer this way.
"""

from __future__ import annotations

import runpy
import sys

import native  # noqa: F401  (first: binds MLX's BLAS symbols to OpenBLAS)


def main() -> None:
    from native.convert import converted_folder

    argv = sys.argv[1:]
    if "--model" in argv:
        i = argv.index("--model") + 1
        argv[i] = str(converted_folder(argv[i]))
    sys.argv = ["mlx_lm.server", *argv]
    runpy.run_module("mlx_lm.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
