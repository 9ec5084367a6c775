"""The error budget on correct kernels: how much of each row's allowance they use.

    python tests/budget_study.py [--problems N] [--dtype D ...] [--backend NAME ...]

Seeded random problems (`study_problems`: saturated and near-uniform rows, one-key rows,
masks with empty rows, causal, grouped KV heads, bias with hidden pairs, softcap), every
correct kernel in every dtype it runs; per backend, dtype and tensor the largest used
fraction of a row's allowance (specs.error_budget, < 1 means accepted) and the same under
flash-attention's rule (2 x the plain error over the tensor, no floor; > 1: it would raise a
false alarm), and the share of rows where ours allows less than flash's.
tests/test_spec_error_budget.py asserts on a smaller run of the same functions.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from attnspec.backends.base import Unsupported  # noqa: E402
from attnspec.backends.registry import PYTEST_WHEN_NAMED, resolve, suite_names  # noqa: E402
from attnspec.specs import error_budget as eb  # noqa: E402
from attnspec.specs.problem import validate, visible  # noqa: E402
from tests.broken import CORRECT as TEETH_CORRECT  # noqa: E402

# every built-in the suite checks by default, and eager flex (torch-flex-compiled, opt-in there,
# compiles each shape for ~20 s: python tests/budget_study.py --backend torch-flex-compiled)
BUILTINS = tuple(suite_names()) + tuple(PYTEST_WHEN_NAMED)
CORRECT = BUILTINS + tuple(e.spec for e in TEETH_CORRECT)  # and every correct kernel of tests/broken/
DTYPES = ("float16", "bfloat16", "float32", "float64")
# (B, Hq, Hkv, Lq, Lk, E): E == Ev so kernels that need it (flash, jax-dpa) run every one;
# a short menu keeps JAX's per-shape compiles few
SHAPES = ((1, 1, 1, 1, 1, 4), (2, 2, 2, 5, 7, 8), (1, 4, 2, 16, 16, 16), (1, 2, 1, 17, 65, 32),
          (1, 1, 1, 33, 130, 64), (2, 3, 3, 9, 1, 8))
SCORE_GOALS = {"float16": (0.01, 1, 4, 16, 64), "bfloat16": (0.01, 1, 4, 16, 64),
               "float32": (0.01, 1, 4, 64, 2048), "float64": (0.01, 1, 4, 64, 2048)}


@dataclass
class StudyProblem:
    label: str
    q: np.ndarray        # (B, Hq, Lq, E)
    k: np.ndarray        # (B, Hkv, Lk, E)
    v: np.ndarray        # (B, Hkv, Lk, Ev)
    mask: object
    is_causal: bool
    scale: float | None
    grad_out: np.ndarray  # (B, Hq, Lq, Ev)
    fields: dict = field(default_factory=dict)

    def problem(self):
        return validate(self.q, self.k, self.v, self.mask, self.is_causal, self.scale, **self.fields)


def _grid(rng, shape, dtype) -> np.ndarray:
    """Values exact in dtype: a k/8 grid for 16-bit formats, float32 numbers for float32."""
    x = rng.standard_normal(shape)
    if dtype in ("float16", "bfloat16"):
        return np.clip(np.round(x * 8), -32, 32) / 8
    return x.astype(np.float32).astype(np.float64) if dtype == "float32" else x


def study_problems(dtype: str, count: int, seed: int = 0, gradients: bool = True) -> list[StudyProblem]:
    """`count` problems for dtype; with `gradients` no row is empty (a NaN there would spread)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        B, Hq, Hkv, Lq, Lk, E = SHAPES[i % len(SHAPES)]
        q, k, v = _grid(rng, (B, Hq, Lq, E), dtype), _grid(rng, (B, Hkv, Lk, E), dtype), _grid(rng, (B, Hkv, Lk, E), dtype)
        goal = float(rng.choice(SCORE_GOALS[dtype]))
        scale = [None, 0.5, 1.0][i % 3]
        size = np.abs(q).max() * np.abs(k).max() * E * (scale or E**-0.5) + 1e-9
        j = int(np.floor(np.log2(goal / size) / 2))  # q, k each times 2^j: scores times 4^j, exact
        q, k = q * 2.0**j, k * 2.0**j
        kind = ["none", "causal", "mask", "empty_rows", "causal_mask"][rng.integers(5)]
        mask = None
        if kind in ("mask", "empty_rows", "causal_mask"):
            mask = rng.random((B, 1, Lq, Lk)) < rng.choice((0.2, 0.6, 0.95))
            if kind == "empty_rows" and not gradients:
                mask[..., rng.integers(Lq), :] = False
            else:
                mask[..., 0] = True
        fields = {"enable_gqa": True} if Hq != Hkv else {}
        if rng.random() < 0.3:  # a bias on the k/8 grid, some pairs hidden by -inf
            bias = _grid(rng, (1, Hq, Lq, Lk), dtype) * 2.0 ** rng.integers(-2, 3)
            bias[..., 1:, -1] = -np.inf if Lk > 1 else 0.0
            fields["bias"] = bias
        if rng.random() < 0.2:
            fields["softcap"] = float(rng.choice((2.0, 8.0, 30.0)))
        g = _grid(rng, (B, Hq, Lq, E), dtype)
        label = f"{i}: {B}x{Hq}/{Hkv}x{Lq}x{Lk}x{E} S~{goal:g} {kind} scale={scale} {sorted(fields)}"
        out.append(StudyProblem(label, q, k, v, mask, kind in ("causal", "causal_mask"), scale, g, fields))
    return out


