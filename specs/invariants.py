"""What every correct attention must satisfy, as pure functions over arrays.

Each check returns a `Verdict`: truthy when the property holds; otherwise ``where``
is the index of the worst offender, ``(batch..., row, col)``, and ``amount`` how far
off it is.  Tolerances (``atol``) are one number or an array broadcastable to what is
judged - per-row budgets (`specs.error_budget.forward_allowed_rows`) as ``allowed[..., None]``.
``amount`` is reported even when the property holds (the worst measured deviation), so callers
can see the margin.  Rows with no visible key are never judged:
the spec leaves them to implementations (seed 000's three properties, and seed 003's
"la máscara causal pone a cero las contribuciones futuras", are about real rows).

The statistical functions reproduce the seeds' claims: Var(q.k) = d*sigma^4 for iid
inputs (seeds 002, 004) and softmax saturation without the 1/sqrt(d) (seed 004).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attnspec.specs.problem import causal_mask


@dataclass(frozen=True)
class Verdict:
    name: str
    holds: bool
    where: tuple | None  # index of the worst offender, None when there is none
    amount: float        # worst measured deviation, <= the tolerance when it holds (0: nothing judged)
    message: str
    limit: float | None = None  # the tolerance at `where` (amount / limit: the used fraction)

    def __bool__(self) -> bool:
        return bool(self.holds)

    @property
    def used(self) -> float:
        """amount / limit: the fraction of the tolerance the worst offender uses (> 1: violated)."""
        if self.limit is None or self.where is None:
            return 0.0 if self.holds else float("inf")
        if self.limit > 0:
            return self.amount / self.limit
        return 0.0 if self.amount <= 0 else float("inf")


def _idx(flat: int, shape: tuple) -> tuple:
    return tuple(int(i) for i in np.unravel_index(int(flat), shape))


def worst_offender(deviation, judged=None) -> tuple:
    """(where, amount): the index and value of the largest deviation among judged entries.

    NaN counts as an infinite deviation (nothing is more wrong); ``judged`` (bool, broadcast
    to the deviation) leaves the others out.  ``(None, 0.0)`` when nothing is judged.
    """
    dev = np.asarray(deviation, dtype=np.float64)
    dev = np.where(np.isnan(dev), np.inf, dev)
    if judged is not None:
        judged = np.broadcast_to(np.asarray(judged, dtype=bool), dev.shape)
        if not judged.any():
            return None, 0.0
        dev = np.where(judged, dev, -np.inf)
    if dev.size == 0:
        return None, 0.0
    flat = int(np.argmax(dev))
    return _idx(flat, dev.shape), float(dev.flat[flat])


def shown(deviation, where, amount: float, spec: str = ".6g") -> str:
    """The amount as a message prints it: "nan" where the worst entry is NaN (`worst_offender` counts
    it as infinite, to find and fail it; the message says what the output held, and a declared NaN
    deviation matches those words: backends.declarations.NAN_IN_OUTPUT)."""
    if where is not None and np.isnan(np.asarray(deviation, dtype=np.float64)[where]):
        return "nan"
    return format(amount, spec)


def _verdict(name: str, deviation: np.ndarray, judged: np.ndarray, atol, what: str) -> Verdict:
    """Worst deviation over judged entries; NaN counts as an infinite deviation.

    ``atol``: one tolerance, or an array broadcastable to the deviation (per-row budgets,
    e.g. ``allowed[..., None]``); the worst offender is then the entry furthest past its own.
    """
    tol = np.asarray(atol, dtype=np.float64)
    if tol.ndim == 0:
        where, worst = worst_offender(deviation, judged)
        limit = float(tol)
    else:
        dev = np.asarray(deviation, dtype=np.float64)
        tol = np.broadcast_to(tol, dev.shape)
        with np.errstate(invalid="ignore"):
            where, _ = worst_offender(dev - tol, judged)  # inf - inf (NaN) counts as infinite
        worst = None if where is None else float(dev[where])
        worst = np.inf if worst is not None and worst != worst else worst
        limit = None if where is None else float(tol[where])
    if where is None:
        return Verdict(name, True, None, 0.0, f"{name}: nothing to judge (no visible rows)")
    holds = bool(worst <= limit)
    msg = (f"{name}: holds (worst {what} {worst:.3g} at {where}, tolerance {limit:.3g})" if holds
           else f"{name}: violated at {where}: {what} {shown(deviation, where, worst)} exceeds tolerance {limit:.3g}")
    return Verdict(name, holds, where, worst, msg, limit)


def _vis(weights: np.ndarray, visible) -> np.ndarray:
    if visible is None:
        return np.ones(np.shape(weights), dtype=bool)  # (..., Lq, Lk)
    return np.broadcast_to(np.asarray(visible, dtype=bool), np.shape(weights))  # (..., Lq, Lk)


def weights_nonnegative(weights, visible=None) -> Verdict:
    """Every weight of a judged row is >= 0 (exactly: exp never yields a negative)."""
    w = np.asarray(weights, dtype=np.float64)  # (..., Lq, Lk)
    vis = _vis(w, visible)
    judged = np.broadcast_to(vis.any(axis=-1, keepdims=True), w.shape)  # (..., Lq, Lk)
    return _verdict("weights_nonnegative", -w, judged, 0.0, "a weight is negative by")


def rows_sum_to_one(weights, visible=None, atol=1e-12) -> Verdict:
    """Each judged row sums to 1 within atol (the whole row: mass on masked keys counts)."""
    w = np.asarray(weights, dtype=np.float64)  # (..., Lq, Lk)
    vis = _vis(w, visible)
    dev = np.abs(w.sum(axis=-1) - 1.0)  # (..., Lq)
    return _verdict("rows_sum_to_one", dev, vis.any(axis=-1), atol, "a row sum is off 1 by")


def order_preserved(scores, weights, visible=None, atol=0.0) -> Verdict:
    """Among visible keys of a row, a strictly higher score never gets a lower weight.

    The deviation of key j is max over visible keys i with s_i < s_j of (w_i - w_j);
    ``where`` names key j (the higher-scored one).  O(Lk log Lk) per row via sorting.
    """
    s = np.asarray(scores, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    s, w = np.broadcast_arrays(s, w)  # (..., Lq, Lk)
    vis = _vis(w, visible)
    order = np.argsort(np.where(vis, s, -np.inf), axis=-1, kind="stable")  # (..., Lq, Lk)
    s_sorted = np.take_along_axis(np.where(vis, s, -np.inf), order, axis=-1)  # (..., Lq, Lk)
    w_low = np.take_along_axis(np.where(vis, w, -np.inf), order, axis=-1)  # as the lower-scored key
    w_high = np.take_along_axis(np.where(vis, w, np.inf), order, axis=-1)  # as the higher-scored key
    Lk = s.shape[-1]
    pos = np.broadcast_to(np.arange(Lk), s.shape)  # (..., Lq, Lk)
    new_group = np.ones(s.shape, dtype=bool)  # (..., Lq, Lk) first entry of each run of equal scores
    new_group[..., 1:] = s_sorted[..., 1:] != s_sorted[..., :-1]
    group_start = np.maximum.accumulate(np.where(new_group, pos, 0), axis=-1)  # (..., Lq, Lk)
    run_max = np.maximum.accumulate(w_low, axis=-1)  # (..., Lq, Lk) max weight up to here
    prev = np.concatenate([np.full(s.shape[:-1] + (1,), -np.inf), run_max[..., :-1]], axis=-1)
    lower_max = np.take_along_axis(prev, group_start, axis=-1)  # (..., Lq, Lk) over strictly lower scores
    with np.errstate(invalid="ignore"):
        dev_sorted = lower_max - w_high  # (..., Lq, Lk)
    # inf - inf (infinite weights) counts as infinite; a NaN weight stays NaN (counted so, printed nan)
    nan_weight = np.isnan(lower_max) | np.isnan(w_high)  # (..., Lq, Lk)
    dev_sorted = np.where(np.isnan(dev_sorted) & np.isfinite(s_sorted) & ~nan_weight, np.inf, dev_sorted)
    dev = np.empty_like(dev_sorted)
    np.put_along_axis(dev, order, dev_sorted, axis=-1)  # back to key order
    judged = vis & np.broadcast_to(vis.any(axis=-1, keepdims=True), vis.shape)
    return _verdict("order_preserved", dev, judged, atol, "a lower score has more weight by")


def convex_combination(output, value, visible=None, atol=0.0) -> Verdict:
    """Each output entry lies within [min, max] of its column over the visible V rows."""
    out = np.asarray(output, dtype=np.float64)  # (..., Lq, Ev)
    v = np.asarray(value, dtype=np.float64)  # (..., Lk, Ev)
    Lq, Lk = out.shape[-2], v.shape[-2]
    vis = np.ones((Lq, Lk), dtype=bool) if visible is None else np.asarray(visible, dtype=bool)
    batch = np.broadcast_shapes(out.shape[:-2], v.shape[:-2], vis.shape[:-2])
    out = np.broadcast_to(out, batch + out.shape[-2:])  # (B..., Lq, Ev)
    v = np.broadcast_to(v, batch + v.shape[-2:])  # (B..., Lk, Ev)
    vis = np.broadcast_to(vis, batch + (Lq, Lk))  # (B..., Lq, Lk)
    lo = np.empty(out.shape)  # (B..., Lq, Ev)
    hi = np.empty(out.shape)  # (B..., Lq, Ev)
    step = max(1, 2_000_000 // max(1, Lk * v.shape[-1] * max(1, math.prod(batch))))  # bound memory
    for r in range(0, Lq, step):
        m = vis[..., r:r + step, :, None]  # (B..., rows, Lk, 1)
        vv = v[..., None, :, :]  # (B..., 1, Lk, Ev)
        lo[..., r:r + step, :] = np.where(m, vv, np.inf).min(axis=-2)  # (B..., rows, Ev)
        hi[..., r:r + step, :] = np.where(m, vv, -np.inf).max(axis=-2)  # (B..., rows, Ev)
    with np.errstate(invalid="ignore"):
        dev = np.maximum(lo - out, out - hi)  # (B..., Lq, Ev)
    judged = np.broadcast_to(vis.any(axis=-1)[..., None], out.shape)  # (B..., Lq, Ev)
    return _verdict("convex_combination", dev, judged, atol, "outside the visible V range by")


def zero_future_mass(weights, alignment: str = "top_left", offsets=None) -> Verdict:
    """Weights on keys the causal mask hides are exactly zero (not merely small).

    ``offsets``: per-sequence diagonal offsets (lead...,) (`specs.masks.sequence_offsets`, a problem's
    ``offsets``) when positions are per sequence: each sequence's future is measured from its own."""
    w = np.asarray(weights, dtype=np.float64)  # (..., Lq, Lk)
    seen = causal_mask(w.shape[-2], w.shape[-1], alignment, offsets)  # (Lq, Lk) or (lead..., 1, Lq, Lk)
    judged = np.broadcast_to(~seen & seen.any(axis=-1, keepdims=True), w.shape)  # (..., Lq, Lk)
    return _verdict(f"zero_future_mass[{alignment}]", np.abs(w), judged, 0.0, "a future key has weight")


