"""What a property runs against: a backend at one dtype, each call under a time limit and recorded.

Every backend call goes through `Target.forward` / `Target.backward`: it runs on a helper thread
and gives up after `call_timeout()` seconds, so a hanging backend fails its test (and is not
called again this run: later calls fail at once) instead of hanging the run.  A combination
the backend declines (``Unsupported``) raises `Declined`; a backend that raises, returns the
wrong shape or dtype, or hangs raises `judge.Failed` with a ``backend_call`` verdict.  Each
call is recorded (its configuration, not its values) so that a reproducer can replay what the
backend saw before a failure, should the backend keep state between calls.
"""
from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass, field

import numpy as np

from attnspec.backends.base import Backend, BackendFailure, Unsupported
from attnspec.properties.judge import Failed
from attnspec.specs.error_budget import BUDGETS
from attnspec.specs.fp8 import Fp8Computation, is_fp8
from attnspec.specs.invariants import Verdict

DEFAULT_CALL_TIMEOUT = 60.0  # s: generous enough for a JAX compile of the largest shape
MAX_REPLAYED = 40  # distinct earlier call configurations a reproducer keeps, most recent


def call_timeout() -> float:
    raw = os.environ.get("ATTNSPEC_CALL_TIMEOUT", "")
    try:
        return float(raw) if raw else DEFAULT_CALL_TIMEOUT
    except ValueError:
        raise ValueError(f"ATTNSPEC_CALL_TIMEOUT must be a number of seconds; got {raw!r}") from None


class Declined(Exception):
    """The backend declined this problem (Unsupported): a skip, or another draw."""


class _Worker:
    """One long-lived daemon thread running backend calls (a thread per call would cost more than a small call)."""

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


@dataclass(eq=False)
class Session:
    """One backend for a run: shared by its targets (one per dtype)."""

    backend: Backend
    spec: str                      # what `registry.resolve` takes, for the reproducer
    import_paths: tuple = ()       # sys.path entries a reproducer needs to import the backend
    hung: str = ""                 # the call that did not return in time (then no further call is made)
    hang: Exception | None = None  # the property's failure in which it hung (explore.attempt raises it again)
    equal_dims: bool | None = None  # whether it declines Ev != E (asked once)
    lse_base: str | None = None  # the LSE's base observed on a probe, when none is declared (asked once)
    declared: bool = False  # its conventions are on a test's report already (properties/plugin.py)
    calls: dict = field(default_factory=dict)  # the MAX_REPLAYED latest distinct call configurations, latest last
    _worker: _Worker | None = None

    def call(self, what: str, fn, *args, **kwargs):
        """fn(*args, **kwargs) on the worker thread; BackendFailure if it has not returned in time."""
        # a backend that compiles on first sight of a shape may say how long a call can take
        limit = max(call_timeout(), float(self.backend.call_timeout))
        if self.hung:
            raise BackendFailure(self.backend.name, f"{what} not attempted: an earlier call ({self.hung}) did not "
                                                    f"return within {limit:g} s")
        if self._worker is None:
            self._worker = _Worker()
        box: dict = {}
        done = threading.Event()
        self._worker.jobs.put((fn, args, kwargs, box, done))
        if not done.wait(limit):
            self.hung, self._worker = what, None  # abandon the stuck thread
            raise BackendFailure(self.backend.name, f"{what} did not return within {limit:g} s "
                                                    "(per-call limit, ATTNSPEC_CALL_TIMEOUT or the backend's call_timeout)")
        if "error" in box:
            raise box["error"]
        return box["value"]


def signature(kind: str, case, dtype: str, return_lse: bool = False, layout: str = "contiguous",
              knobs: dict | None = None) -> tuple:
    """A call's configuration without its values (what a stateful backend may remember), hashable; the
    tuning knobs' setting last (a reproducer's replay of the calls before a failure sets them again)."""
    def describe(name, value):
        if isinstance(value, np.ndarray):
            return (name, "array", value.shape, str(value.dtype),
                    tuple(value.tolist()) if name == "alibi_slopes" else None)
        return (name, "value", value)
    return (kind, dtype, case.q.shape, case.k.shape, case.v.shape, None if case.mask is None else case.mask.shape,
            case.is_causal, case.scale, tuple(describe(n, v) for n, v in sorted(case.fields.items())),
            return_lse, layout, tuple(sorted((knobs or {}).items())))


