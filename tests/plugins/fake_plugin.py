"""A third-party package as attnspec sees it: plain functions, Backend classes and objects.

Each way a user may plug in an implementation, and each way of getting it wrong.
"""
from __future__ import annotations

import numpy as np

from attnspec.backends.base import Backend, Capabilities, Semantics

SEEN_DTYPES: list = []  # dtypes `sdpa` was called with, for the contract tests


def sdpa(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """A correct plain function with PyTorch's signature over NumPy arrays."""
    SEEN_DTYPES.append(query.dtype.name)
    scale = 1.0 / np.sqrt(query.shape[-1]) if scale is None else scale
    s = (query @ np.swapaxes(key, -1, -2)) * query.dtype.type(scale)  # (..., Lq, Lk)
    vis = np.ones(s.shape[-2:], dtype=bool) if attn_mask is None else attn_mask  # (..., Lq, Lk)
    if is_causal:
        vis = vis & np.tri(*s.shape[-2:], dtype=bool)  # (..., Lq, Lk)
    s = np.where(vis, s, -np.inf)  # (..., Lq, Lk)
    e = np.exp(s - np.nan_to_num(s.max(-1, keepdims=True, initial=-np.inf), neginf=0))  # (..., Lq, Lk) Lk = 0 too
    total = e.sum(-1, keepdims=True)  # (..., Lq, 1)
    return (e / np.where(total == 0, 1, total)) @ value  # (..., Lq, Ev)


def sdpa_positional(q, k, v, attn_mask=None, is_causal=False, scale=None, **extra):
    """Other parameter names are fine as long as the call binds."""
    return sdpa(q, k, v, attn_mask, is_causal, scale)


class PluginBackend(Backend):
    """A Backend subclass with declarations, as a package would ship it."""

    name = "plugin-backend"
    capabilities = Capabilities(dtypes=("float64", "float32"), device="cpu", gradients=False)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        return sdpa(q, k, v, mask, is_causal, scale)  # (..., Lq, Ev)


plugin_backend = PluginBackend()  # a ready Backend object


class NeedsArgs(Backend):
    """A Backend class whose constructor cannot be called without arguments."""

    def __init__(self, required):
        self.required = required


class NotABackend:
    """A class that is not a Backend: must be refused, not wrapped as a function."""

    def __call__(self, *args, **kwargs):
        return None


def wrong_signature(x):
    return x


not_callable = 42


# --- misbehaving backends: each must fail alone, with a message naming it -------------

def raises(query, key, value, attn_mask=None, is_causal=False, scale=None):
    raise RuntimeError("kernel exploded")


def wrong_shape(query, key, value, attn_mask=None, is_causal=False, scale=None):
    return sdpa(query, key, value, attn_mask, is_causal, scale)[..., :-1, :]  # (..., Lq-1, Ev)


def wrong_dtype(query, key, value, attn_mask=None, is_causal=False, scale=None):
    return sdpa(query, key, value, attn_mask, is_causal, scale).astype(np.float16)


def returns_none(query, key, value, attn_mask=None, is_causal=False, scale=None):
    return None


class BadBackward(PluginBackend):
    name = "bad-backward"
    capabilities = Capabilities(dtypes=("float64",), device="cpu", gradients=True)

    def native_backward(self, q, k, v, grad_out, mask, is_causal, scale):
        return q, k  # two gradients instead of three


class WrongGradShape(PluginBackend):
    name = "wrong-grad-shape"
    capabilities = Capabilities(dtypes=("float64",), device="cpu", gradients=True)

    def native_backward(self, q, k, v, grad_out, mask, is_causal, scale):
        return q, k.sum(axis=0), v  # dK lost its leading axis
