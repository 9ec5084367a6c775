"""Family: gradients — dQ, dK, dV against the reference, and the seeds' scaling law.

Seed 003: "el /sqrt(d_k) sobrevive al backward — aparece en dL/dQ y dL/dK".  Problems here
have no fully masked row (every row sees key 0): such a row's gradient is the
implementation's choice, and a NaN there would spread into dK and dV through the sums.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from attnspec.specs import error_budget
from attnspec.specs.invariants import gradient_scaling

from attnspec.properties.judge import draw_case, fail_unless, judged_rows
from attnspec.properties.reuse import integers, sampled
from attnspec.properties.seeds import with_seed_examples
from attnspec.properties.strategies import LOW_PRECISION, Case

pytestmark = pytest.mark.needs_gradients


def _grad_out(data, case: Case, dtype: str):
    """dY as (array, the NumPy line that makes it): exact in dtype, like the inputs."""
    seed = 0 if isinstance(data, Case) else data.draw(integers(0, 2**31 - 1), label="grad_out seed")
    shape = case.q.shape[:-1] + case.v.shape[-1:]
    raw = f"np.random.default_rng({seed}).standard_normal({shape})"
    expr = f"np.round({raw} * 8) / 8" if dtype in LOW_PRECISION else (
        f"{raw}.astype(np.float32).astype(np.float64)" if dtype == "float32" else raw)
    line = f"grad_out = {expr}"
    env = {"np": np}
    exec(line, env)  # noqa: S102 - our own generated statement
    return env["grad_out"], line


# the backward costs ~3 forwards here (reference and plain too): half the examples, and
# lengths to 65 (block edges 16, 32, 64 +-1); HYPOTHESIS_PROFILE=thorough draws more
_EXAMPLES = settings(max_examples=max(3, settings.default.max_examples // 2))


def _case(data, target) -> Case:
    case = draw_case(data, target, allow_empty_rows=False, regimes=("small", "small", "medium"))
    assume(judged_rows(case).all())  # bottom-right causal with Lq > Lk, lengths, windows: whole rows hidden
    return case


@with_seed_examples
@_EXAMPLES
@given(data=st.data())
def test_gradients_match_reference(target, data):
    case = _case(data, target)
    g, line = _grad_out(data, case, target.dtype)
    got = target.backward(case, g, grad_line=line)  # (dq, dk, dv[, dbias])
    verdicts = error_budget.check_backward(got, case.problem, None, None, g, dtype=target.budget_dtype)
    for name, verdict in zip(("dq", "dk", "dv", "dbias"), verdicts):
        fail_unless(verdict, "gradients_match_reference", target, case, call="backward", grad_line=line,
                    checks=(f"print(np.abs({name} - ref_{name}).max())",))


@with_seed_examples
@_EXAMPLES
@given(data=st.data())
def test_gradient_scaling_law(target, data):
    """Gradients at (q/c, k/c, scale*c^2) are (c dQ, c dK, dV) at (q, k, scale): same scores, dQ = dS K scale."""
    case = _case(data, target)
    j = 1 if isinstance(data, Case) or target.compiled else data.draw(sampled((1, -1, 2)), label="log2 c")
    c = 2.0**j  # a power of two: q/c, k/c and scale*c^2 are exact
    g, line = _grad_out(data, case, target.dtype)
    scale = case.scale if case.scale is not None else 1.0 / math.sqrt(case.dims["E"])
    base = dataclasses.replace(case, scale=scale, code=case.code + (f"scale = {scale!r}",))
    moved = base.then(f"q, k = q / {c!r}, k / {c!r}  # c = {c!r}; scale -> scale * c**2")
    moved = dataclasses.replace(moved, scale=scale * c * c)
    grads = target.backward(base, g, grad_line=line)[:3]  # (dq, dk, dv) at (q, k, scale)
    scaled = target.backward(moved, g, grad_line=line)[:3]  # at (q/c, k/c, scale c^2)
    budgets = error_budget.backward_allowed(base.problem, None, None, g, dtype=target.budget_dtype)
    # each side is within its budget and the moved problem's budget is c times this one's for dQ
    # and dK (same scores; they, their plain errors and magnitudes all scale by c): (c + c) x
    # budget; dV does not scale at all (same weights), so its two budgets are equal: 2 x budget
    tol = tuple(2 * m * budgets[i][0] for i, m in enumerate((c, c, 1.0)))
    verdict = gradient_scaling(grads, scaled, c, atol=tol)
    fail_unless(verdict, "gradient_scaling_law", target, base, call="backward", grad_line=line, checks=(
        f"dq2, dk2, dv2 = backend.backward(q / {c!r}, k / {c!r}, v, grad_out, mask, is_causal=is_causal, "
        f"scale=scale * {c * c!r}, dtype={target.dtype!r}, **fields)[:3]",
        f"print(np.abs(dq2 - {c!r} * dq).max(), np.abs(dk2 - {c!r} * dk).max(), np.abs(dv2 - dv).max())"))
