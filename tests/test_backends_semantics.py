"""What each built-in declares where the spec leaves a choice, checked by running it.

- fully masked rows (no visible key): `zeros`, `nan`, `mean_of_values` or `error`;
- causal alignment when Lq != Lk: `top_left` (key j <= query i) or `bottom_right`
  (j <= i + Lk - Lq), each checked against the reference with that explicit mask, and
  checked to *disagree* with the other alignment, so the test can tell them apart.
"""
from __future__ import annotations

import numpy as np
import pytest

from attnspec.backends.base import BackendFailure
from attnspec.backends.registry import ZOO, builtin_names, resolve
from attnspec.specs import error_budget, reference
from attnspec.specs.problem import causal_mask
from tests._helpers import judged_dtype, qkv
from tests.plugins.cases import available

# our own adapters; the libraries people run (registry.ZOO) are judged by the suite with what they
# declare (tests/test_backends_zoo.py)
_BACKENDS = {name: resolve(name) for name in builtin_names() if name not in ZOO}
_DTYPE = "float32"  # every CPU built-in declares it; one dtype keeps JAX compiles few


def _available(name):
    return available(_BACKENDS, name)


def _budget(backend) -> str:
    """The budget for its float32 results: a declared narrower effective precision (openvino-sdpa's bfloat16)."""
    return judged_dtype(backend, _DTYPE)


def _problem(Lq, Lk, seed=0):
    return qkv(seed, batch=(1, 2), Lq=Lq, Lk=Lk, E=8)  # (1, 2, L, 8) each


@pytest.mark.parametrize("name", list(_BACKENDS))
def test_fully_masked_row_is_as_declared(name):
    backend = _available(name)
    declared = backend.semantics.fully_masked
    if declared is None:
        pytest.skip(f"{name} declares nothing for fully masked rows")
    q, k, v = _problem(4, 6)
    mask = np.ones((4, 6), dtype=bool)  # (Lq, Lk)
    mask[1] = False  # query 1 sees no key
    if declared == "error":
        with pytest.raises(BackendFailure):
            backend.forward(q, k, v, mask, dtype=_DTYPE)
        return
    out = backend.forward(q, k, v, mask, dtype=_DTYPE)  # (1, 2, 4, 8)
    row = out[..., 1, :]  # (1, 2, 8)
    if declared == "zeros":
        assert np.all(row == 0), f"{name}: fully masked row is {row}, declared zeros"
    elif declared == "nan":
        assert np.all(np.isnan(row)), f"{name}: fully masked row is {row}, declared nan"
    else:  # mean_of_values: every key weighted equally
        mean = v.mean(axis=-2)  # (1, 2, 8)
        # an average of Lk values: the plain float32 algorithm's error is rounding of the
        # inputs and of the sum, which the error model's floor covers (plain = exact here)
        verdict = error_budget.check_close(row, mean, mean, _budget(backend), "fully masked row", 6,
                                           float(np.abs(v).max()))
        assert verdict, f"{name}: {verdict.message}"
    others = np.delete(out, 1, axis=-2)  # the rows that do see keys are unaffected
    ref = np.delete(reference.attention(q, k, v, mask), 1, axis=-2)
    plain = np.delete(error_budget.plain_forward(q, k, v, mask, dtype=_budget(backend)), 1, axis=-2)
    verdict = error_budget.check_close(others, ref, plain, _budget(backend), "visible rows", 8, float(np.abs(v).max()))
    assert verdict, f"{name}: {verdict.message}"


@pytest.mark.parametrize("name", list(_BACKENDS))
@pytest.mark.parametrize("Lq,Lk", [(3, 7), (7, 3)], ids=["Lq<Lk", "Lq>Lk"])
def test_causal_alignment_is_as_declared(name, Lq, Lk):
    backend = _available(name)
    declared = backend.semantics.causal_alignment
    if declared is None:
        pytest.skip(f"{name} declares no causal alignment")
    q, k, v = _problem(Lq, Lk, seed=1)
    out = backend.forward(q, k, v, is_causal=True, dtype=_DTYPE)  # (1, 2, Lq, 8)
    other = {"top_left": "bottom_right", "bottom_right": "top_left"}[declared]
    if backend.semantics.fully_masked not in ("zeros", None) and not causal_mask(Lq, Lk, declared).any(-1).all():
        pytest.skip(f"{name}: the declared alignment empties rows and the backend does not zero them")
    same = error_budget.check_forward(out, q, k, v, causal_mask(Lq, Lk, declared), dtype=_budget(backend))
    assert same, f"{name} declares {declared}: {same.message}"
    differs = error_budget.check_forward(out, q, k, v, causal_mask(Lq, Lk, other), dtype=_budget(backend))
    assert not differs, f"{name}: {other} alignment also fits; the problem cannot tell them apart"


@pytest.mark.parametrize("name", ["numpy-naive", "numpy-tiled", "torch-math", "torch-sdpa-cpu",
                                  "torch-sdpa-cpu-math", "torch-sdpa-cpu-flash", "jax-naive"])
def test_zeros_backends_give_zero_gradients_on_fully_masked_rows(name):
    """Declared `zeros`: the empty row's output is constant, so it passes no gradient and no NaN."""
    backend = _available(name)
    assert backend.semantics.fully_masked == "zeros"
    q, k, v = _problem(4, 6, seed=2)
    mask = np.ones((4, 6), dtype=bool)
    mask[2] = False  # (Lq, Lk) query 2 sees nothing
    g = np.random.default_rng(3).standard_normal((1, 2, 4, 8))  # (1, 2, Lq, Ev)
    grads = backend.backward(q, k, v, g, mask, dtype="float64")
    assert np.all(grads[0][..., 2, :] == 0), f"{name}: dQ of the empty row is not zero"
    for verdict in error_budget.check_backward(grads, q, k, v, g, mask, dtype="float64"):
        assert verdict, f"{name}: {verdict.message}"


@pytest.mark.parametrize("name", [n for n in _BACKENDS if "float64" in _BACKENDS[n].capabilities.dtypes])
def test_effective_precision_is_as_declared(name):
    """float64 in, float64-accurate out - unless a narrower effective precision is declared,
    in which case the float64 budget must fail (the declaration is needed) and its own hold."""
    backend = _available(name)
    # E = 24: no float32 holds sqrt(1/sqrt(24)), as onnxruntime-attention's float32 scale needs to show
    q, k, v = qkv(4, batch=(1, 2), Lq=16, Lk=16, E=24)  # (B, H, L, E)
    out = backend.forward(q, k, v, dtype="float64")
    declared = backend.semantics.effective_precision
    as_float64 = error_budget.check_forward(out, q, k, v, dtype="float64")
    if declared is None:
        assert as_float64, f"{name}: {as_float64.message}"
    else:
        assert not as_float64, f"{name} declares {declared} but is float64-accurate"
        verdict = error_budget.check_forward(out, q, k, v, dtype=declared)
        assert verdict, f"{name}: {verdict.message}"
