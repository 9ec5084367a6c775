"""Family: ALiBi — a bias -slope_h * |i + o - j| with the standard slopes (or one tensor-parallel rank's
slice of a larger model's: a kernel must read the slopes it is given), and its native parameter.

The standard slopes (`specs.masks.alibi_slopes`) for a head count that is not a power of two
interpolate between two powers of two; using 2^(-8 h / H) instead is a common bug
(ml-explore/mlx#343, #3071).  A backend taking slopes natively must equal the explicit bias.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from attnspec.properties.distribution import cases
from attnspec.properties.explore import prop
from attnspec.properties.judge import agreement, close_outputs
from attnspec.specs.masks import alibi_bias

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target

_SMALL = ("small", "medium")


@prop(requires=("alibi",), draw=cases(regimes=_SMALL))
def test_alibi_matches_reference(target: Target, case: Case, params: dict):
    """Native ALiBi slopes, the head counts drawn including 3 and 6 (not powers of two)."""
    agreement(target, case)


@prop(requires=("alibi", "bias"), draw=cases(avoid=frozenset({"bias"}), regimes=_SMALL))
def test_alibi_equals_explicit_bias(target: Target, case: Case, params: dict):
    """The backend's native slopes and the same ALiBi as an explicit bias give the same output."""
    d = case.dims
    explicit = case.replace(bias=alibi_bias(case.fields["alibi_slopes"], d["Lq"], d["Lk"], case.alignment),
                            alibi_slopes=None)
    close_outputs("alibi_equals_explicit_bias", target, case, target.forward(case), target.forward(explicit), explicit,
                  "native ALiBi slopes vs the same ALiBi as a bias")
