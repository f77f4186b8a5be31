"""Model backends behind one small interface (`native.base`), listed with their capabilities in
`native.registry.BACKENDS`: MLX (our own model files, one per architecture: `native.models`), llama.cpp, and any
OpenAI-compatible server.

Importing this package first makes MLX use OpenBLAS on Linux once MLX is imported (see `native.blas`).
"""

from native.blas import preload_before_mlx

preload_before_mlx()

from native.base import (  # noqa: E402
    Backend,
    BackendError,
    Capabilities,
    KVRange,
    KVSession,
    ModelError,
    ModelInfo,
    Session,
    TextBackend,
)
from native.registry import BACKENDS, BackendSpec, list_backends, load_backend  # noqa: E402

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendError",
    "BackendSpec",
    "Capabilities",
    "KVRange",
    "KVSession",
    "ModelError",
    "ModelInfo",
    "Session",
    "TextBackend",
    "list_backends",
    "load_backend",
]
