"""How far an implementation may be from the float64 reference: one model, per row.

Every row r of a result computed in ``dtype`` (an output or dQ row: one query; a dK or dV
row: one key of a KV head; a dBias row: the bias's last axis; the log-sum-exp: one entry)
may err, against the float64 reference, by::

    allowed_r = factor * e_r + floor_ulps * (sigma * Phi_r + tiny)
    e_r       = max over row r of |plain - ref|      the plain same-dtype algorithm's error there
    sigma     = u + sqrt(n) * u_acc                  one rounding, plus an n-term reduction's
    Phi_r     = max over row r of the row's terms    (specs.budget_terms; forward below)

``plain`` is `specs.reference`'s pipeline run with every intermediate rounded to dtype
(`plain_forward`, `plain_backward`): it sees the same inputs and, row by row, what a naive
kernel errs.  n = max(Lq, Lk, E, Ev).  For the output row of query i, with reference weights
w, output y and, per visible key j, T_j = scale |q_i|.|k_j| + |bias| + |ALiBi| (the score's
size; under a softcap its first part is R_j (1 - t_j^2) + |c_j|, below) and g_j = max_l s_l -
s_j (its gap to the row maximum)::

    Phi_ic = (w |V|)_ic + sum_j w_j (T_j + g_j) |v_jc - y_ic|

tiny = n * tau (tau: the smallest normal number) in float32, bfloat16 and float64, whose CPU
kernels may flush subnormal numbers to zero (FTZ/DAZ: XLA, OpenVINO) - each of a sum's n terms
may be flushed, so a normal result near tau may come back as 0 (XLA: a dK of 3.0e-38 made of
subnormal products); u * tau in float16, whose subnormals every kernel keeps.  Where kernels
flush, a weight or dS entry below tau errs by tau itself, not u tau: the terms carry tau / sigma
there (a flushed weight times what it multiplies: XLA's float32 dK of -7.0e-37 came back 0).

Derivation (first order in u).  Rounding x to the format moves it by at most u (|x| + tau)
(tau: the smallest normal number; below it the spacing is even); a sum of n terms taken in
another order, or accumulated in u_acc, by about sqrt(n) u_acc times the sum of the terms'
sizes (random walk).  So one rounding per step and the reductions cost sigma per unit of
what is summed.  (1) The weights are rounded (P is rounded after the row sum is taken:
nothing renormalises it) and so is the output: sigma (w|V|) each.  (2) A score's error: a
kernel may hold scale*q, the score, the capped or biased score and s - max in the format
(XLA and PyTorch's math path keep the scores in the 16-bit format; XLA and OpenVINO round the
scale to it), moving score j by sigma (T_j + g_j) per rounding.  A softcap c = cap tanh(raw /
cap) passes the raw score's error sigma R_j (R_j = scale |q_i|.|k_j|) on times its slope
1 - t_j^2 and adds its own (a library tanh: TANH_ULPS u_acc |c_j|): never less than the raw
error where the raw score is near 0, however large R_j.  The softmax renormalises
score errors e_j: w_j becomes w_j (1 + e_j - sum_l w_l e_l), so the output moves by
sum_j w_j e_j (v_j - y) - the second term, which vanishes on a saturated row (v_j - y ~ 0
where w_j ~ 1); the old tensor-wide floor 4 (u + sqrt(n) u_acc + u max S) max M gave every
row the allowance of the most saturated one.  A kernel that divides by exp(lse) instead of
the row sum (flash's backward, w = exp(s - lse)) adds its lse's rounding, u_acc |lse| |y|.
(3) floor_ulps = 2: the weights and the output are two roundings of (w|V|), the score and
s - max two of the score terms.  (4) factor * e_r: where a row's roundings line up, the
plain algorithm shows it and a kernel gets twice that, as in flash-attention's tests - per
row, and never less than the floor (the plain error is 0 where the plain computation is exact
by chance: one-key rows; and always in float64, where it *is* the reference).  Gradients:
the same steps through dA = dY V^T, dS = w (dA - rowsum(dA w)), dQ = scale dS K, dK =
scale dS^T Q, dV = w^T dY (`specs.budget_terms.backward_terms`, with the softcap's
derivative).  The log-sum-exp: Phi_i = 1 + sum_j w_j (T_j + g_j), plus u |lse_i|.  Weight
row sums: the log-sum-exp's floor (a kernel may write exp(s - lse)).
(5) Intermediates a kernel rounds to the input dtype before the product that consumes them:
P before P V (every flash forward) and before dV = P^T dY, dS before dQ and dK, or dS * scale
(a Triton FlashAttention's float16 backward, "to reduce register pressure").  Rounding x errs
by u (|x| + tau): its relative part is in the terms above (dS * scale's own: a rounding beside dS's,
counted in dQ's and dK's terms); its absolute part u tau - half the
subnormal spacing, all that an x below the subnormal range loses when it rounds to 0 - reaches
the result times what multiplies x, and nothing shrinks it: u tau |V| in the output (the tau
of (w + tau) |V|), u tau |dY| in dV, and for dS * scale u tau |Q| in dK and u tau |K| in dQ,
not the scale u tau |Q| that rounding dS before the scale costs.  So a row's floor carries tau
times the sum of what multiplies the intermediate over the pairs the row reads: dK row j
tau sum_i |q_i| (visible i), dQ row i tau sum_j |k_j|, both beside the scaled term.  Issue 29's
case (tests/broken/witnesses.ds_scale_underflow): float16, E = 128 (scale 0.088), 8 query
rows with |q| = 20, dS = 1.5e-7 (a subnormal float16 keeps) but dS * scale = 1.3e-8, which
rounds to 0: dK = 0 where the reference is 2.1e-6, against an allowance of 1.7e-6 without this
term (the plain computation rounds dS and scales after: it errs 4e-7); the term adds
2 sigma tau sum_i |q_i| = 2^-24 * 160 = 9.6e-6, twice the most such a row can lose (u tau *
160).  Where kernels flush subnormals, tau / sigma stands for tau, as for the weights.

    dtype     u (unit roundoff)  u_acc (reductions)  factor  floor_ulps  tau (smallest normal)
    float16   2^-11 = 4.9e-4     2^-24 = 6.0e-8      2       2           2^-14
    bfloat16  2^-8  = 3.9e-3     2^-24 = 6.0e-8      2       2           2^-126
    float32   2^-24 = 6.0e-8     2^-24 = 6.0e-8      2       2           2^-126
    float64   2^-53 = 1.1e-16    2^-53 = 1.1e-16     2       2           2^-1022

FP8 inputs (`specs.fp8`; the "dtype" is then the kernel's computation, e.g.
``float8_e4m3fn(p=float8_e4m3fn,out=bfloat16)``): the inputs are exact and everything runs in
float32, so sigma and the terms are float32's, and the two roundings the kernel adds are counted
on their own, once each (their own worst case, so no floor_ulps on them): P = exp(s - max)
rounded to p_dtype before P V errs by u_p (P + tau_p) - relative above the format's normal range,
at most P itself or u_p tau_p (half the subnormal spacing) below it - so the output row by
u_p (w |V|) + sum_j min(w_j, u_p tau_p / l) |v_j| with l = exp(lse - max) the row sum P is
counted against (a tiled or split kernel whose running maximum is smaller rounds larger P:
never more than this); the output rounded to its dtype by u_out (|y| + tau_out)
(`budget_terms.rounding_terms`).  The plain computation does exactly these roundings
(`specs.plain.Fp8Plain`), so the factor * e_r term follows them row by row.

u: half the spacing of the format's numbers at 1.  u_acc: every 16-bit kernel worth testing
accumulates reductions in float32 (and keeps the lse in float32).  Measured on every correct
kernel here, in every dtype (tests/budget_study.py, tests/test_budget_margins.py): no row
uses more than MARGIN of its allowance.  Detection power (the smallest defect the suite
rejects): ``python tools/detection_power.py --defects tests.defects`` in a checkout.

``rule="flash"`` (every function here takes it) switches a budget to flash-attention's rule,
2 x the plain error's maximum over the whole tensor and no floor (for comparisons; in float64 it
allows nothing, since there the plain computation is the reference).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attnspec.specs import budget_terms as terms
from attnspec.specs import fp8
from attnspec.specs.invariants import Verdict, worst_offender
from attnspec.specs.memo import ContentMemo
from attnspec.specs.plain import Plain as _Plain  # noqa: F401
from attnspec.specs.plain import (  # noqa: F401 - public names
    _problem,
    arithmetic,
    dtype_name,
    plain_backward,
    plain_forward,
    plain_lse,
    round_bfloat16,
    round_to,
)
from attnspec.specs.problem import Problem
from attnspec.specs.reference import run_backward, run_forward

RULES = ("attnspec", "flash")  # this module's per-row budget; flash-attention's tensor-wide one


@dataclass(frozen=True)
class Budget:
    dtype: str
    unit_roundoff: float        # u: one rounding to dtype
    accumulate_roundoff: float  # u_acc: one rounding inside a reduction
    factor: float               # times the plain same-dtype error of the row
    floor_ulps: float           # the floor, in units of sigma * Phi
    normal_min: float           # tau: the smallest normal number; a rounding errs by u (|x| + tau)
    storage: str                # the NumPy dtype holding dtype's values (bfloat16 -> float32)
    # Kernels may flush subnormal results to zero: CPUs run float32/float64 code with FTZ/DAZ
    # (XLA sets it; OpenVINO's CPU plugin too) and bfloat16 shares float32's range, so a result
    # below tau may come back as 0 - an error below tau, nothing a defect of any size hides in.
    # float16's subnormals are kept: its kernels compute in float32 and round.
    flushes_subnormals: bool = True
    # What storing a result adds near 0 beyond the format's own tau: a bfloat16 computation's result may be
    # stored in float16 (a kernel computing float16 inputs in bfloat16 returns float16: OpenVINO's CPU
    # plugin at its default precision on a CPU with bfloat16 kernels), and float16 rounds a result below
    # its smallest normal to its subnormal grid, off by up to half its spacing, u tau = 2^-25 - where
    # bfloat16's own range shows nothing (found: a sink of 13.25 left an output of -4.4e-8, which
    # float16 stores as -6.0e-8, against a bfloat16 floor of 1.2e-8)
    stored_floor: float = 0.0
    # fp8 inputs (specs.fp8): the roundings of P before P V (0: none) and of the output, each with its
    # format's smallest normal number, counted once each beside the float32 terms
    p_roundoff: float = 0.0
    p_normal_min: float = 0.0
    out_roundoff: float = 0.0
    out_normal_min: float = 0.0

    def sigma(self, n: int) -> float:
        """u + sqrt(n) u_acc: one rounding plus an n-term reduction's, relative."""
        return self.unit_roundoff + math.sqrt(max(1, n)) * self.accumulate_roundoff

    def floor(self, magnitude: float, n: int, score_size: float = 0.0) -> float:
        """The tensor-wide floor for callers without a problem: terms of size `magnitude`,
        scores of size `score_size` (Phi <= (1 + 2 S) M, the S u of every rounded score)."""
        return self.floor_ulps * (self.sigma(n) * (1.0 + 2.0 * score_size) * magnitude + self.tiny(n))

    def weight_tau(self, n: int) -> float:
        """tau for the terms (specs.budget_terms), in units of sigma: a weight or dS entry errs by
        u (|x| + tau) when rounded, but by tau itself when a kernel flushes it to zero, so there
        tau / sigma (the module's docstring)."""
        return self.normal_min / self.sigma(n) if self.flushes_subnormals else self.normal_min

    def tiny(self, n: int = 1) -> float:
        """What a result near 0 may err by: n tau where kernels may flush subnormals to zero (each
        of n summed terms), else u * tau (half the subnormals' spacing); plus `stored_floor`."""
        if self.flushes_subnormals:
            return max(1, n) * self.normal_min + self.stored_floor
        return self.unit_roundoff * self.normal_min + self.stored_floor


