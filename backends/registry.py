"""Finding backends by name: built-ins, ``package.module:attr`` and entry points.

Built-ins are listed as "module:Class" strings so that listing them imports nothing.
"""
from __future__ import annotations

import importlib
import inspect
import os

import numpy as np

from .base import Backend, Capabilities, Semantics

ENV_VAR = "ATTNSPEC_BACKENDS"
ENTRY_POINT_GROUP = "attnspec.backends"

BUILTINS = {
    "numpy-naive": "backends.numpy_backends:NumpyNaive",
}


class BackendSelectionError(ValueError):
    """An unknown name, an import error, or an attribute that is not a backend."""


class FunctionBackend(Backend):
    """A plain function with PyTorch's signature over NumPy arrays: forward only, nothing declared."""

    capabilities = Capabilities(dtypes=("float64", "float32"), device="cpu", gradients=False)
    semantics = Semantics()

    def __init__(self, fn, name: str):
        self.fn = fn
        self.name = name

    def native_forward(self, q, k, v, mask, is_causal, scale):
        return self.fn(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)

    def native_dtype(self, y):
        return str(np.asarray(y).dtype)


def builtin_names() -> list[str]:
    return sorted(BUILTINS)


def _load_attr(spec: str, name: str):
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - report any import failure by name
        raise BackendSelectionError(f"backend {name!r}: cannot import module {module_name!r}: {type(e).__name__}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise BackendSelectionError(f"backend {name!r}: module {module_name!r} has no attribute {attr!r}") from None


def _as_backend(obj, name: str) -> Backend:
    if inspect.isclass(obj) and issubclass(obj, Backend):
        return obj()
    if isinstance(obj, Backend):
        return obj
    if callable(obj):
        return FunctionBackend(obj, name)
    raise BackendSelectionError(f"backend {name!r}: {type(obj).__name__} is neither a Backend nor a function")


def resolve(name: str) -> Backend:
    if name in BUILTINS:
        return _as_backend(_load_attr(BUILTINS[name], name), name)
    if ":" in name:
        return _as_backend(_load_attr(name, name), name)
    raise BackendSelectionError(f"unknown backend {name!r}; built-ins: {', '.join(builtin_names())}; "
                                "or give package.module:attr")
