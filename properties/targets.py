"""What a property test runs against: a backend at one dtype, called under a time limit.

Every backend call goes through `Target.forward` / `Target.backward`, which run it in a
helper thread and give up after `call_timeout()` seconds: a hanging backend fails its
test (and is not called again this run: later calls fail at once, so shrinking and the
other tests stay fast) instead of hanging the run.
"""
from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import reject

from attnspec.backends.base import Backend, BackendFailure, Unsupported
from attnspec.specs.error_budget import BUDGETS

DEFAULT_CALL_TIMEOUT = 60.0  # s: generous enough for a JAX compile of the largest shape


def call_timeout() -> float:
    raw = os.environ.get("ATTNSPEC_CALL_TIMEOUT", "")
    try:
        return float(raw) if raw else DEFAULT_CALL_TIMEOUT
    except ValueError:
        raise ValueError(f"ATTNSPEC_CALL_TIMEOUT must be a number of seconds; got {raw!r}") from None


_HUNG: dict = {}  # id(backend) -> what hung


class _Worker:
    """One long-lived daemon thread running backend calls (starting a thread per call costs ~1 ms)."""

    def __init__(self):
        self.jobs: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, name="attnspec-backend-calls", daemon=True).start()

    def _loop(self):
        while True:
            fn, args, kwargs, box, done = self.jobs.get()
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - handed to the calling thread
                box["error"] = e
            done.set()


_WORKER: list = []


def call_with_limit(backend: Backend, what: str, fn, *args, **kwargs):
    """fn(*args, **kwargs) on the worker thread; BackendFailure if it has not returned in time."""
    # a backend that compiles on first sight of a shape may say how long a call can take
    limit = max(call_timeout(), float(getattr(backend, "call_timeout", 0) or 0))
    if id(backend) in _HUNG:
        raise BackendFailure(backend.name, f"{what} not attempted: an earlier call ({_HUNG[id(backend)]}) "
                                           f"did not return within {limit:g} s")
    if not _WORKER:
        _WORKER.append(_Worker())
    box: dict = {}
    done = threading.Event()
    _WORKER[0].jobs.put((fn, args, kwargs, box, done))
    if not done.wait(limit):
        _HUNG[id(backend)] = what
        _WORKER.clear()  # abandon the stuck thread; the next call starts a fresh one
        raise BackendFailure(backend.name, f"{what} did not return within {limit:g} s "
                                           "(per-call limit, ATTNSPEC_CALL_TIMEOUT or the backend's call_timeout)")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _guarded(target, call: str, case, fn, *args, **kwargs):
    """A declined combination is a skip; a misbehaving backend a failure with a reproducer."""
    try:
        result = call_with_limit(target.backend, call, fn, *args, **kwargs)
        target.declined = 0
        return result
    except Unsupported as e:  # this problem is declined: another one is drawn (all declined: a skip)
        target.unsupported = f"{target.name}: {e}"
        target.declined += 1
        if target.in_hypothesis and target.declined < MAX_DECLINED:
            reject()
        # declining everything a property draws (a masks-only property, a backend without masks) is
        # a skip with the reason, now - not after Hypothesis has drawn hundreds of problems
        pytest.skip(target.unsupported)
    except BackendFailure as e:
        from attnspec.specs.invariants import Verdict

        from attnspec.properties.judge import ConformanceFailure, snippet
        verdict = Verdict("backend_call", False, None, float("nan"), f"the {call} call failed: {e.what}")
        raise ConformanceFailure(target.current_property, target, verdict, case,
                                 snippet(target, case, call, return_lse=kwargs.get("return_lse", False))) from e


MAX_DECLINED = 25  # a test whose problems the backend declined this often in a row is skipped, with the reason
MAX_REPLAYED_SHAPES = 40  # distinct earlier call configurations a reproducer replays, most recent


