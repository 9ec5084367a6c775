"""Detection power: the smallest defect the conformance suite rejects, per dtype, and kill rates.

    python tools/detection_power.py --defects tests.defects [--dtype D ...] [--defect K ...] [--runs K] [--out DIR]
    python tools/detection_power.py --broken tests.broken --kill-rates [--runs K] [--examples N ...] [--out DIR]
    python tools/detection_power.py --broken tests.broken --defects tests.defects --controls [--runs K]

A tool of this repository, not of the installed suite: it takes its defects as arguments.
``--defects MODULE``: graded defects, a module with ``DEFECTS`` (kinds) and ``spec(kind, d, dtype)``
(the backend name of that defect of size d, declaring that dtype; d = 0 is the correct kernel,
tests/defects.py: torch-math with one error of relative size d).  ``--broken MODULE``: planted
bugs, a module with ``BROKEN`` and ``CORRECT`` (entries with ``spec`` and ``label``: tests/broken/).

Detection power: each defect runs through the whole suite (`attnspec.properties.runner.run_suite`,
profile dev) in one dtype, once per seed (``--hypothesis-seed``): the same seed draws the same
problems for every d, so a bisection over the grid (1e-1, 3e-2, 1e-2, ... per dtype) finds, per
seed, the smallest d rejected ("rejected": at least one property *failed*; harness errors are
counted apart).  The rate at d is the share of seeds whose threshold is at most d (a larger
defect on the same draws is assumed to fail too).  The same runs under flash-attention's rule
(``--attnspec-rule flash``: 2 x the plain error over the tensor, no floor) give its thresholds.
The correct kernel (d = 0) runs first on each seed: what it fails is not the defect's doing and
is left out of the defects' verdicts (under flash's rule those are its false alarms; both are
listed).  Each defect stops at its first counted failure.  Writes detection_power.csv (per dtype
and defect), detection_rates.csv (per d) and detection_power.md; --kill-rates writes kill_rates.csv,
--controls controls.csv.

Kill rates: every planted bug under K seeds with N examples per property; a bug is killed in a
run when a property fails.  From the rate r at N, the per-example kill probability
p = 1 - (1 - r)^(1/N) gives the examples a profile needs for 99 % per run.  Controls: every
available CPU built-in, the correct kernels and the defects at d = 0 in every dtype they declare,
K seeds: any failure is a false alarm (or a finding).

Measurement runs load this module as a pytest plugin (``-p tools.detection_power``, public hooks
only): with ATTNSPEC_MEASURE_STOP a backend's first counted failure skips the rest of its suite
(its verdict is made).  Shrinking is off (``--attnspec-no-shrink``: it makes a counterexample
smaller, never decides whether a run fails) and the example database with it (the ci profile).
"""
from __future__ import annotations

import argparse
import csv
import importlib
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from attnspec.properties.runner import run_suite

say = lambda *a: print(*a, flush=True)  # noqa: E731 - progress lines reach a log file as they happen

DTYPES = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")
# per dtype: the grid (largest first, steps of ~3x) and the targets (temperature, gain); fp8 (issue 31:
# torch-math's fp8 path, float32 inside and bfloat16 out) has no target: its figure is reported
GRIDS = {"float16": (-1, -5), "bfloat16": (-1, -4), "float32": (-3, -8), "float64": (-4, -13),
         "float8_e4m3fn": (-1, -7), "float8_e5m2": (-1, -7)}  # fp8 kernels keep a float32 LSE: as float32 deep
TARGETS = {"float8_e4m3fn": {}, "float8_e5m2": {},
           "float16": {"temperature": 1e-2, "gain": 3e-3}, "bfloat16": {"temperature": 3e-2, "gain": 3e-2},
           "float32": {"temperature": 1e-5, "gain": 1e-5}, "float64": {"temperature": 1e-6, "gain": 1e-6}}
STOP_ENV, IGNORE_ENV = "ATTNSPEC_MEASURE_STOP", "ATTNSPEC_MEASURE_IGNORE"  # stop a rejected backend; not counted
DEFECTS_MODULE = BROKEN_MODULE = None  # the --defects and --broken modules (main sets them)


def cpu_builtins() -> list:
    """The CPU built-ins (chosen without importing a framework; the suite skips a missing one)."""
    from attnspec.backends.registry import builtin_names, resolve
    return [n for n in builtin_names() if resolve(n).capabilities.device == "cpu"]


def grid(dtype: str) -> list:
    """Defect sizes for dtype, largest first: 1e-1, 3e-2, 1e-2, ... down to the dtype's end."""
    hi, lo = GRIDS[dtype]
    return [float(f"{m}e{e}") for e in range(hi, lo - 1, -1) for m in (3, 1) if not (e == hi and m == 3)]


# ---- the pytest plugin of measurement runs ---------------------------------------------

