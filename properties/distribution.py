"""The problems a property draws, named in its decorator: ``@prop(draw=cases(kinds=("causal",)))``.

`cases(...)` is the case distribution as a value (what Hypothesis' ``extra.array_api`` exposes as
``xps.arrays``): `draws.draw_case`'s constraints - mask kinds, scales, size regimes, features every
draw needs or avoids - and, per backend and dtype, the Hypothesis strategy that draws them
(`Cases.strategy`).  A reader sees what a property draws in its decorator; `Cases.but` derives a
neighbour (``S.DRAW.but(kinds=("causal",))``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from hypothesis import strategies as st

from attnspec.properties.draws import MASK_KINDS, REGIMES, SCALES, draw_case

if TYPE_CHECKING:  # annotations only
    from attnspec.properties.target import Target


@dataclass(frozen=True)
class Cases:
    """Constraints on the drawn problems (each as `draws.draw_case` reads it)."""

    kinds: tuple = MASK_KINDS       # mask kinds: none, causal, mask, empty_rows, causal_mask
    allow_empty_rows: bool = True   # rows that see no key may be drawn
    scales: tuple = SCALES          # the scale argument (None: the default 1/sqrt(E))
    regimes: tuple = REGIMES        # size regimes, drawn in turn: small, medium, large
    probe: bool = False             # V = identity (Ev = Lk): the output is the weight matrix
    need: frozenset = field(default_factory=frozenset)   # features every draw uses
    avoid: frozenset = field(default_factory=frozenset)  # features no draw uses

    def but(self, **changes) -> Cases:
        """The same distribution with some constraints changed."""
        return cases(**{**self.kwargs(), **changes})

    def kwargs(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def strategy(self, target: Target, draw_labelled: Callable | None = None):
        """The Hypothesis strategy of these problems for `target` (its dtype, capabilities, limits).
        ``draw_labelled(draw, strategy, label)``: how each inner draw is made (the explorer records labels)."""
        def problem(draw):
            inner = (lambda s, label=None: draw(s)) if draw_labelled is None else (
                lambda s, label=None: draw_labelled(draw, s, label))
            return draw_case(inner, target, **self.kwargs())
        return st.composite(problem)()


def cases(**constraints) -> Cases:
    """The case distribution with these constraints (the others as `Cases` has them); TypeError naming
    an unknown one."""
    names = {f.name for f in dataclasses.fields(Cases)}
    unknown = sorted(set(constraints) - names)
    if unknown:
        raise TypeError(f"cases: unknown constraint(s) {unknown}; known: {', '.join(sorted(names))}")
    for name in ("need", "avoid"):
        if name in constraints:
            constraints[name] = frozenset(constraints[name])
    for name in ("kinds", "scales", "regimes"):
        if name in constraints:
            constraints[name] = tuple(constraints[name])
    return Cases(**constraints)