def is_compiled(backend: Backend) -> bool:
    """Backends that compile per shape (JAX, compiled flex) get a bounded shape menu (as declared)."""
    return bool(backend.compiles_per_shape)


@dataclass(eq=False)
class Target:
    """A backend at one dtype; `examples` counts the problems a test ran."""

    session: Session
    dtype: str
    rule: str = "attnspec"  # the error budget's rule (specs.error_budget.RULES)
    examples: int = 0
    declined: int = 0  # calls the backend declined (Unsupported) in the current test
    left_out: int = 0  # fixed-grid problems the backend's declared limits left out of the current test
    outside_limits: dict = field(default_factory=dict)  # limit broken -> how many of them break it
    earlier: list = field(default_factory=list, repr=False)  # call configurations before this example
    answers: list = field(default_factory=list, repr=False)  # semantics answers the current test gave

    @property
    def backend(self) -> Backend:
        return self.session.backend

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

    @property
    def budget_dtype(self) -> str:
        """The dtype whose error budget judges results: a declared narrower effective precision
        (jax-dpa's float32 softmax for float64 input), or a declared narrower output dtype,
        replaces a wider input dtype.  fp8 inputs: the kernel's computation (`fp8_computation`)."""
        if is_fp8(self.dtype):
            return self.fp8_computation()
        out = self.dtype
        for narrower in (self.backend.semantics.effective_precision,
                         self.backend.output_dtype(self.dtype)):
            if narrower in BUDGETS and BUDGETS[narrower].unit_roundoff > BUDGETS[out].unit_roundoff:
                out = narrower
        return out

    def fp8_computation(self, p_dtype: str | None = None) -> str:
        """The computation an fp8 target is judged as (`specs.fp8.Fp8Computation`, by name): P rounded as
        declared (Semantics.p_dtypes; undeclared: to the input's own fp8 format, the coarsest a kernel
        does - never a false alarm; test_fp8 records what it observed), the output in its declared dtype,
        q in Capabilities.fp8_query.  A declared effective precision coarser than float32 (a kernel that
        dequantises to bfloat16 and runs a bfloat16 attention) replaces it: that dtype's budget."""
        b = self.backend
        eff = b.semantics.effective_precision
        if eff in BUDGETS and BUDGETS[eff].unit_roundoff > BUDGETS["float32"].unit_roundoff:
            return eff
        p = p_dtype or b.semantics.p_dtype(self.dtype) or self.dtype
        return Fp8Computation(self.dtype, None if p == "float32" else p, b.output_dtype(self.dtype),
                              b.capabilities.fp8_query).name

    def exact(self, case):
        """A hand-made case with q, k, v rounded to the formats this target hands them in (fp8: q to its
        query dtype, k and v to the fp8 format), so the reference sees the numbers the backend does."""
        if not is_fp8(self.dtype):
            return case
        from attnspec.specs.fp8 import FP8_FORMATS
        from attnspec.specs.plain import round_to

        def to(x, dtype):  # a finite value past the format's range saturates, as a quantiser's cast does
            top = FP8_FORMATS[dtype].largest if dtype in FP8_FORMATS else np.inf
            x = np.where(np.isfinite(x), np.clip(x, -top, top), x)
            return np.asarray(round_to(x, dtype), dtype=np.float64)
        return case.replace(q=to(case.q, self.query_dtype), k=to(case.k, self.dtype), v=to(case.v, self.dtype))

    @property
    def query_dtype(self) -> str:
        """The dtype q's values are exact in: the target's, or the declared 16-bit query beside fp8 K/V."""
        return self.backend.query_dtype(self.dtype)

    @property
    def equal_head_dims(self) -> bool:
        """Whether the backend declines Ev != E (jax.nn.dot_product_attention does): asked once a run."""
        s = self.session
        if self.caps.equal_head_dims:
            return True
        if s.equal_dims is None:
            m = self.caps.head_dim_multiple
            q, k, v = (np.zeros(d) for d in ((1, 1, 2, 2 * m), (1, 1, 3, 2 * m), (1, 1, 3, 3 * m)))
            from attnspec.properties.case import Case
            self._record("forward", Case(q, k, v), self.dtype)
            try:
                s.call("forward (Ev != E probe)", self.backend.forward, q, k, v, None, False, None, self.dtype)
                s.equal_dims = False
            except Unsupported:
                s.equal_dims = True
            except Exception:  # noqa: BLE001 - its failures are for the properties to report
                s.equal_dims = False
        return s.equal_dims

    def begin_example(self) -> None:
        """A new example: the configurations seen so far are what a reproducer may need to replay."""
        self.earlier = list(self.session.calls)
        self.examples += 1

    def _record(self, kind, case, dtype, return_lse=False, layout="contiguous", knobs=None) -> None:
        sig = signature(kind, case, dtype, return_lse, layout, knobs)
        calls = self.session.calls
        calls.pop(sig, None)
        calls[sig] = True
        if len(calls) > MAX_REPLAYED:  # only the latest are replayed: a run-long dict made each example's copy O(run)
            del calls[next(iter(calls))]

    def reset_counts(self) -> None:
        """A new test: no problem checked, declined or left out yet."""
        self.examples, self.declined, self.left_out, self.outside_limits = 0, 0, 0, {}

    def coverage(self) -> dict:
        """What the current test's counts say beyond its problems, for its JSON row: calls declined, and
        fixed-grid problems its declared limits left out ("12 outside the declared limits (E > 128)")."""
        out = {"declined": self.declined}
        if self.left_out:
            out["outside_limits"] = (f"{self.left_out} outside the declared limits ("
                                     + "; ".join(f"{why}: {k}" for why, k in sorted(self.outside_limits.items())) + ")")
        return out

    def call_backend(self, what: str, fn, *args, **kwargs):
        """fn(*args, **kwargs) - a call of the backend, or a harness function that calls it (a packed or
        paged lowering) - under the per-call time limit; Declined for Unsupported, judge.Failed for a
        call that raised, returned something wrong or hung."""
        try:
            return self.session.call(what, fn, *args, **kwargs)
        except Unsupported as e:
            self.declined += 1
            raise Declined(f"{self.name}: {e}") from None
        except BackendFailure as e:  # it raised ("backend_raised"), or returned something wrong or hung
            name = "backend_raised" if e.what.startswith(f"{what} raised") else "backend_call"
            raise Failed(Verdict(name, False, None, float("nan"), f"the {what} call failed: {e.what}")) from e

    def forward(self, case, dtype: str | None = None, return_lse: bool = False, layout: str = "contiguous",
                knobs: dict | None = None):
        """The backend's output (B, H, Lq, Ev) for the case, as float64-held NumPy; with return_lse, (out, lse)
        (natural log: a declared base converted by the backend, an undeclared one as observed)."""
        dtype = dtype or self.dtype
        self._record("forward", case, dtype, return_lse, layout, knobs)
        extra = {} if layout == "contiguous" else {"layout": layout}
        if knobs:
            extra["knobs"] = knobs
        y = self.call_backend("forward", self.backend.forward, case.q, case.k, case.v, dtype=dtype,
                              return_lse=return_lse, **extra, **case.call_kwargs)
        return self.as_observed(y) if return_lse else y

    def as_observed(self, y: tuple) -> tuple:
        """(out, lse) of a call with return_lse: an undeclared base 2 (observed on a probe) converted to
        natural log, as the backend converts a declared one; recorded by test_conventions, judged as observed."""
        if self.backend.semantics.lse_base is None:
            from attnspec.properties.conventions import LN2, observed_lse_base
            if observed_lse_base(self) == "2":
                return y[0], y[1] * LN2
        return y

    def forward_as_returned(self, case, dtype: str | None = None):
        """(output as float64 NumPy, the dtype it came back in): no output-dtype check (Backend.forward_as_returned)."""
        dtype = dtype or self.dtype
        self._record("forward", case, dtype)
        out, returned = self.call_backend("forward", self.backend.forward_as_returned, case.q, case.k, case.v, dtype=dtype,
                                      **case.call_kwargs)
        return np.asarray(out, dtype=np.float64), returned

    def backward(self, case, grad_out, dtype: str | None = None, return_dsink: bool = False,
                 knobs: dict | None = None):
        """(dq, dk, dv[, dbias]) of sum(output * grad_out); return_dsink (a case with sinks): (grads, dsink)."""
        dtype = dtype or self.dtype
        self._record("backward", case, dtype, knobs=knobs)
        extra = {"return_dsink": True} if return_dsink else {}
        if knobs:
            extra["knobs"] = knobs
        return self.call_backend("backward", self.backend.backward, case.q, case.k, case.v, grad_out, dtype=dtype,
                                 **extra, **case.call_kwargs)

    def _repr_pretty_(self, p, cycle):  # Hypothesis' printer: the short form
        p.text(repr(self))

    def __repr__(self) -> str:
        return f"<{self.id}>"
