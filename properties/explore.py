"""Properties: a check of one problem, explored by Hypothesis for each backend and dtype.

A family module (``properties/test_<family>.py``) writes each property as a check of one case::

    @prop(seeds=True)
    def test_matches_reference(target, case, params):
        agreement(target, case)

`prop` makes it the pytest test ``test_matches_reference(target, attnspec_run)``: the plugin
parametrizes ``target`` (a backend at a dtype), and `explore` draws cases (the property's ``draw``:
a `distribution.Cases`, ``@prop(draw=cases(kinds=("causal",)))``), the property's own parameters (``params``: a
permutation, a split point), runs the check, and lets Hypothesis shrink a failure.  The same
check, given the failing case and parameters, is what a reproducer runs (`properties.repro`).
Seeds, example counts and phases come from public Hypothesis settings built per backend
(`settings_for`); nothing of Hypothesis' internals is touched.
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np
from hypothesis import Phase, given, reject, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky, Unsatisfiable

from attnspec.properties.distribution import Cases, cases
from attnspec.properties.judge import Failed
from attnspec.properties.target import Declined

if TYPE_CHECKING:  # annotations only
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target

MAX_DECLINED = 25  # problems declined in a row before a test is skipped with the backend's reason


@dataclass(frozen=True)
class Property:
    name: str
    family: str
    check: Callable            # (target, case, params) -> None; raises judge.Failed
    draw: Cases | Callable = field(default_factory=cases)  # the problems it draws (or target -> them)
    params: Callable | None = None  # (draw, case, target) -> dict: what else the check needs, drawn
    seed_params: dict | Callable = field(default_factory=dict)  # params for the seeds' examples (or case -> them)
    seeds: bool = False        # the seeds' worked examples run first
    gradients: bool = False    # calls Backend.backward (skipped without; half the examples)
    requires: tuple = ()       # features the backend must take natively (else skipped); every draw uses them
    needs: tuple = ()          # capabilities: "masks", "causal", "layouts" (one besides contiguous)
    keep: Callable | None = None   # case -> bool: other problems are not this property's
    grid: Callable | None = None   # target -> [(case, params)]: a fixed list instead of draws
    doc: str = ""

    def constraints(self, target: Target, avoid=frozenset()) -> Cases:
        """The problems it draws on `target`: its distribution, needing its required features and avoiding
        `avoid` besides."""
        drawn = self.draw(target) if callable(self.draw) else self.draw
        avoided = drawn.avoid | set(avoid)
        return drawn.but(avoid=avoided, need=drawn.need | (set(self.requires) - avoided))


def prop(**options):
    """Decorator: a check ``test_<name>(target, case, params)`` becomes the property's pytest test."""
    def wrap(check):
        name = check.__name__.removeprefix("test_")
        family = check.__module__.rsplit(".", 1)[-1].removeprefix("test_")
        p = Property(name, family, check, doc=(check.__doc__ or "").strip(), **options)

        def test(target, attnspec_run):
            attnspec_run(p, target)

        test.__name__ = test.__qualname__ = check.__name__
        test.__doc__ = check.__doc__
        test.__module__ = check.__module__
        test.property = p
        if p.gradients:
            import pytest
            test = pytest.mark.needs_gradients(test)
        return test
    return wrap


# ---- a failure ------------------------------------------------------------------------------

class Counterexample(Exception):
    """A property failed on a case: everything the suite reports and a reproducer needs."""

    def __init__(self, prop: Property, target: Target, verdict, case: Case, params: dict, earlier: list,
                 flaky: str = ""):
        super().__init__(verdict.message)
        self.prop, self.target, self.verdict = prop, target, verdict
        self.case, self.params, self.earlier, self.flaky = case, params, earlier, flaky
        self.attribution = ""
        self.draws: tuple = ()  # "label=value" of the example's labelled draws (draws.py, variants.py)
        self.grid_index: int | None = None  # its place in the property's fixed grid, if it came from one