_REJECTED: set = set()  # backends that failed a counted property in this run


def _backend_of(item):
    target = getattr(getattr(item, "callspec", None), "params", {}).get("target")
    return getattr(target, "name", None)


@pytest.hookimpl(trylast=True)
def pytest_runtest_setup(item):
    """With ATTNSPEC_MEASURE_STOP: a backend already rejected skips its remaining properties
    (its verdict is made; the rest of the suite would only cost time)."""
    if os.environ.get(STOP_ENV) and _backend_of(item) in _REJECTED:
        pytest.skip("measurement: this backend has already failed a property")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    ignored = set(filter(None, os.environ.get(IGNORE_ENV, "").split(",")))
    if report.when == "call" and report.failed and item.originalname.removeprefix("test_") not in ignored:
        _REJECTED.add(_backend_of(item))


# ---- one measured suite run --------------------------------------------------------------

WORKERS = os.environ.get("ATTNSPEC_MEASURE_WORKERS", "")  # pytest-xdist workers per suite run ("" = none)


def suite_run(names, seed: int, rule: str = "attnspec", profile: str = "dev", examples: int | None = None,
              timeout: float | None = 3600, extra=(), stop: bool = False, ignore=()) -> dict:
    """{backend name: (failed properties, errored properties)} of one suite run (``extra``: more
    pytest arguments, e.g. ``["-k", "default_scale"]``; ``stop``: a backend's first failure of a
    property not in ``ignore`` ends its run - the rest is skipped)."""
    env = dict(os.environ)
    for key in (STOP_ENV, IGNORE_ENV, "ATTNSPEC_BACKENDS", "HYPOTHESIS_PROFILE"):
        env.pop(key, None)
    if stop:
        env[STOP_ENV], env[IGNORE_ENV] = "1", ",".join(sorted(ignore))
    env["ATTNSPEC_WORKERS"] = "1"  # one process unless --workers asks for pytest-xdist (-n below)
    args = ["-p", "tools.detection_power", f"--hypothesis-seed={seed}", f"--attnspec-rule={rule}", "--attnspec-no-shrink"]
    args += [f"--attnspec-examples={examples}"] if examples else []
    args += ["-n", WORKERS] if WORKERS not in ("", "0") else []
    with tempfile.TemporaryDirectory(prefix="attnspec-measure-") as scratch:  # its reproducers are not read: gone after
        result = run_suite(list(names), json_path=os.path.join(scratch, "suite.json"), profile=profile, env=env,
                           timeout=timeout, extra_args=args + list(extra))
    if not result.conformance:
        raise RuntimeError(f"the suite reported nothing (exit {result.returncode}):\n{result.output[-3000:]}")
    out: dict = {}
    for row in result.conformance:
        failed, errored = out.setdefault(row["backend"], (set(), set()))
        (failed if row["status"] == "failed" else errored if row["status"] == "error" else set()).add(row["property"])
    return out


def _defect(kind, d, dtype):
    """(backend spec, the backend's own name) of a defect of size d declaring dtype."""
    from attnspec.backends.registry import resolve
    name = DEFECTS_MODULE.spec(kind, d, dtype)
    return name, resolve(name).name


# ---- detection power -------------------------------------------------------------------------