BUDGETS = {
    "float16": Budget("float16", 2.0**-11, 2.0**-24, 2.0, 2.0, 2.0**-14, "float16", flushes_subnormals=False),
    "bfloat16": Budget("bfloat16", 2.0**-8, 2.0**-24, 2.0, 2.0, 2.0**-126, "float32", stored_floor=2.0**-25),
    "float32": Budget("float32", 2.0**-24, 2.0**-24, 2.0, 2.0, 2.0**-126, "float32"),
    "float64": Budget("float64", 2.0**-53, 2.0**-53, 2.0, 2.0, 2.0**-1022, "float64"),
}
# when the caller does not say how long the reductions are: the longest this suite runs
DEFAULT_REDUCTION = 4096


def _format(dtype: str) -> tuple:
    """(u, tau) of a format a computation rounds to."""
    if dtype in fp8.FP8_FORMATS:
        f = fp8.FP8_FORMATS[dtype]
        return f.unit_roundoff, f.normal_min
    return BUDGETS[dtype].unit_roundoff, BUDGETS[dtype].normal_min


def fp8_budget(name: str) -> Budget:
    """The budget of an fp8 kernel's computation (`specs.fp8.computation`): float32's, plus its P and
    output roundings."""
    c = fp8.computation(name)
    f32 = BUDGETS["float32"]
    u_p, tau_p = _format(c.p_dtype) if c.p_dtype else (0.0, 0.0)
    u_out, tau_out = _format(c.out)
    return Budget(c.name, f32.unit_roundoff, f32.accumulate_roundoff, f32.factor, f32.floor_ulps, f32.normal_min,
                  "float32", p_roundoff=u_p, p_normal_min=tau_p, out_roundoff=u_out, out_normal_min=tau_out)


