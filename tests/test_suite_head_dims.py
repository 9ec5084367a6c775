"""A declared head-dim multiple (cuDNN: 8): the draws honour it, the adapter's base refuses the
rest by name, and the suite still judges every property on problems the backend takes."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnspec.backends.base import Capabilities, Unsupported
from attnspec.properties import draws
from attnspec.properties.case import Case
from attnspec.properties.draws import draw_case
from attnspec.properties.judge import agreement
from attnspec.properties.runner import run_suite
from attnspec.properties.target import Target, signature
from tests._helpers import target_of
from tests.plugins.head_dims import NumpyHeadDim8

PLUGIN = "tests.plugins.head_dims:NumpyHeadDim8"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout: tests.plugins imports from it


class EqualHeadDims8(NumpyHeadDim8):
    """Also declines Ev != E (jax.nn.dot_product_attention does), without declaring it: the suite's
    probe must find out, asking with head dims in the multiple."""

    name = "numpy-head-dim-8-equal"

    def native_attention(self, q, k, v, call):
        if q.shape[-1] != v.shape[-1]:
            raise Unsupported(f"{self.name} needs Ev == E; got E={q.shape[-1]}, Ev={v.shape[-1]}")
        return super().native_attention(q, k, v, call)


class CompiledHeadDims8(NumpyHeadDim8):
    """Compiles per shape: its shapes come from the fixed menu, head dims rounded up to the multiple."""

    name = "numpy-head-dim-8-compiled"
    compiles_per_shape = True


def target(backend, dtype="float32") -> Target:
    return target_of(backend, dtype, spec=f"{type(backend).__module__}:{type(backend).__name__}")


@pytest.mark.parametrize("bad", [0, -8, 2.0, True, "8"])
def test_head_dim_multiple_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="head_dim_multiple must be a positive int"):
        Capabilities(head_dim_multiple=bad)


def test_a_head_dim_off_the_multiple_is_unsupported_by_name():
    q = k = v = np.zeros((1, 1, 3, 4))  # E = Ev = 4
    with pytest.raises(Unsupported, match="multiples of 8; got E=4, Ev=4"):
        NumpyHeadDim8().forward(q, k, v, dtype="float64")


def test_the_ev_probe_asks_only_about_ev_within_the_multiple():
    """Whether a backend takes Ev != E is asked once, with head dims it takes (E = 16, Ev = 24): a
    refusal of E = 2 for being off the multiple must not read as "needs Ev == E" (Ev != E would never
    be drawn); a backend that does refuse Ev != E is found out."""
    t = target(NumpyHeadDim8(), "float64")
    assert t.equal_head_dims is False
    probe = signature("forward", Case(*(np.zeros(d) for d in ((1, 1, 2, 16), (1, 1, 3, 16), (1, 1, 3, 24)))),
                      "float64")  # (B, H, L, E = 16; Ev = 24)
    assert list(t.session.calls) == [probe]
    assert t.equal_head_dims is False and len(t.session.calls) == 1  # asked once a run
    assert target(EqualHeadDims8(), "float64").equal_head_dims is True


@pytest.mark.parametrize("backend,probe", [(NumpyHeadDim8, False), (NumpyHeadDim8, True),
                                           (EqualHeadDims8, False), (EqualHeadDims8, True)])
def test_draws_use_head_dims_in_the_declared_multiple(backend, probe):
    """E and Ev in the multiple; with the weight probe (V = identity: Ev becomes Lk) Lk too; E == Ev
    (== Lk with the probe) for a backend that declines Ev != E.  The backend takes every problem
    drawn, and agrees with the reference on it."""
    t = target(backend())
    equal = t.equal_head_dims
    seen = []

    @settings(max_examples=40, database=None, derandomize=True, deadline=None)
    @given(data=st.data())
    def sample(data):
        case = draw_case(data.draw, t, probe=probe)
        d = case.dims
        seen.append((d["E"], d["Ev"]) + ((d["Lk"],) if probe else ()))
        if equal:
            assert d["E"] == d["Ev"] and (not probe or d["Lk"] == d["E"]), d
        agreement(t, case.with_identity_values() if probe else case)  # a Declined or Failed would raise

    sample()
    assert seen and all(n % 8 == 0 for dims in seen for n in dims), seen[:5]
    assert equal or any(e != ev for e, ev, *_ in seen), "Ev != E never drawn for a backend that takes it"


@settings(max_examples=30, database=None, derandomize=True, deadline=None)
@given(data=st.data())
def test_a_compiling_backend_gets_the_menu_shapes_rounded_up_to_the_multiple(data):
    t = target(CompiledHeadDims8())
    case = draw_case(data.draw, t, probe=data.draw(st.booleans(), label="probe"))
    d = case.dims
    assert d["E"] % 8 == 0 and d["Ev"] % 8 == 0 and d["Lk"] % 8 == 0, d
    menu = {(s.B, s.H, s.Hkv, s.Lq) for s in draws.COMPILED_SHAPES + draws.COMPILED_GQA_SHAPES}
    assert (d["B"], d["H"], d["Hkv"], d["Lq"]) in menu, d
    agreement(t, case)


@pytest.mark.slow
def test_the_suite_judges_such_a_backend_on_every_property_numpy_naive_gets():
    """Declaring the multiple costs no coverage: the same verdict per property and dtype as the
    same kernel without it (numpy-naive), no failure from a head dim it does not take, problems run
    for every property it passes."""
    result = run_suite([PLUGIN, "numpy-naive"], extra_args=["-k", "float32 or float64"], profile="dev", timeout=600,
                       pythonpath=[ROOT])
    verdicts = {name: {(r["property"], r["dtype"]): r["status"] for r in result.conformance if r["backend"] == name}
                for name in ("numpy-head-dim-8", "numpy-naive")}
    assert result.returncode == 0, result.output[-3000:]
    assert verdicts["numpy-head-dim-8"] and verdicts["numpy-head-dim-8"] == verdicts["numpy-naive"]
    assert {d for _, d in verdicts["numpy-head-dim-8"]} == {"float32", "float64"}
    assert len({p for p, _ in verdicts["numpy-head-dim-8"]}) >= 40  # every family's properties, not a few
    ran = [r for r in result.conformance if r["backend"] == "numpy-head-dim-8" and r["status"] == "passed"]
    assert ran and all(r["examples"] > 0 for r in ran), [r for r in ran if not r["examples"]][:3]


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