def signature(kind, case, dtype, return_lse=False, layout="contiguous") -> tuple:
    """A call's configuration without its values: what a stateful backend may remember."""
    def field_sig(name, value):
        if isinstance(value, np.ndarray):
            return (name, "array", value.shape, tuple(value.tolist()) if name == "alibi_slopes" else None)
        return (name, "value", value, None)
    return (kind, dtype, case.q.shape, case.k.shape, case.v.shape, None if case.mask is None else case.mask.shape,
            case.is_causal, case.scale, tuple(field_sig(n, v) for n, v in sorted(case.fields.items())),
            return_lse, layout)


def replay_line(sig, dims_q) -> str:
    """One call with random inputs of the recorded configuration (see `signature`)."""
    kind, dtype, qs, ks, vs, ms, causal, scale, fields, lse, layout = sig
    kw = [f"dtype={dtype!r}", f"is_causal={causal}", f"scale={scale!r}"]
    if ms is not None:
        kw.append(f"mask=np.ones({ms}, dtype=bool)")
    for name, kind_, a, b in fields:
        if kind_ == "value":
            kw.append(f"{name}={a!r}")
        elif name == "alibi_slopes":
            kw.append(f"{name}=np.array({list(b)!r})")
        elif name in ("q_lengths", "kv_lengths"):
            kw.append(f"{name}=np.full({a}, {qs[-2] if name == 'q_lengths' else ks[-2]})")
        elif name.endswith("segment_ids"):
            kw.append(f"{name}=np.zeros({a}, dtype=int)")
        else:
            kw.append(f"{name}=np.zeros({a})")
    if lse:
        kw.append("return_lse=True")
    if layout != "contiguous":
        kw.append(f"layout={layout!r}")
    grad = f", np.ones({qs[:-1] + vs[-1:]})" if kind == "backward" else ""
    return f"_ = backend.{kind}(*shaped({qs}, {ks}, {vs}){grad}, {', '.join(kw)})"


_EQUAL_DIMS: dict = {}  # id(backend) -> needs Ev == E


def needs_equal_head_dims(backend: Backend, dtype: str) -> bool:
    """Whether the backend declines Ev != E (jax.nn.dot_product_attention does): asked once."""
    if getattr(backend.capabilities, "equal_head_dims", False):
        return True
    if id(backend) not in _EQUAL_DIMS:
        q, k, v = (np.zeros(s) for s in _probe_shapes(backend))  # E != Ev, both in its head-dim multiple
        try:
            call_with_limit(backend, "forward (Ev != E probe)", backend.forward, q, k, v, None, False, None, dtype)
            _EQUAL_DIMS[id(backend)] = False
        except Unsupported:
            _EQUAL_DIMS[id(backend)] = True
        except Exception:  # noqa: BLE001 - its failures are for the properties to report
            _EQUAL_DIMS[id(backend)] = False
    return _EQUAL_DIMS[id(backend)]


def _probe_shapes(backend: Backend) -> tuple:
    """q, k, v shapes with E = 2m, Ev = 3m (m: the declared head-dim multiple, so only Ev != E is asked)."""
    m = getattr(backend.capabilities, "head_dim_multiple", 1)
    return (1, 1, 2, 2 * m), (1, 1, 3, 2 * m), (1, 1, 3, 3 * m)


def is_compiled(backend: Backend) -> bool:
    """Backends that compile per shape (JAX) get a bounded shape menu."""
    flag = getattr(backend, "compiles_per_shape", None)
    if flag is not None:
        return bool(flag)
    return "jax" in type(backend).__module__ or backend.name.startswith("jax")


