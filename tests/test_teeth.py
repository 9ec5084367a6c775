"""Proof of teeth: the conformance suite rejects every broken implementation in tests/broken/
and accepts every correct-but-different one.

Two layers, each per dtype (every implementation declares the dtypes it runs in; each bug family
is proven in float16, bfloat16, float32 and float64 by one member or another):
- witnesses (fast, no Hypothesis): each broken implementation really differs from the float64
  reference beyond the error budget on a hand-made problem, in every dtype it declares, and each
  correct one agrees with it on all of them.  A teeth test against a bug that never shows would
  be vacuous.
- the suite: ONE `pytest properties` subprocess with every implementation selected by repeated
  ``--backend``, the results read back from ``--attnspec-json``; each broken one must fail at
  least one property of its expected family in *each* dtype it declares (it runs that family's
  properties and the semantics probes: tests/teeth_selection.py), each correct one none of the
  whole suite's in any.  The summary (property that caught each, per dtype, its shrunk counterexample) is
  printed (-s) and written to ``$ATTNSPEC_TEETH_DIR`` or the test's tmp dir as teeth.json / teeth.md.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from attnspec.backends.base import Unsupported  # noqa: E402
from attnspec.backends.registry import resolve  # noqa: E402
from attnspec.specs import error_budget, reference, sink_budget  # noqa: E402
from tests import teeth_conventions as conventions  # noqa: E402
from tests import teeth_report as teeth  # noqa: E402
from tests.broken import BROKEN, CORRECT, FAMILIES, FP8_FAMILIES  # noqa: E402
from tests.broken import witnesses as W  # noqa: E402
from tests.teeth_conventions import CONVENTION_OPS  # noqa: E402


def _in_dtype(p: dict, dtype: str) -> dict:
    """The witness with its float inputs rounded to dtype's values (held in float64): the kernel's
    cast then loses nothing, and reference and kernel see the very same numbers."""
    def r(x, to=dtype):
        return x if x is None else np.asarray(error_budget.round_to(x, to), dtype=np.float64)
    from attnspec.specs.fp8 import is_fp8
    wide = "float32" if is_fp8(dtype) else dtype  # fp8 kernels take a bias in float32 (Backend._call_of)
    fields = {n: (r(x, wide) if n == "bias" else x) for n, x in p.get("fields", {}).items()}
    return {**p, "q": r(p["q"]), "k": r(p["k"]), "v": r(p["v"]), "grad_out": r(p.get("grad_out")),
            "fields": fields, "dtype": dtype}


def _budget_dtype(backend, dtype: str) -> str:
    """What judges the backend's results at dtype: fp8 inputs, its declared computation (Target's)."""
    from attnspec.properties.target import Session, Target
    return Target(Session(backend, backend.name), dtype).budget_dtype


def _p_rounding(backend, dtype: str, paged: bool = False) -> list:
    """properties/test_fp8.py's probe: P rounded before P V as the backend declares (a Verdict); ``paged``: the
    probe as a paged call (`backends.serving.forward_paged`)."""
    from attnspec.backends import serving
    from attnspec.properties.target import Session, Target
    from attnspec.properties.test_fp8 import p_probe, p_rounding_of
    from attnspec.specs.invariants import Verdict
    t = Target(Session(backend, backend.name), dtype)
    case = p_probe(t)
    if paged:
        layouts = [f.split("-", 1)[1] for f in backend.capabilities.formats if f.startswith("paged-")]
        if not layouts:
            raise Unsupported(f"{backend.name} takes no paged call")
        out = serving.forward_paged(backend, case.q, case.k, case.v, dtype, layout=layouts[0], rng=0,
                                    **{**case.call_kwargs, "positions": "per_sequence"})
    else:
        out = backend.forward(case.q, case.k, case.v, dtype=dtype, **case.call_kwargs)
    observed, far = p_rounding_of(t, out, case)
    declared = backend.semantics.p_dtype(dtype)
    return [Verdict("p_rounding", observed == declared, None, far[declared] if declared in far else float("nan"),
                    f"P rounded as {observed}, declared {declared} (distances {far})")]


def _verdicts(backend, p, dtype: str) -> list:
    """Error-budget verdicts (specs.error_budget) of one backend on one witness problem in one dtype."""
    if p["op"] in ("p_rounding", "p_rounding_paged"):
        backend.check_supported(dtype, "forward")
        return _p_rounding(backend, dtype, paged=p["op"] == "p_rounding_paged")
    p = _in_dtype(p, dtype)
    budget = _budget_dtype(backend, dtype)
    q, k, v, mask, causal, scale, fields = (p[n] for n in ("q", "k", "v", "mask", "is_causal", "scale", "fields"))
    if p["op"] in CONVENTION_OPS:
        return conventions.verdicts(backend, p, dtype)
    if p["op"] in ("forward", "lse"):
        out, lse = backend.forward(q, k, v, mask=mask, is_causal=causal, scale=scale, dtype=dtype, return_lse=True,
                                   layout=p.get("layout", "contiguous"), **fields) if p["op"] == "lse" else (
            backend.forward(q, k, v, mask=mask, is_causal=causal, scale=scale, dtype=dtype, **fields), None)
        empty = reference.forward(q, k, v, mask, causal, scale, **fields).empty_rows  # (..., Lq)
        if fields.get("sinks") is not None:  # a row that sees only its finite sink is no fully masked row: output 0
            empty = empty & ~np.isfinite(np.asarray(fields["sinks"], dtype=np.float64))[:, None]
        if backend.semantics.fully_masked == "nan":  # its declared choice: judge real rows only
            assert np.isnan(out[np.broadcast_to(empty, out.shape[:-1])]).all()
            out = np.where(empty[..., None], 0.0, out)  # (..., Lq, Ev)
        if lse is not None:
            if backend.semantics.lse_with_sinks is False:  # declared: the LSE over the real keys
                fields = {n: x for n, x in fields.items() if n != "sinks"}
                empty = reference.forward(q, k, v, mask, causal, scale, **fields).empty_rows
            return [error_budget.check_lse(lse, q, k, v, mask, causal, scale, budget, rows=~empty, **fields),
                    conventions.empty_lse_verdict(backend, lse, empty)]
        return [error_budget.check_forward(out, q, k, v, mask, causal, scale, budget, **fields)]
    if p["op"] == "dsink":  # the sinks' gradient too
        grads, dsink = backend.backward(q, k, v, p["grad_out"], mask=mask, is_causal=causal, scale=scale, dtype=dtype,
                                        return_dsink=True, **fields)
        return error_budget.check_backward(grads, q, k, v, p["grad_out"], mask, causal, scale, dtype, **fields) + [
            sink_budget.check_dsink(dsink, q, k, v, p["grad_out"], mask, causal, scale, dtype, **fields)]
    knobs = p.get("knobs") or {}  # a setting of the backend's knobs: one without them declines the witness
    if set(knobs) - set(backend.knobs):
        raise Unsupported(f"{backend.name} has no knob {sorted(knobs)}")
    grads = backend.backward(q, k, v, p["grad_out"], mask=mask, is_causal=causal, scale=scale, dtype=dtype,
                             knobs=knobs or None, **fields)
    return error_budget.check_backward(grads, q, k, v, p["grad_out"], mask, causal, scale, dtype, **fields)


_BROKEN_CELLS = [(e, d) for e in BROKEN for d in teeth.dtypes(e)]
_CORRECT_CELLS = [(e, d) for e in CORRECT for d in teeth.dtypes(e)]


def _cell_id(cell) -> str:
    return f"{cell[0].label}-{cell[1]}"


# The tests that read the suite's results share one pytest-xdist worker (README's `--dist loadgroup`):
# the suite runs in that worker's subprocess while the other workers go on with the rest.  Spread
# over workers, every worker but one would wait on the fixture's lock with its CPU idle.
ON_THE_SUITES_WORKER = pytest.mark.xdist_group("proof-of-teeth-suite")


@pytest.mark.parametrize("cell", _BROKEN_CELLS, ids=_cell_id)
def test_witness_shows_the_bug(cell):
    entry, dtype = cell
    failed = [v for v in _verdicts(resolve(entry.spec), entry.witness(), dtype) if not v]
    assert failed, (f"{entry.label} agrees with the reference on its witness {entry.witness.__name__} in {dtype}: "
                    "no bug to find")
    print(f"\n{entry.label} on {entry.witness.__name__} in {dtype}: {failed[0].message}")


@pytest.mark.parametrize("entry", CORRECT, ids=lambda e: e.label)
def test_correct_agrees_on_every_witness(entry):
    backend, judged = resolve(entry.spec), 0
    for make in W.ALL:
        for dtype in teeth.dtypes(entry):
            try:
                verdicts = _verdicts(backend, make(), dtype)
            except Unsupported:
                continue
            judged += 1
            assert all(verdicts), (f"{entry.label} on {make.__name__} in {dtype}: "
                                   f"{[v.message for v in verdicts if not v]}")
    assert judged >= 3, f"{entry.label} supports too few witness problems ({judged}) to mean anything"


def test_catalogue_is_big_enough():
    assert len(BROKEN) >= 34 and len(CORRECT) >= 8
    assert len({e.label for e in BROKEN + CORRECT}) == len(BROKEN) + len(CORRECT)


def test_the_suite_run_gives_a_broken_implementation_its_family_and_the_probes_a_correct_one_all():
    from tests.teeth_selection import catches_by_name, kept
    catches = catches_by_name()
    scale_by_d = next(e for e in BROKEN if e.label == "ScaleByD")  # its family: the scale (SCALE + REF)
    for name in teeth.names(scale_by_d):
        assert kept(name, "default_scale", "properties/test_output.py", catches)
        assert kept(name, "matches_reference", "properties/test_output.py", catches)
        assert not kept(name, "rows_sum_to_one", "properties/test_weights.py", catches)
        assert not kept(name, "sinks_match_reference", "properties/test_sinks.py", catches)
        assert kept(name, "empty_sizes", "properties/test_semantics.py", catches)  # a probe answers a question
        assert kept(name, "batch_invariance", "properties/test_conventions.py", catches)
    correct = {n for entry in CORRECT for n in teeth.names(entry)}
    assert all(kept(n, "sinks_match_reference", "properties/test_sinks.py", catches) for n in correct)
    assert not correct & set(catches)  # a name shared would give a correct one a broken one's family


def test_every_family_is_proven_in_every_dtype():
    """Each bug family has members declaring float16, bfloat16, float32 and float64 between them (the fp8
    family: float8_e4m3fn and float8_e5m2)."""
    from attnspec.specs.fp8 import FP8_DTYPE_NAMES
    from attnspec.specs.problem import DTYPE_NAMES, FLOAT_DTYPE_NAMES
    assert teeth.DTYPES == DTYPE_NAMES
    assert {e.family for e in BROKEN} == set(FAMILIES)
    for family in FAMILIES:
        covered = {d for e in BROKEN if e.family == family for d in teeth.dtypes(e)}
        want = FP8_DTYPE_NAMES if family in FP8_FAMILIES else FLOAT_DTYPE_NAMES
        assert covered == set(want), f"family {family!r} is proven in {sorted(covered)} only"
    missing = [d for d in DTYPE_NAMES if not any(d in teeth.dtypes(e) for e in CORRECT)]
    assert not missing, f"no correct implementation runs in {missing}: false alarms there would go unseen"


def test_witness_alibi_slopes_are_the_standard_ones():
    """tests/broken never reads specs, so the witness writes the 6-head slopes out: they must be the spec's."""
    from attnspec.specs.problem import alibi_slopes
    np.testing.assert_array_equal(W.ALIBI_SLOPES_6, alibi_slopes(6))


