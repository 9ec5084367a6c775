"""Run the conformance suite on every teeth implementation and print who caught what, per dtype.

    python tests/teeth_report.py [--out DIR] [--workers N]

One `pytest --pyargs attnspec.properties` subprocess selects every implementation of tests/broken/ with repeated
``--backend`` and writes ``--attnspec-json``; this module reads it back.  A broken implementation runs
its expected family's properties and the semantics and conventions probes, a correct one every
property (tests/teeth_selection.py).  A broken implementation counts as rejected in a dtype when a
property failed, or a declaration was contradicted, in that dtype (a semantics row without a dtype
counts in the implementation's widest).  tests/test_teeth.py uses the same functions and asserts
on them.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the implementations are named tests.broken.*: importable from the root
    sys.path.insert(0, str(ROOT))

from attnspec.backends.registry import resolve  # noqa: E402
from attnspec.properties import cores  # noqa: E402
from tests.broken import BROKEN, CORRECT  # noqa: E402

# never hang CI: the run takes a few minutes on 2 idle cores, several times that on a loaded machine
SUITE_TIMEOUT_S = float(os.environ.get("ATTNSPEC_TEETH_TIMEOUT") or 1800)
# a broken implementation counts as rejected only by a property that *failed*: an "error" is a
# fault of the harness (a health check, a bug in a property) and proves nothing; for a correct
# implementation both are alarms
REJECTED = ("failed",)
ALARMS = ("failed", "error")
# specs.problem.DTYPE_NAMES (a test checks): the float formats, then fp8 (issue 31's family only)
DTYPES = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")
TEETH_SEED = 20261201


def run_teeth_suite(out_dir: Path, workers: str | None = None) -> dict:
    """One `pytest properties` over every teeth implementation; its JSON results plus timing."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, log_path = out_dir / "suite.json", out_dir / "suite.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    env["ATTNSPEC_PROFILE"] = "ci"  # 6 problems a property, no example database
    # fixed draws: every test's seed derives from this one (the proof is a statement about draws
    # any run repeats; how often a fresh seed catches each bug is the kill rate, tools/detection_power.py)
    env["ATTNSPEC_SEED"] = str(TEETH_SEED)
    env.pop("ATTNSPEC_JSON", None)  # ours goes to --attnspec-json, not the caller's file
    env.pop("ATTNSPEC_BACKENDS", None)
    for key in [k for k in env if k.startswith("PYTEST_XDIST") or k == "PYTEST_CURRENT_TEST"]:
        env.pop(key)  # an outer xdist run must not leak into the inner pytest
    # unshrunk: whether a bug is caught does not depend on shrinking, only how small the printed
    # counterexample is (and each of ~200 failures would shrink on its own)
    # a broken implementation runs its expected family's properties only (tests/teeth_selection.py)
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "attnspec.properties", "-q", "-p", "no:cacheprovider",
           "-p", "tests.teeth_selection", "--attnspec-no-shrink", "--attnspec-json", str(json_path)]
    cmd += [f"--backend={e.spec}" for e in BROKEN + CORRECT]
    if workers is None:  # the suite's own rule (properties/cores.py): a worker a CPU this process may use, so
        # a pinned xdist worker of README's run gives one process; ATTNSPEC_WORKERS steers it as for any run
        workers = str(cores.workers_wanted(len(BROKEN + CORRECT))) if importlib.util.find_spec("xdist") else "0"
    if str(workers) not in ("", "0"):
        cmd += ["-n", str(workers)]
    start, cpu = time.perf_counter(), _children_cpu()
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=SUITE_TIMEOUT_S)
    seconds, cpu = time.perf_counter() - start, _children_cpu() - cpu
    tail = log_path.read_text()[-3000:]
    # 0: all passed; 1: some failed (the broken ones must); anything else: a crash or a usage error
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"the suite did not run (exit {proc.returncode}); {log_path}:\n{tail}")
    if not json_path.exists():
        raise RuntimeError(f"the suite wrote no {json_path}; {log_path}:\n{tail}")
    results = json.loads(json_path.read_text())
    results["_seconds"] = seconds
    results["_cpu_seconds"] = cpu  # the suite's processes' CPU time: steadier than wall time on a shared machine
    results["_command"] = " ".join(cmd)
    return results


def _children_cpu() -> float:
    """User + system CPU seconds of the finished child processes (xdist workers included); 0 off POSIX."""
    try:
        import resource
    except ImportError:
        return 0.0
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def dtypes(entry) -> tuple:
    """The dtypes the entry's implementation declares, narrowest first (a plain function: its defaults)."""
    declared = resolve(entry.spec).capabilities.dtypes
    return tuple(d for d in DTYPES if d in declared)


def names(entry) -> set:
    """How the suite may call this backend in its results: its declared name or its spec."""
    return {entry.spec, getattr(resolve(entry.spec), "name", entry.spec)}


def rows(results, entry):
    known = names(entry)
    conf = [r for r in results.get("conformance", []) if r.get("backend") in known]
    sem = [r for r in results.get("semantics", []) if r.get("backend") in known]
    return conf, sem


