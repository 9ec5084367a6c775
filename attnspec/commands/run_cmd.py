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
import sys
import tempfile
import time

from attnspec.errors import UserError
from attnspec.reports import runner as _procs
from attnspec.reports import suites
from attnspec.reports.runner import ROOT

# Benchmark grid per mode: benchmarks/_grid.py defines each (ATTNSPEC_BENCH_GRID), so `asv run`
# by hand measures what `attnspec run` does.  asv runs every parameter combination in a process
# forked from one server that has the frameworks imported (~10 ms each), so the calls at large T
# and the number of backends set the time.  Default: the T sweep 4..2048 (float32 both ops; the
# 16-bit dtypes forward at T = 4, 256, 2048), decode (Lq 1 and 4, Lk 256 and 2048, Hkv 8/2/1),
# causal and sliding-window problems, extra memory (forward), the machine's peaks and bandwidth.
# Three samples per combination make the report's medians; asv run by hand takes 6, what asv
# continuous needs to call a change significant (benchmarks/_grid.py SAMPLES).
MODES = {"quick": {"ATTNSPEC_BENCH_GRID": "quick"},
         "default": {"ATTNSPEC_BENCH_GRID": "default", "ATTNSPEC_BENCH_SAMPLES": "3"},
         "full": {"ATTNSPEC_BENCH_GRID": "full", "ATTNSPEC_BENCH_SAMPLES": "3"}}
# Seconds per backend: the suite takes 20-140 s per backend here with the machine shared,
# so the limit only stops a hang; suites run side by side, so it rarely adds to the wall time.
# one backend's whole suite: a safety net (a hung call is ended after ATTNSPEC_CALL_TIMEOUT);
# the slowest here, jax-dpa with a cold compilation cache, takes ~3 min on 2 cores
SUITE_TIMEOUT = {"quick": 1200, "default": 1200, "full": 2400}
_PROBE = ("import json, sys\nfrom backends import registry\nout = []\nfor name in sys.argv[1:]:\n"
          "    try:\n        backend = registry.resolve(name)\n        (ok, why), shown = backend.availability(), backend.name\n"
          "    except registry.BackendSelectionError as e:\n        ok, why, shown = None, str(e), name\n"
          "    out.append([name, ok, why, shown])\nprint('ATTNSPEC-PROBE ' + json.dumps(out))\n")


def add_parser(sub):
    p = sub.add_parser("run", help="run the conformance suite and the benchmarks, then write the report",
                       description="Run the conformance suite once per backend (each in its own process), the "
                       "asv benchmark sweep, and write the HTML and CSV report.  Exit status: 0 all "
                       "selected backends conform, 1 some do not (or crashed/timed out, or a backend named "
                       "with --backend was not tested), 2 bad input.")
    p.add_argument("--backend", action="append", metavar="NAME", help="a built-in name or package.module:attr "
                   "(repeatable; default: ATTNSPEC_BACKENDS, else every built-in whose framework is installed)")
    p.add_argument("--out", default=os.path.join(ROOT, "reports", "out"), help="report folder (default: reports/out)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", dest="mode", const="quick",
                      help="a small benchmark grid (float32 forward, T in {64, 256, 1024}), one sample each, "
                      "nothing saved: a smoke test")
    size.add_argument("--full", action="store_const", dest="mode", const="full",
                      help="the whole benchmark sweep: T = 4..2048 every power of two, E in {16, 64, 128}, every "
                      "dtype and op, decode up to Lk = 32768")
    p.add_argument("--no-bench", action="store_true", help="skip the benchmarks (conformance only)")
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
    if not os.path.isdir(os.path.join(ROOT, "properties")):
        raise UserError(f"the conformance suite is not at {ROOT}/properties: attnspec run works in a source checkout")
    if not args.no_bench and shutil.which("asv") is None:
        raise UserError("asv is not installed (pip install -e \".[bench]\"); or pass --no-bench to skip the benchmarks")
    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {args.jobs}")
    if args.suite_timeout is not None and not args.suite_timeout > 0:
        raise UserError(f"--suite-timeout must be a positive number of seconds, got {args.suite_timeout}")


def probe(names: list[str]) -> list[tuple]:
    """[(name, available, reason, the backend's own name)] from a child; available None = unknown name."""
    res = _procs.run_captured([sys.executable, "-c", _PROBE, *names], timeout=180)
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


