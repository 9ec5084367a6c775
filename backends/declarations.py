"""What a backend declares (capabilities, semantics) and what its native call receives (Call).

Plain data, no framework: `backends.base.Backend` reads them, the suite judges by them, and
`attnspec backends` lists them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, make_dataclass

import numpy as np

from attnspec.backends.cache_views import CACHE_VIEWS
from attnspec.specs.fields import FEATURES, FIELDS
from attnspec.specs.formats import FORMATS
from attnspec.specs.fp8 import FP8_DTYPE_NAMES

FULLY_MASKED_CHOICES = ("zeros", "nan", "mean_of_values", "error")
LSE_BASES = ("e", "2")  # the log-sum-exp's base: natural (the spec's), or 2 (FlashInfer: flashinfer#2113)
EMPTY_LSES = ("-inf", "+inf")  # the LSE of a row that sees nothing: FA3 -inf, FA2 +inf
# Memory layouts of q, k, v a backend can be handed (`Backend.relayout`): the same values, other strides.
# head_slice: the heads a slice of a wider heads axis, NaN on either side (a fused QKV projection's q,
# k or v: a token stride past H * E and an offset; flash-attention-v100#41, TransformerEngine#1195)
LAYOUTS = ("contiguous", "transposed", "offset", "permuted", "head_slice", "expanded")
OPS = ("forward", "forward_backward")
# how finely fp8 descales may vary: one per (batch, KV head) - FA3/FA4's and PyTorch's (B, Hkv) - or one
# per tensor (FlashInfer's k_scale, vLLM's, JAX's ragged paged attention)
DESCALE_GRANULARITIES = ("head", "tensor")
QUERY_DTYPES = ("float16", "bfloat16", "float32")  # a query that stays 16/32-bit beside fp8 K/V



def _positive_int(name: str, m, zero: bool = False) -> None:
    if isinstance(m, bool) or not isinstance(m, int) or m < (0 if zero else 1):
        raise ValueError(f"Capabilities.{name} must be a {'non-negative' if zero else 'positive'} int; got {m!r}")


@dataclass(frozen=True)
class Capabilities:
    """What a backend takes: dtypes, masks, optional features, and the shapes its kernel takes.

    The declared limits (head dims, lengths, causal with Lq = Lk, dtypes per op) are honoured by the
    suite's draws and fixed grids by construction (`fit_head_dim`, `fit_length`), and a problem
    outside them is declined by `Backend.check_supported` with the limit it breaks (`outside`)."""

    dtypes: tuple = ("float64", "float32")
    device: str = "cpu"
    gradients: bool = False
    masks: bool = True
    causal: bool = True
    equal_head_dims: bool = False  # needs Ev == E (value's last dim equal to query's): flash kernels
    head_dim_multiple: int = 1     # E and Ev must be multiples of this (cuDNN's fused attention: 8)
    features: frozenset = frozenset()  # optional features supported natively: specs.problem.FEATURES
    bias_gradient: bool = False    # the backward returns dBias too (with gradients and "bias")
    mask_with_causal: bool = True  # takes a mask together with is_causal (PyTorch's SDPA does not)
    layouts: tuple = ("contiguous",)  # memory layouts `relayout` can produce (LAYOUTS)
    head_dims: tuple = ()          # the head dims E, Ev it takes, when a set (a kernel's templates); () any
    max_head_dim: int = 0          # E, Ev at most this (a Triton kernel's "head dim <= 128"); 0: no maximum
    head_dim_power_of_two: bool = False  # E, Ev powers of two only (tl.arange needs them)
    length_multiple: int = 1       # Lq and Lk multiples of this (a kernel without a masked tail block)
    max_length: int = 0            # Lq, Lk at most this; 0: no maximum
    causal_equal_lengths: bool = False  # causal only with Lq == Lk (no alignment question asked)
    op_dtypes: tuple = ()          # (op, dtypes) pairs narrowing `dtypes` for an op (OPS), e.g. a backward in fp16 only
    # the call formats it takes (specs.formats.FORMATS; backends/serving.py): the first is how a backend
    # without "padded" is called for a padded problem
    formats: tuple = ("padded",)
    # the strided views of larger storage it takes its paged caches as (backends/cache_views.py: K and V
    # halves of one pool, rows inside wider ones, the other layout's storage transposed, padded pages), as
    # vLLM and FlashInfer hand them; True: all of CACHE_VIEWS, False or (): contiguous caches only (the views
    # property skips), a tuple: those views only (a kernel that checks its page stride is whole slots, say)
    paged_cache_views: tuple = CACHE_VIEWS
    # fp8 inputs (dtypes float8_e4m3fn / float8_e5m2, issue 31): the descales it takes with the "descale"
    # feature (DESCALE_GRANULARITIES), and the dtype q comes in when only K and V are fp8 (FlashInfer's and
    # vLLM's fp8 KV cache: the query's 16-bit dtype); None: q is fp8 too (FA3, FA4, PyTorch)
    descale_granularity: str = "head"
    fp8_query: str | None = None

    def __post_init__(self):
        unknown = sorted(set(self.features) - set(FEATURES))
        if unknown:
            raise ValueError(f"Capabilities.features: unknown {unknown}; known: {', '.join(FEATURES)}")
        object.__setattr__(self, "features", frozenset(self.features))
        views = self.paged_cache_views
        views = CACHE_VIEWS if views is True else () if views is False else views
        if isinstance(views, str) or not set(views) <= set(CACHE_VIEWS):
            raise ValueError(f"Capabilities.paged_cache_views: True, False or a tuple of {', '.join(CACHE_VIEWS)}; "
                             f"got {self.paged_cache_views!r}")
        object.__setattr__(self, "paged_cache_views", tuple(v for v in CACHE_VIEWS if v in views))
        _positive_int("head_dim_multiple", self.head_dim_multiple)
        _positive_int("length_multiple", self.length_multiple)
        _positive_int("max_head_dim", self.max_head_dim, zero=True)
        _positive_int("max_length", self.max_length, zero=True)
        for d in self.head_dims:
            _positive_int("head_dims entries", d)
        object.__setattr__(self, "head_dims", tuple(sorted(set(self.head_dims))))
        for op, dtypes in self.op_dtypes:
            if op not in OPS or isinstance(dtypes, str):
                raise ValueError(f"Capabilities.op_dtypes: pairs of an op ({', '.join(OPS)}) and a tuple of dtypes; "
                                 f"got {(op, dtypes)!r}")
        if isinstance(self.formats, str) or not self.formats or set(self.formats) - set(FORMATS):
            raise ValueError(f"Capabilities.formats: a non-empty tuple of {', '.join(FORMATS)}; got {self.formats!r}")
        object.__setattr__(self, "formats", tuple(self.formats))
        if self.descale_granularity not in DESCALE_GRANULARITIES:
            raise ValueError(f"Capabilities.descale_granularity must be one of {', '.join(DESCALE_GRANULARITIES)}; "
                             f"got {self.descale_granularity!r}")
        if self.fp8_query not in (None,) + QUERY_DTYPES:
            raise ValueError(f"Capabilities.fp8_query must be None (q is fp8 too) or one of {', '.join(QUERY_DTYPES)}; "
                             f"got {self.fp8_query!r}")
        if not any(self.takes_head_dim(E) for E in range(1, 1025)):
            raise ValueError("Capabilities: the declared head-dim limits leave no head dim up to 1024")

    # ---- the declared limits -------------------------------------------------------------------
    def dtypes_for(self, op: str) -> tuple:
        """The dtypes an op (forward, forward_backward) runs in; fp8 inputs are forward-only (FA3, FA4 and
        PyTorch's quantised SDPA have no fp8 backward; the error budget has none either)."""
        narrowed = dict(self.op_dtypes).get(op)
        dtypes = self.dtypes if narrowed is None else tuple(d for d in self.dtypes if d in narrowed)
        return dtypes if op == "forward" else tuple(d for d in dtypes if d not in FP8_DTYPE_NAMES)

    def head_dim_limits(self, E: int) -> list:
        """The head-dim limits E breaks, in words ("E=160 > 128")."""
        out = []
        if E % self.head_dim_multiple:
            out.append(f"{E} not a multiple of {self.head_dim_multiple}")
        if self.max_head_dim and E > self.max_head_dim:
            out.append(f"{E} > {self.max_head_dim}")
        if self.head_dim_power_of_two and E & (E - 1):
            out.append(f"{E} not a power of two")
        if self.head_dims and E not in self.head_dims:
            out.append(f"{E} not in {{{', '.join(map(str, self.head_dims))}}}")
        return out

    def takes_head_dim(self, E: int) -> bool:
        return not self.head_dim_limits(E)

    def fit_head_dim(self, E: int) -> int:
        """The head dim nearest E that it takes: the least at or above E, else the largest below."""
        up = next((d for d in range(max(E, 1), 4 * max(E, 1) + 1024) if self.takes_head_dim(d)), None)
        down = next((d for d in range(E - 1, 0, -1) if self.takes_head_dim(d)), None)
        if up is not None and (down is None or not self.max_head_dim or up <= self.max_head_dim):
            return up
        return down if down is not None else up

    def length_limits(self, L: int) -> list:
        out = []
        if L % self.length_multiple:
            out.append(f"{L} not a multiple of {self.length_multiple}")
        if self.max_length and L > self.max_length:
            out.append(f"{L} > {self.max_length}")
        return out

    def fit_length(self, L: int) -> int:
        """The length nearest L that it takes (a multiple at or above L, within the maximum); 0 stays 0."""
        m = self.length_multiple
        up = -(-L // m) * m
        if self.max_length and up > self.max_length:
            up = self.max_length // m * m
        return up

    def outside(self, E: int, Ev: int, Lq: int, Lk: int, is_causal: bool = False) -> list:
        """The declared shape limits a problem breaks, each in words naming the size ("E=160 > 128")."""
        out = [f"E={w}" for w in self.head_dim_limits(E)]
        out += [f"Ev={w}" for w in self.head_dim_limits(Ev) if Ev != E]
        if self.equal_head_dims and Ev != E:
            out.append(f"Ev={Ev} != E={E}")
        out += [f"Lq={w}" for w in self.length_limits(Lq)] + [f"Lk={w}" for w in self.length_limits(Lk)]
        if is_causal and self.causal_equal_lengths and Lq != Lk:
            out.append(f"causal with Lq={Lq} != Lk={Lk}")
        return out


@dataclass(frozen=True)
class Deviation:
    """A known departure from the spec, declared with its reason (an upstream bug, a documented limit).

    The suite still runs the property: where it fails as declared the result is `deviation` (shown
    as such in the summary, the JSON and the report, with its reproducer), never `passed`; any
    other failure is still a failure.  ``property``: a property's name, or "*" for every property
    (with ``feature``).  ``dtypes`` () means every dtype.  ``when``: a regular expression the
    failure's text (its message and problem) must contain to be this deviation - '' takes any
    failure of the property, which can hide a second bug behind the declared one (torch-flex's
    Lk = 0 declaration hid its adapter's Lq = 0 error).  A departure confined to some problems says
    which: ``feature``, an optional feature (specs.fields.FEATURES) the departure needs (a library
    whose grouped-heads path is broken), or ``problems``, a regular expression over the problem as
    the suite prints it (``Case(... Lq=1 ...)``).  A failure on such a problem is the deviation, and
    the property is checked again on draws without such problems, where any failure is a failure.
    """

    property: str
    why: str
    dtypes: tuple = ()
    when: str = ""
    feature: str = ""
    problems: str = ""

    def __post_init__(self):
        if self.property == "*" and not (self.feature or self.problems):
            raise ValueError("Deviation('*', ...) covers every property: it needs the feature or the problems "
                             "its failures are confined to")
        if self.feature and self.feature not in FEATURES:
            raise ValueError(f"Deviation.feature must be one of {', '.join(FEATURES)}; got {self.feature!r}")

    def covers(self, prop: str, dtype: str) -> bool:
        return self.property in (prop, "*") and (not self.dtypes or dtype in self.dtypes)

    def confines(self, case) -> bool:
        """Whether a problem is one this departure is confined to (its feature, or its problems)."""
        if self.feature:
            return self.feature in case.features
        return re.search(self.problems, repr(case)) is not None

    def matches(self, failure: str) -> bool:
        """Whether a failure of the property, as text, is this deviation."""
        return not self.when or re.search(self.when, failure or "") is not None


# The words a property's failure uses where the worst output entry is NaN (the error budget's "got nan";
# specs.invariants.shown prints a NaN as "nan", never as "inf"): `Deviation.when` for a library's NaN outputs
NAN_IN_OUTPUT = r"\b(?:got|weight|by|sum) nan\b"


@dataclass(frozen=True)
class Semantics:
    """Declared behaviour where the spec leaves a choice; None = not declared."""

    fully_masked: str | None = None      # one of FULLY_MASKED_CHOICES (a row with a finite sink is not one: 0)
    causal_alignment: str | None = None  # what a plain is_causal does when Lq != Lk: CAUSAL_ALIGNMENTS
    notes: tuple = field(default_factory=tuple)  # free text: e.g. "softmax runs in float32"
    # The narrowest float type a step runs in when it caps accuracy below the input's
    # (jax.nn.dot_product_attention's softmax is float32 even for float64 input): judge
    # results of wider dtypes against this dtype's budget.  None = the input dtype.
    effective_precision: str | None = None
    padded_rows: str | None = None       # what a query row past q_lengths outputs: FULLY_MASKED_CHOICES
    # Results that come back in another dtype by policy, as (input dtype, output dtype) pairs,
    # e.g. (("float64", "float32"),) for a library that computes float64 input in float32.
    output_dtypes: tuple = ()
    deviations: tuple = ()  # Deviation(property, why, dtypes): known departures, reported as such
    # issue 31: whether the returned LSE counts the sinks (logaddexp(lse, s_h): FA4 yes; gpt-oss's
    # Triton kernel no, its M = m + log l over the real keys).  None = not declared (recorded).
    lse_with_sinks: bool | None = None
    # ---- conventions kernels differ on (issue 31; properties/test_conventions.py): judged where declared,
    # recorded where not.  lse_base: LSE_BASES (None: natural, the spec's, is assumed and the base recorded);
    # empty_lse: EMPTY_LSES for a row with no visible key (None: left open, recorded); deterministic:
    # repeated backward calls bitwise equal (the forward is asked of every backend); batch_invariant: a
    # sequence's rows bitwise independent of the others in the call; knob_exact: every setting of
    # Backend.knobs bitwise equal to the default (else within the error budget)
    lse_base: str | None = None
    empty_lse: str | None = None
    deterministic: bool | None = None
    batch_invariant: bool | None = None
    knob_exact: bool = False
    # issue 30: what the native packed and paged hooks do with index arguments that point outside their
    # tensors (properties/test_bad_indices.py hands them such, bypassing the harness's validation): True
    # = every one refused (raises), judged; False = declared unchecked (the caller validates, as
    # flash-attention's kernels expect), recorded; None = not declared, recorded
    rejects_bad_indices: bool | None = None
    # fp8 inputs (issue 31): what P = exp(s - max) is rounded to before P V, as (input dtype, P dtype) pairs -
    # "float8_e4m3fn" (FA3, FA4, PyTorch's quantised SDPA: the second GEMM takes fp8), a 16-bit dtype
    # (FlashInfer's fp8 KV cache), "float32" (not rounded); an fp8 input without a pair: not declared, the
    # rounding is observed on a probe, recorded and judged as observed (properties/test_fp8.py)
    p_dtypes: tuple = ()

    def __post_init__(self):
        for name, known in (("lse_base", LSE_BASES), ("empty_lse", EMPTY_LSES)):
            if getattr(self, name) not in (None,) + known:
                raise ValueError(f"Semantics.{name} must be one of {', '.join(known)} or None; got {getattr(self, name)!r}")
        for pair in self.p_dtypes:
            if (not isinstance(pair, tuple) or len(pair) != 2 or pair[0] not in FP8_DTYPE_NAMES
                    or pair[1] not in FP8_DTYPE_NAMES + QUERY_DTYPES):
                raise ValueError(f"Semantics.p_dtypes: (fp8 input dtype, P dtype) pairs, the P dtype one of "
                                 f"{', '.join(FP8_DTYPE_NAMES + QUERY_DTYPES)}; got {pair!r}")

    def p_dtype(self, dtype: str) -> str | None:
        """What P is rounded to before P V for fp8 input `dtype` ("float32": not rounded); None: not declared."""
        return dict(self.p_dtypes).get(dtype)

    def deviation(self, prop: str, dtype: str, feature: bool | None = None):
        """The declared Deviation covering this property at this dtype, or None (feature: only those
        tied to a feature, True, or only those that are not, False)."""
        return next((d for d in self.deviations if d.covers(prop, dtype)
                     and (feature is None or bool(d.feature or d.problems) == feature)), None)


def _call_fields() -> list:
    """Call's fields: the classic three, every field of the problem's table (at its off value), then
    the call options."""
    return ([("mask", object, None), ("is_causal", bool, False), ("scale", object, None)]
            + [(f.name, object, f.off) for f in FIELDS]
            + [("return_lse", bool, False), ("dtype", str, "float64"), ("knobs", object, None)])


# What `native_attention` receives besides q, k, v: the problem's fields (specs.fields.FIELDS), arrays
# native and cast as each row says (bias in the input dtype, lengths and segment ids int32, ALiBi
# slopes float64 for float64 input, else float32); mask bool (..., Lq, Lk), True = takes part; scale
# None = the backend's default (1/sqrt(E)); return_lse: then return (output, lse (..., Hq, Lq),
# natural log, or base 2 where Semantics.lse_base says so); dtype: the dtype q, k, v were cast to; knobs:
# {knob: value} of Backend.knobs for this call (None: every knob at its default, the first of its domain).
Call = make_dataclass("Call", _call_fields(), frozen=True)
Call.__doc__ = "What native_attention receives besides q, k, v (backends/declarations.py)."


def numpy_layout(x: np.ndarray, layout: str, heads: int = -3) -> np.ndarray:
    """A NumPy view of x's values in `layout` (see Backend.relayout); `heads`: the heads axis."""
    if layout == "head_slice":
        if x.ndim < 3:
            return x
        wide = list(x.shape)
        wide[heads] += 2
        buf = np.full(wide, np.nan, dtype=x.dtype)  # the neighbouring heads: NaN, a stray read shows
        view = buf[(slice(None),) * (heads % x.ndim) + (slice(1, 1 + x.shape[heads]),)]
        view[...] = x
        return view
    if layout == "transposed":
        return np.swapaxes(np.ascontiguousarray(np.swapaxes(x, -1, -2)), -1, -2)
    if layout == "offset":
        buf = np.empty(x.size + 7, dtype=x.dtype)
        view = buf[7:].reshape(x.shape)
        view[...] = x
        return view
    if layout == "permuted":
        return np.swapaxes(np.ascontiguousarray(np.swapaxes(x, -3, -2)), -3, -2) if x.ndim >= 3 else x
    if layout == "expanded":
        if x.ndim < 3 or not (x == x[:1]).all():
            raise ValueError("an expanded layout needs equal batch slices")
        return np.broadcast_to(x[:1], x.shape)
    raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