# the row budgets of recent problems: a fixed grid's problem recurs once a backend (specs/memo.py)
_MEMO = ContentMemo(max_bytes=256 << 20)


def _budget(dtype) -> Budget:
    name = dtype_name(dtype)
    return fp8_budget(name) if fp8.is_fp8(name) else BUDGETS[name]


def check_rule(rule: str) -> str:
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}; got {rule!r}")
    return rule


def _as_f64(x, name: str) -> np.ndarray:
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a numeric array; got {type(x).__name__}") from None


def reduction_length(q_shape, k_shape, v_shape) -> int:
    """The longest reduction in forward and backward: max(Lq, Lk, E, Ev)."""
    return int(max(q_shape[-2], k_shape[-2], q_shape[-1], v_shape[-1]))


def _reduction(p: Problem) -> int:
    return int(max(p.Lq, p.Lk, p.E, p.Ev, 1))


# ---- the row budgets -----------------------------------------------------------------

def _plain_error(ref, plain, dtype, per_row: bool) -> np.ndarray:
    err = np.abs(_as_f64(plain, "plain") - _as_f64(ref, "reference"))
    if not np.isfinite(err).all():  # the plain computation overflowed: it bounds nothing
        raise ValueError(f"plain has a non-finite error against reference: the problem overflows {dtype}")
    return err.max(axis=-1, initial=0.0) if per_row else err


