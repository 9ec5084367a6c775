"""How far an implementation may be from the float64 reference: one model, per dtype.

The model (the one PyTorch's SDPA tests and flash-attention's tests use): a kernel
computing in ``dtype`` may err, against the float64 reference, by at most ``factor``
times what the *plain* same-dtype algorithm errs, plus a floor::

    max|actual - ref| <= factor * max|plain - ref| + floor
    floor = floor_ulps * (u + sqrt(n) * u_acc + S * u) * M + tiny

``plain`` is the naive algorithm of `specs.reference` run with every intermediate
rounded to ``dtype`` (`plain_forward`, `plain_backward`); it sees the same rounded
inputs the kernel sees, so input rounding is in both errors.  Errors are max-norms over
the whole tensor (output, dQ, dK or dV), as flash-attention's tests measure them.
M is the size of the terms summed into the tensor (`forward_magnitude`,
`backward_magnitudes`), S the size of the scores' terms (`score_size`), n the longest
reduction, max(Lq, Lk, E, Ev).  `check_forward` / `check_backward` compute them all.

    dtype     u (unit roundoff)  u_acc (reductions)  factor  floor_ulps  tiny
    float16   2^-11 = 4.9e-4     2^-24 = 6.0e-8      2       4           2^-14
    bfloat16  2^-8  = 3.9e-3     2^-24 = 6.0e-8      2       4           2^-126
    float32   2^-24 = 6.0e-8     2^-24 = 6.0e-8      2       4           2^-126
    float64   2^-53 = 1.1e-16    2^-53 = 1.1e-16     2       4           2^-1022

Why these numbers:
- u is half the spacing of the format's numbers at 1 (10, 7, 23, 52 stored bits): the
  largest relative error of one rounding to nearest.
- u_acc: reductions (the q.k dot products, the row sum of exponentials, the P.V sums)
  are accumulated in float32 by every 16-bit kernel worth testing (tensor cores, the CPU
  kernels of PyTorch, XLA), and in the format itself for float32 and float64.
- factor 2: a fused/tiled/online-softmax kernel does the same kind of roundings as the
  plain algorithm, in another order, plus one rescaling exp(m_old - m_new) per key tile;
  its error is of the plain one's order, and flash-attention's tests allow exactly 2x.
  Measured (tests/test_spec_error_budget.py, and torch SDPA on CPU over random and
  adversarial problems): correct kernels use at most ~0.55 of the allowance.
- the floor is what a correct kernel may err where the plain computation happens to be
  (nearly) exact: a one-key row has weight exactly 1, and in float64 the plain algorithm
  *is* the reference, so its error is 0.  Errors scale with the size of what is summed
  (|V| for the output; |dY|, |V|, |Q|, |K| for gradients - M, not the result, because
  the softmax backward cancels); a reduction of n terms summed in another order differs by
  about sqrt(n)*u_acc (random-walk growth of rounding errors); and exp turns a score's
  absolute error into a relative error of its weight.  That error is u * S, not u_acc * S:
  however the dot product is accumulated, a kernel may hold q*scale or the score itself
  in the format (XLA and PyTorch's math path store the (..., Lq, Lk) scores as float16),
  and one rounding of a score of size S moves it by u * S.  (Measured: jax-naive, in
  half precision at scores ~65, differs from the plain computation by half an ulp of a score,
  a 3 % change of a weight, where the plain error happened to be small.)  floor_ulps = 4
  leaves room for the few roundings a kernel adds (scale multiply, exp, final division).
  ``tiny`` (the smallest normal number) keeps an all-zero reference from demanding
  bit-exact zeros where a kernel leaves denormal dust.

What the budget can and cannot see: a scale off by a factor, or a mask off by one
position, moves the output by O(|V| / L) or more; in float16 the budget is about
10*u*|V| ~ 5e-3*|V|, so such bugs are rejected for L up to ~100; bfloat16 is 8x
coarser.  Tests that hunt bugs in 16-bit formats use short rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .invariants import Verdict
from .problem import Problem, validate, visible
from .reference import EXACT, Exact, expand_kv, run_backward, run_forward


@dataclass(frozen=True)
class Budget:
    dtype: str
    unit_roundoff: float        # u: one rounding to dtype
    accumulate_roundoff: float  # u_acc: one rounding inside a reduction
    factor: float               # times the plain same-dtype error
    floor_ulps: float           # the floor, in units of (u + sqrt(n) u_acc + S u) * M
    storage: str                # the NumPy dtype holding dtype's values (bfloat16 -> float32)

    def floor(self, magnitude: float, n: int, score_size: float = 0.0) -> float:
        spread = (self.unit_roundoff + math.sqrt(max(1, n)) * self.accumulate_roundoff
                  + score_size * self.unit_roundoff)
        return self.floor_ulps * spread * magnitude + _TINY[self.dtype]


BUDGETS = {
    "float16": Budget("float16", 2.0**-11, 2.0**-24, 2.0, 4.0, "float16"),
    "bfloat16": Budget("bfloat16", 2.0**-8, 2.0**-24, 2.0, 4.0, "float32"),
    "float32": Budget("float32", 2.0**-24, 2.0**-24, 2.0, 4.0, "float32"),
    "float64": Budget("float64", 2.0**-53, 2.0**-53, 2.0, 4.0, "float64"),
}
# smallest normal numbers: below them a format loses relative precision
_TINY = {"float16": 2.0**-14, "bfloat16": 2.0**-126, "float32": 2.0**-126, "float64": 2.0**-1022}
# when the caller does not say how long the reductions are: the longest this suite runs
DEFAULT_REDUCTION = 4096


def _budget(dtype) -> Budget:
    name = str(getattr(dtype, "__name__", dtype)).replace("torch.", "")
    name = np.dtype(name).name if name in ("float", "double", "half") else name
    if name not in BUDGETS:
        raise ValueError(f"dtype must be one of {sorted(BUDGETS)}; got {dtype!r}")
    return BUDGETS[name]


# ---- rounding to a format ----------------------------------------------------------

def round_bfloat16(x) -> np.ndarray:
    """Round to bfloat16 (round-to-nearest-even on the float32 bit pattern), held in float32."""
    f = np.asarray(x, dtype=np.float32)
    bits = f.view(np.uint32)  # same shape
    lsb = (bits >> 16) & 1  # the last bit bfloat16 keeps: ties go to the even one
    rounded = ((bits + np.uint32(0x7FFF) + lsb) & np.uint32(0xFFFF0000)).astype(np.uint32)
    rounded = np.where(np.isnan(f), bits | np.uint32(0x00400000), rounded)  # NaN stays NaN
    return rounded.view(np.float32)


def round_to(x, dtype) -> np.ndarray:
    """x rounded to dtype's values, held in dtype's storage type."""
    b = _budget(dtype)
    if b.dtype == "bfloat16":
        return round_bfloat16(x)
    return np.asarray(x).astype(b.storage)


class _Plain(Exact):
    """The reference's pipeline with each operation computed in the accumulator type (float32
    for 16-bit formats and float32, float64 for float64) and its result rounded to dtype."""

    def __init__(self, dtype):
        self.dtype = _budget(dtype).dtype
        self.acc = np.float64 if self.dtype == "float64" else np.float32

    def r(self, x) -> np.ndarray:
        return round_to(np.asarray(x, dtype=self.acc) if self.dtype != "float16" else x, self.dtype)

    def a(self, x) -> np.ndarray:
        return np.asarray(x, dtype=self.acc)

    def matmul(self, x, y) -> np.ndarray:
        return self.r(self.a(x) @ self.a(y))


def _problem(q, k, v, mask, is_causal, scale, fields) -> Problem:
    return q if isinstance(q, Problem) else validate(q, k, v, mask, is_causal, scale, **fields)


def plain_forward(q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", **fields) -> np.ndarray:
    """The naive forward in ``dtype``: the output, in dtype's storage type."""
    return run_forward(_problem(q, k, v, mask, is_causal, scale, fields), _Plain(dtype)).output


