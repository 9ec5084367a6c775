"""Family: grouped KV heads (GQA; MQA when Hkv = 1) — query head h reads KV head h // (Hq // Hkv).

Two views of the same problem must agree: the backend's grouped call and its ungrouped call
with K/V repeated per query head (PyTorch's ``repeat_interleave``), within both budgets; the
gradients of K/V are the sums over each group.  Bugs this catches: head h reading KV head
h % Hkv, every head reading KV head 0, dK/dV not summed over the group
(Dao-AILab/flash-attention#2528, pytorch/pytorch#177842).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnspec.properties.distribution import cases
from attnspec.properties.explore import prop
from attnspec.properties.judge import agreement, check_gradients, close_outputs, grad_out, require, rule_of, verdict
from attnspec.properties.test_gradients import grad_seed, whole_rows
from attnspec.specs import error_budget
from attnspec.specs.reference import sum_groups

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target


@prop(requires=("gqa",))
def test_grouped_heads_match_repeated_kv(target: Target, case: Case, params: dict):
    grouped = agreement(target, case)  # (B, Hq, Lq, Ev)
    flat = case.repeated_kv()
    close_outputs("grouped_heads_match_repeated_kv", target, case, grouped, target.forward(flat), flat,
                  "grouped call vs the same call with K/V repeated per query head (query head h must read KV "
                  "head h // group)")


# medium first: seeded normal values in every head (small draws favour zeros, and a query head of
# zeros adds nothing to dK - a group sum that drops it looks right)
@prop(requires=("gqa",), gradients=True, draw=cases(allow_empty_rows=False, regimes=("medium", "small", "medium")),
      keep=whole_rows, params=grad_seed)
def test_grouped_heads_gradients_are_group_sums(target: Target, case: Case, params: dict):
    name = "grouped_heads_gradients_are_group_sums"
    g = grad_out(case, target.dtype, params["grad_seed"])
    got = check_gradients(name, target, case, g)  # (dq, dk (B, Hkv, Lk, E), dv, [dbias])
    flat_grads = target.backward(case.repeated_kv(), g)  # dk, dv per query head
    budgets = error_budget.backward_allowed(case.problem, None, None, g, dtype=target.budget_dtype,
                                            rule=rule_of(target))
    for i, grad in ((1, "dk"), (2, "dv")):
        summed = sum_groups(np.asarray(flat_grads[i]), case.group)  # (B, Hkv, Lk, .)
        err = float(np.max(np.abs(summed - got[i]), initial=0.0))
        allowed = 2 * budgets[i][0] * case.group  # each of `group` terms within its budget, and the sum within its own
        require(verdict(name, err <= allowed, None, err, f"{grad} of the grouped call differs from the group sum of "
                        f"the repeated call's {grad} by {err:.6g} (allowed {allowed:.3g})", allowed))
