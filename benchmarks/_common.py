"""What every attention benchmark shares: backends, workloads, inputs and the prepared call.

asv runs each parameter combination in its own process (forked from asv's server, see
benchmarks/__init__.py) and, with a `setup` hook present, re-runs `setup` before every timed
call (asv-runner >= 0.3), so `prepared()` caches the converted inputs and the warmed-up callable
per combination: the re-run is a dict lookup; conversion, compilation and warm-up stay out of
the timed region.  Importing this module loads no framework; a backend loads its own.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from attnspec.benchmarks import _threads  # first: thread variables before NumPy loads
from attnspec.benchmarks._grid import BACKEND_BUDGET_SECONDS, BATCH, HEADS, MAX_CALL_SECONDS  # noqa: F401 - re-exported

# isort: split
import numpy as np  # after _threads (above): the BLAS reads its thread count when NumPy loads

THREADS = _threads.THREADS
_threads.limit()

from attnspec.backends import registry, serving  # noqa: E402
from attnspec.backends.base import BackendUnavailable, Unsupported  # noqa: E402
from attnspec.specs import cost  # noqa: E402

# The clock of the time_ benchmarks. "process" = the process's CPU time: with one thread it is
# the call's compute time, blind to waiting for a core (on the shared 2-core VM, under load 6-8,
# wall-clock medians of numpy-naive were flat from T=256 to 2048). "wall" = perf_counter, the
# latency: right on a quiet machine and for GPU backends (CPU time misses device work).
CLOCKS = ("process", "wall")
CLOCK = os.environ.get("ATTNSPEC_CLOCK") or ("process" if THREADS == 1 else "wall")
if CLOCK not in CLOCKS:
    raise ValueError(f"ATTNSPEC_CLOCK={CLOCK!r}: expected one of {', '.join(CLOCKS)}")
SEED = 20240601


def log(message: str) -> None:
    """asv keeps a benchmark's stderr in its log: say why a combination is skipped."""
    print(f"attnspec-bench: {message}", file=sys.stderr)


def skip(why: str):
    """asv's skip: NotImplementedError in setup (the result is n/a; the reason is in the log)."""
    log(f"skip: {why}")
    raise NotImplementedError(why)


def device_of(name: str) -> str:
    """The device a backend declares (a built-in's read without importing its framework)."""
    try:
        return registry.resolve(name).capabilities.device
    except registry.BackendSelectionError:
        return "cpu"


def _installed_builtins() -> list[str]:
    """Every built-in whose framework is installed and whose device seems present.

    Checked without importing a framework (find_spec only).  The device check is a cheap look
    for an NVIDIA device node; where it guesses wrong, the backend's setup still raises
    NotImplementedError with the real reason (a skip).
    """
    import importlib.util
    import inspect

    gpu = os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")
    names = []
    for name in registry.builtin_names():
        module, _, attr = registry.BUILTINS[name].partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)  # adapters import no framework
        except (ImportError, AttributeError) as e:  # a built-in this checkout lacks
            log(f"built-in {name} not importable: {e}")
            continue
        device = cls.capabilities.device if inspect.isclass(cls) else "cpu"
        frameworks = _threads.frameworks_of([name])
        if all(importlib.util.find_spec(f) is not None for f in frameworks) and (device == "cpu" or gpu):
            names.append(name)
    return names


def backend_names() -> list[str]:
    """ATTNSPEC_BACKENDS (the plug-in contract), else every installed built-in."""
    names = registry.names_from_env()
    return list(names or _installed_builtins())


@dataclass(frozen=True)
class Workload:
    """One problem shape: q (B, Hq, Lq, E), k and v (B, Hkv, Lk, E); a mask kind."""

    batch: int = BATCH
    hq: int = HEADS
    hkv: int = HEADS
    lq: int = 1
    lk: int = 1
    e: int = 64
    mask: str = "none"  # none | causal | window-N (N keys, own included) | decode (causal, bottom-right)
    format: str = "padded"  # or a serving format (specs.formats.FORMATS): packed, paged-NHD, ...
    page_size: int = 0  # a paged format's

    def fields(self) -> dict:
        """Backend.prepare's keyword arguments for this problem."""
        out = {}
        if self.format == "packed":  # a mixed varlen batch: sequence b has specs.cost.prefill_lengths' length
            lengths = np.array(cost.prefill_lengths(self.lq, self.batch))
            out.update(q_lengths=lengths, kv_lengths=lengths, positions="per_sequence")
        elif self.format.startswith("paged-"):  # every cache full, its pages placed at random in the pool
            out["positions"] = "per_sequence"
        if self.hkv != self.hq:
            out["enable_gqa"] = True
        if self.mask.startswith("window-"):
            out["window"] = (int(self.mask[7:]) - 1, 0)
        if self.mask == "decode" and self.lq > 1:  # new tokens see the cache and each other causally
            out["causal_alignment"] = "bottom_right"
        return out

    @property
    def is_causal(self) -> bool:
        return self.mask == "causal" or (self.mask == "decode" and self.lq > 1)

    def scaled(self, t: int) -> "Workload":
        """The same problem at Lq = Lk = t (to predict a large call's time from a small one)."""
        return Workload(self.batch, self.hq, self.hkv, t, t, self.e, self.mask, self.format, self.page_size)