def _rows(ref, plain, phi, dtype, n: int, extra=0.0, per_row: bool = True, rule: str = "attnspec") -> np.ndarray:
    """allowed per row: factor * e_r + floor_ulps * (sigma * max_r phi + extra) + tiny (or flash's rule)."""
    b = _budget(dtype)
    e = _plain_error(ref, plain, b.dtype, per_row)
    if check_rule(rule) == "flash":
        return np.full(e.shape, b.factor * float(np.max(e, initial=0.0)))
    phi = np.max(phi, axis=-1, initial=0.0) if per_row else phi
    return b.factor * e + b.floor_ulps * (b.sigma(n) * phi + extra + b.tiny(n))


def forward_allowed_rows(q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", *, rule="attnspec",
                         **fields):
    """(allowed (..., Lq), reference output (..., Lq, Ev), plain output (..., Lq, Ev))."""
    p = _problem(q, k, v, mask, is_causal, scale, fields)
    return _MEMO(lambda: _forward_rows(p, dtype, rule), "forward", p, dtype, rule)


def _forward_rows(p: Problem, dtype, rule: str) -> tuple:
    f = run_forward(p)
    plain = run_forward(p, arithmetic(dtype)).output  # (..., Lq, Ev)
    b, n = _budget(dtype), _reduction(p)
    phi = terms.forward_terms(p, f, b.weight_tau(n), b.accumulate_roundoff / b.sigma(n), _tanh_share(dtype, p))
    if b.p_roundoff or b.out_roundoff:  # an fp8 kernel's own roundings, once each (in units of the floor)
        phi = phi + terms.rounding_terms(p, f, b) / (b.floor_ulps * b.sigma(n))  # (..., Lq, Ev)
    return _rows(f.output, plain, phi, dtype, n, rule=rule), f.output, plain


