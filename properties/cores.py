"""Which CPUs a suite process works on when several run side by side.

Suite processes run side by side in two ways: `pytest properties -n N` (pytest-xdist workers)
and `attnspec run` (one child pytest per backend, one per core).  Left alone, every framework
in every process sizes its thread pools for the whole machine (OpenBLAS, torch's intra-op pool,
XLA's Eigen pool, OpenVINO's TBB arena), so on this 2-core VM two suites ran 1.5-2x slower each
than one alone.  The suite's problems are small (a few hundred keys at most), so one core a
process loses little (numpy-naive alone: 11.3 s on two threads, 10.4 s pinned to one) and two
processes then share the machine without fighting.

A process is given its CPUs by ``ATTNSPEC_CPUS`` (a comma-separated list, set by `attnspec run`
for its children) or, as an xdist worker, a slice of the CPUs it may run on; it then restricts
its affinity to them and sets every thread pool's size to their count: the variables OpenMP,
OpenBLAS and MKL read when they load, threadpoolctl for a pool already loaded, torch's intra-op
pool when torch loads, and XLA (which sizes its pool from the affinity when its client starts).
``ATTNSPEC_CPUS=all`` (or one process alone) leaves everything as the machine has it.
"""
from __future__ import annotations

import os
from collections import OrderedDict

ENV = "ATTNSPEC_CPUS"
_POOL_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def parse(text: str) -> list[int] | None:
    """The CPU ids of an ATTNSPEC_CPUS value ("0", "2,3"); None for "all" or empty."""
    text = (text or "").strip()
    if text in ("", "all"):
        return None
    try:
        cpus = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"{ENV} must be CPU ids separated by commas (e.g. 0 or 2,3) or 'all'; got {text!r}") from None
    if not cpus or min(cpus) < 0:
        raise ValueError(f"{ENV} must name CPU ids >= 0; got {text!r}")
    return cpus


def worker_slice(index: int, count: int, allowed: list[int]) -> list[int]:
    """Worker `index` of `count`: an equal share of the allowed CPUs (one each when there are more
    workers than CPUs, round the ring)."""
    allowed = sorted(allowed)
    if count <= 1 or not allowed:
        return allowed
    share = len(allowed) // count
    if share == 0:
        return [allowed[index % len(allowed)]]
    return allowed[index * share:(index + 1) * share]


def _allowed() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def shares(jobs: int) -> list[str]:
    """ATTNSPEC_CPUS values for `jobs` processes side by side ("" each for one alone, or where
    this OS has no CPU affinity: left as they are)."""
    if jobs <= 1 or not hasattr(os, "sched_setaffinity"):
        return [""] * max(jobs, 1)
    return [",".join(map(str, worker_slice(i, jobs, _allowed()))) for i in range(jobs)]


WORKERS_ENV = "ATTNSPEC_WORKERS"


def workers_wanted(backends: int, environ=None) -> int:
    """How many pytest-xdist workers a run of the suite over `backends` backends starts by itself
    (0: none, the run stays in this process): one per CPU this process may use, at most one per
    backend (a backend's tests in a dtype share a worker); ATTNSPEC_WORKERS=N asks for N, 0 or 1 for none."""
    env = os.environ if environ is None else environ
    raw = env.get(WORKERS_ENV, "").strip().lower()
    if raw in ("", "auto"):
        wanted = len(parse(env.get(ENV, "")) or _allowed())  # ATTNSPEC_CPUS=0,1: the run keeps to those
    else:
        try:
            wanted = int(raw)
        except ValueError:
            raise ValueError(f"{WORKERS_ENV} must be a number of workers or 'auto'; got {raw!r}") from None
        if wanted < 0:
            raise ValueError(f"{WORKERS_ENV} must be >= 0 (0 or 1: one process); got {raw!r}")
    wanted = min(wanted, backends)
    return wanted if wanted >= 2 else 0


# options by which a user decides how the run is laid out (then it is left as they said)
_USER_CHOICES = ("-n", "--numprocesses", "--dist", "--maxprocesses", "--tx", "-d", "--pdb", "--trace",
                 "--sw", "--stepwise", "--co", "--collect-only", "--setup-plan", "--setup-only", "xdist",
                 "--looponfail", "-f")


