"""A property's outcome through pytest's own mechanisms, and the row it leaves in ``user_properties``.

passed, or skipped with the reason (pytest.skip); a failure is ``pytest.fail`` with one block
(backend, dtype, property, verdict, shrunk problem, which features it needs, the reproducer's
path) instead of a traceback through Hypothesis and the backend; a failure the backend declares
as a known deviation is ``pytest.xfail`` with the declaration's reason (counted "deviation");
anything else raised is a fault of the harness and keeps its traceback ("error").

Failure attribution and the re-checks are explicit second steps, after a failure only:

- attribution (properties/attribution.py): which optional features the counterexample needs;
- a deviation confined to a feature (a library whose grouped-heads path is broken) or to some
  problems covers the failures on them; the property is then checked again on fresh draws
  without them;
- any other declared deviation (``when=`` patterns too): the property goes on exploring past it,
  fresh draws on which a failure the declaration covers counts as checked.

A failure a re-check finds is a failure like any other (a defect behind the declared one); the
deviation's message says how deep the re-check went (problems checked, of them covered).
"""
from __future__ import annotations

import pytest

from attnspec.properties import repro, results
from attnspec.properties.attribution import attribute
from attnspec.properties.explore import explore
from attnspec.specs.fields import FEATURE_TEXT


def deviation_of(target, prop_name: str, feature: bool | None = None):
    """The Deviation the backend declares for this property at this dtype, or None."""
    return target.backend.semantics.deviation(prop_name, target.dtype, feature)


def confined_deviations(target, prop_name: str) -> list:
    """Every declared Deviation of this property at this dtype that is confined to a feature or to
    some problems (a backend may declare several: keras-numpy's grouped heads and its long float16 rows)."""
    return [d for d in target.backend.semantics.deviations
            if d.covers(prop_name, target.dtype) and (d.feature or d.problems)]


def run_property(node, run, prop, target) -> None:
    """Explore `prop` on `target` inside pytest test `node`; the outcome raised, the row left on the node."""
    declared = deviation_of(target, prop.name, feature=False)
    confined = confined_deviations(target, prop.name)
    target.reset_counts()
    target.answers.clear()
    row = {"examples": 0}
    node.user_properties.append((results.ROW_KEY, row))
    if target.session.hung:  # learned once: a backend whose call hung is not called again this run
        message = hung_before(target)
        row.update(failed=True, message=message, hung=target.session.hung)
        pytest.fail(message, pytrace=False)
    try:  # a declared deviation is known: not shrunk, not attributed
        failure = explore(prop, target, run.options, shrink=declared is None)
        head = results.headline(failure) if failure is not None else ""
        hit = next((d for d in confined if d.confines(failure.case) and d.matches(head)), None) if head else None
        if hit is not None:
            need = prop.constraints(target).need
            if hit.feature in need:  # the property is about that feature
                conclude(node, run, failure, row, hit)
            # checked again without every confined departure's problems (one of them alone would let
            # the others fail the re-check), keeping the features the property needs
            avoid = frozenset(d.feature for d in confined if d.feature and d.feature not in need)
            exclude = "|".join(f"(?:{d.problems})" for d in confined if d.problems)
            what = " or ".join(FEATURE_TEXT.get(d.feature) or f"problems like {d.problems!r}"
                               for d in confined if d.problems or d.feature not in need)
            tally: dict = {}
            again = explore(prop, target, run.options, avoid=avoid, exclude=exclude, seeds=False, tally=tally,
                            step=":without-confined")
            if again is None:  # the declared departure, and nothing else wrong without it
                conclude(node, run, failure, row, hit, seen=f"{head}\n  re-checked without {what}: "
                                                             f"{tally['checked']} problems passed")
            failure = again  # a failure elsewhere: not the declared one
        covered = (lambda f: declared.matches(results.headline(f))) if declared is not None else None
        if failure is not None and covered is not None and covered(failure):
            # the declared deviation; the property goes on exploring past it, fresh draws on which a
            # failure the declaration covers counts as checked, so a defect behind it is still found
            tally = {}
            resume = 0 if failure.grid_index is None else failure.grid_index + 1  # a grid: the rest of it
            again = explore(prop, target, run.options, seeds=False, covered=covered, tally=tally, step=":past-declared",
                            grid_from=resume)
            if again is None:
                conclude(node, run, failure, row, declared, seen=(
                    f"{head}\n  re-checked past it: {tally['checked']} problems, {tally['covered']} of them the "
                    "declared deviation, no other failure"))
            failure = again  # behind the declared deviation: a failure like any other (shrunk above)
        elif failure is not None and covered is not None and run.options.shrink:
            failure = explore(prop, target, run.options, covered=covered) or failure  # not the declared one: shrunk
    finally:
        row["examples"] = target.examples
        row.update(target.coverage())  # declined calls; grid problems its declared limits left out
        row["hung"] = target.session.hung  # attnspec run ends a suite whose backend hung
    if failure is None:
        repro.forget(run.repro_dir, target.name, target.dtype, prop.name)
        if declared is not None:
            row["message"] = f"declared deviation not seen in this run: {declared.why}"
        return
    conclude(node, run, failure, row, declared)


def hung_before(target) -> str:
    """Why a test of a backend whose call hung earlier in the run fails at once: the call, where, the problem."""
    hang, session = target.session.hang, target.session
    where = (f" in {hang.prop.name}[{hang.target.dtype}] on the problem {hang.case!r} (that test's reproducer "
             "replays it)") if hang is not None else ""
    return (f"not attempted: an earlier {session.hung} call of {target.name} did not return within the per-call "
            f"limit{where}; the backend is not called again in this run (ATTNSPEC_CALL_TIMEOUT sets the limit)")


def conclude(node, run, failure, row: dict, declared=None, seen: str = "") -> None:
    """Report a failure: its reproducer written, its features attributed, its outcome raised."""
    if declared is None and run.options.attribute:
        failure.attribution = attribute(failure, run.options)
        row["examples"] = failure.target.examples
    head = results.headline(failure)
    path = text = None
    try:
        known = declared is not None and declared.matches(head)  # a declared deviation: not checked again
        hung = bool(failure.target.session.hung)  # a fresh process would hang too: not run to check
        path, text = repro.write(run.repro_dir, failure, head, failure.target.session.import_paths,
                                 check_alone=run.options.shrink and not known and not hung)
    except OSError:  # a read-only folder: the JSON still holds the script
        text = repro.script(failure, head, failure.target.session.import_paths)
    row.update(failed=True, message=head, counterexample=text, reproducer=path, attribution=failure.attribution)
    if declared is not None and declared.matches(head):
        row["message"] = f"declared deviation: {declared.why} | observed: {seen or head}"
        pytest.xfail(row["message"])
    if declared is not None:
        row["message"] = f"{head}\n  not the declared deviation ({declared.why}; when: {declared.when!r})"
    if run.tb == "long":
        raise AssertionError(results.block(failure, path)) from failure
    pytest.fail(f"{results.block(failure, path)}\n{results.LONG_HINT}", pytrace=False)
