"""The gradient of a row that sees no key is judged as its output is declared (properties/test_gradients.py):
zeros declared, a constant row passes no gradient and a NaN through exp(S - LSE) is a failure; another
declaration, the property is skipped with its reason (a NaN row's gradient is NaN by the declaration).  In a
packed call, such a row's dQ may be NaN where NaN is declared, never another sequence's dK (test_packed.py)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attnspec.backends import numpy_formats
from attnspec.backends.base import Semantics
from attnspec.backends.numpy_backends import NumpyNaive
from attnspec.properties import test_gradients as G
from attnspec.properties import test_packed as T
from attnspec.properties.explore import Exploration, explore
from tests._helpers import target_of
from tests.broken._kernels import numpy_caps
from tests.broken._variants import VariantKernel
from tests.broken.reach_bugs import BwdEmptyRowNaN

PROP = G.test_backward_empty_rows_pass_nothing.property


class Correct(VariantKernel):
    name = "correct-with-gradients"
    capabilities = numpy_caps("float32", gradients=True, features=("gqa", "causal_bottom_right"))


class NanDeclared(BwdEmptyRowNaN):
    name = "nan-rows-declared"
    semantics = dataclasses.replace(BwdEmptyRowNaN.semantics, fully_masked="nan")


def test_a_correct_backward_passes_every_grid_problem():
    target = target_of(Correct(), "float32")
    assert explore(PROP, target, Exploration()) is None
    assert len(G.BACKWARD_EMPTY_ROWS) == 3 and target.left_out == 0  # every grid problem ran


def test_nan_in_an_empty_rows_gradient_fails_where_zeros_are_declared():
    assert BwdEmptyRowNaN.semantics.fully_masked == "zeros"
    failure = explore(PROP, target_of(BwdEmptyRowNaN(), "float32"), Exploration())
    assert failure is not None and failure.prop is PROP
    assert failure.verdict.message.startswith(("dq:", "dk:", "dv:")), failure.verdict.message
    assert "inf" in failure.verdict.message or "nan" in failure.verdict.message
    assert not failure.case.judged_rows().all()  # the failing grid problem has a row that sees no key


def test_another_declaration_skips_with_its_reason():
    assert isinstance(NanDeclared.semantics, Semantics)
    with pytest.raises(pytest.skip.Exception, match="declares fully_masked = 'nan'"):
        explore(PROP, target_of(NanDeclared(), "float32"), Exploration())


def test_the_grid_has_whole_empty_tiles_single_empty_rows_and_grouped_heads():
    from attnspec.properties import test_edges as edges
    cases = [edges.grid_case(e, "float64") for e in G.BACKWARD_EMPTY_ROWS]
    empty = [~c.judged_rows() for c in cases]  # (B, H, Lq) each
    assert empty[0][0, 0, :64].all() and empty[0].sum() == 2 * 96  # a whole 64-row query tile and more
    assert np.flatnonzero(empty[1][0, 0]).tolist() == [0, *range(32, 48), 64]
    assert cases[2].fields.get("enable_gqa") and np.flatnonzero(empty[2][0, 0]).tolist() == [5, 32]


class _PackedNanRows(NumpyNaive):
    """Declares NaN for a row that sees no key; its packed backward gives such rows NaN dQ (`spread`: and every
    key of the batch NaN dK, as a block-diagonal bias over the packed tokens does)."""

    name = "packed-nan-rows"
    capabilities = dataclasses.replace(NumpyNaive.capabilities, dtypes=("float32",), formats=("padded", "packed"),
                                       features=frozenset({"seq_lengths", "seq_positions", "causal_bottom_right"}))
    semantics = dataclasses.replace(NumpyNaive.semantics, fully_masked="nan")
    spread = False

    def native_packed_backward(self, q, k, v, grad_out, args, call):
        dq, dk, dv = (np.array(g) for g in numpy_formats.gathered_packed_backward(self, q, k, v, grad_out, args, call))
        cu_q, _, used = numpy_formats._packed_extents(args)
        for b in np.flatnonzero(used == 0):
            dq[cu_q[b]:cu_q[b + 1]] = np.nan  # (tokens, Hq, E) rows that see no key
            if self.spread:
                dk[...] = np.nan
        return dq, dk, dv


class _PackedNanSpread(_PackedNanRows):
    name = "packed-nan-spread"
    spread = True


def test_a_nan_declared_packed_backward_may_give_empty_rows_nan_dq_but_never_other_keys_nan():
    prop = T.test_packed_gradient_edges.property
    assert explore(prop, target_of(_PackedNanRows(), "float32"), Exploration()) is None
    failure = explore(prop, target_of(_PackedNanSpread(), "float32"), Exploration())
    assert failure is not None and failure.verdict.message.startswith("dk:"), failure and failure.verdict.message