def gradient_scaling(grads, grads_scaled, factor: float, atol, rtol: float = 0.0) -> Verdict:
    """Gradients at (q/c, k/c, scale*c^2) equal (c*dQ, c*dK, dV) of those at (q, k, scale).

    The scores are unchanged, so dS is unchanged; dQ = dS K scale picks up c^2/c = c.
    An entry fails when |got - expected| > atol + rtol*|expected|; ``atol`` is one number or
    one per gradient (dq, dk, dv), each a number or an array broadcastable to its gradient
    (e.g. per-row budgets ``allowed[..., None]``).  ``where`` starts with the gradient's name,
    ("dq", batch..., row, col); the worst offender is the entry furthest past its tolerance,
    and ``amount`` is that entry's error (NaN counts as infinite).
    """
    c = float(factor)
    atols = tuple(atol) if isinstance(atol, (tuple, list)) else (atol,) * 3
    if len(atols) != 3:
        raise ValueError(f"atol must be one tolerance or three (dq, dk, dv); got {len(atols)}")
    worst = (-np.inf, None, 0.0, 0.0)  # (excess over tolerance, where, |error| (NaN kept), tolerance)
    for name, g, gs, mult, tol in zip(("dq", "dk", "dv"), grads, grads_scaled, (c, c, 1.0), atols, strict=True):
        expected = mult * np.asarray(g, dtype=np.float64)
        got = np.asarray(gs, dtype=np.float64)
        if expected.shape != got.shape:
            raise ValueError(f"grads_scaled[{name}] has shape {got.shape} but grads[{name}] has {expected.shape}")
        if got.size == 0:
            continue
        err = np.abs(got - expected)  # like the gradient
        bound = np.broadcast_to(np.asarray(tol, dtype=np.float64) + rtol * np.abs(expected), err.shape)
        where, excess = worst_offender(err - bound)
        if excess > worst[0]:
            worst = (excess, (name,) + where, float(err[where]), float(bound[where]))
    excess, where, error, tol = worst
    err = np.inf if np.isnan(error) else error  # counted as infinite, printed nan
    holds = bool(excess <= 0)
    msg = (f"gradient_scaling(c={c:g}): holds (worst |error| {err:.3g} at {where})" if holds else
           f"gradient_scaling(c={c:g}): {where[0]} at {where[1:]} is off from its expected value "
           f"by {shown(error, (), err)} (tolerance there {tol:.3g}); dQ and dK must scale by c, dV not at all")
    return Verdict("gradient_scaling", holds, where, err, msg, tol if where is not None else None)


