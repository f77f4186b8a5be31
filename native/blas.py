"""Point MLX's CPU backend at an optimized BLAS on Linux.

MLX's Linux CPU wheel links a bundled *reference* (unoptimized) BLAS (timings in README). libmlx leaves
`cblas_sgemm` & co. as undefined dynamic symbols, so loading OpenBLAS with RTLD_GLOBAL *before* the first
`import mlx` makes the dynamic linker bind them to OpenBLAS (the global scope is searched before a library's
own dependencies). `make` installs Debian's libopenblas0-pthread; without it MLX still works, only slower, and
`nexus doctor` says so.

The same global scope would capture PyTorch's BLAS: libtorch_cpu exports the MKL routines it links (`sgemm_`,
...), so a library loaded with RTLD_GLOBAL before it interposes them, and the tool embedder (sentence-transformers)
ran its matmuls on OpenBLAS: 3-4x slower (300 tool texts on one core: 17.9-21.5 s against 4.8-5.6 s). PyTorch is
therefore imported first when it is installed: its symbols are bound when it loads, and MLX's still go to
OpenBLAS (a 1024x1024 matmul: 75 ms either way, 452 ms on the reference BLAS). Both happen when MLX is first
imported (`preload_before_mlx`), not when `native` is: importing PyTorch takes ~1.2 s, which every `nexus` command
paid at start-up when it was done there (`nexus --help` 0.3 s -> 1.8 s).
"""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.util
import os
import sys

OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
)

_loaded: str | None = None


def preload_openblas() -> str | None:
    """Load OpenBLAS globally once (Linux only); return its path, or None when unavailable or too late."""
    global _loaded
    if _loaded is not None or not sys.platform.startswith("linux"):
        return _loaded
    if "mlx.core" in sys.modules:  # symbols already bound to the reference BLAS
        return None
    if os.environ.get("NEXUS_NO_OPENBLAS"):
        return None
    if importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401  (bind PyTorch's own BLAS before OpenBLAS joins the global scope)
    for path in OPENBLAS_CANDIDATES:
        if os.path.exists(path):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            _loaded = path
            break
    return _loaded


class _BeforeMLX(importlib.abc.MetaPathFinder):
    """Runs `preload_openblas` as the first `mlx` module is looked up, then leaves the import system."""

    def find_spec(self, name, path=None, target=None):
        if name == "mlx" or name.startswith("mlx."):
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            preload_openblas()
        return None  # the normal finders import it


def preload_before_mlx() -> None:
    """Load OpenBLAS (and PyTorch before it) as MLX is first imported; nothing once it has been (too late)."""
    if "mlx.core" not in sys.modules and not any(isinstance(f, _BeforeMLX) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeMLX())
