"""Backends for the declared-deviation tests: one known departure, declared or not."""
from __future__ import annotations

import numpy as np

from attnspec.backends.base import Deviation, Semantics
from attnspec.backends.numpy_backends import NumpyNaive


class LeaksPaddingNaN(NumpyNaive):
    """numpy-naive reading the padding: 0 * NaN in a padded value reaches the output (JAX's and
    flex's behaviour with sequence lengths).  Declares nothing about it."""

    name = "leaks-padding-nan"

    def native_attention(self, q, k, v, call):
        w, lse = self._weights(q, k, call)  # (..., Lq, Lk) zero weight on padded keys
        return w @ v  # (..., Lq, Ev) 0 * NaN = NaN


class LeaksPaddingNaNDeclared(LeaksPaddingNaN):
    name = "leaks-padding-nan-declared"
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros", deviations=(
        Deviation("nan_in_padding_changes_nothing", "reads padded values: 0 * NaN reaches the output"),))


class DeclaresADeviationItHasNot(NumpyNaive):
    name = "declares-a-deviation-it-has-not"
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros", deviations=(
        Deviation("nan_in_padding_changes_nothing", "said to read padded values"),))


class NanRowsButFloat64Declared(NumpyNaive):
    """Fully masked rows are NaN (as declared), but float64's are zeros: declared as a float64
    deviation of fully_masked_rows (OpenVINO's f32 variant does the like: the mean of V)."""

    name = "nan-rows-but-float64-declared"
    semantics = Semantics(fully_masked="nan", causal_alignment="top_left", padded_rows="zeros", deviations=(
        Deviation("fully_masked_rows", "float64 rows are zeros, the others NaN", dtypes=("float64",)),))

    def native_attention(self, q, k, v, call):
        out = super().native_attention(q, k, v, call)
        if q.dtype == "float64":
            return out
        empty = ~self._weights(q, k, call)[0].any(axis=-1, keepdims=True)  # (..., Lq, 1) rows with no key
        return np.where(empty, np.nan, out)  # (..., Lq, Ev)


class LeaksPaddingNaNDeclaredElsewhere(LeaksPaddingNaN):
    """Declares the padding leak only where a problem has a single batch element (`when`): the
    leak on other problems is a failure, not the declared deviation."""

    name = "leaks-padding-nan-declared-elsewhere"
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros", deviations=(
        Deviation("nan_in_padding_changes_nothing", "reads padded values on a problem of one batch element",
                  when=r"no problem has this text"),))


class TwoConfinedDeviations(NumpyNaive):
    """Two departures, each declared as confined: grouped heads raise (a feature), and a causal
    problem's output is 1 % off (some problems).  Keras' NumPy backend declares two the same way;
    a failure on the second's problems is that deviation, not a failure, whichever comes first."""

    name = "two-confined-deviations"
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros", deviations=(
        Deviation("*", "grouped heads raise", feature="gqa", when="grouped heads refused"),
        Deviation("matches_reference", "causal rows 1 % off", problems=r"is_causal=True", when="exceeds"),))

    def native_attention(self, q, k, v, call):
        if call.enable_gqa:
            raise ValueError("grouped heads refused")
        out = super().native_attention(q, k, v, call)
        return out * 1.01 if call.is_causal and not call.return_lse else out  # (..., Lq, Ev)


class TwoConfinedDeviationsOneUndeclared(TwoConfinedDeviations):
    """The same kernel declaring only its grouped heads: the causal error is a failure."""

    name = "two-confined-deviations-one-undeclared"
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros", deviations=(
        TwoConfinedDeviations.semantics.deviations[0],))


class DeclaredAndAnotherDefect(NumpyNaive):
    """Two defects in one property: one-row queries are off by one (declared, with ``when=`` on the
    problem's text; the seeds' one-row examples meet it first), and queries of four rows or more are
    1 % off (undeclared).  The declared one must not end the property: the second is still found."""

    name = "declared-and-another-defect"
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros", deviations=(
        Deviation("matches_reference", "one-row queries off by one", when=r"problem: Case\(.*\bLq=1 "),))

    def native_attention(self, q, k, v, call):
        out = super().native_attention(q, k, v, call)
        if call.return_lse:
            return out
        if q.shape[-2] == 1:
            return out + 1  # (..., 1, Ev) declared
        return out * 1.01 if q.shape[-2] >= 4 else out  # (..., Lq, Ev) not declared