# ---- the seeds' statistical claims -------------------------------------------------

@dataclass(frozen=True)
class VarianceCheck:
    d: int
    sigma: float
    n: int
    empirical: float       # sample variance of n draws of q.k
    mean: float            # sample mean of the same draws (E[q.k] = 0)
    predicted: float       # d * sigma^4
    standard_error: float  # of the sample variance under the model

    @property
    def z(self) -> float:
        return (self.empirical - self.predicted) / self.standard_error


def dot_product_variance(d: int, sigma: float = 1.0, n: int = 100_000, seed: int = 0) -> VarianceCheck:
    """Empirical Var(q.k) for q, k iid N(0, sigma^2) in d dims, against d*sigma^4.

    Each product q_i k_i has variance sigma^4 and kurtosis 9, so the sum of d of them has
    kurtosis 3 + 6/d and the sample variance a standard error of
    d*sigma^4*sqrt((2 + 6/d)/n).
    """
    if d < 1 or n < 2 or not sigma > 0:
        raise ValueError(f"need d >= 1, n >= 2, sigma > 0; got d={d}, n={n}, sigma={sigma}")
    rng = np.random.default_rng(seed)
    q = rng.normal(0.0, sigma, size=(n, d))  # (n, d)
    k = rng.normal(0.0, sigma, size=(n, d))  # (n, d)
    dots = np.einsum("nd,nd->n", q, k)  # (n,)
    predicted = d * sigma**4
    return VarianceCheck(d, sigma, n, float(dots.var()), float(dots.mean()), predicted,
                         predicted * math.sqrt((2.0 + 6.0 / d) / n))


