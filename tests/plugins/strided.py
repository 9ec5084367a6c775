"""A kernel that reads its inputs as if they were contiguous (the strides bug of pytorch#187506)."""
from __future__ import annotations

import numpy as np

from attnspec.backends.base import LAYOUTS
from attnspec.backends.declarations import Capabilities
from attnspec.backends.numpy_backends import NumpyNaive


def _as_if_contiguous(x: np.ndarray) -> np.ndarray:
    """The buffer behind x read with contiguous strides: right only when x is contiguous."""
    strides = tuple(int(np.prod(x.shape[i + 1:])) * x.itemsize for i in range(x.ndim))
    base = x if x.base is None else x.base
    start = (x.__array_interface__["data"][0] - base.__array_interface__["data"][0]) if x.base is not None else 0
    flat = np.frombuffer(np.ascontiguousarray(base).tobytes(), dtype=x.dtype)[start // x.itemsize:]
    return np.lib.stride_tricks.as_strided(flat, x.shape, strides)


class AssumesContiguous(NumpyNaive):
    name = "assumes-contiguous"
    capabilities = Capabilities(dtypes=("float64", "float32"), device="cpu", layouts=LAYOUTS)

    def native_attention(self, q, k, v, call):
        return super().native_attention(_as_if_contiguous(q), _as_if_contiguous(k), _as_if_contiguous(v), call)
