"""`python -m native.llamacpp_peer ARGS`: llama-cpp-python's OpenAI server (`python -m llama_cpp.server ARGS`)
with the same weight-repacking rule as our llama.cpp backend (`extra_buffers_allowed`: off on CPUs with AMX,
where llama.cpp's AMX matmul can segfault). The tests and `evals/serve.py` start the peer server this way so
that both servers run the same kernels; its command line is llama_cpp.server's own.
"""

from __future__ import annotations

import runpy

import llama_cpp
from llama_cpp import llama_cpp as C

from native.llamacpp_backend import extra_buffers_allowed


def main() -> None:
    default_params = C.llama_model_default_params
    allowed = extra_buffers_allowed()

    def params():
        p = default_params()
        p.use_extra_bufts = allowed
        return p

    # llama_cpp.Llama reads the defaults as `llama_cpp.llama_cpp.llama_model_default_params`; the package re-exports it.
    C.llama_model_default_params = params
    llama_cpp.llama_model_default_params = params
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