@dataclass(frozen=True)
class Saturation:
    weights: np.ndarray        # (..., L)
    entropy_bits: np.ndarray   # (...,)
    max_weight: np.ndarray     # (...,)


def softmax_saturation(scores) -> Saturation:
    """Softmax of the last axis, its entropy in bits and its largest weight (seed 004)."""
    s = np.asarray(scores, dtype=np.float64)  # (..., L)
    e = np.exp(s - s.max(axis=-1, keepdims=True))  # (..., L)
    w = e / e.sum(axis=-1, keepdims=True)  # (..., L)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(w > 0, -w * np.log2(w), 0.0)  # (..., L) 0 log 0 = 0
    return Saturation(w, terms.sum(axis=-1), w.max(axis=-1))


@dataclass(frozen=True)
class SaturationStudy:
    d: int
    n_keys: int
    trials: int
    unscaled_entropy_bits: float   # mean over trials
    unscaled_max_weight: float
    scaled_entropy_bits: float
    scaled_max_weight: float
    max_entropy_bits: float        # log2(n_keys): the uniform distribution


def saturation_study(d: int, seed: int = 0, n_keys: int = 4, trials: int = 2000) -> SaturationStudy:
    """Seed 004's comparison, averaged over trials: q, k ~ N(0, 1) in d dims, scores q.k
    with and without the 1/sqrt(d)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((trials, 1, d))  # (T, 1, d)
    k = rng.standard_normal((trials, n_keys, d))  # (T, n, d)
    s = (q @ np.swapaxes(k, -1, -2))[:, 0, :]  # (T, n)
    raw, scaled = softmax_saturation(s), softmax_saturation(s / math.sqrt(d))
    return SaturationStudy(d, n_keys, trials, float(raw.entropy_bits.mean()), float(raw.max_weight.mean()),
                           float(scaled.entropy_bits.mean()), float(scaled.max_weight.mean()),
                           math.log2(n_keys))
