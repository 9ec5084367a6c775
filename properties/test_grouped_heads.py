"""Family: grouped KV heads (GQA; MQA when Hkv = 1) — query head h reads KV head h // (Hq // Hkv).

Two views of the same problem must agree: the backend's grouped call and its ungrouped call
with K/V repeated per query head (PyTorch's ``repeat_interleave``), within both budgets; the
gradients of K/V are the sums over each group.  Bugs this catches: head h reading KV head
h % Hkv, every head reading KV head 0, dK/dV not summed over the group
(Dao-AILab/flash-attention#2528, pytorch/pytorch#177842).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from attnspec.specs import error_budget
from attnspec.specs.invariants import Verdict
from attnspec.specs.reference import sum_groups

from attnspec.properties.judge import agreement, close_outputs, draw_case, fail_unless, judged_rows, requires
from attnspec.properties.test_gradients import _EXAMPLES, _grad_out


def _repeated(case):
    """The same problem with K/V repeated per query head and no grouping."""
    g = case.dims["H"] // case.dims["Hkv"]
    return case.then(f"k, v = np.repeat(k, {g}, axis=-3), np.repeat(v, {g}, axis=-3)  # one KV head per query head",
                     ).with_fields("grouped heads off", enable_gqa=None)


@given(data=st.data())
def test_grouped_heads_match_repeated_kv(target, data):
    requires(target, "gqa")
    case = draw_case(data, target, need=frozenset({"gqa"}))
    grouped = agreement(target, case, "grouped_heads_match_repeated_kv")  # (B, Hq, Lq, Ev)
    flat = _repeated(case)
    repeated = target.forward(flat)  # (B, Hq, Lq, Ev)
    close_outputs("grouped_heads_match_repeated_kv", target, case, grouped, repeated, flat,
                  "grouped call vs the same call with K/V repeated per query head", checks=(
                      "g = q.shape[-3] // k.shape[-3]",
                      "flat = dict(call_kwargs); flat.pop('enable_gqa')",
                      f"out2 = backend.forward(q, np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3), "
                      f"dtype={target.dtype!r}, **flat)",
                      "print(np.abs(out - out2).max())  # query head h must read KV head h // g"))


@pytest.mark.needs_gradients
@_EXAMPLES
@given(data=st.data())
def test_grouped_heads_gradients_are_group_sums(target, data):
    requires(target, "gqa")
    # medium first: seeded normal values in every head (small draws favour zeros, and a query
    # head of zeros adds nothing to dK - a group sum that drops it looks right)
    case = draw_case(data, target, need=frozenset({"gqa"}), allow_empty_rows=False,
                     regimes=("medium", "small", "medium"))
    assume(judged_rows(case).all())
    g, line = _grad_out(data, case, target.dtype)
    got = target.backward(case, g, grad_line=line)  # (dq, dk (B, Hkv, Lk, E), dv, [dbias])
    verdicts = error_budget.check_backward(got, case.problem, None, None, g, dtype=target.budget_dtype)
    for name, verdict in zip(("dq", "dk", "dv", "dbias"), verdicts):
        fail_unless(verdict, "grouped_heads_gradients_are_group_sums", target, case, call="backward",
                    grad_line=line, checks=(f"print(np.abs({name} - ref_{name}).max())  "
                                            "# dK, dV: summed over each group of query heads",))
    flat = _repeated(case)
    flat_grads = target.backward(flat, g, grad_line=line)  # dk, dv per query head
    group = case.dims["H"] // case.dims["Hkv"]
    budgets = error_budget.backward_allowed(case.problem, None, None, g, dtype=target.budget_dtype)
    for i, name in ((1, "dk"), (2, "dv")):
        summed = sum_groups(np.asarray(flat_grads[i]), group)  # (B, Hkv, Lk, .)
        err = float(np.max(np.abs(summed - got[i]), initial=0.0))
        allowed = 2 * budgets[i][0] * group  # each of `group` terms within its budget, and the sum within its own
        verdict = Verdict("grouped_heads_gradients_are_group_sums", err <= allowed, None, err,
                          f"{name} of the grouped call differs from the group sum of the repeated call's {name} "
                          f"by {err:.6g} (allowed {allowed:.3g})")
        fail_unless(verdict, "grouped_heads_gradients_are_group_sums", target, case, call="backward",
                    grad_line=line, checks=(f"print({name})  # must equal the group sums of the repeated call's",))