def failures(results, entry, statuses=REJECTED, dtype=None) -> list:
    """(property[dtype], counterexample, message) for each property whose status is in `statuses`
    and each contradicted declaration, in `dtype` only when given; the expected family's first, its
    most specific property (the first it lists) first.

    A semantics row without a dtype (the profile asked in the backend's widest dtype only) counts
    for that widest dtype."""
    conf, sem = rows(results, entry)
    out = [(f"{r['property']}[{r.get('dtype')}]", r.get("counterexample"), r.get("message") or r["status"])
           for r in conf if r.get("status") in statuses and dtype in (None, r.get("dtype"))]
    widest = dtypes(entry)[-1]
    out += [(f"semantics:{r.get('question')}[{r.get('dtype') or widest}]", None,
             f"observed {r.get('observed')!r}, declared {r.get('declared')!r}")
            for r in sem if r.get("agrees") is False and dtype in (None, r.get("dtype") or widest)]
    return sorted(out, key=lambda f: rank(entry, f[0]))


def expected(entry, prop: str) -> bool:
    return any(c in prop for c in entry.catches)


def rank(entry, prop: str) -> int:
    """Where the property stands in the entry's expected family (listed most specific first);
    past the end when it is not in the family."""
    return next((i for i, c in enumerate(entry.catches) if c in prop), len(entry.catches))


def short(text, limit=240) -> str:
    text = text if isinstance(text, str) else json.dumps(text, default=str)
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + " ..."


def problem_of(message) -> str:
    """The shrunk problem ("Case(B=1 H=1 Lq=2 ...)") out of a failure message, else ''."""
    for line in str(message or "").splitlines():
        if line.strip().startswith("problem:"):
            return line.strip()[len("problem:"):].strip()
    return ""


def verdict_of(message) -> str:
    """The line saying what broke and by how much."""
    lines = [ln.strip() for ln in str(message or "").splitlines() if ln.strip()]
    return lines[1] if len(lines) > 1 and "failed on backend" in lines[0] else (lines[0] if lines else "")


def summarize(results) -> dict:
    """Per broken implementation and dtype: rejected or not, by what, on which minimal problem;
    per correct implementation and dtype: passed, skipped, false alarms."""
    broken, correct = [], []
    for e in BROKEN:
        for d in dtypes(e):
            fails = failures(results, e, dtype=d)
            first = fails[0] if fails else (None, None, None)
            broken.append({"implementation": e.label, "dtype": d, "family": e.family, "origin": e.origin,
                           "rejected": bool(fails), "expected_family": list(e.catches),
                           "in_family": bool(fails) and expected(e, first[0]),
                           "caught_by": first[0], "all_failures": [f[0] for f in fails],
                           "verdict": verdict_of(first[2]), "problem": problem_of(first[2]),
                           "message": first[2], "counterexample": first[1]})
    for e in CORRECT:
        conf, _ = rows(results, e)
        for d in dtypes(e):
            alarms = failures(results, e, ALARMS, dtype=d)
            mine = [r for r in conf if r.get("dtype") == d]
            correct.append({"implementation": e.label, "dtype": d, "origin": e.origin, "accepted": not alarms,
                            "passed": sum(r.get("status") == "passed" for r in mine),
                            "skipped": sum(r.get("status") == "skipped" for r in mine),
                            "false_alarms": [f[0] for f in alarms]})
    return {"seconds": results.get("_seconds"), "cpu_seconds": results.get("_cpu_seconds"),
            "command": results.get("_command"),
            "rejected": f"{sum(b['rejected'] for b in broken)}/{len(broken)}",
            "in_family": f"{sum(b['in_family'] for b in broken)}/{len(broken)}",
            "false_alarms": sum(not c["accepted"] for c in correct), "broken": broken, "correct": correct}


def markdown(summary) -> str:
    cpu = summary.get("cpu_seconds")
    lines = [f"# Proof of teeth: {summary['rejected']} (implementation, dtype) broken rejected "
             f"({summary['in_family']} by their expected family), {summary['false_alarms']} false alarms "
             f"(suite run {summary['seconds'] or 0:.1f} s" + (f", {cpu:.0f} CPU s)" if cpu else ")"), "",
             "| broken implementation | dtype | family | models | caught by | failed properties "
             "| minimal counterexample | what broke |",
             "|---|---|---|---|---|---|---|---|"]
    for b in summary["broken"]:
        caught = b["caught_by"] or "**NOT CAUGHT**"
        cells = (b["implementation"], b["dtype"], b["family"], b["origin"], caught, len(b["all_failures"]),
                 short(b["problem"], 140), short(b["verdict"], 160))
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    lines += ["", "| correct implementation | dtype | what differs | passed | skipped | false alarms |",
              "|---|---|---|---|---|---|"]
    for c in summary["correct"]:
        lines.append(f"| {c['implementation']} | {c['dtype']} | {c['origin']} | {c['passed']} | {c['skipped']} "
                     f"| {', '.join(c['false_alarms']) or 'none'} |")
    return "\n".join(lines) + "\n"


def write(summary, out_dir: Path) -> None:
    (out_dir / "teeth.json").write_text(json.dumps(summary, indent=1, default=str))
    (out_dir / "teeth.md").write_text(markdown(summary))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "attnspec-teeth", help="where teeth.md/json go")
    ap.add_argument("--workers", default=None, help="the suite run's pytest-xdist workers (-n; default a worker a CPU, 0: none)")
    args = ap.parse_args(argv)
    summary = summarize(run_teeth_suite(args.out, args.workers))
    write(summary, args.out)
    print(markdown(summary))
    ok = summary["rejected"] == f"{len(summary['broken'])}/{len(summary['broken'])}" and not summary["false_alarms"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