def attempt(prop: Property, target: Target, case: Case, params: dict) -> None:
    """One example: the check on case; Counterexample when it fails (Declined passes through).

    After a call of the backend hung, no example calls it again: each raises the failure in which
    it hung (its problem, its reproducer), so shrinking and attribution cost nothing more."""
    session = target.session
    if session.hang is not None:
        raise session.hang
    target.begin_example()
    try:
        prop.check(target, case, params)
    except Failed as f:
        failure = Counterexample(prop, target, f.verdict, case, params, list(target.earlier))
        if session.hung:  # this example's call did not return
            session.hang = failure
        raise failure from None


def failure_in(exc: BaseException) -> Counterexample | None:
    """Our Counterexample as Hypothesis raised it: itself (report_multiple_bugs is off in our profiles), or
    the first inside Hypothesis' Flaky group (it failed, then passed when replayed)."""
    if isinstance(exc, Counterexample):
        return exc
    if isinstance(exc, Flaky) and hasattr(exc, "subgroup"):  # FlakyFailure, an exception group
        group = exc.subgroup(Counterexample)
        while group is not None and not isinstance(group, Counterexample):
            group = group.exceptions[0] if group.exceptions else None
        return group
    return None


def _shown(value) -> str:
    """A drawn value as a failure report lists it: short values as they are, arrays by shape."""
    if isinstance(value, np.ndarray):
        return f"array{value.shape}"
    if isinstance(value, bytes):  # raw choices (a seed, feature bytes): their size says enough
        return f"{len(value)} bytes"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- Hypothesis, per backend -----------------------------------------------------------------

@dataclass(frozen=True)
class Exploration:
    """How the run explores (properties.options builds it from the command line and environment)."""

    examples: int = 6           # drawn examples a property (gradient properties: half, at least 3)
    seed: int = 0               # base seed: each test's seed derives from it and the test's id
    shrink: bool = True         # False: no shrink phase (measurements; a declared deviation never)
    attribute: bool = True      # after a failure, find the features it needs
    rule: str = "attnspec"      # the error budget's rule (specs.error_budget.RULES)


