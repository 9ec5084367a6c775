"""Family: ALiBi — a bias -slope_h * |i + o - j| with the standard slopes, and its native parameter.

The standard slopes (`specs.problem.alibi_slopes`) for a head count that is not a power of two
interpolate between two powers of two; using 2^(-8 h / H) instead is a common bug
(ml-explore/mlx#343, #3071).  A backend taking slopes natively must equal the explicit bias.
"""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from attnspec.properties.judge import agreement, close_outputs, draw_case, requires

_ALIBI = frozenset({"alibi"})


@given(data=st.data())
def test_alibi_matches_reference(target, data):
    """Native ALiBi slopes, the head counts drawn including 3 and 6 (not powers of two)."""
    requires(target, "alibi")
    agreement(target, draw_case(data, target, need=_ALIBI, regimes=("small", "medium")), "alibi_matches_reference")


@given(data=st.data())
def test_alibi_equals_explicit_bias(target, data):
    """The backend's native slopes and the same ALiBi as an explicit bias give the same output."""
    requires(target, "alibi", "bias")
    case = draw_case(data, target, need=_ALIBI, avoid=frozenset({"bias"}), regimes=("small", "medium"))
    d = case.dims
    explicit = case.then(f"fields = dict(fields, bias=alibi_bias(fields['alibi_slopes'], {d['Lq']}, {d['Lk']}, "
                         f"{case.alignment!r}))  # ALiBi as an explicit bias", alibi_bias=_alibi_bias)
    explicit = explicit.with_fields("slopes off", alibi_slopes=None)
    native, biased = target.forward(case), target.forward(explicit)  # (B, H, Lq, Ev) twice
    close_outputs("alibi_equals_explicit_bias", target, case, native, biased, explicit,
                  "native ALiBi slopes vs the same ALiBi as a bias", checks=(
                      "from specs.problem import alibi_bias",
                      "kw = dict(call_kwargs, bias=alibi_bias(fields['alibi_slopes'], q.shape[-2], k.shape[-2], "
                      "fields.get('causal_alignment', 'top_left')))",
                      "kw.pop('alibi_slopes')",
                      f"out2 = backend.forward(q, k, v, dtype={target.dtype!r}, **kw)",
                      "print(np.abs(out2 - out).max())  # must be ~0"))


def _alibi_bias(*args):
    from attnspec.specs.problem import alibi_bias
    return alibi_bias(*args)