def select_backends(args) -> tuple[list[tuple], list[dict]]:
    """[(name as given, the backend's own name)] to run, and skipped rows (with the reason)."""
    from attnspec.backends import registry  # imports no framework

    explicit = named(args)
    names = list(dict.fromkeys(explicit or registry.builtin_names()))
    chosen, skipped = [], []
    for name, ok, why, shown in probe(names):
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
    if not chosen:
        raise UserError("none of the selected backends is available here: " + "; ".join(
            f"{r['backend']}: {r['message']}" for r in skipped))
    return chosen, skipped


def run_suites(chosen: list[tuple], limit: float, workdir: str, jobs: int) -> dict:
    """Conformance and semantics rows from one child pytest per backend, `jobs` at a time, each
    child on a share of the CPUs of its own (side by side, their thread pools fought over them)."""
    import queue
    from concurrent.futures import ThreadPoolExecutor

    from attnspec.properties import cores

    slots: queue.Queue = queue.Queue()
    for share in cores.shares(jobs):  # one per running child; a child gives its share back when it ends
        slots.put(share)

    def one(i, name, shown):
        path = os.path.join(workdir, f"suite-{i}.json")
        _procs.say(f"[suite {i}/{len(chosen)}] {name}: started")
        progress = suites.SuiteProgress(label=shown, redraw=False if jobs > 1 else None)
        cpus = slots.get()
        try:
            data = suites.run_suite(name, path, limit, shown=shown, progress=progress, cpus=cpus)
        finally:
            slots.put(cpus)
        _procs.say(f"[suite {i}/{len(chosen)}] done: {progress.text()}")
        return data

    # the longest suites start first, so the last to finish is a short one (the rows keep `chosen`'s order)
    todo = sorted(enumerate(chosen, 1), key=lambda t: cores.suite_weight(t[1][0]), reverse=True)
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = {i: pool.submit(one, i, n, s) for i, (n, s) in todo}
        parts = [futures[i].result() for i in sorted(futures)]
    except BaseException:  # Ctrl-C reaches only this thread; the children run in their own sessions
        pool.shutdown(wait=False, cancel_futures=True)
        _procs.kill_all()
        raise
    pool.shutdown()
    return {key: [row for part in parts for row in part[key]] for key in ("conformance", "semantics")}


# Each CPU built-in's share of a default benchmark run (seconds, this 2-core VM, at 81bfed8; the
# compiled flex's estimated for the 60 s budget): the shards are balanced on these over *every*
# built-in, so a backend's shard never depends on which others run (its results stay in one asv
# environment from run to run); a plug-in, or a GPU built-in, goes by its name's hash.  By name's
# hash alone the two shards took 115 and 181 s.
BENCH_SECONDS = {"torch-flex-compiled": 74, "torch-flex": 45, "torch-math": 32, "jax-naive": 27, "jax-dpa": 21,
                 "openvino-sdpa": 20, "openvino-sdpa-f32": 20, "numpy-naive": 16, "numpy-tiled": 16,
                 "torch-sdpa-cpu-math": 12, "torch-sdpa-cpu": 11, "torch-sdpa-cpu-flash": 11,
                 "onnxruntime-attention": 10}


def bench_shards(names: list[str], jobs: int) -> list[list[str]]:
    """`names` split into `jobs` shards: the built-ins by BENCH_SECONDS, longest first, each to the
    least loaded shard; any other backend by its name's hash."""
    import zlib

    load, home = [0.0] * jobs, {}
    for name in sorted(BENCH_SECONDS, key=lambda n: (-BENCH_SECONDS[n], n)):
        i = min(range(jobs), key=lambda j: (load[j], j))
        home[name], load[i] = i, load[i] + BENCH_SECONDS[name]
    return [[n for n in names if home.get(n, zlib.crc32(n.encode()) % jobs) == i] for i in range(jobs)]


