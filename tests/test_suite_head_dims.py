"""A declared head-dim multiple (cuDNN: 8): the draws honour it, the adapter's base refuses the
rest by name, and the suite still judges every property on problems the backend takes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnspec.backends.base import Capabilities, Unsupported
from attnspec.properties.runner import run_suite
from attnspec.properties.strategies import cases
from tests.plugins.head_dims import NumpyHeadDim8

PLUGIN = "tests.plugins.head_dims:NumpyHeadDim8"


@pytest.mark.parametrize("bad", [0, -8, 2.0, True, "8"])
def test_head_dim_multiple_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="head_dim_multiple must be a positive int"):
        Capabilities(head_dim_multiple=bad)


def test_a_head_dim_off_the_multiple_is_unsupported_by_name():
    q = k = v = np.zeros((1, 1, 3, 4))  # E = Ev = 4
    with pytest.raises(Unsupported, match="multiples of 8; got E=4, Ev=4"):
        NumpyHeadDim8().forward(q, k, v, dtype="float64")


@pytest.mark.parametrize("equal_dims,probe", [(False, False), (True, True), (False, True)])
def test_draws_use_head_dims_in_the_declared_multiple(equal_dims, probe):
    """E and Ev in the multiple; with the weight probe (V = identity: Ev becomes Lk) Lk too."""
    seen = []

    @settings(max_examples=60, database=None, derandomize=True, deadline=None)
    @given(data=st.data())
    def sample(data):
        case = data.draw(cases("float32", NumpyHeadDim8.capabilities, equal_dims=equal_dims, probe=probe))
        seen.append((case.q.shape[-1], case.v.shape[-1]) + ((case.k.shape[-2],) if probe else ()))

    sample()
    assert seen and all(n % 8 == 0 for dims in seen for n in dims), seen[:5]


def test_the_suite_judges_such_a_backend_on_every_property_numpy_naive_gets():
    """Declaring the multiple costs no coverage: the same verdict per property and dtype as the
    same kernel without it (numpy-naive), no failure from a head dim it does not take."""
    result = run_suite([PLUGIN, "numpy-naive"], extra_args=["-k", "float32 or float64"], timeout=600)
    verdicts = {name: {(r["property"], r["dtype"]): r["status"] for r in result.conformance if r["backend"] == name}
                for name in ("numpy-head-dim-8", "numpy-naive")}
    assert result.returncode == 0, result.output[-3000:]
    assert verdicts["numpy-head-dim-8"] and verdicts["numpy-head-dim-8"] == verdicts["numpy-naive"]


def test_a_plain_function_declares_its_head_dim_multiple_and_deviations():
    from attnspec.backends.base import Deviation
    from attnspec.backends.registry import resolve

    backend = resolve("tests.plugins.head_dims:plain_head_dim_8")
    assert backend.capabilities.head_dim_multiple == 8
    assert backend.semantics.deviations == (Deviation("zero_future_mass", "said to leak weight to the future "
                                                                          "(declared to test the plumbing)"),)
    q = np.random.default_rng(0).standard_normal((1, 2, 3, 8))  # (B, H, Lq, E = 8)
    assert backend.forward(q, q, q).shape == (1, 2, 3, 8)
    with pytest.raises(Unsupported, match="multiples of 8; got E=4"):
        backend.forward(q[..., :4], q[..., :4], q[..., :4])


@pytest.mark.parametrize("bad", [dict(head_dim_multiple=0), dict(head_dim_multiple=8.0),
                                 dict(deviations=["zero_future_mass"]), dict(deviations={"zero_future_mass": ""})])
def test_declare_refuses_a_bad_head_dim_multiple_or_deviations(bad):
    from attnspec.backends import declare

    with pytest.raises(ValueError, match=f"declare: {next(iter(bad))} must"):
        declare(lambda query, key, value, attn_mask=None, is_causal=False, scale=None: None, **bad)


def test_the_ev_probe_asks_only_about_ev_within_the_multiple():
    """Whether a backend takes Ev != E is asked with head dims it takes (16 and 24): a refusal of
    E = 2 for being off the multiple must not read as "needs Ev == E" (Ev != E would never be drawn)."""
    from attnspec.properties import targets

    backend = NumpyHeadDim8()
    targets._EQUAL_DIMS.pop(id(backend), None)  # the cache is keyed by id: no answer of a collected object
    assert targets.needs_equal_head_dims(backend, "float64") is False
