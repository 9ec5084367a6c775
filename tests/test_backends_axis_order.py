"""`length_before_heads`: a backend that takes (..., L, H, E) gets its arrays in that order, swapped on
the host (never in its call, so never timed or compiled as the kernel's), and the suite rejects one
that declares the order but does not honour it."""
from __future__ import annotations

import os

import numpy as np
import pytest

from attnspec.backends.base import BackendFailure
from attnspec.backends.numpy_backends import NumpyNaive
from attnspec.properties.runner import run_suite
from tests.plugins.length_first import LengthFirst

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout: tests.plugins imports from it


def _problem(rng, B=2, Hq=4, Hkv=2, Lq=5, Lk=7, E=8):
    q = rng.standard_normal((B, Hq, Lq, E))  # (B, Hq, Lq, E)
    k = rng.standard_normal((B, Hkv, Lk, E))  # (B, Hkv, Lk, E)
    v = rng.standard_normal((B, Hkv, Lk, E))  # (B, Hkv, Lk, E)
    g = rng.standard_normal((B, Hq, Lq, E))  # (B, Hq, Lq, E)
    return q, k, v, g


def test_the_call_is_handed_length_before_heads_and_its_results_come_back_in_the_suites_order():
    rng = np.random.default_rng(0)
    q, k, v, g = _problem(rng)
    mask = rng.random((2, 4, 5, 7)) > 0.3  # (B, Hq, Lq, Lk): masks keep the suite's order
    mask[..., 0] = True
    naive, first = NumpyNaive(), LengthFirst()
    first.seen = []
    out, lse = first.forward(q, k, v, mask, enable_gqa=True, return_lse=True)
    assert first.seen == [(2, 5, 4, 8)]  # (B, Lq, Hq, E), swapped before the call
    want, want_lse = naive.forward(q, k, v, mask, enable_gqa=True, return_lse=True)
    np.testing.assert_array_equal(out, want)  # the same kernel: the same bits, back in (B, Hq, Lq, E)
    np.testing.assert_array_equal(lse, want_lse)  # the LSE keeps (B, Hq, Lq)
    for got, expected in zip(first.backward(q, k, v, g, mask, enable_gqa=True),
                             naive.backward(q, k, v, g, mask, enable_gqa=True), strict=True):
        np.testing.assert_array_equal(got, expected)
    run = first.prepare(q, k, v, mask, dtype="float64", enable_gqa=True)
    assert run().shape == (2, 5, 4, 8) and first.seen[-1] == (2, 5, 4, 8)  # the benchmarks' call: no swap timed
    dq, dk, dv = first.prepare(q, k, v, mask, dtype="float64", op="forward_backward", enable_gqa=True)()
    assert (dq.shape, dk.shape, dv.shape) == ((2, 5, 4, 8), (2, 7, 2, 8), (2, 7, 2, 8))
    got, _ = first.forward_as_returned(q, k, v, mask, enable_gqa=True)
    np.testing.assert_array_equal(got, want)
    sinks = rng.standard_normal(4)  # (Hq,)
    got_grads, dsink = first.backward(q, k, v, g, mask, enable_gqa=True, sinks=sinks, return_dsink=True)
    want_grads, want_dsink = naive.backward(q, k, v, g, mask, enable_gqa=True, sinks=sinks, return_dsink=True)
    for a, b in zip(got_grads, want_grads, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(dsink, want_dsink)
    assert first.describe()["length_before_heads"] and not naive.describe()["length_before_heads"]


def test_rank_2_has_no_head_axis_to_swap_and_rank_5_swaps_the_last_heads_and_length():
    rng = np.random.default_rng(1)
    first, naive = LengthFirst(), NumpyNaive()
    q2, k2, v2 = rng.standard_normal((5, 8)), rng.standard_normal((6, 8)), rng.standard_normal((6, 8))
    np.testing.assert_array_equal(first.forward(q2, k2, v2), naive.forward(q2, k2, v2))
    q5, k5, v5 = rng.standard_normal((3, 2, 4, 5, 8)), rng.standard_normal((3, 1, 4, 6, 8)), rng.standard_normal((3, 1, 4, 6, 8))
    first.seen = []
    np.testing.assert_array_equal(first.forward(q5, k5, v5, is_causal=True), naive.forward(q5, k5, v5, is_causal=True))
    assert first.seen == [(3, 2, 5, 4, 8)]
    g5 = rng.standard_normal((3, 2, 4, 5, 8))  # the broadcast batch (3, 2), Hq = 4
    for got, expected in zip(first.backward(q5, k5, v5, g5, is_causal=True), naive.backward(q5, k5, v5, g5, is_causal=True),
                              strict=True):  # dk, dv summed back to k's and v's broadcast shape (3, 1, 4, 6, 8)
        np.testing.assert_array_equal(got, expected)


def test_an_output_in_the_undeclared_order_fails_clearly():
    class ReturnsHeadsFirst(LengthFirst):
        name = "returns-heads-first"

        def native_attention(self, q, k, v, call):
            return np.swapaxes(super().native_attention(q, k, v, call), -3, -2)  # (B, H, L, E): not as declared

    q, k, v, _ = _problem(np.random.default_rng(2), Hkv=4)
    with pytest.raises(BackendFailure, match=r"forward output has shape \(2, 4, 5, 8\), expected \(2, 5, 4, 8\) "
                                             r"\(length before heads, as declared"):
        ReturnsHeadsFirst().forward(q, k, v)


@pytest.mark.slow
def test_the_suite_passes_the_declared_order_and_rejects_a_kernel_that_mixes_the_axes(tmp_path):
    # the JSON (and the failures' reproducers beside it) in the test's folder, not left in the system's temp dir
    result = run_suite(["tests.plugins.length_first:LengthFirst", "tests.plugins.length_first:LengthFirstMixesAxes"],
                       json_path=str(tmp_path / "out.json"),
                       extra_args=["-k", "float64 and (test_matches_reference or test_gradients_match_reference)"], profile="dev",
                       timeout=600, pythonpath=[ROOT])
    rows = {(r["backend"], r["property"]): r["status"] for r in result.conformance}
    good = {p: s for (b, p), s in rows.items() if b == "numpy-length-first"}
    assert good.get("matches_reference") == "passed" and good.get("gradients_match_reference") == "passed"
    assert "failed" not in good.values() and "error" not in good.values(), result.output[-3000:]
    assert rows[("broken-length-first-mixes-axes", "matches_reference")] == "failed", result.output[-3000:]