def thresholds(dtype: str, kinds, seed: int, rule: str, log=say) -> dict:
    """{kind: the largest index into grid(dtype) rejected on this seed (-1: not even the largest d)},
    plus 'control': the properties torch-math itself (d = 0) failed on these draws - those say
    nothing about a defect, so they are left out of its verdict.  The control runs first, alone;
    then a bisection: each step one suite run with every unfinished kind at the middle of its
    interval, each defect stopped at its first counted failure."""
    sizes = grid(dtype)
    rej = {k: -1 for k in kinds}          # largest index known rejected
    acc = {k: len(sizes) for k in kinds}  # smallest index known accepted
    spec, name = _defect(DEFECTS_MODULE.DEFECTS[0], 0, dtype)
    start = time.perf_counter()
    control = sorted(suite_run([spec], seed, rule).get(name, (set(), set()))[0])
    log(f"  {dtype} seed {seed} {rule}: control (d = 0) failed {', '.join(control) or 'nothing'} "
        f"({time.perf_counter() - start:.0f} s)")
    while any(acc[k] - rej[k] > 1 for k in kinds):
        todo = {k: (rej[k] + acc[k]) // 2 for k in kinds if acc[k] - rej[k] > 1}
        specs = {k: _defect(k, sizes[i], dtype) for k, i in todo.items()}
        start = time.perf_counter()
        got = suite_run([s for s, _ in specs.values()], seed, rule, stop=True, ignore=control)
        for k, i in todo.items():
            failed, errored = got.get(specs[k][1], (set(), set()))
            failed = failed - set(control)
            rej[k], acc[k] = (i, acc[k]) if failed else (rej[k], i)
            log(f"  {dtype} seed {seed} {rule}: {k} d={sizes[i]:g} " + (f"rejected ({', '.join(sorted(failed))})"
                if failed else "passed") + (f"; harness errors: {', '.join(sorted(errored))}" if errored else ""))
        log(f"  ({time.perf_counter() - start:.0f} s)")
    return dict(rej, control=control)


def detection_power(dtypes, kinds, seeds, rules=("attnspec", "flash"), flash_runs=None, log=say) -> list:
    """Rows of detection_rates.csv: dtype, defect, rule, d, rate, runs (flash's rule: the first
    `flash_runs` seeds only, default all)."""
    rows = []
    for dtype in dtypes:
        sizes = grid(dtype)
        for rule in rules:
            chosen = seeds[:flash_runs] if rule == "flash" and flash_runs else seeds
            per_seed = [thresholds(dtype, kinds, s, rule, log) for s in chosen]
            alarms = " ".join(sorted({p for t in per_seed for p in t["control"]}))
            for kind in kinds:
                for i, d in enumerate(sizes):
                    rate = sum(t[kind] >= i for t in per_seed) / len(chosen)
                    rows.append(dict(dtype=dtype, defect=kind, rule=rule, d=d, rate=rate, runs=len(chosen),
                                     control_failed=alarms))
    return rows


def summarize(rates: list) -> list:
    """Per dtype and defect: the smallest d rejected in every run, and where it was sometimes, per rule."""
    out = []
    keys = dict.fromkeys((r["dtype"], r["defect"]) for r in rates)
    for dtype, kind in keys:
        row = dict(dtype=dtype, defect=kind)
        for rule, tag in (("attnspec", ""), ("flash", "flash_rule_")):
            pts = sorted((r for r in rates if (r["dtype"], r["defect"], r["rule"]) == (dtype, kind, rule)),
                         key=lambda r: -r["d"])
            if not pts:
                continue
            always = [r["d"] for r in pts if r["rate"] == 1.0]
            some = [r["d"] for r in pts if r["rate"] > 0]
            row[f"{tag}smallest_d_rejected"] = min(always) if always else ""
            row[f"{tag}smallest_d_sometimes"] = min(some) if some else ""
            row[f"{tag}rate_at_target"] = next((r["rate"] for r in pts if _close(r["d"], TARGETS[dtype].get(kind))), "")
            row[f"{tag}control_failed"] = pts[0]["control_failed"]
            row[f"{tag}runs"] = pts[0]["runs"]
        target = TARGETS[dtype].get(kind)
        row["target"] = target or ""
        d = row.get("smallest_d_rejected")
        row["meets_target"] = "" if target is None else bool(d != "" and d <= target * (1 + 1e-9))
        out.append(row)
    return out


def _close(a, b) -> bool:
    return b is not None and abs(a - b) <= 1e-9 * b


# ---- kill rates and controls ------------------------------------------------------------------

def kill_rates(seeds, examples=(2, 6), profiles=("dev", "ci"), log=say) -> list:
    """Rows: bug, profile, examples, killed runs, runs, rate, per-example p, examples for 99 %."""
    BROKEN = BROKEN_MODULE.BROKEN
    rows = []
    for profile in profiles:
        for n in examples:
            killed = {e.label: 0 for e in BROKEN}
            for seed in seeds:
                start = time.perf_counter()
                got = suite_run([e.spec for e in BROKEN], seed, profile=profile, examples=n, stop=True)
                for e in BROKEN:
                    killed[e.label] += any(got.get(name, (set(), set()))[0] for name in _names(e))
                log(f"  kill rates: {profile} N={n} seed {seed}: {time.perf_counter() - start:.0f} s")
            for label, k in killed.items():
                p = per_example(k, len(seeds), n)
                rows.append(dict(bug=label, profile=profile, examples=n, killed=k, runs=len(seeds),
                                 rate=k / len(seeds), per_example=round(p, 4), examples_for_99=examples_needed(p)))
    return rows


def per_example(killed: int, runs: int, examples: int) -> float:
    """Per-example kill probability p from `killed` of `runs` runs of `examples` examples each:
    rate = 1 - (1 - p)^examples.  Every run killed: the rate is taken as 1 - 1/(2 runs) (a
    cautious estimate: more runs are needed to show more)."""
    rate = killed / runs if killed < runs else 1 - 0.5 / runs
    return 1 - (1 - rate) ** (1 / examples)


def examples_needed(p: float, target: float = 0.99):
    """Examples per property for a kill with probability `target` per run ("inf": never killed)."""
    if p <= 0:
        return "inf"
    return max(1, math.ceil(math.log(1 - target) / math.log(1 - p))) if p < 1 else 1


def _names(entry) -> set:
    from attnspec.backends.registry import resolve
    return {entry.spec, getattr(resolve(entry.spec), "name", entry.spec)}


def controls(seeds, log=say) -> list:
    """Rows: backend, seed, failed properties - every correct kernel in every dtype it declares."""
    names = cpu_builtins() + [e.spec for e in BROKEN_MODULE.CORRECT] + [
        DEFECTS_MODULE.spec(k, 0, None) for k in DEFECTS_MODULE.DEFECTS]
    rows = []
    for seed in seeds:
        got = suite_run(names, seed)
        rows += [dict(backend=b, seed=seed, failed=" ".join(sorted(f)), errors=" ".join(sorted(e)))
                 for b, (f, e) in sorted(got.items())]
        log(f"  controls seed {seed}: {sum(bool(f) for f, _ in got.values())} backends with a failure")
    return rows


# ---- output -----------------------------------------------------------------------------------

def write_csv(path: Path, rows: list) -> None:
    if not rows:
        return
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def markdown(rows: list) -> str:
    if not rows:
        return ""
    fields = list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda x: f"{x:g}" if isinstance(x, float) else str(x)  # noqa: E731
    return "\n".join(["| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)] +
                     ["| " + " | ".join(fmt(r.get(k, "")) for k in fields) + " |" for r in rows]) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=(
        "Cost: a suite run per bisection step (4 defects each), ~4 steps per dtype, seed and rule; "
        "measured on 2 cores (see the report for the figure)."))
    ap.add_argument("--defects", metavar="MODULE", help="graded defects: a module with DEFECTS and spec(kind, d, dtype) "
                    "(this repository's: tests.defects)")
    ap.add_argument("--broken", metavar="MODULE", help="planted bugs: a module with BROKEN and CORRECT "
                    "(this repository's: tests.broken)")
    ap.add_argument("--dtype", action="append", choices=DTYPES)
    ap.add_argument("--defect", action="append", help="kinds of --defects to measure (default: all)")
    ap.add_argument("--rule", action="append", choices=("attnspec", "flash"))
    ap.add_argument("--runs", type=int, default=3, help="seeds per measurement (default 3)")
    ap.add_argument("--flash-runs", type=int, default=None, help="seeds for flash-attention's rule (default --runs)")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("detection-power"))
    ap.add_argument("--kill-rates", action="store_true", help="measure tests/broken/ kill rates instead")
    ap.add_argument("--examples", type=int, action="append", help="--kill-rates: examples per property (2, 6)")
    ap.add_argument("--profile", action="append", choices=("dev", "ci"), help="--kill-rates: profiles (dev, ci)")
    ap.add_argument("--controls", action="store_true", help="run every correct kernel instead (false alarms)")
    ap.add_argument("--workers", default=None, help="pytest-xdist workers per suite run (-n; default none)")
    args = ap.parse_args(argv)
    global WORKERS, DEFECTS_MODULE, BROKEN_MODULE
    WORKERS = args.workers if args.workers is not None else WORKERS
    sys.path.insert(0, os.getcwd())  # the modules are named from here, as python -m would
    need = {"--defects": not args.kill_rates, "--broken": args.kill_rates or args.controls}
    missing = [flag for flag, needed in need.items() if needed and not getattr(args, flag[2:])]
    if missing:
        ap.error(f"{' and '.join(missing)} required here (this repository's: --defects tests.defects, "
                 "--broken tests.broken)")
    DEFECTS_MODULE = importlib.import_module(args.defects) if args.defects else None
    BROKEN_MODULE = importlib.import_module(args.broken) if args.broken else None
    args.out.mkdir(parents=True, exist_ok=True)
    seeds = list(range(args.first_seed, args.first_seed + args.runs))
    start = time.perf_counter()
    if args.kill_rates:
        rows = kill_rates(seeds, tuple(args.examples or (2, 6)), tuple(args.profile or ("dev", "ci")))
        write_csv(args.out / "kill_rates.csv", rows)
        print(markdown(rows))
    elif args.controls:
        rows = controls(seeds)
        write_csv(args.out / "controls.csv", rows)
        bad = [r for r in rows if r["failed"]]
        print(markdown(bad) or f"no false alarm: {len(rows)} backend runs")
    else:
        rates = detection_power(args.dtype or DTYPES, args.defect or DEFECTS_MODULE.DEFECTS, seeds,
                                tuple(args.rule or ("attnspec", "flash")), args.flash_runs)
        summary = summarize(rates)
        write_csv(args.out / "detection_rates.csv", rates)
        write_csv(args.out / "detection_power.csv", summary)
        (args.out / "detection_power.md").write_text(markdown(summary))
        print(markdown(summary))
    print(f"({time.perf_counter() - start:.0f} s; written to {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
