"""The seeds' worked examples as Cases: problems every backend must get right, checked first.

Inputs copied from the course notes in shared/seeds/ (the numbers they compute by hand are
checked in specs.worked_examples; here they are simply problems every backend must get right).
A property with ``seeds=True`` runs each that suits the backend before its drawn problems.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnspec.properties.case import seed_case
from attnspec.specs.fp8 import is_fp8

if TYPE_CHECKING:
    from attnspec.properties.target import Target

_K000 = [[1.0, 0.0], [0.0, 1.0], [0.9, 0.1]]  # seed 000: key 0 = Q, key 1 perpendicular, key 2 close
_V000 = [[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]]
_X003 = np.array([[0.50, 0.30, -0.20, 0.10], [-0.10, 0.40, 0.20, -0.30],
                  [0.20, -0.10, 0.50, 0.10], [0.00, 0.00, 0.00, 0.20]])  # seed 003: "I will work ."
# seed 004 prints scores only; as E = 1 problems with scale 1 their scores are exactly these
_S004_D256_UNSCALED = [[-9.7106], [-2.6027], [1.9724], [-15.9423]]  # saturated: weights 8e-06 .. 0.99
_S004_D8_SCALED = [[0.3541], [-0.3729], [2.3033], [0.8469]]

SEED_CASES = (
    seed_case("seed 000: Q=[1,0], output (6.04, 3.95)", [[1.0, 0.0]], _K000, _V000),
    seed_case("seed 000 exercise: Q=[0,1]", [[0.0, 1.0]], _K000, _V000),
    seed_case("seed 000: the three keys as queries, causal", _K000, _K000, _V000, is_causal=True),
    seed_case("seed 003: length 4, Q=K=X/2, V=X, causal", 0.5 * _X003, 0.5 * _X003, _X003, is_causal=True),
    seed_case("seed 004: d=256 unscaled scores (saturated)", [[1.0]], _S004_D256_UNSCALED, np.eye(4), scale=1.0),
    seed_case("seed 004: d=8 scaled scores", [[1.0]], _S004_D8_SCALED, np.eye(4), scale=1.0),
)


def seed_examples(prop, target: Target) -> list:
    """(case rounded to the target's dtype, the property's seed params) for each seed that suits it."""
    probe = prop.constraints(target).probe
    out = []
    for case in SEED_CASES:
        d = case.dims
        ev = d["Lk"] if probe else d["Ev"]  # the probe's V = identity makes Ev = Lk
        if target.equal_head_dims and d["E"] != ev or target.caps.outside(d["E"], ev, d["Lq"], d["Lk"], case.is_causal):
            continue  # outside what the backend declares it takes
        if case.is_causal and not target.caps.causal:
            continue
        params = prop.seed_params(case) if callable(prop.seed_params) else dict(prop.seed_params)
        exact = target.exact(case) if is_fp8(target.dtype) else case.rounded(target.dtype)  # fp8: q in its own dtype
        out.append((exact, params))
    return out