def run_benchmarks(chosen: list[tuple], mode: str, commit: str) -> tuple[str, int]:
    """asv over the available backends at `commit`; returns asv's results folder and status.

    The machine's benchmarks (matmul peaks, bandwidth, fidelity) run first, alone; then the
    attention benchmarks in one asv process per core (ATTNSPEC_BENCH_JOBS), each with its own
    share of the backends.  Every benchmark is single-threaded and times CPU time, so two side by
    side on two cores use the machine as one would not: half the wall time.  Each shard is an
    asv "existing" environment of its own interpreter path (a link under .asv/shards/), so its
    results file never overwrites another's; a backend's shard is fixed by its name (`bench_shards`),
    so its results of two runs share an environment and `asv compare` matches them."""
    from concurrent.futures import ThreadPoolExecutor

    _procs.ensure_asv_machine()
    names = [n for n, _ in chosen]
    jobs = max(1, min(int(os.environ.get("ATTNSPEC_BENCH_JOBS") or os.cpu_count() or 1), len(names)))
    shards = [s for s in bench_shards(names, jobs) if s] or [names]
    base = ["asv", "run", "--set-commit-hash", commit] + (["--quick"] if mode == "quick" else [])
    print(f"[bench] asv run at commit {commit[:8]} (grid: {mode}; {len(shards)} process(es) side by side; "
          "benchmarks/README.md)", flush=True)
    start = time.monotonic()
    machine_env = _procs.child_env(ATTNSPEC_BACKENDS=",".join(names), **MODES[mode])
    rcs = [_procs.stream(base + ["--environment", f"existing:{sys.executable}", "--bench", "^bench_machine"],
                         env=machine_env, prefix="  ")]

    def shard(i: int) -> int:
        env = _procs.child_env(ATTNSPEC_BACKENDS=",".join(shards[i]), **MODES[mode])
        cmd = base + ["--environment", f"existing:{_shard_python(i)}", "--bench", "^(?!bench_machine)"]
        return _procs.stream(cmd, env=env, prefix=f"  [{i + 1}/{len(shards)}] " if len(shards) > 1 else "  ")

    with ThreadPoolExecutor(max_workers=len(shards)) as pool:
        rcs += list(pool.map(shard, range(len(shards))))
    rc = next((r for r in rcs if r), 0)
    state = "done" if rc == 0 else f"asv exited with status {rc}; the report keeps what it recorded"
    print(f"[bench] {state} in {time.monotonic() - start:.0f} s", flush=True)
    return _procs.asv_results_dir(), rc


def _shard_python(i: int) -> str:
    """This interpreter, under a path of its own for shard i > 0 (asv names environments by path).

    In a virtual environment the path is a view of it (its pyvenv.cfg and lib/ linked beside
    bin/python): Python finds its venv from a pyvenv.cfg beside or above the path it was started
    by, so a bare link would start the base interpreter without the venv's packages (seen on the
    GPU machine, whose python3 is a venv: asv could not import the benchmarks in shard 2)."""
    if i == 0:
        return sys.executable
    folder = os.path.join(ROOT, ".asv", "shards", str(i))
    in_venv = sys.prefix != sys.base_prefix
    links = {os.path.join("bin", "python") if in_venv else "python": sys.executable}
    if in_venv:
        links.update({name: os.path.join(sys.prefix, name) for name in ("pyvenv.cfg", "lib", "lib64")
                      if os.path.lexists(os.path.join(sys.prefix, name))})
    for rel, target in links.items():
        link = os.path.join(folder, rel)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if os.path.realpath(link) != os.path.realpath(target):
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(target, link)
    return os.path.join(folder, next(iter(links)))


def run(args) -> int:
    from attnspec.reports import build, inputs

    try:
        return _run(args, build, inputs)
    except inputs.ReportInputError as e:
        raise UserError(str(e)) from None


def _run(args, build, inputs) -> int:
    from attnspec.backends import registry  # imports no framework

    _require_tools(args)
    commit = None if args.no_bench else _procs.git_head()  # before the long part: fail fast
    start = time.monotonic()
    chosen, skipped = select_backends(args)
    limit = args.suite_timeout or SUITE_TIMEOUT[args.mode]
    workdir = tempfile.mkdtemp(prefix="attnspec-run-")
    try:
        checked = chosen if named(args) else [(n, s) for n, s in chosen if n not in registry.SUITE_OPT_IN]
        for name in sorted({n for n, _ in chosen} - {n for n, _ in checked}):
            print(f"  not checked by default (benchmarked only): {name}: {registry.SUITE_OPT_IN[name]}")
        suite = run_suites(checked, limit, workdir, args.jobs or min(len(checked), os.cpu_count() or 1))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    collected = inputs.Inputs(conformance=skipped + suite["conformance"], semantics=suite["semantics"])
    measured = os.path.join(ROOT, "reports", "detection-power", inputs.DETECTION_FILE)
    if os.path.isfile(measured):  # the detection-power figures measured for this checkout
        collected.detection = inputs.read_detection_csv(measured)
    asv_rc = 0
    if not args.no_bench:
        results_dir, asv_rc = run_benchmarks(chosen, args.mode, commit)
        if os.path.isdir(results_dir):
            collected.asv_dirs.append(results_dir)
    summary = build.build(collected, args.out, asv_commit=commit)
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
    return 1 if summary["problems"] or asv_rc or asked_untested else 0
