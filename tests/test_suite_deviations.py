"""Declared deviations: a known departure is reported as `deviation`, never as a pass, and only there.

A built-in adapter declares what its framework is known to get wrong (an upstream bug, with its
reproducer) so that a run over every built-in tells those apart from new failures; the property
still runs, and any failure it does not declare is still a failure.
"""
from __future__ import annotations

import re

import pytest

from attnspec.properties.runner import run_suite

PLUGIN = "tests.plugins.deviating"
ONLY = ["-k", "nan_in_padding"]


def _rows(result, backend):
    return [r for r in result.conformance if r["backend"] == backend]


@pytest.mark.parametrize("declared", [False, True])
def test_a_declared_deviation_is_reported_as_such_and_only_then_spares_the_run(declared):
    name = f"{PLUGIN}:LeaksPaddingNaN" + ("Declared" if declared else "")
    result = run_suite([name], extra_args=ONLY, timeout=600)
    backend = "leaks-padding-nan" + ("-declared" if declared else "")
    statuses = {r["status"] for r in _rows(result, backend)}
    if declared:
        assert statuses == {"deviation"}, result.output[-2000:]
        assert result.returncode == 0, result.output[-2000:]
        assert all("declared deviation: reads padded values" in r["message"] for r in _rows(result, backend))
        assert all(r["reproducer"] for r in _rows(result, backend))  # the reproducer is kept: it shows the bug
        closing = [line for line in result.output.splitlines() if re.search(r" in [\d.]+s", line)]
        assert closing and "deviation" in closing[-1]  # pytest's own closing line counts them
        line = next(x for x in result.output.splitlines() if x.startswith(backend + " "))
        assert "declared deviation(s)" in line and "NOT TESTED" not in line  # the property ran: it was seen
    else:
        assert statuses == {"failed"}, result.output[-2000:]
        assert result.returncode == 1


def test_a_backend_whose_only_checks_are_skips_and_seen_deviations_was_tested():
    from attnspec.properties.output import backend_lines

    rows = [dict(backend="b", status=s, seconds=0.1) for s in ("skipped", "deviation")]
    assert "NOT TESTED" not in backend_lines(rows)[0]
    assert "NOT TESTED" in backend_lines(rows[:1])[0]


def test_a_declared_deviation_that_does_not_show_passes_and_says_so():
    result = run_suite([f"{PLUGIN}:DeclaresADeviationItHasNot"], extra_args=ONLY, timeout=600)
    rows = _rows(result, "declares-a-deviation-it-has-not")
    assert {r["status"] for r in rows} == {"passed"} and result.returncode == 0, result.output[-2000:]
    assert all(r["message"].startswith("declared deviation not seen in this run") for r in rows)


def test_a_declared_semantics_deviation_is_no_contradiction():
    """A semantics question whose test departs as declared at one dtype: the test is `deviation`,
    the answer is recorded (not 'CONTRADICTS'), and the report counts no contradicted declaration."""
    import pandas as pd

    from attnspec.reports.tables import verdict_frame

    result = run_suite([f"{PLUGIN}:NanRowsButFloat64Declared"], extra_args=["-k", "fully_masked_rows"], timeout=600)
    backend = "nan-rows-but-float64-declared"
    status = {r["dtype"]: r["status"] for r in _rows(result, backend)}
    assert status["float64"] == "deviation" and status["float32"] == "passed", result.output[-2000:]
    answers = {r["dtype"]: r for r in result.semantics if r["backend"] == backend}
    assert answers["float64"]["observed"] == "zeros" and answers["float64"]["agrees"] is None
    assert answers["float32"]["agrees"] is True
    assert "CONTRADICTS" not in result.output
    verdict = verdict_frame(pd.DataFrame(result.conformance), pd.DataFrame(result.semantics))
    assert int(verdict.loc[verdict["backend"] == backend, "semantics contradicted"].iloc[0]) == 0


def test_a_failure_the_declaration_does_not_describe_is_still_a_failure():
    """A deviation with `when` covers only failures whose text matches it: the same leak, declared
    for other problems, fails the run (torch-flex's Lk = 0 declaration had hidden an Lq = 0 error)."""
    result = run_suite([f"{PLUGIN}:LeaksPaddingNaNDeclaredElsewhere"], extra_args=ONLY, timeout=600)
    rows = _rows(result, "leaks-padding-nan-declared-elsewhere")
    assert rows and {r["status"] for r in rows} == {"failed"}, result.output[-2000:]
    assert result.returncode == 1
    assert all("not the declared deviation" in r["message"] for r in rows)


def test_when_matches_the_failures_text():
    from attnspec.backends.base import Deviation

    d = Deviation("edge_shapes_match_reference", "Lk = 0 raises", when=r"\bLk=0\b")
    assert d.matches("problem: Case(B=1 H=2 Lq=8 Lk=0 E=32 Ev=32, mask=None)")
    assert not d.matches("problem: Case(B=1 H=2 Lq=0 Lk=16 E=32 Ev=32, mask=None)")
    assert Deviation("p", "any").matches("whatever")
