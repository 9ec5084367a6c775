"""The semantics profile: what each backend does where the spec leaves a choice, in every dtype.

One test per question and dtype (``test_fully_masked_rows[numpy-naive-float32]``).  A declared
answer (`backends.base.Semantics`, or `backends.declare` for a plain function) is judged: a
contradiction fails.  An undeclared one is *recorded* - status ``recorded`` in the JSON, the
terminal summary and pytest's count - and never fails.  Answers are decided with that dtype's
error budget (`specs.error_budget`), never a fixed tolerance; the output's dtype is a question
of its own (``output_dtype``), so a backend returning float32 for float64 input still answers
every other question.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest

from attnspec.specs import error_budget
from attnspec.specs.error_budget import BUDGETS, round_to

from attnspec.properties.case import Case, build, fields_literal, literal
from attnspec.properties.judge import ConformanceFailure

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN and inf are fed on purpose

_SHAPE = (1, 2, 3, 4)  # B, H, Lq (= 3), Lk (= 4)
_E = 4  # E = Ev: suits backends that need Ev == E


def _problem(target, seed=0, value_offset=0.0):
    """q, k, v on a grid of k/8 (exact in every format); values offset so a mean is far from zero.
    E = Ev = 4, or the backend's head-dim multiple (cuDNN takes multiples of 8 only)."""
    rng = np.random.default_rng(seed)
    B, H, Lq, Lk = _SHAPE
    m = getattr(target.caps, "head_dim_multiple", 1)
    E = -(-_E // m) * m
    q = np.round(rng.standard_normal((B, H, Lq, E)) * 8) / 8  # (B, H, Lq, E)
    k = np.round(rng.standard_normal((B, H, Lk, E)) * 8) / 8  # (B, H, Lk, E)
    v = np.round(rng.standard_normal((B, H, Lk, E)) * 8) / 8 + value_offset  # (B, H, Lk, Ev)
    return q, k, v


@contextlib.contextmanager
def _any_output_dtype(backend, seen: dict):
    """Backend.forward without its dtype check, noting the dtype the output came back in."""
    native_dtype = backend.native_dtype

    def noting(y):
        seen["dtype"] = native_dtype(y)
        return seen["dtype"]
    try:
        backend.output_dtype, backend.native_dtype = (lambda dtype: None), noting
    except AttributeError:  # __slots__: the dtype check stays (a mismatch is then an error)
        yield
        return
    try:
        yield
    finally:
        del backend.output_dtype, backend.native_dtype


def _case(q, k, v, mask=None, is_causal=False, **fields) -> Case:
    """The probe as a Case: its code rebuilds it, so a later failure's reproducer can replay this call."""
    lines = [line for n, x in (("q", q), ("k", k), ("v", v)) for line in _literal(n, x)]
    lines.append("mask = None" if mask is None else literal("mask", mask))
    lines += [literal(n, x) for n, x in fields.items() if isinstance(x, np.ndarray)]
    lines.append(f"fields = {fields_literal(fields)}")
    return build(lines, Case(None, None, None, None, is_causal, None, label="semantics probe"))


def _literal(name: str, x: np.ndarray) -> list:
    """``name = np.array([...])`` with the NaN and inf entries set afterwards (there are few)."""
    bad = ~np.isfinite(x)
    return [literal(name, np.where(bad, 0.0, x))] + [
        f"{name}[{tuple(int(i) for i in at)}] = {'np.nan' if np.isnan(x[tuple(at)]) else repr(float(x[tuple(at)])).replace('inf', 'np.inf')}"
        for at in np.argwhere(bad)]


def _run(target, q, k, v, mask=None, is_causal=False, **fields):
    """(output as float64, the dtype it came back in), or ("error", None) when the backend raised."""
    target.examples += 1
    seen: dict = {}
    try:
        with _any_output_dtype(target.backend, seen):
            out = target.forward(_case(q, k, v, mask, is_causal, **fields))  # recorded, declines skip
    except ConformanceFailure:  # the backend raised (or hung): a choice some make for these inputs
        return "error", None
    return np.asarray(out, dtype=np.float64), seen.get("dtype", target.dtype)


def _judge(record, target, question, observed, declared):
    agrees = None if declared is None else observed == declared
    record(question, observed, declared, agrees)
    # an AssertionError (not pytest.fail) so the JSON records a contradiction as "failed"
    assert agrees is not False, (f"{target.name} declares {question} = {declared!r} but at {target.dtype} "
                                 f"does {observed!r}")


def _needs(target, masks=False, causal=False, feature=None):
    if masks and not target.caps.masks:
        pytest.skip(f"{target.name} takes no boolean mask")
    if causal and not target.caps.causal:
        pytest.skip(f"{target.name} has no causal mode")
    if feature and not target.supports(feature):
        pytest.skip(f"{target.name} does not declare {feature}")


def _row_answer(target, out, row: int, q, k, v, computed=None) -> str:
    """What query `row` holds: nan, zeros, mean_of_values (uniform weights over every key),
    computed (the row as if nothing hid it), or other - each within the dtype's row budget."""
    got = out[..., row, :]  # (B, H, Ev)
    if np.isnan(got).all():
        return "nan"
    if not np.isfinite(got).all():
        return "other"
    q_flat = q.copy()
    q_flat[..., row, :] = 0  # equal scores: the reference row is the mean of the values
    allowed, uniform, _ = error_budget.forward_allowed_rows(q_flat, k, v, dtype=target.budget_dtype)
    limit = allowed[..., row, None]  # (B, H, 1): that row's allowance
    if np.all(np.abs(got) <= limit):
        return "zeros"
    if computed is not None and np.all(np.abs(got - computed[..., row, :]) <= limit):
        return "computed"
    if np.all(np.abs(got - uniform[..., row, :]) <= limit):
        return "mean_of_values"
    return "other"


def test_output_dtype(target, record_semantics):
    """The dtype results come back in: the input's, unless a policy is declared (output_dtypes)."""
    q, k, v = _problem(target)
    _, returned = _run(target, q, k, v)
    observed = returned or "error"
    _judge(record_semantics, target, "output_dtype", observed, target.backend.output_dtype(target.dtype))


def test_fully_masked_rows(target, record_semantics):
    _needs(target, masks=True)
    q, k, v = _problem(target, value_offset=2.0)
    mask = np.ones(_SHAPE, dtype=bool)  # (B, H, Lq, Lk)
    mask[..., 1, :] = False  # query 1 sees nothing
    out, _ = _run(target, q, k, v, mask)
    observed = out if isinstance(out, str) else _row_answer(target, out, 1, q, k, v)
    _judge(record_semantics, target, "fully_masked", observed, target.backend.semantics.fully_masked)


def test_padded_rows(target, record_semantics):
    """A query row past q_lengths (backends that take sequence lengths): what it outputs."""
    _needs(target, feature="seq_lengths")
    q, k, v = _problem(target, value_offset=2.0)
    out, _ = _run(target, q, k, v, q_lengths=np.array([2]))  # query 2 is padding
    if isinstance(out, str):
        observed = out
    else:
        computed = error_budget.forward_allowed_rows(q, k, v, dtype=target.budget_dtype)[1]  # (B, H, Lq, Ev)
        observed = _row_answer(target, out, 2, q, k, v, computed)
    _judge(record_semantics, target, "padded_rows", observed, getattr(target.backend.semantics, "padded_rows", None))


def test_causal_alignment(target, record_semantics):
    """Lq=3 < Lk=4: top-left lets query i see keys 0..i; bottom-right keys 0..i+1."""
    _needs(target, causal=True)
    if target.supports("causal_bottom_right"):
        pytest.skip(f"{target.name} takes the causal alignment as a parameter "
                    "(both are asked for and judged by test_causal_alignment_as_asked)")
    q, k, v = _problem(target)
    out, _ = _run(target, q, k, v, None, True, causal_alignment=target.alignments[0])
    observed = out if isinstance(out, str) else "other"
    for name in ("top_left", "bottom_right"):
        if not isinstance(out, str) and error_budget.check_forward(out, q, k, v, None, True, dtype=target.budget_dtype,
                                                                   causal_alignment=name):
            observed = name
            break
    _judge(record_semantics, target, "causal_alignment", observed, target.backend.semantics.causal_alignment)


@pytest.mark.parametrize("where", ["key", "value"])
@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
def test_non_finite_in_masked_pair(target, record_semantics, bad, where):
    """A NaN/inf in a key or value no query may see: does it reach the output? (0 * NaN = NaN)"""
    _needs(target, masks=True)
    q, k, v = _problem(target)
    mask = np.ones(_SHAPE, dtype=bool)  # (B, H, Lq, Lk)
    mask[..., 2] = False  # key 2 hidden from every query
    (k if where == "key" else v)[..., 2, :] = bad
    out, _ = _run(target, q, k, v, mask)
    observed = out if isinstance(out, str) else ("leaks" if not np.isfinite(out).all() else "no_leak")
    _judge(record_semantics, target, f"masked_{'nan' if math.isnan(bad) else 'inf'}_{where}", observed, None)


def test_nan_in_unmasked_query(target, record_semantics):
    """NaN in query 0: only row 0 should be NaN; does it spread to other rows or vanish?"""
    q, k, v = _problem(target)
    q[0, 0, 0, 0] = math.nan
    out, _ = _run(target, q, k, v)
    if isinstance(out, str):
        observed = out
    else:
        nan = np.isnan(out).any(axis=-1)  # (B, H, Lq)
        observed = "row_only" if nan[0, 0, 0] and nan.sum() == 1 else "spreads" if nan.sum() > 1 else "swallowed"
    _judge(record_semantics, target, "nan_query", observed, None)


def test_effective_precision(target, record_semantics):
    """The widest format whose error budget the results meet (float64 input computed in float32: float32)."""
    rng = np.random.default_rng(1)
    q, k, v = (np.asarray(round_to(rng.standard_normal((1, 2, 64, 64)), target.dtype), dtype=np.float64)
               for _ in range(3))  # (B, H, L, E), exact in the dtype
    out, _ = _run(target, q, k, v)
    observed = out if isinstance(out, str) else "worse than bfloat16"
    if not isinstance(out, str):
        u = BUDGETS[target.dtype].unit_roundoff
        for fmt in sorted((d for d in BUDGETS if BUDGETS[d].unit_roundoff >= u), key=lambda d: BUDGETS[d].unit_roundoff):
            if error_budget.check_forward(out, q, k, v, dtype=fmt):
                observed = fmt
                break
    semantics = target.backend.semantics
    declared_any = getattr(semantics, "effective_precision", None) or target.backend.output_dtype(target.dtype) != target.dtype
    declared = target.budget_dtype if declared_any else None
    # a declared precision is a floor on the error allowed, not a promise of that error: results
    # more accurate than declared (openvino-sdpa's float32 calls at its bfloat16 hint meet the
    # float16 budget) agree with it; only worse ones contradict
    agrees = None if declared is None else BUDGETS.get(observed, BUDGETS[declared]).unit_roundoff <= \
        BUDGETS[declared].unit_roundoff and observed != "worse than bfloat16"
    record_semantics("effective_precision", observed, declared, agrees)
    assert agrees is not False, (f"{target.name} declares effective_precision = {declared!r} but at {target.dtype} "
                                 f"its results are only {observed!r}-accurate")