@dataclass(eq=False)
class Target:
    """A backend at one dtype; `examples` counts the cases a test body ran."""

    backend: Backend
    dtype: str
    examples: int = 0
    current_property: str = "?"
    unsupported: str = ""  # the last reason the backend gave for declining a problem
    in_hypothesis: bool = True
    declined: int = 0  # problems declined (Unsupported) in a row
    history: list = field(default_factory=list, repr=False)  # backend calls (see begin_example)
    signatures: dict = field(default_factory=dict, repr=False)  # every distinct call config, latest last
    earlier: list = field(default_factory=list, repr=False)  # signatures seen before this example
    example_start: int = 0
    import_paths: tuple = ()  # sys.path entries a reproducer needs to import the backend
    _available: tuple | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def id(self) -> str:
        return f"{self.backend.name}-{self.dtype}"

    @property
    def caps(self):
        return self.backend.capabilities

    @property
    def alignments(self) -> tuple:
        """The causal alignments problems may ask this backend for (when Lq != Lk)."""
        return self.backend.causal_alignments()

    def supports(self, feature: str) -> bool:
        return self.backend.supports(feature)

    @property
    def compiled(self) -> bool:
        return is_compiled(self.backend)

    def availability(self) -> tuple:
        if self._available is None:
            self._available = self.backend.availability()
        return self._available

    def skip_reason(self, op: str = "forward") -> str | None:
        ok, why = self.availability()
        if not ok:
            return f"{self.name} unavailable: {why}"
        try:
            self.backend.check_supported(self.dtype, op)
        except Unsupported as e:
            return str(e)
        return None

    @property
    def budget_dtype(self) -> str:
        """The dtype whose error budget judges results: a declared narrower effective precision
        (jax-dpa's float32 softmax for float64 input), or a declared narrower output dtype,
        replaces a wider input dtype."""
        out = self.dtype
        for narrower in (getattr(self.backend.semantics, "effective_precision", None),
                         self.backend.output_dtype(self.dtype)):
            if narrower in BUDGETS and BUDGETS[narrower].unit_roundoff > BUDGETS[out].unit_roundoff:
                out = narrower
        return out

    @property
    def equal_head_dims(self) -> bool:
        probed = id(self.backend) in _EQUAL_DIMS
        needs = needs_equal_head_dims(self.backend, self.dtype)
        if not probed and not needs:  # the probe was a call too: a stateful backend's reproducer replays it
            from attnspec.properties.case import build, Case
            q, k, v = _probe_shapes(self.backend)
            self._record("forward", build([f"q, k, v = np.zeros({q}), np.zeros({k}), np.zeros({v})",
                                           "mask = None", "fields = {}"], Case(None, None, None, None, False, None)),
                         self.dtype)
        return needs

    # -- calls, recorded so a failure's snippet can replay them in order ------------------
    def begin_example(self) -> None:
        """A new example starts: keep only the call just before it (a stateful backend's context)."""
        self.history = self.history[-1:]
        self.example_start = len(self.history)
        self.earlier = list(self.signatures)[-MAX_REPLAYED_SHAPES - 1:-1]  # the last one is replayed exactly

    def calls_before(self, case) -> list:
        """Recorded calls before the failing example's first call with `case` (incl. the one before it)."""
        first = next((i for i, c in enumerate(self.history) if i >= self.example_start and c["case"] is case),
                     len(self.history))
        return self.history[max(0, self.example_start - 1):first]

    def _record(self, kind, case, dtype, **extra) -> None:
        self.history.append(dict(kind=kind, case=case, dtype=dtype, **extra))
        sig = signature(kind, case, dtype, extra.get("return_lse", False), extra.get("layout", "contiguous"))
        self.signatures.pop(sig, None)
        self.signatures[sig] = True

    def forward(self, case, dtype: str | None = None, return_lse: bool = False, layout: str = "contiguous"):
        dtype = dtype or self.dtype
        self._record("forward", case, dtype, return_lse=return_lse, layout=layout)
        extra = {} if layout == "contiguous" else {"layout": layout}
        return _guarded(self, "forward", case, self.backend.forward, case.q, case.k, case.v, dtype=dtype,
                        return_lse=return_lse, **extra, **case.call_kwargs)

    def backward(self, case, grad_out, dtype: str | None = None, grad_line: str = ""):
        dtype = dtype or self.dtype
        self._record("backward", case, dtype, grad_line=grad_line)
        return _guarded(self, "backward", case, self.backend.backward, case.q, case.k, case.v, grad_out,
                        dtype=dtype, **case.call_kwargs)

    def _repr_pretty_(self, p, cycle):  # Hypothesis' printer: the short form
        p.text(repr(self))

    def __repr__(self) -> str:  # what Hypothesis prints in "Falsifying example"
        return f"<{self.id}>"
