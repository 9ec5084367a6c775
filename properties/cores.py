"""How a run of the suite over several backends spreads itself over the cores.

`pytest properties` over several backends starts pytest-xdist workers by itself (a worker a CPU,
a group per backend and dtype, the longest backends first), through xdist's public options;
`attnspec run` starts its suite children in the same order.  Pinning each worker to a CPU of its
own, which this module also did, gained nothing measurable and was removed (the figures:
properties/README.md, "Side by side").
"""
from __future__ import annotations

import os


def _allowed() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


WORKERS_ENV = "ATTNSPEC_WORKERS"


def workers_wanted(backends: int, environ=None) -> int:
    """How many pytest-xdist workers a run of the suite over `backends` backends starts by itself
    (0: none, the run stays in this process): one per CPU this process may use, at most one per
    backend (a backend's tests in a dtype share a worker); ATTNSPEC_WORKERS=N asks for N, 0 or 1 for none."""
    env = os.environ if environ is None else environ
    raw = env.get(WORKERS_ENV, "").strip().lower()
    if raw in ("", "auto"):
        wanted = len(_allowed())  # the CPUs this process may use (taskset keeps a run to fewer)
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