def timer_for(backend, clock: str):
    """The function asv times with: CPU time only where the work runs on this process's CPU."""
    if clock == "process" and backend.capabilities.device == "cpu":
        return time.process_time
    return time.perf_counter


class Prepared:
    """One combination, converted and warmed up: `run()` is the timed call."""

    def __init__(self, backend, inputs: tuple, run, call_seconds: float, workload: Workload):
        self.backend = backend
        self.inputs = inputs  # float64 NumPy (q, k, v, grad_out)
        self.run = run
        self.call_seconds = call_seconds  # a warm call, to size asv's `number`
        self.workload = workload


_CACHE: dict[tuple, Prepared] = {}
_BACKENDS: dict[str, object] = {}


def inputs(w: Workload) -> tuple:
    rng = np.random.default_rng(SEED)
    q = rng.standard_normal((w.batch, w.hq, w.lq, w.e))  # (B, Hq, Lq, E)
    k = rng.standard_normal((w.batch, w.hkv, w.lk, w.e))  # (B, Hkv, Lk, E)
    v = rng.standard_normal((w.batch, w.hkv, w.lk, w.e))  # (B, Hkv, Lk, E)
    grad_out = rng.standard_normal((w.batch, w.hq, w.lq, w.e))  # (B, Hq, Lq, E)
    return q, k, v, grad_out


LOAD_ERROR = "attnspec: cannot load backend"  # attnspec.procs.stream echoes lines holding it


