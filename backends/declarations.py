"""What a backend declares (capabilities, semantics) and what its native call receives (Call).

Plain data, no framework: `backends.base.Backend` reads them, the suite judges by them, and
`attnspec backends` lists them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, make_dataclass

import numpy as np

from attnspec.specs.fields import CAUSAL_ALIGNMENTS, FEATURES, FIELDS

FULLY_MASKED_CHOICES = ("zeros", "nan", "mean_of_values", "error")
# Memory layouts of q, k, v a backend can be handed (`Backend.relayout`): the same values, other strides.
LAYOUTS = ("contiguous", "transposed", "offset", "permuted", "expanded")
OPS = ("forward", "forward_backward")



@dataclass(frozen=True)
class Capabilities:
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

    def __post_init__(self):
        unknown = sorted(set(self.features) - set(FEATURES))
        if unknown:
            raise ValueError(f"Capabilities.features: unknown {unknown}; known: {', '.join(FEATURES)}")
        object.__setattr__(self, "features", frozenset(self.features))
        m = self.head_dim_multiple
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"Capabilities.head_dim_multiple must be a positive int; got {m!r}")


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


@dataclass(frozen=True)
class Semantics:
    """Declared behaviour where the spec leaves a choice; None = not declared."""

    fully_masked: str | None = None      # one of FULLY_MASKED_CHOICES
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
            + [("return_lse", bool, False), ("dtype", str, "float64")])


# What `native_attention` receives besides q, k, v: the problem's fields (specs.fields.FIELDS), arrays
# native and cast as each row says (bias in the input dtype, lengths and segment ids int32, ALiBi
# slopes float64 for float64 input, else float32); mask bool (..., Lq, Lk), True = takes part; scale
# None = the backend's default (1/sqrt(E)); return_lse: then return (output, lse (..., Hq, Lq),
# natural log); dtype: the dtype q, k, v were cast to.
Call = make_dataclass("Call", _call_fields(), frozen=True)
Call.__doc__ = "What native_attention receives besides q, k, v (backends/declarations.py)."


def numpy_layout(x: np.ndarray, layout: str) -> np.ndarray:
    """A NumPy view of x's values in `layout` (see Backend.relayout)."""
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
