"""Verdicts shared by the property families: agreement with the reference, two outputs alike, exact zeros.

A property's check calls `require(verdict)`: a verdict that does not hold raises `Failed`,
which the suite turns into a failure with the shrunk problem and a reproducer, and which a
reproducer prints.  Every tolerance comes from the error budget (`specs.error_budget`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnspec.specs import error_budget, reference
from attnspec.specs.invariants import Verdict, shown  # shown: the amount as messages print it

if TYPE_CHECKING:  # annotations only: target.py imports this module
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target


class Failed(AssertionError):
    """A property's verdict did not hold (an AssertionError, so Hypothesis shrinks it)."""

    def __init__(self, verdict: Verdict):
        super().__init__(verdict.message)
        self.verdict = verdict


def require(verdict: Verdict) -> None:
    if not verdict:
        raise Failed(verdict)


def verdict(name: str, holds: bool, where, amount: float, message: str, limit: float | None = None) -> Verdict:
    return Verdict(name, bool(holds), where, float(amount), message, limit)


def with_full_index(v: Verdict, rows: np.ndarray) -> Verdict:
    """A verdict over the judged rows (rows[sel] flattened) re-indexed into the full tensor."""
    import dataclasses
    if v or v.where is None or len(v.where) != 2:  # (judged row, column); else already full
        return v
    full = tuple(int(i) for i in np.argwhere(rows)[v.where[0]]) + tuple(v.where[1:])
    return dataclasses.replace(v, where=full, message=v.message.replace(str(v.where), str(full)))


def worst(deviation: np.ndarray, judged: np.ndarray) -> tuple:
    """(where, amount) of the largest deviation over judged entries; NaN counts as infinite."""
    dev = np.where(judged, deviation, 0.0)
    dev = np.where(np.isnan(dev), np.inf, dev)
    if dev.size == 0:
        return None, 0.0
    where = tuple(int(i) for i in np.unravel_index(int(np.argmax(dev)), dev.shape))
    return where, float(dev[where])


def rule_of(target: Target) -> str:
    return target.rule


def agreement(target: Target, case: Case, call=None):
    """The backend's output within the error budget of the reference, on the judged rows."""
    out = target.forward(case) if call is None else call  # (B, H, Lq, Ev)
    rows = case.judged_rows()  # (B, H, Lq)
    v = error_budget.check_forward(out, case.problem, dtype=target.budget_dtype, rows=rows, rule=rule_of(target))
    require(with_full_index(v, rows))
    return out


def output_tolerance(case: Case, target: Target) -> float:
    """The error budget of this problem's output over the judged rows (specs.error_budget)."""
    return error_budget.forward_allowed(case.problem, dtype=target.budget_dtype, rows=case.judged_rows(),
                                        rule=rule_of(target))[0]


def close_outputs(name: str, target: Target, case: Case, a, b, other, what: str) -> None:
    """Two outputs of problems with the same reference: each within its budget, so 2 x budget apart at most."""
    rows = case.judged_rows() & other.judged_rows()  # (B, H, Lq)
    atol = output_tolerance(case, target) + output_tolerance(other, target)
    where, amount = worst(diff := np.abs(a - b), np.broadcast_to(rows[..., None], np.shape(a)))
    require(verdict(name, amount <= atol, where, amount,
                    f"{what}: output at {where} (batch, head, query, column) differs by {shown(diff, where, amount)} "
                    f"(allowed {atol:.3g}: both budgets)", atol))


def lse_tolerance(case: Case, target: Target) -> np.ndarray:
    """The LSE's error budget per row (B, H, Lq) (specs.error_budget); with sinks, the wider of the LSE with the
    sink and the one over the real keys from a running maximum started at the sink (`lse_with_sinks`: either)."""
    rule = rule_of(target)
    allowed = error_budget.lse_allowed_rows(case.problem, dtype=target.budget_dtype, rule=rule)[0]  # (B, H, Lq)
    sinks = case.fields.get("sinks")
    if sinks is None:
        return allowed
    shift = np.asarray(sinks, dtype=np.float64)[:, None]  # (Hq, 1) against (B, Hq, Lq)
    real = error_budget.lse_allowed_rows(case.without("sinks").problem, dtype=target.budget_dtype, rule=rule,
                                         shift=shift)[0]  # (B, H, Lq)
    return np.maximum(allowed, real)