def plain_lse(q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", **fields) -> np.ndarray:
    """The naive forward's log-sum-exp (..., Lq) in ``dtype``'s accumulator type."""
    return run_forward(_problem(q, k, v, mask, is_causal, scale, fields), _Plain(dtype)).lse


def plain_backward(q, k, v, grad_out, mask=None, is_causal=False, scale=None, dtype="float32", **fields):
    """The naive backward in ``dtype`` (seed 003's chain): (dq, dk, dv[, dbias]) in dtype's storage type."""
    return run_backward(_problem(q, k, v, mask, is_causal, scale, fields), grad_out, _Plain(dtype))


# ---- the budget ----------------------------------------------------------------------

def _as_f64(x, name: str) -> np.ndarray:
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a numeric array; got {type(x).__name__}") from None


def forward_magnitude(q, k=None, v=None, mask=None, is_causal=False, scale=None, **fields) -> float:
    """Largest entry of weights @ |V|: the size of the terms summed into the output."""
    p = _problem(q, k, v, mask, is_causal, scale, fields)
    f = run_forward(p)
    return float(np.max(f.weights @ np.abs(f.v), initial=0.0))


def _score_terms(p: Problem) -> np.ndarray:
    """(..., Lq, Lk) scale |q|.|k| + |bias| + |alibi| on visible pairs, 0 elsewhere."""
    q = np.abs(_as_f64(p.query, "query"))  # (..., Hq, Lq, E)
    k = expand_kv(np.abs(_as_f64(p.key, "key")), p.group)  # (..., Hq, Lk, E)
    vis = visible(p)  # (..., Lq, Lk)
    terms = np.broadcast_to((q @ np.swapaxes(k, -1, -2)) * p.scale, vis.shape)  # (..., Lq, Lk)
    if p.softcap is not None:
        terms = np.minimum(terms, p.softcap)  # a capped score is at most the cap
    if p.bias is not None:
        b = np.abs(_as_f64(p.bias, "bias"))
        terms = terms + np.where(np.isinf(b), 0.0, b)
    if p.alibi_slopes is not None:
        from .problem import alibi_bias
        terms = terms + np.abs(alibi_bias(p.alibi_slopes, p.Lq, p.Lk, p.causal_alignment))
    return np.where(vis, terms, 0.0)


def score_size(q, k, mask=None, is_causal=False, scale=None, value=None, **fields) -> float:
    """Largest |score term| over visible pairs: scale |q|.|k| plus |bias| and |ALiBi|.

    exp turns an absolute error e in a score into a relative error e in its weight, and a
    score's rounding error is about u * scale * |q|.|k| - so a kernel that forms the
    scores differently (q*scale first, exp2 with log2(e) folded in) moves the weights by
    that much even in float64, where the plain algorithm shows no error at all.
    """
    v = _as_f64(k, "key")[..., :1] if value is None else value
    p = _problem(q, k, v, mask, is_causal, scale, fields)
    return float(np.max(_score_terms(p), initial=0.0))


def backward_magnitudes(q, k, v, grad_out, mask=None, is_causal=False, scale=None, **fields) -> tuple:
    """Largest entries of the gradients recomputed on absolute values (|dY|, |V|, |K|, |Q|).

    The softmax backward subtracts rowsum(dA*A) from dA: the result may cancel to ~0 while
    each term is large, and its rounding error is set by the terms (u * sum|terms|, the
    classic running error bound), not by the result.  With a bias, a fourth entry: dBias's.
    """
    p = _problem(q, k, v, mask, is_causal, scale, fields)
    f = run_forward(p)
    a = f.weights  # (..., Lq, Lk)
    aq, ak, av = np.abs(f.q), np.abs(f.k), np.abs(f.v)  # expanded to query heads
    ady = np.abs(_as_f64(grad_out, "grad_out"))  # (..., Lq, Ev)
    da = ady @ np.swapaxes(av, -1, -2)  # (..., Lq, Lk) |dA| bound
    ds = a * (da + (da * a).sum(axis=-1, keepdims=True))  # (..., Lq, Lk) |dS| terms
    from .reference import sum_groups
    mq = np.max(ds @ ak, initial=0.0) * p.scale
    mk = np.max(sum_groups(np.swapaxes(ds, -1, -2) @ aq, p.group), initial=0.0) * p.scale
    mv = np.max(sum_groups(np.swapaxes(a, -1, -2) @ ady, p.group), initial=0.0)
    out = [float(mq), float(mk), float(mv)]
    if p.bias is not None:
        from .reference import sum_to
        out.append(float(np.max(sum_to(ds, np.shape(p.bias)), initial=0.0)))
    return tuple(out)


def allowed_error(reference, plain, dtype, reduction_length: int | None = None,
                  magnitude: float | None = None, score_size: float = 0.0) -> float:
    """factor * max|plain - reference| + floor, for one tensor computed in dtype.

    ``magnitude``: the size of the terms that make up the tensor (`forward_magnitude`,
    `backward_magnitudes`); None uses max|reference|, which is too tight where the result
    cancels (e.g. dQ when V has equal rows) - prefer `check_forward`/`check_backward`.
    ``reduction_length``: None means DEFAULT_REDUCTION.  ``score_size``: `score_size`.
    """
    b = _budget(dtype)
    ref, pl = _as_f64(reference, "reference"), _as_f64(plain, "plain")
    if ref.shape != pl.shape:
        raise ValueError(f"plain has shape {pl.shape} but reference has {ref.shape}")
    n = DEFAULT_REDUCTION if reduction_length is None else int(reduction_length)
    if n < 1:
        raise ValueError(f"reduction_length must be >= 1; got {reduction_length}")
    if magnitude is None:
        magnitude = float(np.max(np.abs(ref), initial=0.0))
    if not (magnitude >= 0 and math.isfinite(magnitude)):
        raise ValueError(f"magnitude must be a finite number >= 0; got {magnitude}")
    plain_err = float(np.max(np.abs(pl - ref), initial=0.0))
    if not math.isfinite(plain_err):  # the plain computation overflowed: it bounds nothing
        raise ValueError(f"plain has a non-finite error against reference ({plain_err}): "
                         f"the problem overflows {b.dtype}")
    if not (score_size >= 0 and math.isfinite(score_size)):
        raise ValueError(f"score_size must be a finite number >= 0; got {score_size}")
    return b.factor * plain_err + b.floor(magnitude, n, score_size)


def check_close(actual, reference, plain, dtype, name: str = "output", reduction_length: int | None = None,
                magnitude: float | None = None, score_size: float = 0.0) -> Verdict:
    """Verdict on max|actual - reference| against `allowed_error`; where = worst entry."""
    act, ref = _as_f64(actual, "actual"), _as_f64(reference, "reference")
    if act.shape != ref.shape:
        raise ValueError(f"actual {name} has shape {act.shape} but reference has {ref.shape}")
    return _verdict(act, ref, allowed_error(ref, plain, dtype, reduction_length, magnitude, score_size), dtype, name)


def reduction_length(q_shape, k_shape, v_shape) -> int:
    """The longest reduction in forward and backward: max(Lq, Lk, E, Ev)."""
    return int(max(q_shape[-2], k_shape[-2], q_shape[-1], v_shape[-1]))


def forward_allowed(q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", rows=None,
                    **fields):
    """(allowed error, reference output, plain output) with every input of the budget.

    ``rows``: optional bool (..., Lq) selecting the rows judged (e.g. those with a visible
    key); reference and plain come back restricted to them.
    """
    p = _problem(q, k, v, mask, is_causal, scale, fields)
    ref = run_forward(p).output  # (..., Lq, Ev)
    plain = run_forward(p, _Plain(dtype)).output  # (..., Lq, Ev)
    if rows is not None:
        ref, plain = ref[rows], plain[rows]  # (judged rows, Ev)
    allowed = allowed_error(ref, plain, dtype, _reduction(p), forward_magnitude(p), float(np.max(_score_terms(p), initial=0.0)))
    return allowed, ref, plain


def _reduction(p: Problem) -> int:
    return int(max(p.Lq, p.Lk, p.E, p.Ev, 1))


def backward_allowed(q, k, v, grad_out, mask=None, is_causal=False, scale=None, dtype="float32", **fields):
    """[(allowed error, reference, plain)] for dq, dk, dv (and dbias with a bias)."""
    p = _problem(q, k, v, mask, is_causal, scale, fields)
    refs = run_backward(p, grad_out)
    plains = run_backward(p, grad_out, _Plain(dtype))
    mags = backward_magnitudes(p, None, None, grad_out)
    n, s = _reduction(p), float(np.max(_score_terms(p), initial=0.0))
    return [(allowed_error(r, pl, dtype, n, m, s), r, pl) for r, pl, m in zip(refs, plains, mags)]


def lse_allowed(q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", rows=None, **fields):
    """(allowed error, reference lse, plain lse) over the judged rows (default: rows with a visible key).

    The log-sum-exp's error is absolute: a score moved by e moves it by at most e (u * S), a
    relative error r of the row sum moves it by r (sqrt(n) u_acc), and its own rounding by
    u * |lse|.  So its floor is floor_ulps * (u * (|lse| + S) + sqrt(n) u_acc), magnitude 1.
    """
    p = _problem(q, k, v, mask, is_causal, scale, fields)
    f = run_forward(p)
    rows = f.visible.any(axis=-1) if rows is None else rows  # (..., Lq)
    ref, plain = f.lse[rows], run_forward(p, _Plain(dtype)).lse[rows]  # (judged rows,)
    b = _budget(dtype)
    size = float(np.max(np.abs(ref), initial=0.0))
    plain_err = float(np.max(np.abs(plain - ref), initial=0.0))
    S = float(np.max(_score_terms(p), initial=0.0))
    allowed = b.factor * plain_err + b.floor(1.0, _reduction(p), S + size)
    return allowed, ref, plain


def check_lse(actual, q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", rows=None,
              **fields) -> Verdict:
    """A backend's log-sum-exp (..., Lq) against the reference, on rows with a visible key."""
    p = _problem(q, k, v, mask, is_causal, scale, fields)
    rows = visible(p).any(axis=-1) if rows is None else rows
    allowed, ref, _ = lse_allowed(p, dtype=dtype, rows=rows)
    act = _as_f64(actual, "actual")
    if act.shape != rows.shape:
        raise ValueError(f"actual lse has shape {act.shape} but the problem's rows are {rows.shape}")
    return _verdict(act[rows], ref, allowed, dtype, "lse")


def _verdict(actual, reference, allowed, dtype, name) -> Verdict:
    act, ref = _as_f64(actual, "actual"), _as_f64(reference, "reference")
    if act.shape != ref.shape:
        raise ValueError(f"actual {name} has shape {act.shape} but reference has {ref.shape}")
    if act.size == 0:
        return Verdict(f"close[{name}]", True, None, 0.0, f"{name}: empty")
    err = np.abs(act - ref)  # like the tensor
    err = np.where(np.isnan(err), np.inf, err)  # NaN is as wrong as it gets
    flat = int(np.argmax(err))
    where = tuple(int(i) for i in np.unravel_index(flat, err.shape))
    worst = float(err.flat[flat])
    dt = _budget(dtype).dtype
    if worst <= allowed:
        return Verdict(f"close[{name}]", True, where, worst,
                       f"{name} ({dt}): max error {worst:.3g} at {where} within the allowed {allowed:.3g}")
    return Verdict(f"close[{name}]", False, where, worst,
                   f"{name} ({dt}): max error {worst:.6g} at {where} (got {act.flat[flat]:.6g}, reference "
                   f"{ref.flat[flat]:.6g}) exceeds the allowed {allowed:.3g} = {BUDGETS[dt].factor:g} x plain "
                   f"{dt} error + floor")


def check_forward(actual, q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", rows=None,
                  **fields) -> Verdict:
    """A backend's forward output (restricted to ``rows`` if given) against the reference."""
    allowed, ref, _ = forward_allowed(q, k, v, mask, is_causal, scale, dtype, rows, **fields)
    actual = _as_f64(actual, "actual")
    return _verdict(actual[rows] if rows is not None else actual, ref, allowed, dtype, "output")


def check_backward(actual, q, k, v, grad_out, mask=None, is_causal=False, scale=None, dtype="float32",
                   **fields) -> list:
    """One Verdict per gradient (dq, dk, dv, and dbias when both sides have it) of a backend's backward."""
    budgets = backward_allowed(q, k, v, grad_out, mask, is_causal, scale, dtype, **fields)
    if len(actual) not in (3, len(budgets)):
        raise ValueError(f"actual must be (dq, dk, dv) or (dq, dk, dv, dbias); got {len(actual)} arrays")
    return [_verdict(a, r, allowed, dtype, name)
            for a, (allowed, r, _), name in zip(actual, budgets, ("dq", "dk", "dv", "dbias"))]
