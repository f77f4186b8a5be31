"""Point MLX's CPU backend at an optimized BLAS on Linux.

MLX's Linux CPU wheel links a bundled *reference* (unoptimized) BLAS (timings in README). libmlx leaves
`cblas_sgemm` & co. as undefined dynamic symbols, so loading OpenBLAS with RTLD_GLOBAL *before* the first
`import mlx` makes the dynamic linker bind them to OpenBLAS (the global scope is searched before a library's
own dependencies). `make` installs Debian's libopenblas0-pthread; without it MLX still works, only slower, and
`nexus doctor` says so.
"""

from __future__ import annotations

import ctypes
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
    for path in OPENBLAS_CANDIDATES:
        if os.path.exists(path):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            _loaded = path
            break
    return _loaded