def get_backend(name: str):
    """The backend, loaded; NotImplementedError (asv's skip) with the reason if it cannot load."""
    if name not in _BACKENDS:
        try:
            backend = registry.resolve(name)
        except Exception as e:  # said on stderr, where attnspec run (asv --show-stderr) finds it
            print(f"{LOAD_ERROR} {name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            raise
        if backend.uniform_hooks:
            # eager torch-flex: the suite's trace-reusing hooks cost more a call than the call itself at
            # small sizes (docs/measurements.md); a timed call pays for the hooks users write
            backend.uniform_hooks = False
        if name in registry.BUILTINS and "jax" in _threads.frameworks_of([name]):
            import importlib.util

            if importlib.util.find_spec("jax") is not None:
                import jax  # noqa: F401 - pinned below, before the backend's load() creates the client
        if "jax" in sys.modules:  # a plug-in on JAX: the fork server imported it
            _threads.pin_xla()
        ok, why = backend.availability()
        if not ok:
            skip(f"{name} unavailable: {why}")
        _threads.limit()  # the framework may have loaded its own OpenMP runtime
        _BACKENDS[name] = backend
    return _BACKENDS[name]


def _declines(backend, w: Workload, op: str, dtype: str) -> str | None:
    """A reason from the class's declarations alone: no framework loads to skip these."""
    caps = backend.capabilities
    if w.format not in caps.formats:
        return f"{backend.name} takes no {w.format} call (declares {', '.join(caps.formats)})"
    if dtype not in caps.dtypes:
        return f"{backend.name} declares dtypes {', '.join(caps.dtypes)}"
    if op == "forward_backward" and not caps.gradients:
        return f"{backend.name} computes no gradients"
    if w.is_causal and not caps.causal:
        return f"{backend.name} has no causal mode"
    needed = {"gqa": w.hkv != w.hq, "window": w.mask.startswith("window-"),
              "causal_bottom_right": w.mask == "decode" and w.lq > 1 and w.lq != w.lk}
    for feature, used in needed.items():
        if used and feature not in caps.features and not (
                feature == "causal_bottom_right" and backend.semantics.causal_alignment == "bottom_right"):
            return f"{backend.name} does not declare {feature!r}"
        broken = next((d for d in backend.semantics.deviations if used and d.feature == feature
                       and (not d.dtypes or dtype in d.dtypes)), None)
        if broken is not None:  # the library fails there, as declared: nothing to time
            return f"{backend.name} declares a deviation with {feature!r}: {broken.why}"
    return None


def _first_call(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def prepared(name: str, w: Workload, op: str, dtype: str, time_warm_call: bool = True) -> Prepared:
    """Converted, warmed up and cached; `time_warm_call=False` skips the second (sizing) call."""
    key = (name, w, op, dtype)
    if key in _CACHE:
        return _CACHE[key]
    backend = _BACKENDS.get(name) or registry.resolve(name)
    why = _declines(backend, w, op, dtype) or _over_budget(name)
    if why:
        skip(f"{name} {op} {dtype}: {why}")
    backend = get_backend(name)
    q, k, v, grad_out = inputs(w)
    try:
        if w.format == "padded":
            run = backend.prepare(q, k, v, None, w.is_causal, None, dtype=dtype, op=op, **w.fields())
        else:  # lowered to the format once, in setup (backends/serving.py)
            run = serving.prepare_format(backend, w.format, q, k, v, dtype, page_size=w.page_size, mask=None,
                                         is_causal=w.is_causal, **w.fields())
        if MAX_CALL_SECONDS and w.lq == w.lk and w.lq > 256 and dtype in ("bfloat16", "float16"):
            _check_predicted_time(backend, w, op, dtype)
        call_seconds = _first_call(run)  # compilation, lazy allocation, first touch: never timed
    except Unsupported as e:  # includes BackendUnavailable; raised by prepare or the first call
        skip(f"{name} {op} {dtype}: {e}")
    spent = call_seconds
    # the first call may hold one-off init: time a warm one - always where it compiled (its time sizes
    # asv's samples and is charged for them: torch.compile'd flex's compile was once taken for its call)
    if time_warm_call and (call_seconds < 1.0 or backend.compiles_per_shape):
        call_seconds = _first_call(run)
        spent += call_seconds
    spend(name, spent)
    _CACHE[key] = Prepared(backend, (q, k, v, grad_out), run, call_seconds, w)
    return _CACHE[key]


def _under_asv() -> bool:
    """The budget is per asv run; a test or script calling prepared() keeps no account.  asv's fork
    server for an existing environment passes no ASV_* variable on (asv 0.6: the default grid's
    budget never applied in `attnspec run`); its command line says what it is."""
    if os.environ.get("ASV_ENV_TYPE"):
        return True
    argv = sys.argv
    return len(argv) > 1 and os.path.basename(argv[0]) == "benchmark.py" and argv[1] in ("run_server", "run")


RUN_FOLDER_PREFIX = "attnspec-bench-"


def _started(pid: int) -> str | None:
    """A process's start time (Linux), None when it is gone: with the pid, it names one process."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _run_folder() -> str:
    """A folder shared by the processes of one asv run: keyed by their parent (asv's server)."""
    import tempfile

    parent = os.getppid()
    return os.path.join(tempfile.gettempdir(), f"{RUN_FOLDER_PREFIX}{parent}-{_started(parent) or '0'}")


def _remove_ended_runs() -> None:
    """The folders of asv runs whose server has ended: nothing else removes them (Linux only, where a
    live server can be told from an ended one)."""
    import glob
    import shutil
    import tempfile

    if not os.path.isdir("/proc/self"):
        return
    for path in glob.glob(os.path.join(tempfile.gettempdir(), RUN_FOLDER_PREFIX + "*")):
        pid, _, started = os.path.basename(path)[len(RUN_FOLDER_PREFIX):].partition("-")
        if pid.isdigit() and _started(int(pid)) != started:
            shutil.rmtree(path, ignore_errors=True)


def _marker(name: str) -> str:
    return os.path.join(_run_folder(), "".join(c if c.isalnum() or c in "-_." else "_" for c in name))


def _spent(name: str) -> float:
    try:
        with open(_marker(name)) as f:
            return float(f.read() or 0)
    except (OSError, ValueError):
        return 0.0


def _over_budget(name: str) -> str | None:
    """Why this run leaves `name` out: its calls used up the grid's budget (BACKEND_BUDGET_SECONDS)."""
    spent = _spent(name) if BACKEND_BUDGET_SECONDS and _under_asv() else 0.0
    if spent <= (BACKEND_BUDGET_SECONDS or float("inf")):
        return None
    return (f"its calls took {spent:.0f} s so far in this run (first calls: compilation, lazy initialisation; "
            f"and timing), over the grid's {BACKEND_BUDGET_SECONDS:g} s per backend: left out of the rest of this "
            "run (ATTNSPEC_BENCH_GRID=full measures it)")


def spend(name: str, seconds: float) -> None:
    """Add seconds of calls to the backend's account for this run (asv runs one at a time)."""
    if not BACKEND_BUDGET_SECONDS or not _under_asv():
        return
    total = _spent(name) + seconds  # read before opening for writing: "w" empties the file
    folder = _run_folder()
    if not os.path.isdir(folder):  # this run's first account: earlier runs' folders go
        _remove_ended_runs()
        os.makedirs(folder, exist_ok=True)
    with open(_marker(name), "w") as f:
        f.write(repr(total))


def _check_predicted_time(backend, w: Workload, op: str, dtype: str) -> None:
    """Skip a call the grid's budget cannot afford, predicted from the same problem at T = 256."""
    small = w.scaled(256)
    q, k, v, _ = inputs(small)
    run = backend.prepare(q, k, v, None, small.is_causal, None, dtype=dtype, op=op, **small.fields())
    _first_call(run)
    predicted = _first_call(run) * (w.lq / 256) ** 2  # attention's work grows as T^2
    if predicted > MAX_CALL_SECONDS:
        skip(f"{backend.name} {op} {dtype} T={w.lq}: predicted {predicted:.0f} s per call from T=256 "
             f"(x(T/256)^2), over this grid's {MAX_CALL_SECONDS:g} s; ATTNSPEC_BENCH_GRID=full measures it")


__all__ = ["BATCH", "HEADS", "THREADS", "CLOCK", "CLOCKS", "Workload", "prepared", "get_backend", "inputs",
           "log", "skip", "BackendUnavailable", "backend_names", "timer_for"]
