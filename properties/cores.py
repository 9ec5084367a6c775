"""Side by side over the cores: the suite's workers, and which backends' suites go first.

`pytest properties` over several backends, with pytest-xdist installed and no layout of the
user's, runs as if they had typed ``-n W --dist loadgroup`` (W: a worker a CPU this process may
use, at most one per backend; ``loadgroup``: a backend's tests in one dtype share a worker, and
with them the programs it compiled for that dtype).  One mechanism steers it, documented in
properties/README.md: ``ATTNSPEC_WORKERS`` (auto, N, or 0/1 for one process).  "No layout of the
user's" is read from pytest's parsed options (however spelled: command line, PYTEST_ADDOPTS,
the ini's addopts): no -n, --dist, --tx or --maxprocesses, and none of the modes that need one
process (--pdb, --trace, --stepwise, --collect-only, --setup-only/plan, --looponfail).
`attnspec run` starts one child per backend itself.  In both the longest suites start first, so
the last to finish is a short one; "longest" is what the previous run recorded (each row
carries its ``seconds``), in ``.attnspec/suite-seconds.json`` of the folder the run started in.
With nothing recorded a backend weighs its number of tests (pytest-xdist), or keeps its place
(`attnspec run`).

One CPU a worker: when the suite lays itself out over the cores (a worker, or an `attnspec run`
child, per CPU), each process is pinned to a CPU of its own (``ATTNSPEC_CPU``) and its thread
pools get one thread (OpenMP, OpenBLAS and MKL from the variables they read when they load, unless
the user set them; XLA, oneTBB and the rest size their pools from the pinned affinity).  Otherwise
every worker's runtimes start a thread per CPU and spin against each other's; the problems are
small, and one thread each did the same work in well under the time (docs/measurements.md).
The draws and the checks are the same either way; a run the user lays out keeps its threads.
"""
from __future__ import annotations

import json
import os

SECONDS_FILE = os.path.join(".attnspec", "suite-seconds.json")
WORKERS_ENV = "ATTNSPEC_WORKERS"
CPU_ENV = "ATTNSPEC_CPU"  # the slot of a process the suite laid out: pinned to the slot-th CPU it may use
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")  # read when the runtime loads
# pytest's parsed options (dests) of the modes that need the run in one process
_ONE_PROCESS_MODES = ("usepdb", "trace", "stepwise", "collectonly", "setuponly", "setupplan", "looponfail")


def workers_wanted(backends: int, environ=None) -> int:
    """How many pytest-xdist workers a run of the suite over `backends` backends starts by itself
    (0: none): one per CPU this process may use, at most one per backend; ATTNSPEC_WORKERS=N asks
    for N, 0 or 1 for none."""
    env = os.environ if environ is None else environ
    raw = env.get(WORKERS_ENV, "").strip().lower()
    if raw in ("", "auto"):
        wanted = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    else:
        try:
            wanted = int(raw)
        except ValueError:
            raise ValueError(f"{WORKERS_ENV} must be a number of workers or 'auto'; got {raw!r}") from None
        if wanted < 0:
            raise ValueError(f"{WORKERS_ENV} must be >= 0 (0 or 1: one process); got {raw!r}")
    wanted = min(wanted, backends)
    return wanted if wanted >= 2 else 0


def user_laid_out(config) -> bool:
    """Whether the run's own options (as pytest parsed them) say how it is laid out, or need one process."""
    o = config.option
    if getattr(o, "numprocesses", None) is not None or getattr(o, "dist", "no") != "no" \
            or getattr(o, "tx", None) or getattr(o, "maxprocesses", None):
        return True
    return any(getattr(o, mode, False) for mode in _ONE_PROCESS_MODES)


def spread(config, backends: int) -> int:
    """Lay the suite over `workers_wanted` pytest-xdist workers (loadgroup) when the user did not;
    the number of workers started (0: the run stays as it is)."""
    if hasattr(config, "workerinput") or not backends or not config.pluginmanager.hasplugin("xdist") \
            or user_laid_out(config):
        return 0
    workers = workers_wanted(backends)
    if workers:
        # --no-loadscope-reorder: xdist hands the groups out in the plugin's order, the longest first
        config.option.numprocesses, config.option.dist, config.option.loadscopereorder = workers, "loadgroup", False
    return workers


def one_cpu_each(environ, slot: int | str | None = None) -> dict:
    """The variables of a process laid out one a CPU: one thread for the runtimes that read a variable
    (those the user set are kept), and its slot (`pin`) when given."""
    out = {var: environ.get(var) or "1" for var in THREAD_VARS}
    if slot is not None:
        out[CPU_ENV] = str(slot)
    return out


def pin(environ=None, worker: str | None = None) -> int | None:
    """Pin this process to its CPU (``ATTNSPEC_CPU``: a slot, or "xdist" for pytest-xdist worker `worker`,
    "gw3" -> slot 3); the CPU, or None when nothing asks for it or the platform cannot."""
    env = os.environ if environ is None else environ
    raw = env.get(CPU_ENV, "").strip()
    if raw == "xdist":
        raw = (worker or "").removeprefix("gw")
    if not raw.isdigit() or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    cpu = allowed[int(raw) % len(allowed)]
    os.sched_setaffinity(0, {cpu})
    return cpu


def recorded_seconds(folder: str) -> dict[str, float]:
    """backend -> seconds its suite took in the last run that recorded it (empty when none did)."""
    try:
        with open(os.path.join(folder, SECONDS_FILE)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))} if isinstance(data, dict) else {}


def record_seconds(folder: str, rows: list) -> None:
    """Add the seconds of each backend in `rows` (conformance rows) to the record, keeping the others'."""
    totals: dict[str, float] = {}
    for r in rows:
        if r.get("backend"):
            totals[r["backend"]] = totals.get(r["backend"], 0.0) + float(r.get("seconds") or 0.0)
    if not totals:
        return
    path = os.path.join(folder, SECONDS_FILE)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".lock", "w") as lock:  # `attnspec run`'s children finish side by side
            _locked(lock)
            merged = {**recorded_seconds(folder), **{b: round(s, 2) for b, s in totals.items()}}
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(merged, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
    except OSError:  # a read-only folder: the next run keeps the fallback order
        pass


def _locked(f) -> None:
    try:
        import fcntl
    except ImportError:  # not POSIX: a lost update costs only an order
        return
    fcntl.flock(f, fcntl.LOCK_EX)


def suite_weight(backend: str, recorded: dict, tests: int = 0) -> tuple:
    """Sort key, largest first: the backend's recorded seconds, else its number of tests."""
    return (1, recorded[backend]) if backend in recorded else (0, tests)


def longest_first(items: list, target_of, recorded: dict) -> None:
    """Reorder collected items so that each (backend, dtype) group stays together and the longest
    backends' groups come first (pytest-xdist's loadgroup then hands them out in this order)."""
    groups: dict = {}
    for item in items:
        t = target_of(item)
        groups.setdefault(None if t is None else (t.name, t.dtype), []).append(item)
    counts: dict = {}
    for key, members in groups.items():
        if key is not None:
            counts[key[0]] = counts.get(key[0], 0) + len(members)
    order = sorted(groups, key=lambda key: (key is not None, suite_weight(key[0], recorded, counts[key[0]])
                                            if key else ()), reverse=True)
    items[:] = [item for key in order for item in groups[key]]