def _user_chose(config) -> bool:
    """Whether the command line, PYTEST_ADDOPTS or the ini's addopts name a layout option."""
    words = list(config.invocation_params.args) + os.environ.get("PYTEST_ADDOPTS", "").split()
    try:
        words += list(config.getini("addopts"))
    except ValueError:
        pass
    return any(w == c or w.startswith(c + "=") or (c.startswith("-") and not c.startswith("--") and len(c) == 2
                                                    and w.startswith(c) and w[2:].isdigit())
               for w in words for c in _USER_CHOICES)


def spread(config, backends: int) -> None:
    """`pytest properties` over several backends with no layout of the user's: as if they had typed
    ``-n W --dist loadgroup --no-loadscope-reorder`` (W from `workers_wanted`: a worker a CPU; a
    backend's tests in a dtype on one worker; the groups in the order the plugin sorts them, the
    longest first).  Nothing the user said is changed."""
    if (hasattr(config, "workerinput") or not backends or not config.pluginmanager.hasplugin("xdist")
            or _user_chose(config) or not config.args):
        return
    from attnspec.properties import options
    if not all(options.reaches_suite(config, arg, inside=True) for arg in config.args):
        return
    workers = workers_wanted(backends)
    if workers:
        config.option.numprocesses, config.option.dist, config.option.loadscopereorder = workers, "loadgroup", False
        config._attnspec_workers = workers


def chosen(workerinput: dict | None = None, environ=None) -> list[int] | None:
    """The CPUs this process should keep, or None to leave it as it is."""
    env = os.environ if environ is None else environ
    given = parse(env.get(ENV, ""))
    if workerinput:  # an xdist worker: "gw3" of workercount, a slice of ATTNSPEC_CPUS or of what it may use
        count = int(workerinput.get("workercount") or 1)
        index = int(str(workerinput.get("workerid", "gw0")).lstrip("gw") or 0)
        if count > 1:
            return worker_slice(index, count, given or _allowed())
    return given


def pin(cpus: list[int] | None) -> None:
    """Restrict this process to `cpus` and size its thread pools to match (nothing for None)."""
    if not cpus:
        return
    threads = str(len(cpus))
    for var in _POOL_VARS:
        os.environ[var] = threads  # for runtimes not loaded yet (torch reads OMP_NUM_THREADS at import)
    os.environ[ENV] = ",".join(map(str, cpus))  # inherited by anything this process starts
    if hasattr(os, "sched_setaffinity"):
        allowed = set(_allowed())
        usable = [c for c in cpus if c in allowed]
        if usable:
            os.sched_setaffinity(0, usable)
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(limits=len(cpus))  # NumPy's OpenBLAS is loaded by the time the plugin runs
    except ImportError:
        pass
    import sys
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(len(cpus))


# The built-ins whose suites take longest here (compiling per shape: JAX, FlexAttention; OpenVINO
# per model), longest first.  Side by side, starting them first means the last suite to finish is
# a short one: `attnspec run` and the spread run both use it.
LONG_SUITES = ("jax-dpa", "torch-flex", "jax-naive", "openvino-sdpa", "openvino-sdpa-f32")


def suite_weight(backend: str, tests: int = 0) -> tuple:
    """Sort key, largest first: a known long suite by its place in LONG_SUITES, else its test count."""
    if backend in LONG_SUITES:
        return (1, len(LONG_SUITES) - LONG_SUITES.index(backend))
    return (0, tests)


def longest_first(items: list, target_of) -> None:
    """Reorder collected items so that each (backend, dtype) group stays together and the longest
    backends' groups come first (xdist's loadgroup then hands them out in this order)."""
    groups: dict = {}
    for item in items:
        t = target_of(item)
        groups.setdefault(None if t is None else (t.name, t.dtype), []).append(item)
    counts: dict = {}
    for key, members in groups.items():
        if key is not None:
            counts[key[0]] = counts.get(key[0], 0) + len(members)
    order = sorted(groups, key=lambda key: (key is not None, suite_weight(key[0], counts[key[0]]) if key else ()),
                   reverse=True)
    items[:] = [item for key in order for item in groups[key]]
