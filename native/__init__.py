"""Model backends behind one small interface: MLX (our own llama-family module) and llama.cpp.

Importing this package first makes MLX use OpenBLAS on Linux (see `native.blas`).
"""

from native.blas import preload_openblas

preload_openblas()

from native.base import (  # noqa: E402
    Backend,
    BackendError,
    Capabilities,
    KVRange,
    ModelError,
    ModelInfo,
    Session,
)
from native.registry import BACKENDS, load_backend  # noqa: E402

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendError",
    "Capabilities",
    "KVRange",
    "ModelError",
    "ModelInfo",
    "Session",
    "load_backend",
]
