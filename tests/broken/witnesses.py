"""Hand-made problems on which each broken implementation visibly differs from the reference.

They prove the bugs are real independently of the suite (a teeth test against a bug that never
shows would be vacuous).  Each returns keyword arguments for Backend.forward/backward plus
``op`` ("forward" or "backward") and ``dtype``.
"""
from __future__ import annotations

import numpy as np


def _qkv(Lq, Lk, E=8, Ev=8, seed=0, spread=1.0, batch=(1, 2)):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(batch + (Lq, E)) * spread  # (B, H, Lq, E)
    k = rng.standard_normal(batch + (Lk, E)) * spread  # (B, H, Lk, E)
    v = rng.standard_normal(batch + (Lk, Ev))  # (B, H, Lk, Ev)
    return q, k, v


def _problem(q, k, v, mask=None, is_causal=False, scale=None, op="forward", dtype="float64", seed=1):
    kw = dict(q=q, k=k, v=v, mask=mask, is_causal=is_causal, scale=scale, dtype=dtype, op=op)
    if op == "backward":
        rng = np.random.default_rng(seed)
        kw["grad_out"] = rng.standard_normal(q.shape[:-1] + (v.shape[-1],))  # (B, H, Lq, Ev)
    return kw


def _random_mask(Lq, Lk, seed=3):
    mask = np.random.default_rng(seed).random((Lq, Lk)) < 0.6  # (Lq, Lk)
    mask[:, 0] = True  # no empty rows: the bug, not the spec's open choice, must show
    return mask


def default_path(seed=0):
    return _problem(*_qkv(5, 7, E=16, seed=seed))


def with_mask(seed=0):
    return _problem(*_qkv(5, 7, seed=seed), mask=_random_mask(5, 7))


def causal_square(seed=0):
    return _problem(*_qkv(6, 6, seed=seed), is_causal=True)


def causal_rectangular(seed=0):
    return _problem(*_qkv(2, 5, seed=seed), is_causal=True)


def explicit_scale(seed=0):
    return _problem(*_qkv(4, 6, seed=seed), scale=0.7)


def huge_logits(seed=0):
    return _problem(*_qkv(3, 5, seed=seed, spread=40.0))  # logits ~ 1e3: exp overflows in float64


def fully_masked_row(seed=0):
    mask = _random_mask(4, 6)
    mask[2] = False  # (4, 6) row 2 sees nothing
    return _problem(*_qkv(4, 6, seed=seed), mask=mask)


def growing_max(seed=0):
    """Keys whose norms grow along the sequence, so later key blocks raise the running maximum."""
    q, k, v = _qkv(4, 40, seed=seed)
    k = k * np.linspace(0.2, 3.0, 40)[:, None]  # (B, H, 40, E)
    q = np.abs(q)
    k = np.abs(k)
    return _problem(q, k, v)


def first_block_masked(seed=0):
    mask = np.ones((3, 20), dtype=bool)  # (3, 20)
    mask[0, :8] = False  # row 0 sees keys 8.. only: its first 8-key block is empty
    return _problem(*_qkv(3, 20, seed=seed), mask=mask)


def short_tail(seed=0):
    return _problem(*_qkv(3, 5, seed=seed))


def long_masked(seed=0):
    return _problem(*_qkv(3, 80, seed=seed), mask=_random_mask(3, 80))


def long_float32(seed=0):
    return _problem(*_qkv(4, 300, E=64, Ev=16, seed=seed), dtype="float32")


def gradient(seed=0):
    return _problem(*_qkv(4, 6, seed=seed), op="backward")


def gradient_causal(seed=0):
    return _problem(*_qkv(5, 5, seed=seed), is_causal=True, op="backward")


ALL = (default_path, with_mask, causal_square, causal_rectangular, explicit_scale, huge_logits,
       fully_masked_row, growing_max, first_block_masked, short_tail, long_masked, long_float32,
       gradient, gradient_causal)