def close_lses(name: str, target: Target, case: Case, a, b, what: str) -> None:
    """Two LSEs (B, H, Lq) of one problem (another layout, another knob setting), on the rows that see a key:
    each within the row's budget, so twice it apart at most."""
    rows = case.judged_rows()  # (B, H, Lq)
    atol = 2 * lse_tolerance(case, target)  # (B, H, Lq)
    diff = np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))  # (B, H, Lq)
    with np.errstate(invalid="ignore", divide="ignore"):
        over = np.where(diff <= atol, 0.0, np.where(atol > 0, diff / atol, np.inf))  # (B, H, Lq) > 1: past it
    where, amount = worst(np.where(np.isnan(diff), np.inf, over), rows)
    require(verdict(name, amount == 0.0, where if amount else None, float(diff[where]) if amount else 0.0,
                    f"{what}: the LSE at {where} (batch, head, query) differs by {shown(diff, where, amount)} "
                    f"(allowed {atol[where] if amount else 0.0:.3g}: both budgets)",
                    float(atol[where]) if amount else None))


def unchanged(name: str, before, after, rows, what: str) -> None:
    """Rows that must not change at all: bit for bit (the same program on the same numbers)."""
    where, amount = worst(diff := np.abs(after - before), np.broadcast_to(rows[..., None], np.shape(before)))
    require(verdict(name, amount == 0.0, where if amount else None, amount,
                    f"{what}: output at {where} (batch, head, query, column) changed by {shown(diff, where, amount)}; "
                    "it must not change at all", 0.0))


def zero_weights(name: str, weights, hidden, what: str) -> None:
    """Hidden pairs get exactly zero weight (V = identity: the output is the weights)."""
    where, amount = worst(np.abs(weights), hidden)
    require(verdict(name, amount == 0.0, where if amount else None, amount,
                    f"{what}: weight {shown(weights, where, amount)} on the hidden pair {where} (batch, head, query, key); "
                    "must be exactly 0", 0.0))


def expected(case: Case):
    """reference.Forward of the case (every field counted)."""
    return reference.forward(case.problem)


def plain_output(case: Case, target: Target) -> np.ndarray:
    return error_budget.plain_forward(case.problem, dtype=target.budget_dtype)


def reduction_length(case: Case) -> int:
    p = case.problem
    return int(max(p.Lq, p.Lk, p.E, p.Ev, 1))


def score_size(case: Case) -> float:
    return error_budget.score_size(case.problem)


def grad_out(case: Case, dtype: str, seed: int) -> np.ndarray:
    """dY for the case's output, exact in dtype like the inputs (seeded: a reproducer remakes it)."""
    raw = np.random.default_rng(seed).standard_normal(case.q.shape[:-1] + case.v.shape[-1:])  # (B, H, Lq, Ev)
    if dtype in ("float16", "bfloat16"):
        return np.round(raw * 8) / 8
    return raw.astype(np.float32).astype(np.float64) if dtype == "float32" else raw


def check_gradients(name: str, target: Target, case: Case, g, knobs: dict | None = None) -> tuple:
    """dQ, dK, dV (and dBias) of the backend (at a setting of its knobs) within their budgets; returns the
    backend's gradients."""
    got = target.backward(case, g, knobs=knobs)  # (dq, dk, dv[, dbias])
    verdicts = error_budget.check_backward(got, case.problem, None, None, g, dtype=target.budget_dtype,
                                           rule=rule_of(target))
    for grad, v in zip(("dq", "dk", "dv", "dbias"), verdicts, strict=False):
        if not v:
            require(Verdict(name, False, v.where, v.amount, f"{grad}: {v.message}", v.limit))
    return got