def _tanh_share(dtype: str, p) -> float:
    """A library tanh's own error (TANH_ULPS u_acc) in units of sigma."""
    b = _budget(dtype)
    return terms.TANH_ULPS * b.accumulate_roundoff / b.sigma(_reduction(p))


def lse_allowed_rows(q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", *, rule="attnspec",
                     shift=None, **fields):
    """(allowed (..., Lq), reference lse, plain lse); rows with no visible key: lse -inf, allowed 0.

    ``shift`` (broadcastable to (..., Lq)): a maximum a kernel may subtract that lies above the row's own
    (gpt-oss's Triton kernel starts its running maximum at the sink and returns the LSE over the real
    keys, m + log l): d = shift - max_j s_j past it moves each exp(s_j - m) by u d and the sum's log by
    d more before m + log l cancels them, so the row's terms grow by 2 d."""
    p = _problem(q, k, v, mask, is_causal, scale, fields)
    return _MEMO(lambda: _lse_rows(p, dtype, rule, shift), "lse", p, dtype, rule, shift)


def _lse_rows(p: Problem, dtype, rule: str, shift) -> tuple:
    f = run_forward(p)
    plain = run_forward(p, arithmetic(dtype)).lse  # (..., Lq)
    seen = np.isfinite(f.lse)
    phi, size = terms.lse_terms(p, f, _tanh_share(dtype, p))  # (..., Lq) twice
    if shift is not None:
        top = np.where(f.visible, f.scores, -np.inf).max(axis=-1, initial=-np.inf)  # (..., Lq)
        with np.errstate(invalid="ignore"):
            past = np.where(seen & np.isfinite(np.asarray(shift, dtype=np.float64)), np.asarray(shift) - top, 0.0)
        phi = phi + 2 * np.maximum(past, 0.0)  # (..., Lq)
    ref0, plain0 = np.where(seen, f.lse, 0.0), np.where(seen, plain, 0.0)
    u = _budget(dtype).unit_roundoff
    allowed = _rows(ref0, plain0, phi, dtype, _reduction(p), u * size, per_row=False, rule=rule)
    return np.where(seen, allowed, 0.0), f.lse, plain


