"""Family: the output — agreement with the float64 reference, convexity, the scale.

Agreement is judged by the error budget (specs.error_budget): at most 2 x the error of the
plain same-dtype computation, plus a floor.  Rows with no visible key are not judged.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnspec.properties.distribution import cases
from attnspec.properties.draws import SCALES
from attnspec.properties.explore import prop
from attnspec.properties.judge import agreement, output_tolerance, require
from attnspec.specs import invariants

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target


@prop(seeds=True)
def test_matches_reference(target: Target, case: Case, params: dict):
    agreement(target, case)


@prop(draw=cases(scales=(None,)))
def test_default_scale(target: Target, case: Case, params: dict):
    """scale=None means 1/sqrt(E) (seeds 000, 002, 004: not 1/E, not 1)."""
    agreement(target, case)


@prop(draw=cases(scales=tuple(s for s in SCALES if s is not None)))
def test_explicit_scale_honoured(target: Target, case: Case, params: dict):
    """An explicit scale replaces 1/sqrt(E) (PyTorch's and JAX's `scale=` argument)."""
    agreement(target, case)


@prop(seeds=True)
def test_convex_combination(target: Target, case: Case, params: dict):
    """Seed 000: "la salida es una combinación convexa de las filas de V" (within the budget)."""
    out = target.forward(case)  # (B, H, Lq, Ev)
    v = np.repeat(case.dequantized().v, case.group, axis=-3)  # (B, H, Lk, Ev) each query head's values
    require(invariants.convex_combination(out, v, case.visible(), output_tolerance(case, target)))
