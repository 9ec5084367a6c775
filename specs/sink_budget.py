"""The error budget of dSink, the gradient of the attention sinks (issue 31).

dSink_h = sum over the batch and the rows i of head h of dS_sink_i = -p_i r_i, with p_i = exp(s_h -
lse_i) the sink's weight and r_i = dY_i . Y_i (FlashAttention's D_i).  A kernel errs, per term, by
(in units of sigma = u + sqrt(n) u_acc, `specs.error_budget`):

    p_i (1 + Th_s + Thbar_i + lse_share |lse_i|) |r_i|      p_i rounded (1), renormalised by every score's
                                                            error (Th_s the sink's, Thbar_i the keys'),
                                                            and exp(s_h - lse) with lse's rounding (flash)
    + p_i sum_c |dY_ic| (|Y_ic| + Phi_ic)                    r_i from an output that errs by Phi_ic
                                                            (`budget_terms.forward_terms`) and its sum
    + tau                                                   the weight's absolute rounding

and the sum over N = batch x Lq terms rounds like any reduction of that length: sigma is taken at
n = max(Lq, Lk, E, Ev, N).  The row rule of `specs.error_budget` then gives head h::

    allowed_h = factor |plain_h - ref_h| + floor_ulps (sigma Phi_h + tiny)

with plain the reference's dSink computed with every step rounded (`specs.plain.Plain`).
"""
from __future__ import annotations

import numpy as np

from attnspec.specs import budget_terms as terms
from attnspec.specs.error_budget import _budget, _reduction, _verdict, check_rule
from attnspec.specs.invariants import Verdict
from attnspec.specs.plain import Plain
from attnspec.specs.problem import Problem, validate
from attnspec.specs.reference import run_dsink, run_forward


def _problem(q, k, v, mask, is_causal, scale, fields) -> Problem:
    p = q if isinstance(q, Problem) else validate(q, k, v, mask, is_causal, scale, **fields)
    if p.sinks is None:
        raise ValueError("sinks: the dSink budget needs a problem with sinks; got none")
    return p


def dsink_terms(p: Problem, grad_out, f=None, tau: float = 0.0, lse_share: float = 0.0) -> np.ndarray:
    """Phi_h (Hq,): each head's dSink terms, summed over its batch elements and rows."""
    f = run_forward(p) if f is None else f
    dy = np.asarray(grad_out, dtype=np.float64)  # (..., Hq, Lq, Ev)
    _, th = terms.pair_terms(p, f)  # (..., Lq, Lk)
    ws, ths = terms.sink_terms(p, f)  # (..., Lq, 1) twice
    thbar = (f.weights * th).sum(axis=-1)  # (..., Lq)
    r = np.abs((dy * f.output).sum(axis=-1))  # (..., Lq) |dY . Y|
    phi_y = terms.forward_terms(p, f, tau, lse_share)  # (..., Lq, Ev) the output's own error
    spread = (np.abs(dy) * (np.abs(f.output) + phi_y)).sum(axis=-1)  # (..., Lq)
    lse = lse_share * np.where(np.isfinite(f.lse), np.abs(f.lse), 0.0)  # (..., Lq)
    p_s, th_s = ws[..., 0], ths[..., 0]  # (..., Lq)
    per_row = p_s * ((1.0 + th_s + thbar + lse) * r + spread) + tau * (p_s > 0)  # (..., Lq)
    per_row = per_row.reshape(-1, *per_row.shape[-2:])  # (batch, Hq, Lq)
    return per_row.sum(axis=(0, 2))  # (Hq,)


def dsink_allowed(q, k=None, v=None, grad_out=None, mask=None, is_causal=False, scale=None, dtype="float32", *,
                  rule="attnspec", **fields) -> tuple:
    """(allowed (Hq,), reference dSink (Hq,), plain dSink (Hq,))."""
    p = _problem(q, k, v, mask, is_causal, scale, fields)
    f = run_forward(p)
    ref = run_dsink(p, grad_out, f=f)  # (Hq,)
    plain = np.asarray(run_dsink(p, grad_out, Plain(dtype)), dtype=np.float64)  # (Hq,)
    b = _budget(dtype)
    lead = int(np.prod(p.batch_shape[:-1], dtype=np.int64)) * p.Lq  # the terms each head's sum adds
    n = max(_reduction(p), lead)
    e = np.abs(plain - ref)
    if not np.isfinite(e).all():
        raise ValueError(f"plain dSink has a non-finite error against the reference: the problem overflows {dtype}")
    if check_rule(rule) == "flash":
        return np.full(ref.shape, b.factor * float(np.max(e, initial=0.0))), ref, plain
    phi = dsink_terms(p, grad_out, f, b.weight_tau(n), b.accumulate_roundoff / b.sigma(n))
    return b.factor * e + b.floor_ulps * (b.sigma(n) * phi + b.tiny(n)), ref, plain


def check_dsink(actual, q, k=None, v=None, grad_out=None, mask=None, is_causal=False, scale=None, dtype="float32", *,
                rule="attnspec", **fields) -> Verdict:
    """A backend's dSink (Hq,) against the reference, each head within its allowance."""
    allowed, ref, _ = dsink_allowed(q, k, v, grad_out, mask, is_causal, scale, dtype, rule=rule, **fields)
    act = np.asarray(actual, dtype=np.float64)
    if act.shape != ref.shape:
        raise ValueError(f"actual dsink has shape {act.shape}; the problem has {ref.shape[0]} query heads")
    return _verdict(act, ref, allowed, dtype, "dsink", rule=rule)
