"""attnspec run: the conformance suite per backend (each in its own process), asv, the report.

A backend that kills its interpreter is recorded as `crashed`; one whose call hangs past the
per-call limit (ATTNSPEC_CALL_TIMEOUT), or whose suite runs past the per-backend limit, as
`timed_out` (its process is ended at once); the other backends go on.  A backend asked for
with --backend that ends up not tested (unavailable, every check skipped) fails the run.  This process never imports a
framework: which backends are available is asked of a child process too.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

from attnspec import asvtool, benchrun, files, procs, suites
from attnspec.errors import UserError
from attnspec.properties import profiles  # imports nothing heavy (no Hypothesis until a profile loads)

# one backend's whole suite: a safety net (a hung call is ended after ATTNSPEC_CALL_TIMEOUT), well
# above the slowest built-in's suite (jax-dpa with its programs not yet compiled: docs/measurements.md)
SUITE_TIMEOUT = {"quick": 1200, "default": 1200, "full": 2400}
DEFAULT_OUT = os.path.join("reports", "out")  # under the current folder
# What a run of named backends is benchmarked beside (benchmarked only, never checked): NumPy,
# PyTorch and JAX, so your kernel's time, memory and rates read against theirs in the report.
BASELINES = ("numpy-naive", "torch-sdpa-cpu", "jax-dpa")
_PROBE = ("import json, sys\nfrom attnspec.backends import registry\nout = []\nfor name in sys.argv[1:]:\n"
          "    try:\n        backend = registry.resolve(name)\n        (ok, why), shown = backend.availability(), backend.name\n"
          "    except registry.BackendSelectionError as e:\n        ok, why, shown = None, str(e), name\n"
          "    out.append([name, ok, why, shown])\nprint('ATTNSPEC-PROBE ' + json.dumps(out))\n")


def add_parser(sub):
    p = sub.add_parser("run", help="run the conformance suite and the benchmarks, then write the report",
                       description="Run the conformance suite once per backend (each in its own process), the "
                       "asv benchmark sweep, and write the HTML and CSV report.  Exit status: 0 all "
                       "selected backends conform, 1 some do not (or crashed/timed out, or a backend named "
                       "with --backend was not tested, or a result could not be read: the report is "
                       "incomplete), 2 bad input (or another attnspec run is running in this folder).")
    p.add_argument("--backend", action="append", metavar="NAME", help="a built-in name or package.module:attr "
                   "(repeatable; default: ATTNSPEC_BACKENDS, else every built-in whose framework is installed)")
    p.add_argument("--out", default=DEFAULT_OUT, help="report folder (default: ./reports/out, under the current folder)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", dest="mode", const="quick",
                      help="a small benchmark grid (float32 forward, T in {64, 256, 1024}), one sample each, "
                      "nothing saved: a smoke test")
    size.add_argument("--full", action="store_const", dest="mode", const="full",
                      help="the whole benchmark sweep: T = 4..2048 every power of two, E in {16, 64, 128}, every "
                      "dtype and op, decode up to Lk = 32768")
    p.add_argument("--no-bench", action="store_true", help="skip the benchmarks (conformance only)")
    p.add_argument("--baselines", default=",".join(BASELINES), metavar="A,B",
                   help="with --backend: built-ins benchmarked (not checked) beside yours, those installed "
                   f"(default: {','.join(BASELINES)}; '' for none)")
    p.add_argument("--jobs", type=int, metavar="N", help="suites run side by side (default: one per core); "
                   "the attention benchmarks run one asv process per core (ATTNSPEC_BENCH_JOBS)")
    p.add_argument("--suite-timeout", type=float, metavar="SECONDS",
                   help="limit for one backend's suite (default 1200; 2400 with --full)")
    p.set_defaults(func=run, mode="default")
    return p


def _require_tools(args) -> None:
    from attnspec.reports import build, writer

    try:  # before anything runs: the swap at the end would replace the folder whole
        writer.check_out_dir(args.out)
    except writer.OutDirError as e:
        raise UserError(str(e)) from None
    build.require_modules()
    if not args.no_bench and (why := asvtool.missing()):
        raise UserError(why)
    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {args.jobs}")
    if args.suite_timeout is not None and not args.suite_timeout > 0:
        raise UserError(f"--suite-timeout must be a positive number of seconds, got {args.suite_timeout}")


def probe(names: list[str]) -> list[tuple]:
    """[(name, available, reason, the backend's own name)] from a child; available None = unknown name."""
    res = procs.run_captured([sys.executable, "-c", _PROBE, *names], timeout=180)
    for line in res.output.splitlines():
        if line.startswith("ATTNSPEC-PROBE "):
            return [tuple(x) for x in json.loads(line[len("ATTNSPEC-PROBE "):])]
    # The probe itself died (a plug-in that crashes on import): let each suite run find out.
    print(f"attnspec run: could not check availability ({res.describe()}); running every backend", file=sys.stderr)
    return [(n, True, "", n) for n in names]


def named(args) -> list[str] | None:
    """The backends the user asked for (--backend, else ATTNSPEC_BACKENDS); None: the default selection."""
    from attnspec.backends import registry  # imports no framework

    return args.backend or registry.names_from_env()


def run_profile(args) -> str:
    """The suites' profile: the one asked for (ATTNSPEC_PROFILE), else deep for a few named
    backends and dev for the run over every built-in - the depth follows the run's selection."""
    named_backends = named(args)
    try:
        return profiles.choose(len(named_backends) if named_backends else 0)
    except ValueError as e:
        raise UserError(str(e)) from None


def baselines(args) -> list[str]:
    """The built-ins a run of named backends is benchmarked beside (none without --backend)."""
    from attnspec.backends import registry  # imports no framework

    if not named(args) or args.no_bench:
        return []
    wanted = [b.strip() for b in (args.baselines or "").split(",") if b.strip()]
    unknown = [b for b in wanted if b not in registry.BUILTINS]
    if unknown:
        raise UserError(f"--baselines: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not a built-in "
                        f"(built-ins: {', '.join(registry.builtin_names())})")
    return [b for b in wanted if b not in named(args)]


def select_backends(args) -> tuple[list[tuple], list[dict], list[tuple]]:
    """[(name as given, the backend's own name)] to run, skipped rows (with the reason), and the
    baselines available here (benchmarked only)."""
    from attnspec.backends import registry  # imports no framework

    explicit = named(args)
    names = list(dict.fromkeys(explicit or registry.builtin_names()))
    extra = baselines(args)
    chosen, skipped, beside = [], [], []
    for name, ok, why, shown in probe(names + extra):
        if name in extra and name not in names:
            if ok:
                beside.append((name, shown))
            continue
        if ok is None:
            raise UserError(why)
        if ok:
            chosen.append((name, shown))
        else:
            skipped.append({"backend": shown, "property": "(all)", "dtype": "", "status": "skipped",
                            "examples": 0, "seconds": 0.0, "counterexample": "", "message": why})
    how = "as asked" if explicit else "every built-in whose framework is installed"
    print(f"attnspec run: backends ({how}): {', '.join(n for n, _ in chosen) or 'none'}")
    for row in skipped:
        print(f"  skipped {row['backend']}: {row['message']}")
    if beside:
        print(f"  benchmarked beside them (not checked; --baselines): {', '.join(n for n, _ in beside)}")
    if not chosen:
        raise UserError("none of the selected backends is available here: " + "; ".join(
            f"{r['backend']}: {r['message']}" for r in skipped))
    return chosen, skipped, beside


LOCK = os.path.join(".attnspec", "run.lock")  # under the current folder, beside asv's folders


def run(args) -> int:
    from attnspec.reports import build, inputs

    main = threading.current_thread() is threading.main_thread()  # signal handlers live in the main thread
    previous = signal.signal(signal.SIGTERM, _interrupted) if main else None  # SIGTERM ends the run as Ctrl-C does
    try:  # one run at a time in a folder: two would write the same asv folders and report
        with files.run_lock(LOCK):
            procs.start_run()  # an earlier run in this process that was interrupted left its stop set
            return _run(args, build, inputs)
    except files.RunLocked as e:
        raise UserError(str(e)) from None
    except inputs.ReportInputError as e:
        raise UserError(str(e)) from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _interrupted(signum, frame):
    """SIGTERM: unwind as Ctrl-C does - children killed, the lock released, no report swapped in."""
    raise KeyboardInterrupt(f"signal {signum}")


def _run(args, build, inputs) -> int:
    from attnspec.backends import registry  # imports no framework

    _require_tools(args)
    commit = None if args.no_bench else procs.git_head()  # before the long part: fail fast
    start = time.monotonic()
    chosen, skipped, beside = select_backends(args)
    limit = args.suite_timeout or SUITE_TIMEOUT[args.mode]
    workdir = tempfile.mkdtemp(prefix="attnspec-run-")
    try:
        checked = chosen if named(args) else [(n, s) for n, s in chosen if n not in registry.SUITE_OPT_IN]
        for name in sorted({n for n, _ in chosen} - {n for n, _ in checked}):
            print(f"  not checked by default (benchmarked only): {name}: {registry.SUITE_OPT_IN[name]}")
        profile = run_profile(args)
        print(f"attnspec run: profile {profile} ({profiles.EXAMPLES[profile]} drawn problems a property; "
              f"{'deep for the few backends named' if profile == 'deep' else 'ATTNSPEC_PROFILE to choose'})")
        suite = suites.run_suites(checked, limit, workdir, args.jobs or min(len(checked), os.cpu_count() or 1),
                                  profile=profile)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    collected = inputs.Inputs(conformance=skipped + suite["conformance"], semantics=suite["semantics"],
                              declarations=suite.get("declarations", []))
    measured = os.path.join(procs.ROOT, "reports", "detection-power", inputs.DETECTION_FILE)
    if os.path.isfile(measured):  # the detection-power figures measured for this checkout
        collected.detection = inputs.read_detection_csv(measured)
    asv_rc = 0
    if not args.no_bench:
        results_dirs, asv_rc, not_merged = benchrun.run_benchmarks(chosen + beside, args.mode, commit)
        collected.asv_dirs += results_dirs
        for skip in not_merged:  # the report names them too, as it reads the same files
            print(f"attnspec run: not merged into the grid's asv database: {skip}", file=sys.stderr)
    summary = build.build(collected, args.out, asv_commit=commit)
    for skip in summary["skipped"]:
        print(f"attnspec run: skipped: {skip}", file=sys.stderr)
    untested = summary["not_tested"]
    print(f"attnspec run: report written to {os.path.join(summary['out'], 'index.html')} "
          f"({summary['backends']} backends, {summary['problems']} problem(s), {len(untested)} not tested; "
          f"{time.monotonic() - start:.0f} s)")
    if asv_rc:
        print(f"attnspec run: asv exited with status {asv_rc}: the benchmark results may be incomplete", file=sys.stderr)
    # nothing tested is not a pass: a backend the user asked for must have been tested
    asked_untested = untested if named(args) else {}
    for backend, why in asked_untested.items():
        print(f"attnspec run: {backend} was asked for but not tested: {why or 'every check was skipped'}", file=sys.stderr)
    if summary["skipped"]:
        print(f"attnspec run: the report is incomplete: {len(summary['skipped'])} input(s) could not be read",
              file=sys.stderr)
    return 1 if summary["problems"] or asv_rc or asked_untested or summary["skipped"] else 0
