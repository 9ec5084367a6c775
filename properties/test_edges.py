"""Family: the shapes where kernels switch paths — a deterministic grid, every run.

Random draws find a head dimension of 72 or a key length of 129 by chance; real kernels branch
exactly there (block multiples of the lengths, head-dim templates, Lq = 1 decode paths, empty
tensors), and so do their bugs: flashinfer-ai/flashinfer#5090 (Lk % 64 != 0),
pytorch/pytorch#153799 (NaN when the length is not a multiple of 128),
Dao-AILab/flash-attention#2896 (head dims 72/104), pytorch/pytorch#174939 and
flash-attention#2470 (zero sizes).  Each grid problem is seeded (normal inputs, exact in the
dtype, default scale) and judged by the error budget.  Zero sizes must come back with the
shapes PyTorch and JAX give ((..., 0, Ev) for Lq = 0; for Lk = 0 every row sees nothing and
its values are the backend's choice) and must not raise - unless the backend declares that a
row with nothing to see is an error.

Sampling: backends that run eagerly get the whole grid in every dtype they declare.  Backends
that compile per shape (JAX, compiled flex) would spend minutes compiling it four times, so
the grid is dealt out over their dtypes: problem i runs in dtype i mod (number of dtypes) -
every grid shape still runs every run, in one dtype.  A backend may ask for the same
(``edge_grid_over_dtypes = True``): eager flex, one dense path for every shape at ~20 ms a call.
"""
from __future__ import annotations

import numpy as np
import pytest

from attnspec.specs.problem import FLOAT_DTYPE_NAMES

from attnspec.properties.case import build, Case
from attnspec.specs.invariants import Verdict

from attnspec.properties.judge import agreement, fail_unless

HEAD_DIMS = (8, 16, 32, 59, 64, 72, 80, 96, 111, 128, 160, 192, 256)
LENGTHS = (1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257)
DECODE_KEYS = (512, 1024, 2048)


def grid() -> list:
    """(label, B, H, Lq, Lk, E, is_causal) for every edge; E = Ev (flash kernels need it)."""
    shapes = [(f"head dim {E}", 1, 2, 9, 65, E, False) for E in HEAD_DIMS]
    shapes += [(f"Lq {L}", 1, 2, L, 33, 64, False) for L in LENGTHS]
    shapes += [(f"Lk {L}", 1, 2, 7, L, 64, False) for L in LENGTHS]
    shapes += [(f"causal L {L}", 1, 1, L, L, 32, True) for L in LENGTHS]
    shapes += [(f"decode Lk {L}", 2, 2, 1, L, 64, False) for L in DECODE_KEYS]
    shapes += [("Lq 0", 1, 2, 0, 16, 32, False), ("Lk 0", 1, 2, 8, 0, 32, False), ("batch 0", 0, 2, 8, 16, 32, False)]
    return shapes


def _case(label, B, H, Lq, Lk, E, is_causal, dtype: str, seed: int) -> Case:
    lines = [f"rng = np.random.default_rng({seed})  # {label}"]
    for name, L in (("q", Lq), ("k", Lk), ("v", Lk)):
        dims = (B, H, L, E)
        expr = f"rng.standard_normal({dims})"
        if dtype in ("float16", "bfloat16"):
            expr = f"np.clip(np.round({expr} * 8), -32, 32) / 8"  # a k/8 grid, exact in every format
        elif dtype == "float32":
            expr += ".astype(np.float32).astype(np.float64)"
        lines.append(f"{name} = {expr}")
    lines += ["mask = None", "fields = {}"]
    return build(lines, Case(None, None, None, None, is_causal, None, label=label))


def _nothing_to_see(target, case, out) -> None:
    """Lk = 0: every row sees nothing - what it outputs is what the backend declares for such rows."""
    declared = target.backend.semantics.fully_masked
    if declared not in ("zeros", "nan") or out.size == 0:
        return  # undeclared (recorded by the semantics profile) or the mean of no values (undefined)
    ok = np.all(out == 0) if declared == "zeros" else np.all(np.isnan(out))
    bad = out[out != 0] if declared == "zeros" else out[~np.isnan(out)]
    verdict = Verdict("edge_shapes_match_reference", bool(ok), None, float("nan"),
                      f"Lk = 0: every row sees nothing and {target.name} declares {declared} for such rows, "
                      f"but returned values such as {bad.ravel()[:3].tolist()}")
    fail_unless(verdict, "edge_shapes_match_reference", target, case, checks=("print(out)",))


def _mine(target, i: int) -> bool:
    if not (target.compiled or getattr(target.backend, "edge_grid_over_dtypes", False)):
        return True
    dtypes = [d for d in FLOAT_DTYPE_NAMES if d in target.caps.dtypes]
    return dtypes.index(target.dtype) == i % len(dtypes) if target.dtype in dtypes else False


def test_edge_shapes_match_reference(target):
    """Every grid shape (head dims, block edges of Lq and Lk, causal block edges, decode, zero sizes)."""
    target.in_hypothesis = False  # a declined grid problem is skipped, not redrawn
    ran, declined = 0, []
    for i, shape in enumerate(grid()):
        if not _mine(target, i):
            continue
        label, B, H, Lq, Lk, E, is_causal = shape
        if is_causal and not target.caps.causal:
            continue
        case = _case(*shape, target.dtype, seed=i)
        target.begin_example()
        target.examples += 1
        try:
            if B * H * Lq * Lk == 0 and target.backend.semantics.fully_masked == "error" and Lk == 0:
                continue  # no key at all: a row with nothing to see, which it declares an error
            out = agreement(target, case, "edge_shapes_match_reference")
            if Lk == 0:
                _nothing_to_see(target, case, out)
        except pytest.skip.Exception as e:  # this backend declines the shape: say which, go on
            declined.append(f"{label}: {str(e).split(': ', 1)[-1]}")
            continue
        ran += 1
    if not ran:
        pytest.skip(f"{target.name} declined every grid shape: {declined[:3]}")