def row_sum_allowed_rows(q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", *, rule="attnspec",
                         **fields):
    """(allowed (..., Lq), plain row sums of the weights (..., Lq)): how far from 1 a row's weights
    may sum.  A normalising kernel errs by its weights' roundings (sigma); one that writes
    exp(s - lse) by its log-sum-exp's error - the lse budget covers both."""
    p = _problem(q, k, v, mask, is_causal, scale, fields)
    f = run_forward(p)
    sums = run_forward(p, arithmetic(dtype)).weights.sum(axis=-1, dtype=np.float64)  # (..., Lq)
    seen = f.visible.any(axis=-1)  # (..., Lq)
    phi, size = terms.lse_terms(p, f, _tanh_share(dtype, p))
    b = _budget(dtype)
    if b.p_roundoff or b.out_roundoff:  # an fp8 kernel's weights (V = identity: its output) rounded twice
        phi = phi + terms.row_sum_rounding(p, f, b) / (b.floor_ulps * b.sigma(_reduction(p)))  # (..., Lq)
    u = b.unit_roundoff
    allowed = _rows(seen.astype(float), np.where(seen, sums, 0.0), phi, dtype, _reduction(p), u * size, per_row=False,
                    rule=rule)
    return allowed, sums


def weight_sum_rounding(q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", **fields):
    """(..., Lq) what an fp8 kernel's own roundings (P before P V, the output) move a row's weights' sum
    by, beside the log-sum-exp's budget (V = identity: each weight an output); 0 for other dtypes."""
    p = _problem(q, k, v, mask, is_causal, scale, fields)
    b = _budget(dtype)
    if not (b.p_roundoff or b.out_roundoff):
        return np.zeros(p.batch_shape + (p.Lq,))
    return terms.row_sum_rounding(p, run_forward(p), b)


def backward_allowed_rows(q, k, v, grad_out, mask=None, is_causal=False, scale=None, dtype="float32", *,
                          rule="attnspec", **fields):
    """((allowed, reference, plain), ...) for dq, dk, dv (and dbias with a bias); allowed is per row,
    shaped like the gradient without its last axis."""
    p = _problem(q, k, v, mask, is_causal, scale, fields)
    if fp8.is_fp8(dtype_name(dtype)):
        raise ValueError(f"dtype {dtype}: fp8 inputs are forward-only here (FA3, FA4, PyTorch's quantised SDPA)")
    return _MEMO(lambda: _backward_rows(p, grad_out, dtype, rule), "backward", p, grad_out, dtype, rule)


def _backward_rows(p: Problem, grad_out, dtype, rule: str) -> tuple:
    f = run_forward(p)
    refs = run_backward(p, grad_out)
    plains = run_backward(p, grad_out, _Plain(dtype))
    b, n = _budget(dtype), _reduction(p)
    acc = b.accumulate_roundoff / b.sigma(n)  # u_acc in units of sigma
    phis = terms.backward_terms(p, _as_f64(grad_out, "grad_out"), f, b.weight_tau(n), acc, _tanh_share(dtype, p))
    return tuple((_rows(r, pl, phi, dtype, n, rule=rule), r, pl) for r, pl, phi in zip(refs, plains, phis, strict=True))


# ---- tensor-wide views (the maxima of the row budgets) ---------------------------------

def _max(allowed, rows=None) -> float:
    a = np.asarray(allowed) if rows is None else np.asarray(allowed)[rows]
    return float(np.max(a, initial=0.0))


def forward_allowed(q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", rows=None, *,
                    rule="attnspec", **fields):
    """(largest row allowance, reference output, plain output); ``rows`` (bool (..., Lq)) restricts
    all three to the judged rows (reference and plain then come back as (judged rows, Ev))."""
    allowed, ref, plain = forward_allowed_rows(q, k, v, mask, is_causal, scale, dtype, rule=rule, **fields)
    if rows is not None:
        return _max(allowed, rows), ref[rows], plain[rows]
    return _max(allowed), ref, plain


def backward_allowed(q, k, v, grad_out, mask=None, is_causal=False, scale=None, dtype="float32", *, rule="attnspec",
                     **fields):
    """[(largest row allowance, reference, plain)] for dq, dk, dv (and dbias with a bias)."""
    return [(_max(a), r, pl) for a, r, pl in backward_allowed_rows(q, k, v, grad_out, mask, is_causal, scale,
                                                                   dtype, rule=rule, **fields)]


def lse_allowed(q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", rows=None, *,
                rule="attnspec", **fields):
    """(largest allowance, reference lse, plain lse) over the judged rows (default: rows with a visible key)."""
    allowed, ref, plain = lse_allowed_rows(q, k, v, mask, is_causal, scale, dtype, rule=rule, **fields)
    rows = np.isfinite(ref) if rows is None else rows
    return _max(allowed, rows), ref[rows], plain[rows]


def allowed_error(reference, plain, dtype, reduction_length: int | None = None,
                  magnitude: float | None = None, score_size: float = 0.0, rule: str = "attnspec") -> float:
    """factor * max|plain - reference| + `Budget.floor`: one allowance for a whole tensor.

    For callers without a problem; with one, prefer the row budgets (`check_forward`,
    `forward_allowed_rows`).  ``magnitude``: the size of the terms summed into the tensor
    (None: max|reference|, too tight where the result cancels); ``reduction_length``: None
    means DEFAULT_REDUCTION; ``score_size``: the largest |score| involved.
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
    if not (score_size >= 0 and math.isfinite(score_size)):
        raise ValueError(f"score_size must be a finite number >= 0; got {score_size}")
    plain_err = float(np.max(_plain_error(ref, pl, b.dtype, per_row=False), initial=0.0))
    if check_rule(rule) == "flash":
        return b.factor * plain_err
    return b.factor * plain_err + b.floor(magnitude, n, score_size)


def score_size(q, k=None, mask=None, is_causal=False, scale=None, value=None, **fields) -> float:
    """Largest |score term| over visible pairs: scale |q|.|k| (capped) plus |bias| and |ALiBi|."""
    if not isinstance(q, Problem):
        value = _as_f64(k, "key")[..., :1] if value is None else value
    return float(np.max(terms.score_terms(_problem(q, k, value, mask, is_causal, scale, fields)), initial=0.0))


def forward_magnitude(q, k=None, v=None, mask=None, is_causal=False, scale=None, **fields) -> float:
    """Largest entry of weights @ |V|: the size of the terms summed into the output."""
    f = run_forward(_problem(q, k, v, mask, is_causal, scale, fields))
    return float(np.max(f.weights @ np.abs(f.v), initial=0.0))


# ---- verdicts ----------------------------------------------------------------------------

def _verdict(actual, reference, allowed, dtype, name, judged=None, rule: str = "attnspec") -> Verdict:
    """Every judged entry within its row's allowance; ``where`` is the entry that uses the
    largest fraction of its row's allowance (a full index), ``limit`` that allowance."""
    act, ref = _as_f64(actual, "actual"), _as_f64(reference, "reference")
    if act.shape != ref.shape:
        raise ValueError(f"actual {name} has shape {act.shape} but reference has {ref.shape}")
    allowed = np.asarray(allowed, dtype=np.float64)
    limit = np.broadcast_to(allowed[..., None] if allowed.ndim == ref.ndim - 1 and ref.ndim else allowed, ref.shape)
    err = np.abs(act - ref)  # like the tensor
    with np.errstate(divide="ignore", invalid="ignore"):
        used = np.where(err == 0, 0.0, err / limit)  # (like the tensor) NaN error: NaN, counted infinite
    if judged is not None:
        judged = np.broadcast_to(np.asarray(judged, bool)[..., None] if np.ndim(judged) == ref.ndim - 1 else
                                 np.asarray(judged, bool), ref.shape)
    where, frac = worst_offender(used, judged)
    dt = _budget(dtype).dtype
    if where is None:
        return Verdict(f"close[{name}]", True, None, 0.0, f"{name}: empty (nothing judged)")
    worst, lim = float(err[where]), float(limit[where])
    worst = math.inf if worst != worst else worst
    row = where[:-1] if allowed.ndim == ref.ndim - 1 and ref.ndim else where
    how = "2 x plain error over the tensor (flash-attention's rule)" if rule == "flash" else \
        f"{_budget(dtype).factor:g} x the row's plain {dt} error + floor"
    if frac <= 1:
        return Verdict(f"close[{name}]", True, where, worst,
                       f"{name} ({dt}): worst use of a row's allowance {frac:.2f} (error {worst:.3g} at {where}, "
                       f"allowed {lim:.3g})", lim)
    return Verdict(f"close[{name}]", False, where, worst,
                   f"{name} ({dt}): error {worst:.6g} at {where} (got {act[where]:.6g}, reference {ref[where]:.6g}) "
                   f"exceeds row {row}'s allowance {lim:.3g} = {how} by {worst - lim:.3g} ({frac:.3g} x)", lim)


def check_close(actual, reference, plain, dtype, name: str = "output", reduction_length: int | None = None,
                magnitude: float | None = None, score_size: float = 0.0, rule: str = "attnspec") -> Verdict:
    """Verdict on every entry against `allowed_error` (one allowance for the tensor)."""
    act, ref = _as_f64(actual, "actual"), _as_f64(reference, "reference")
    if act.shape != ref.shape:
        raise ValueError(f"actual {name} has shape {act.shape} but reference has {ref.shape}")
    return _verdict(act, ref, allowed_error(ref, plain, dtype, reduction_length, magnitude, score_size, rule), dtype,
                    name, rule=rule)


def check_forward(actual, q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", rows=None, *,
                  rule="attnspec", **fields) -> Verdict:
    """A backend's forward output against the reference, each row within its own budget;
    ``rows`` (bool (..., Lq)): only those rows are judged.  ``where`` is a full index."""
    allowed, ref, _ = forward_allowed_rows(q, k, v, mask, is_causal, scale, dtype, rule=rule, **fields)
    return _verdict(actual, ref, allowed, dtype, "output", rows, rule)


def check_lse(actual, q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", rows=None, *,
              rule="attnspec", shift=None, **fields) -> Verdict:
    """A backend's log-sum-exp (..., Lq) against the reference, on rows with a visible key (``shift``: see
    `lse_allowed_rows`)."""
    allowed, ref, _ = lse_allowed_rows(q, k, v, mask, is_causal, scale, dtype, rule=rule, shift=shift, **fields)
    act = _as_f64(actual, "actual")
    if act.shape != ref.shape:
        raise ValueError(f"actual lse has shape {act.shape} but the problem's rows are {ref.shape}")
    rows = np.isfinite(ref) if rows is None else np.asarray(rows, bool) & np.isfinite(ref)
    return _verdict(np.where(rows, act, 0.0), np.where(rows, ref, 0.0), allowed, dtype, "lse", rows, rule)


def check_backward(actual, q, k, v, grad_out, mask=None, is_causal=False, scale=None, dtype="float32", *,
                   rule="attnspec", **fields) -> list:
    """One Verdict per gradient (dq, dk, dv, and dbias when both sides have it), rows within their budgets."""
    budgets = backward_allowed_rows(q, k, v, grad_out, mask, is_causal, scale, dtype, rule=rule, **fields)
    if len(actual) not in (3, len(budgets)):
        raise ValueError(f"actual must be (dq, dk, dv) or (dq, dk, dv, dbias); got {len(actual)} arrays")
    # dbias only when both sides have it: a 3-tuple `actual` leaves the budget's fourth unjudged
    return [_verdict(a, r, allowed, dtype, name, rule=rule)
            for a, (allowed, r, _), name in zip(actual, budgets, ("dq", "dk", "dv", "dbias"), strict=False)]