@dataclass
class Margin:
    """Largest used fraction of a row's allowance: ours, and flash-attention's rule's."""

    used: float = 0.0
    flash_used: float = 0.0
    tighter: int = 0      # rows where ours allows less than flash's rule
    rows: int = 0
    where: str = ""

    def add(self, err_rows, allowed_rows, flash_allowed, label):
        with np.errstate(divide="ignore", invalid="ignore"):
            used = float(np.max(np.where(err_rows == 0, 0.0, err_rows / allowed_rows), initial=0.0))
        if used > self.used:
            self.used, self.where = used, label
        with np.errstate(divide="ignore", invalid="ignore"):
            flash = np.max(np.where(err_rows == 0, 0.0, err_rows / flash_allowed), initial=0.0)
        self.flash_used = max(self.flash_used, float(flash))
        self.tighter += int((allowed_rows < flash_allowed).sum())
        self.rows += int(err_rows.size)


def _row_errors(actual, ref, judged) -> np.ndarray:
    err = np.abs(np.asarray(actual, dtype=np.float64) - ref)
    err = np.where(np.isnan(err), np.inf, err).max(axis=-1)  # per row
    return err[judged] if judged is not None else err.ravel()


def measure(backend_name: str, dtype: str, problems, margins: dict) -> int:
    """Judge one backend on the problems; fills margins[(backend, dtype, tensor)]; returns how many ran."""
    backend, ran = resolve(backend_name), 0
    for sp in problems:
        p = sp.problem()
        try:
            backend.check_supported(dtype, "forward", problem=p)
        except Unsupported:
            continue
        try:
            out = backend.forward(sp.q, sp.k, sp.v, sp.mask, sp.is_causal, sp.scale, dtype, **sp.fields)
        except Unsupported:
            continue
        ran += 1
        judged_dtype = backend.semantics.effective_precision if _wider(dtype, backend) else dtype
        allowed, ref, plain = eb.forward_allowed_rows(p, dtype=judged_dtype)
        rows = visible(p).any(axis=-1)  # the spec leaves empty rows to the kernel
        rows = np.broadcast_to(rows, allowed.shape)
        flash = 2 * float(np.abs(plain - ref).max(axis=-1)[rows].max(initial=0.0))
        margins.setdefault((backend.name, dtype, "output"), Margin()).add(
            _row_errors(out, ref, rows), allowed[rows], flash, sp.label)
        if backend.capabilities.gradients and rows.all():
            try:
                grads = backend.backward(sp.q, sp.k, sp.v, sp.grad_out, sp.mask, sp.is_causal, sp.scale, dtype,
                                         **sp.fields)
            except Unsupported:
                continue
            grad_budgets = eb.backward_allowed_rows(p, None, None, sp.grad_out, dtype=judged_dtype)
            # dbias only when both the backend and the budget have it
            for name, got, (a, r, pl) in zip(("dq", "dk", "dv", "dbias"), grads, grad_budgets, strict=False):
                flash = 2 * float(np.abs(pl - r).max(initial=0.0))
                margins.setdefault((backend.name, dtype, name), Margin()).add(
                    _row_errors(got, r, None), a.ravel(), flash, sp.label)
    return ran


def _wider(dtype, backend) -> bool:
    eff = backend.semantics.effective_precision
    return bool(eff) and eb.BUDGETS[eff].unit_roundoff > eb.BUDGETS[dtype].unit_roundoff


def table(margins: dict) -> str:
    lines = ["| backend | dtype | tensor | max used (ours) | max used (flash's rule) | rows ours tighter | worst problem |",
             "|---|---|---|---|---|---|---|"]
    for (name, dtype, tensor), m in sorted(margins.items()):
        lines.append(f"| {name} | {dtype} | {tensor} | {m.used:.3f} | {m.flash_used:.3g} | "
                     f"{m.tighter}/{m.rows} | {m.where} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=60)
    ap.add_argument("--dtype", action="append", choices=DTYPES)
    ap.add_argument("--backend", action="append")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    margins: dict = {}
    for dtype in args.dtype or DTYPES:
        problems = study_problems(dtype, args.problems, args.seed)
        for name in args.backend or CORRECT:
            try:
                if dtype in resolve(name).capabilities.dtypes and resolve(name).availability()[0]:
                    measure(name, dtype, problems, margins)
            except Unsupported:
                continue
    print(table(margins))
    return 0 if all(m.used <= 1 for m in margins.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
