"""The semantics profile: what each backend does where the spec leaves the choice.

Recorded for every backend (JSON "semantics" rows, and the terminal summary); a test fails
only where the backend contradicts its own declaration (`backends.base.Semantics`).  A
plain-function plug-in declares nothing, so it is recorded and never failed.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from backends.base import BackendFailure, Unsupported
from specs import reference
from specs.problem import causal_mask

from .targets import call_with_limit

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN and inf are fed on purpose

_SHAPE = (1, 2, 3, 4)  # B, H, Lq (= 3), Lk (= 4)


def _problem(E=2, Ev=2, seed=0):
    rng = np.random.default_rng(seed)
    B, H, Lq, Lk = _SHAPE
    q = np.round(rng.standard_normal((B, H, Lq, E)) * 8) / 8  # (B, H, Lq, E) exact in every format
    k = np.round(rng.standard_normal((B, H, Lk, E)) * 8) / 8  # (B, H, Lk, E)
    v = np.round(rng.standard_normal((B, H, Lk, Ev)) * 8) / 8  # (B, H, Lk, Ev)
    return q, k, v


def _run(target, q, k, v, mask=None, is_causal=False, scale=None):
    """The output, or "error" when the backend raised (a choice some make for these inputs)."""
    target.examples += 1
    try:
        return call_with_limit(target.backend, "forward", target.backend.forward, q, k, v, mask, is_causal, scale,
                               target.dtype)
    except Unsupported as e:
        pytest.skip(f"{target.name}: {e}")
    except BackendFailure:
        return "error"


def _judge(record, target, question, observed, declared):
    agrees = None if declared is None else observed == declared
    record(question, observed, declared, agrees)
    # an AssertionError (not pytest.fail) so the JSON records a contradiction as "failed"
    assert agrees is not False, f"{target.name} declares {question} = {declared!r} but does {observed!r}"


def _needs(target, masks=False, causal=False):
    if masks and not target.caps.masks:
        pytest.skip(f"{target.name} takes no boolean mask")
    if causal and not target.caps.causal:
        pytest.skip(f"{target.name} has no causal mode")


def test_fully_masked_rows(backend_target, record_semantics):
    _needs(backend_target, masks=True)
    q, k, v = _problem()
    mask = np.ones(_SHAPE, dtype=bool)  # (B, H, Lq, Lk)
    mask[..., 1, :] = False  # query 1 sees nothing
    out = _run(backend_target, q, k, v, mask)
    if isinstance(out, str):
        observed = out
    else:
        row = out[..., 1, :]  # (B, H, Ev)
        if np.isnan(row).all():
            observed = "nan"
        elif np.all(row == 0):
            observed = "zeros"
        elif np.allclose(row, v.mean(axis=-2), rtol=1e-2, atol=1e-2):  # uniform weights over all keys
            observed = "mean_of_values"
        else:
            observed = "other"
    _judge(record_semantics, backend_target, "fully_masked", observed, backend_target.backend.semantics.fully_masked)


def test_causal_alignment(backend_target, record_semantics):
    """Lq=3 < Lk=4 with V = identity: top-left lets query 0 see key 0 only; bottom-right keys 0..1."""
    _needs(backend_target, causal=True)
    q, k, _ = _problem(E=4)  # E = Ev = Lk: fits backends that need Ev == E
    v = np.broadcast_to(np.eye(4), _SHAPE[:2] + (4, 4)).copy()  # (B, H, Lk, Lk)
    w = _run(backend_target, q, k, v, None, True)
    if isinstance(w, str):
        observed = w
    else:
        seen = w != 0  # (B, H, Lq, Lk)
        observed = "other"
        for name in ("top_left", "bottom_right"):
            if np.array_equal(seen, np.broadcast_to(causal_mask(3, 4, name), seen.shape)):
                observed = name
    _judge(record_semantics, backend_target, "causal_alignment", observed,
           backend_target.backend.semantics.causal_alignment)


def _leak(target, record, bad: float, where: str):
    _needs(target, masks=True)
    q, k, v = _problem()
    mask = np.ones(_SHAPE, dtype=bool)  # (B, H, Lq, Lk)
    mask[..., 2] = False  # key 2 hidden from every query
    (k if where == "key" else v)[..., 2, :] = bad
    out = _run(target, q, k, v, mask)
    observed = out if isinstance(out, str) else ("leaks" if not np.isfinite(out).all() else "no_leak")
    _judge(record, target, f"masked_{'nan' if math.isnan(bad) else 'inf'}_{where}", observed, None)


@pytest.mark.parametrize("where", ["key", "value"])
@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
def test_non_finite_in_masked_pair(backend_target, record_semantics, bad, where):
    """A NaN/inf in a key or value no query may see: does it reach the output? (0 * NaN = NaN)"""
    _leak(backend_target, record_semantics, bad, where)


def test_nan_in_unmasked_query(backend_target, record_semantics):
    """NaN in query 0: only row 0 should be NaN; does it spread to other rows or vanish?"""
    q, k, v = _problem()
    q[0, 0, 0, 0] = math.nan
    out = _run(backend_target, q, k, v)
    if isinstance(out, str):
        observed = out
    else:
        nan = np.isnan(out).any(axis=-1)  # (B, H, Lq)
        observed = ("row_only" if nan[0, 0, 0] and nan.sum() == 1 else "spreads" if nan.sum() > 1
                    else "swallowed")
    _judge(record_semantics, backend_target, "nan_query", observed, None)


def test_float64_effective_precision(backend_target, record_semantics):
    """Bits of agreement with the reference when asked for float64 (~50: float64; ~22: float32 inside)."""
    if backend_target.dtype != "float64":
        pytest.skip(f"{backend_target.name} does not take float64")
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 64, 64)) for _ in range(3))  # (B, H, L, E)
    out = _run(backend_target, q, k, v)
    if isinstance(out, str):
        observed = out
    else:
        err = float(np.max(np.abs(out - reference.attention(q, k, v)))) / float(np.max(np.abs(v)))
        bits = 53 if err == 0 else min(53, int(-math.log2(err)))  # float64 ~50, float32 ~22, 16-bit < 12
        observed = "float64" if bits > 40 else "float32" if bits > 18 else "bfloat16" if bits < 9 else "float16"
    declared = getattr(backend_target.backend.semantics, "effective_precision", None)
    _judge(record_semantics, backend_target, "float64_precision", observed, declared)