def test_bfloat16_storage_rounds_like_the_spec():
    """The teeth kernels' own bfloat16 rounding (no specs import there) equals specs' on hard cases."""
    from tests.broken._kernels import round_bfloat16
    x = np.array([1.0, 1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-9, -3.14159, 65504.0, 1e-40, np.inf, -np.inf,
                  3.4e38, 0.0, -0.0])
    np.testing.assert_array_equal(round_bfloat16(x), error_budget.round_to(x, "bfloat16"))
    assert np.isnan(round_bfloat16(np.array([np.nan]))).all()


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
            done.write_text(json.dumps(teeth.run_teeth_suite(shared, os.environ.get("ATTNSPEC_TEETH_WORKERS"))))
    results = json.loads(done.read_text())
    results["_dir"] = str(shared)
    return results


@pytest.mark.slow
@ON_THE_SUITES_WORKER
@pytest.mark.parametrize("cell", _BROKEN_CELLS, ids=_cell_id)
def test_suite_rejects_broken(suite, cell):
    """Rejected in this dtype (each declared dtype on its own), by a property of its family."""
    entry, dtype = cell
    conf, sem = teeth.rows(suite, entry)
    assert conf or sem, f"the suite reported nothing for {entry.spec}"
    fails = teeth.failures(suite, entry, dtype=dtype)
    assert fails, (f"{entry.label} ({entry.origin}) passed the whole suite in {dtype}: "
                   "the suite has no teeth for it there")
    prop, cex, msg = fails[0]
    print(f"\n{entry.label} ({entry.origin}) in {dtype}: caught by {prop} (of {len(fails)} failures)\n"
          f"  {teeth.verdict_of(msg)}\n  minimal counterexample: {teeth.problem_of(msg)}")
    if cex:
        print("  reproduce:\n" + "\n".join("    " + line for line in str(cex).splitlines()))
    assert teeth.expected(entry, prop), (f"{entry.label} was rejected in {dtype}, but not by its expected family "
                                         f"{entry.catches}: {[f[0] for f in fails]}")


