"""Proof of teeth: the conformance suite rejects every broken implementation in tests/broken/
and accepts every correct-but-different one.

Two layers:
- witnesses (fast, no Hypothesis): each broken implementation really differs from the float64
  reference beyond the error budget on a hand-made problem, and each correct one agrees with it
  on all of them.  A teeth test against a bug that never shows would be vacuous.
- the suite: ONE `pytest properties` subprocess with every implementation selected by repeated
  ``--backend``, the results read back from ``--attnspec-json``; each broken one must fail at
  least one property of its expected family, each correct one none.  The summary (property that
  caught each, its shrunk counterexample) is printed (-s) and written to
  ``$ATTNSPEC_TEETH_DIR`` or the test's tmp dir as teeth.json / teeth.md.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the implementations are named tests.broken.*: importable from the root
    sys.path.insert(0, str(ROOT))

from backends.base import Unsupported  # noqa: E402
from backends.registry import resolve  # noqa: E402
from specs import error_budget, reference  # noqa: E402
from tests.broken import BROKEN, CORRECT  # noqa: E402
from tests.broken import witnesses as W  # noqa: E402
from tests import teeth_report as teeth  # noqa: E402


def _verdicts(backend, p) -> list:
    """Error-budget verdicts (specs.error_budget) of one backend on one witness problem."""
    q, k, v, mask, causal, scale, dtype = (p[n] for n in ("q", "k", "v", "mask", "is_causal", "scale", "dtype"))
    if p["op"] == "forward":
        out = backend.forward(q, k, v, mask=mask, is_causal=causal, scale=scale, dtype=dtype)
        if backend.semantics.fully_masked == "nan":  # its declared choice: judge real rows only
            empty = reference.forward(q, k, v, mask, causal, scale).empty_rows  # (..., Lq)
            assert np.isnan(out[np.broadcast_to(empty, out.shape[:-1])]).all()
            out = np.where(empty[..., None], 0.0, out)  # (..., Lq, Ev)
        return [error_budget.check_forward(out, q, k, v, mask, causal, scale, dtype)]
    grads = backend.backward(q, k, v, p["grad_out"], mask=mask, is_causal=causal, scale=scale, dtype=dtype)
    return error_budget.check_backward(grads, q, k, v, p["grad_out"], mask, causal, scale, dtype)


@pytest.mark.parametrize("entry", BROKEN, ids=lambda e: e.label)
def test_witness_shows_the_bug(entry):
    failed = [v for v in _verdicts(resolve(entry.spec), entry.witness()) if not v]
    assert failed, f"{entry.label} agrees with the reference on its witness {entry.witness.__name__}: no bug to find"
    print(f"\n{entry.label} on {entry.witness.__name__}: {failed[0].message}")


@pytest.mark.parametrize("entry", CORRECT, ids=lambda e: e.label)
def test_correct_agrees_on_every_witness(entry):
    backend, judged = resolve(entry.spec), 0
    for make in W.ALL:
        for dtype in backend.capabilities.dtypes:
            try:
                verdicts = _verdicts(backend, {**make(), "dtype": dtype})
            except Unsupported:
                continue
            judged += 1
            assert all(verdicts), f"{entry.label} on {make.__name__} in {dtype}: {[v.message for v in verdicts if not v]}"
    assert judged >= 3, f"{entry.label} supports too few witness problems ({judged}) to mean anything"


def test_catalogue_is_big_enough():
    assert len(BROKEN) >= 14 and len(CORRECT) >= 4
    assert len({e.label for e in BROKEN + CORRECT}) == len(BROKEN) + len(CORRECT)


# ---- the suite on every implementation ---------------------------------------------------

@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """The suite's results, computed once per session even under pytest-xdist (a file lock)."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # shared by the workers of one xdist run
    base = tmp_path_factory.getbasetemp()
    base = base.parent if run_id else base  # xdist: each worker's basetemp sits in the run's one
    shared = Path(os.environ.get("ATTNSPEC_TEETH_DIR") or base / "attnspec-teeth")
    shared.mkdir(parents=True, exist_ok=True)
    done = shared / f"suite.{run_id or os.getpid()}.json"  # this run's results, never a previous run's
    with open(shared / "lock", "w") as lock:
        with contextlib.suppress(ImportError):  # no fcntl (Windows): run without xdist there
            import fcntl
            fcntl.flock(lock, fcntl.LOCK_EX)  # the other workers wait for the one running the suite
        if not done.exists():
            done.write_text(json.dumps(teeth.run_suite(shared, os.environ.get("ATTNSPEC_TEETH_WORKERS"))))
    results = json.loads(done.read_text())
    results["_dir"] = str(shared)
    return results


@pytest.mark.parametrize("entry", BROKEN, ids=lambda e: e.label)
def test_suite_rejects_broken(suite, entry):
    conf, sem = teeth.rows(suite, entry)
    assert conf or sem, f"the suite reported nothing for {entry.spec}"
    fails = teeth.failures(suite, entry)
    assert fails, f"{entry.label} ({entry.origin}) passed the whole suite: the suite has no teeth for it"
    prop, cex, msg = fails[0]
    print(f"\n{entry.label} ({entry.origin}): caught by {prop} (of {len(fails)} failures)\n"
          f"  {teeth.verdict_of(msg)}\n  minimal counterexample: {teeth.problem_of(msg)}")
    if cex:
        print("  reproduce:\n" + "\n".join("    " + line for line in str(cex).splitlines()))
    assert teeth.expected(entry, prop), (f"{entry.label} was rejected, but not by its expected family "
                                         f"{entry.catches}: {[f[0] for f in fails]}")


@pytest.mark.parametrize("entry", CORRECT, ids=lambda e: e.label)
def test_suite_accepts_correct(suite, entry):
    conf, _ = teeth.rows(suite, entry)
    assert any(r["status"] == "passed" for r in conf), f"the suite passed no property on {entry.spec}: all skipped?"
    fails = teeth.failures(suite, entry, teeth.ALARMS)
    alarms = "\n".join(f"  {prop}: {teeth.verdict_of(msg)} on {teeth.problem_of(msg)}" for prop, _, msg in fails)
    assert not fails, f"false alarm on correct {entry.label} ({entry.origin}):\n{alarms}"


def test_teeth_summary(suite):
    """The table: 100 % of the broken rejected, 0 false alarms; written next to the suite's JSON."""
    summary = teeth.summarize(suite)
    teeth.write(summary, Path(suite["_dir"]))
    print("\n" + teeth.markdown(summary) + f"\n(written to {suite['_dir']}/teeth.md and teeth.json)")
    assert summary["rejected"] == f"{len(BROKEN)}/{len(BROKEN)}", summary["rejected"]
    assert summary["false_alarms"] == 0
