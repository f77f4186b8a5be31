"""Which BLAS each library's matrix products bind to once `native` has pointed MLX at OpenBLAS (`native.blas`).

The dynamic linker's own record (`LD_DEBUG=bindings`) in a fresh interpreter that imports `native`, then MLX, then
PyTorch: MLX's CBLAS calls must reach OpenBLAS, and PyTorch's (the tool embedder's) must stay with the MKL
routines libtorch_cpu carries (bound to OpenBLAS they ran 3-4x slower), while importing `native` alone imports
neither (start-up).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from native.blas import OPENBLAS_CANDIDATES

ROOT = Path(__file__).resolve().parents[2]
OPENBLAS = next((p for p in OPENBLAS_CANDIDATES if os.path.exists(p)), None)

SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import native
assert "torch" not in sys.modules, "importing native imported PyTorch (1.2 s at every nexus command's start)"
import mlx.core as mx
import torch
(torch.ones(64, 64) @ torch.ones(64, 64)).sum()
mx.eval(mx.ones((64, 64)) @ mx.ones((64, 64)))
"""


def _bindings(tmp_path: Path) -> list[tuple[str, str, str]]:
    """(from file, to file, symbol) of every symbol binding the dynamic linker made in the script."""
    env = {**os.environ, "LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": str(tmp_path / "ld")}
    env.pop("NEXUS_NO_OPENBLAS", None)
    subprocess.run([sys.executable, "-c", SCRIPT.format(root=str(ROOT))], env=env, check=True, timeout=120)
    out = []
    for log in tmp_path.glob("ld*"):
        for line in log.read_text(errors="replace").splitlines():
            if "binding file" in line:
                head, _, sym = line.partition("symbol `")
                files = head.split("binding file ", 1)[1].split(" to ")
                out.append((files[0].split(" [")[0], files[1].split(" [")[0], sym.rstrip("'").split("'")[0]))
    return out


@pytest.mark.skipif(OPENBLAS is None, reason="Debian's libopenblas0-pthread is not installed (make installs it)")
def test_mlx_binds_to_openblas_and_torch_keeps_its_own_blas(tmp_path):
    binds = _bindings(tmp_path)
    openblas_dir = os.path.dirname(OPENBLAS)
    mlx = [(f, t, s) for f, t, s in binds if "libmlx" in os.path.basename(f) and "gemm" in s]
    assert mlx and all(t.startswith(openblas_dir) for _, t, _ in mlx), mlx[:5]
    torch_to_openblas = [(f, s) for f, t, s in binds if "/torch/" in f and t.startswith(openblas_dir)]
    assert not torch_to_openblas, torch_to_openblas[:5]
