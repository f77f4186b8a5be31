"""Rotary position embeddings: the variants the architectures use, as one frozen description per layer.

`traditional=True` rotates interleaved pairs (2i, 2i+1), the layout llama.cpp's converter permutes Llama Q/K
into; False rotates the half-split pairs (i, i + D/2) that Hugging Face weights and NEOX-style GGUFs (Qwen,
Gemma) use. `scale` multiplies positions (linear scaling: 1 / factor). `freqs`, when set, are per-pair
wavelengths (D/2,) that replace base ** (2i / D): Llama 3 scaling, from config.json or from a GGUF's
`rope_freqs` factors (llama.cpp divides each pair's angle by its factor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import mlx.core as mx
import numpy as np


@dataclass(frozen=True)
class Rope:
    dims: int
    base: float = 10000.0
    traditional: bool = False
    scale: float = 1.0
    freqs: tuple[float, ...] | None = None

    @cached_property
    def _freqs(self) -> mx.array | None:
        return None if self.freqs is None else mx.array(np.asarray(self.freqs, dtype=np.float32))

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        """Rotate (B, H, T, D) by positions offset .. offset+T-1 (`offset` (B,) rotates each batch row by its own)."""
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=None if self.freqs else self.base,
                            scale=self.scale, offset=offset, freqs=self._freqs)

    def at(self, x: mx.array, positions: np.ndarray) -> mx.array:
        """Rotate (1, H, T, D) by arbitrary per-token positions (T,): one rope batch row per token."""
        out = self(x.transpose(2, 1, 0, 3), mx.array(np.asarray(positions, dtype=np.int32)))  # (T, H, 1, D)
        return out.transpose(2, 1, 0, 3)

    def shift(self, keys: mx.array, delta: int) -> mx.array:
        """Rotate post-RoPE keys (..., T, D) by `delta` positions: R(m + delta) = R(delta) R(m)."""
        if delta == 0:
            return keys
        flat = keys.reshape(-1, 1, keys.shape[-1])  # every key the same offset: a length-1 sequence per row
        return self(flat, delta).reshape(keys.shape)


def rope_from_factors(dims: int, base: float, factors: np.ndarray, traditional: bool) -> Rope:
    """A Rope whose pair i turns at base ** (-2i / D) / factors[i] per position (GGUF `rope_freqs`)."""
    wavelengths = base ** (np.arange(0, dims, 2, dtype=np.float64) / dims) * np.asarray(factors, np.float64)
    return Rope(dims, base, traditional, freqs=tuple(float(w) for w in wavelengths))


def llama3_factors(dims: int, base: float, factor: float, low_freq_factor: float = 1.0,
                   high_freq_factor: float = 4.0, original_context: int = 8192) -> np.ndarray:
    """Llama 3's per-pair divisors (D/2,): long wavelengths slowed by `factor`, short ones kept, a smooth ramp
    between (the rule config.json's `rope_scaling: {"rope_type": "llama3", ...}` names)."""
    wavelen = 2 * math.pi * base ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    low, high = original_context / low_freq_factor, original_context / high_freq_factor
    smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    out = 1.0 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < high, 1.0, out)
    return np.where(wavelen > low, factor, out)