def examples_for(prop: Property, options: Exploration) -> int:
    return max(3, options.examples // 2) if prop.gradients else options.examples


def settings_for(prop: Property, target: Target, options: Exploration, examples: int | None = None,
                 shrink: bool = True):
    base = settings.default
    kw = dict(max_examples=examples or examples_for(prop, options))
    if not (shrink and options.shrink):
        kw["phases"] = tuple(p for p in base.phases if p not in (Phase.shrink, Phase.explain))
    return settings(base, **kw)


def seed_of(base: int, prop: Property, target: Target, step: str = "") -> int:
    """Each test's own seed: the run's base seed and the test's id (`--hypothesis-seed=N` replays a run);
    a re-check after a failure (`step`) draws anew from a seed of its own."""
    return zlib.crc32(f"{base}:{prop.family}.{prop.name}[{target.id}]{step}".encode())


def explore(prop: Property, target: Target, options: Exploration, examples: int | None = None, avoid=frozenset(),
            seeds: bool = True, shrink: bool = True, exclude: str = "", covered: Callable | None = None,
            tally: dict | None = None, step: str = "", grid_from: int = 0) -> Counterexample | None:
    """Run the property on the target: the (shrunk) failure, or None.  Raises pytest's skip when every
    problem was declined.  ``avoid``: features no draw uses; ``exclude``: a regular expression over a
    problem as printed - such draws are left out (a declared deviation's problems); ``covered``:
    Counterexample -> bool, failures a declaration covers, counted as checked and passed over (the
    re-check after a declared deviation goes on exploring behind it).  ``tally`` gets how far it
    went: "checked" problems, of them "covered"."""
    import pytest

    tally = {} if tally is None else tally
    tally.update(checked=0, covered=0)

    def one(case, params):
        try:
            attempt(prop, target, case, params)
        except Counterexample as f:
            if covered is None or not covered(f):
                raise
            tally["covered"] += 1
        tally["checked"] += 1

    if prop.grid is not None:  # a fixed list: leaves out what `avoid` and `exclude` name, as the draws do
        def left_out(case: Case | None) -> bool:  # None: a grid entry whose check builds its own problem
            return case is not None and (bool(case.features & avoid) or bool(exclude and re.search(exclude, repr(case))))

        return _fixed(one, target, prop.grid(target)[grid_from:], first_index=grid_from, left_out=left_out)
    if seeds and prop.seeds:
        from attnspec.properties.seeds import seed_examples
        found = _fixed(one, target, seed_examples(prop, target), skip_declined=True)
        if found is not None:
            return found
    declined = {"row": 0, "all": 0, "why": ""}

    def every_declined(why: str) -> str:  # the skip, with its counts (only when nothing was checked)
        return f"every drawn problem was declined ({declined['all']} declined, 0 checked): {why}"

    constraints = prop.constraints(target, avoid)
    # one strategy for the problem (drawn as one labelled draw; its inner draws unlabelled: a composite's
    # draw takes no label): drawn draw by draw at the top level, Hypothesis' later examples came out
    # near-uniform far more often (q = k = 0 in ~30 %, against ~5 % from one composite)
    # the labelled draws of the example being run, listed in its failure report (a composite's draw takes
    # no label, so they are recorded here; the shrunk example is the last one run, its list the last kept)
    labelled: list = []

    def _listed(value, label):
        if label:
            labelled.append(f"{label}={_shown(value)}")
        return value

    def draw_labelled(draw, strategy, label=None):
        return _listed(draw(strategy), label)

    problems = constraints.strategy(target, draw_labelled)

    def body(data):
        labelled.clear()
        case = data.draw(problems, label="problem")
        if prop.keep is not None and not prop.keep(case) or exclude and re.search(exclude, repr(case)):
            reject()
        params = prop.params(lambda strategy, label=None: _listed(data.draw(strategy, label=label), label),
                             case, target) if prop.params else {}
        try:
            one(case, params)
        except Counterexample as f:
            f.draws = tuple(labelled)
            raise
        except Declined as e:
            declined["row"] += 1
            declined["all"] += 1
            declined["why"] = str(e)
            # a masks-only property on a backend without masks...; a property that has checked problems
            # goes on drawing (never reported as all declined)
            if declined["row"] >= MAX_DECLINED and not tally["checked"]:
                pytest.skip(every_declined(str(e)))
            reject()
        declined["row"] = 0

    # seeded per test (and per step): the same draws every run of the same seed, on any machine - a
    # failure replays from its seed (and its reproducer), so no example database is kept (seed() turns
    # Hypothesis' database off for the test, as Hypothesis documents)
    run = seed(seed_of(options.seed, prop, target, step))(
        settings_for(prop, target, options, examples, shrink)(given(data=st.data())(body)))
    try:
        run()
    except Unsatisfiable:
        if tally["checked"]:  # Hypothesis found too few; what it checked passed
            return None
        pytest.skip(every_declined(declined["why"] or "no problem fits"))
    except Exception as e:  # noqa: BLE001 - ours inside Hypothesis' report, or a fault of the harness
        found = failure_in(e)
        if found is None:
            raise
        if isinstance(e, Flaky):
            found.flaky = "it failed once and passed when Hypothesis replayed it (the backend keeps state?)"
        return found
    return None


def _fixed(one: Callable, target: Target, examples, skip_declined: bool = False,
           first_index: int = 0, left_out: Callable | None = None) -> Counterexample | None:
    ran, declined = 0, []
    for i, (case, params) in enumerate(examples, first_index):
        if left_out is not None and left_out(case):
            continue
        try:
            one(case, params)
            ran += 1
        except Declined as e:
            declined.append(f"{case.label or case!r}: {str(e).split(': ', 1)[-1]}")
        except Counterexample as f:
            f.grid_index = i
            return f
    if not ran and declined and not skip_declined and not first_index:
        import pytest
        pytest.skip(f"{target.name} declined every problem: {declined[:3]}")
    return None
