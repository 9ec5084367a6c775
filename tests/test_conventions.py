"""Issue 31's declarations and entry points: bad values are ValueErrors naming the argument; a declared
base-2 LSE comes back natural; the merge entry points of numpy-naive and torch-math (a pair, a list)
meet the reference."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from attnspec.backends.base import Semantics, Unsupported
from attnspec.backends.registry import resolve
from attnspec.specs import reference
from attnspec.specs.merge_budget import merge_allowed


@pytest.mark.parametrize("name, value", [("lse_base", "10"), ("empty_lse", "nan"), ("empty_lse", "-inf ")])
def test_semantics_refuses_unknown_conventions(name, value):
    with pytest.raises(ValueError, match=f"Semantics.{name}"):
        Semantics(**{name: value})


def test_unknown_knob_is_a_value_error_naming_it():
    q = np.ones((1, 1, 2, 4))
    with pytest.raises(ValueError, match="knobs: numpy-tiled has no knob"):
        resolve("numpy-tiled").forward(q, q, q, knobs={"num_splits": 2})
    with pytest.raises(ValueError, match="knobs: numpy-naive has no knob"):
        resolve("numpy-naive").forward(q, q, q, knobs={"block_size": 16})


def test_format_calls_take_knobs_as_the_padded_call_does():
    """A setting reaches the packed, paged and append calls' `call.knobs` (a split count acts on a decode's
    paged call above all), and a backend without a padded call gets its forward's setting through its format;
    an unknown knob is the same ValueError there."""
    from attnspec.backends import serving
    from attnspec.backends.numpy_backends import NumpyNaive

    seen = []

    class Recording(NumpyNaive):
        name = "recording-knobs"
        knobs = {"num_splits": (1, 2)}

        def native_attention(self, q, k, v, call):
            seen.append(call.knobs)
            return super().native_attention(q, k, v, call)

    class PagedOnly(Recording):
        capabilities = replace(NumpyNaive.capabilities, formats=("paged-NHD",))

    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 1, 3, 4)), rng.standard_normal((2, 1, 5, 4)), rng.standard_normal((2, 1, 5, 4))
    fields = dict(kv_lengths=np.array([5, 3]), positions="per_sequence")
    backend = Recording()
    for call in (serving.forward_packed, serving.forward_paged):
        seen.clear()
        call(backend, q, k, v, knobs={"num_splits": 2}, **fields)
        assert seen and all(s == {"num_splits": 2} for s in seen), (call.__name__, seen)
        with pytest.raises(ValueError, match="knobs: recording-knobs has no knob"):
            call(backend, q, k, v, knobs={"block_size": 16}, **fields)
    seen.clear()
    serving.append_paged(backend, q, k, v, 1, knobs={"num_splits": 2}, **fields)
    assert seen and all(s == {"num_splits": 2} for s in seen), seen
    seen.clear()
    PagedOnly().forward(q, k, v, knobs={"num_splits": 2}, **fields)
    assert seen and all(s == {"num_splits": 2} for s in seen), seen


def test_backward_calls_take_knobs_as_the_forward_does():
    """A setting reaches the backward's `call.knobs`: the padded backward, with sinks, a packed-only backend's
    backward (through its packed backward) and the packed backward itself; an unknown knob is a ValueError."""
    from attnspec.backends import serving
    from attnspec.backends.numpy_backends import NumpyNaive

    seen = []

    class Recording(NumpyNaive):
        name = "recording-backward-knobs"
        knobs = {"num_splits": (1, 2)}

        def native_attention_backward(self, q, k, v, grad_out, call):
            seen.append(call.knobs)
            return super().native_attention_backward(q, k, v, grad_out, call)

    class PackedOnly(Recording):
        capabilities = replace(NumpyNaive.capabilities, formats=("packed",))

    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 2, 3, 4)), rng.standard_normal((2, 2, 5, 4)), rng.standard_normal((2, 2, 5, 4))
    g = rng.standard_normal((2, 2, 3, 4))  # (B, H, Lq, Ev)
    fields = dict(kv_lengths=np.array([5, 3]), positions="per_sequence")
    calls = [lambda kn: Recording().backward(q, k, v, g, knobs=kn),
             lambda kn: Recording().backward(q, k, v, g, knobs=kn, sinks=np.array([0.5, -1.0])),
             lambda kn: PackedOnly().backward(q, k, v, g, knobs=kn, **fields),
             lambda kn: serving.backward_packed(Recording(), q, k, v, g, knobs=kn, **fields)]
    for n, call in enumerate(calls):
        seen.clear()
        call({"num_splits": 2})
        assert seen and all(s == {"num_splits": 2} for s in seen), (n, seen)
        with pytest.raises(ValueError, match="knobs: recording-backward-knobs has no knob"):
            call({"block_size": 16})


def test_merge_parts_are_checked_and_default_is_not_offered():
    o, lse = np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3))
    naive = resolve("numpy-naive")
    with pytest.raises(ValueError, match="parts: every output must share one shape"):
        naive.merge([(o, lse), (o, lse[..., :2])])
    with pytest.raises(ValueError, match="parts: every output must share one shape"):
        naive.merge([(o, lse), (o[..., :2], lse)])
    with pytest.raises(ValueError, match="parts: a non-empty list"):
        naive.merge([])
    with pytest.raises(ValueError, match="parts: a non-empty list"):
        naive.merge([o, lse])  # arrays, not (output, lse) pairs
    with pytest.raises(Unsupported, match="offers no merge"):
        resolve("numpy-tiled").merge([(o, lse), (o, lse)])
    from tests.broken.convention_bugs import MergeAverages  # a pair hook only: a list is declined
    with pytest.raises(Unsupported, match="merges pairs only"):
        MergeAverages().merge([(o, lse)] * 3)
    with pytest.raises(ValueError, match="parts: at least one"):
        merge_allowed([], "float32")


@pytest.mark.parametrize("name", ["numpy-naive", "torch-math"])
@pytest.mark.parametrize("count", [2, 4])
def test_builtin_merges_meet_the_reference_and_keep_empty_exact(name, count):
    """A pair and a list of four (FA3's flash_attn_combine): a huge gap, an empty state, every state empty."""
    backend = resolve(name)  # not loaded: a merge may be a backend's first call (a reproducer replays it alone)
    rng = np.random.default_rng(0)
    outs = rng.standard_normal((count, 1, 2, 3, 4))  # each (B, H, Lq, Ev)
    lses = rng.standard_normal((count, 1, 2, 3))  # each (B, H, Lq)
    lses[0, ..., 1], lses[1:, ..., 1] = 1e4, -np.inf  # row 1: one state of all the mass, the others empty
    lses[..., 2], outs[..., 2, :] = -np.inf, 0.0  # row 2: every state empty
    parts = list(zip(outs, lses, strict=True))
    o, lse = backend.merge(parts, "float64")
    want_o, want_lse = reference.merge(parts)
    o_tol, l_tol = merge_allowed(parts, "float64")
    assert np.all(np.abs(o[..., :2, :] - want_o[..., :2, :]) <= o_tol[..., :2, :])
    assert np.all(np.abs(lse[..., :2] - want_lse[..., :2]) <= l_tol[..., :2])
    assert np.all(o[..., 2, :] == 0) and np.all(lse[..., 2] == -np.inf)  # flashinfer#4051: not NaN


def test_declared_base_two_comes_back_natural():
    from tests.broken.correct import LseBase2Declared
    rng = np.random.default_rng(1)
    q, k, v = np.round(rng.standard_normal((3, 1, 2, 4, 8)) * 8) / 8  # exact in bfloat16
    _, lse = LseBase2Declared().forward(q, k, v, dtype="bfloat16", return_lse=True)
    # computed in float32 (the kernel widens bfloat16): a few float32 roundings of an LSE near 1
    np.testing.assert_allclose(lse, reference.forward(q, k, v).lse, rtol=2.0**-20)


def test_compiled_flex_tiles_by_its_block_size_knob():
    """torch-flex-compiled's knob reaches its CPU kernel as the BlockMask's BLOCK_SIZE (what the CPU template
    tiles by), a full block mask where the problem hides nothing; the default leaves flex its own (no mask)."""
    from attnspec.backends.base import Call
    backend = resolve("torch-flex-compiled")
    ok, why = backend.availability()
    if not ok:
        pytest.skip(why)
    default, other = backend.knobs["block_size"]
    for knobs, want in ((None, None), ({"block_size": default}, None), ({"block_size": other}, (other, other))):
        _, block_mask = backend._specialised_mods(Call(knobs=knobs), (1, 2), 1, 2, 40, 70, "cpu")
        assert (None if block_mask is None else tuple(block_mask.BLOCK_SIZE)) == want, knobs
    _, causal = backend._specialised_mods(Call(is_causal=True, knobs={"block_size": other}), (1, 2), 1, 2, 40, 70, "cpu")
    assert tuple(causal.BLOCK_SIZE) == (other, other)
