"""Problems the backend tests run: the seeds' worked examples and small random ones.

The seeds' problems come from specs.worked_examples.SEED_PROBLEMS (seed 000: one query,
three keys, d_k = 2, output (6.04, 3.95); seed 003: four tokens, Q = K = 0.5 X, V = X,
causal, with dL/dY non-zero only at the last position as its backward section assumes;
seed 004's score vectors).  Random problems exercise what the seeds do
not: Lq != Lk both ways, broadcast batch dimensions, a boolean mask, mask AND causal, an
explicit scale.  No row is fully masked here: that choice is tested separately.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Case:
    name: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    mask: np.ndarray | None = None
    is_causal: bool = False
    scale: float | None = None
    grad_out: np.ndarray | None = None

    def args(self):
        return self.q, self.k, self.v, self.mask, self.is_causal, self.scale

    @property
    def square_values(self) -> bool:
        return self.q.shape[-1] == self.v.shape[-1]


def seed_cases() -> list[Case]:
    """specs.worked_examples.SEED_PROBLEMS as cases, each with a fixed dL/dY."""
    from attnspec.specs.worked_examples import SEED_PROBLEMS

    rng = np.random.default_rng(0)
    cases = []
    for name, p in SEED_PROBLEMS.items():
        grad_out = rng.standard_normal(p["q"].shape[:-1] + p["v"].shape[-1:])  # (Lq, Ev)
        if name == "003_causal":  # seed 003's backward: dL/dY non-zero only at the last position
            grad_out[:-1] = 0
        cases.append(Case(f"seed{name}", p["q"], p["k"], p["v"], p["mask"], p["is_causal"], p["scale"], grad_out))
    return cases


def seed_case(name: str) -> Case:
    return next(c for c in seed_cases() if c.name == f"seed{name}")


def random_cases(seed: int = 0) -> list[Case]:
    rng = np.random.default_rng(seed)

    def arr(*shape):
        return rng.standard_normal(shape)

    def mask(Lq, Lk):
        m = rng.random((Lq, Lk)) > 0.4  # (Lq, Lk)
        m[:, 0] = True  # key 0 visible to all: no fully masked row, even with causal
        return m

    return [
        Case("causal-Lq<Lk-broadcast", arr(2, 3, 5, 8), arr(1, 3, 7, 8), arr(2, 1, 7, 8),
             is_causal=True, grad_out=arr(2, 3, 5, 8)),
        Case("mask-Lq>Lk", arr(2, 7, 8), arr(2, 5, 8), arr(2, 5, 8), mask=mask(7, 5), grad_out=arr(2, 7, 8)),
        Case("mask+causal-scale", arr(1, 2, 12, 8), arr(1, 2, 12, 8), arr(1, 2, 12, 8), mask=mask(12, 12),
             is_causal=True, scale=0.3, grad_out=arr(1, 2, 12, 8)),
    ]


def all_cases() -> list[Case]:
    return seed_cases() + random_cases()


def available(backends: dict, name: str):
    """The named backend, or a skip with its reason (no framework, no device)."""
    import pytest

    backend = backends[name]
    ok, why = backend.availability()
    if not ok:
        pytest.skip(f"{name}: {why}")
    return backend