@pytest.mark.slow
@ON_THE_SUITES_WORKER
@pytest.mark.parametrize("cell", _CORRECT_CELLS, ids=_cell_id)
def test_suite_accepts_correct(suite, cell):
    entry, dtype = cell
    conf, _ = teeth.rows(suite, entry)
    assert any(r["status"] == "passed" and r.get("dtype") == dtype for r in conf), \
        f"the suite passed no property on {entry.spec} in {dtype}: all skipped?"
    fails = teeth.failures(suite, entry, teeth.ALARMS, dtype=dtype)
    alarms = "\n".join(f"  {prop}: {teeth.verdict_of(msg)} on {teeth.problem_of(msg)}" for prop, _, msg in fails)
    assert not fails, f"false alarm on correct {entry.label} ({entry.origin}) in {dtype}:\n{alarms}"


@pytest.mark.slow
@ON_THE_SUITES_WORKER
def test_teeth_summary(suite):
    """The table: every broken implementation rejected in every dtype it declares, 0 false alarms;
    written next to the suite's JSON."""
    summary = teeth.summarize(suite)
    teeth.write(summary, Path(suite["_dir"]))
    print("\n" + teeth.markdown(summary) + f"\n(written to {suite['_dir']}/teeth.md and teeth.json)")
    assert summary["rejected"] == f"{len(_BROKEN_CELLS)}/{len(_BROKEN_CELLS)}", summary["rejected"]
    assert summary["false_alarms"] == 0
