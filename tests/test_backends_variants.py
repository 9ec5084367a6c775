"""Every CPU built-in on every optional feature it declares, against the float64 reference.

For each backend and each feature of `specs.problem.FEATURES` it declares: a small seeded
problem using that feature, forward (and backward where the backend computes gradients) in
its widest dtype (float64 for all but torch-flex-compiled), judged by the error model (`specs.error_budget.check_forward`,
`check_backward`, `check_lse`: twice the plain same-dtype error plus a floor).  Then one
problem combining every feature the backend declares, in every dtype it declares (16-bit
inputs exact in the dtype), with the log-sum-exp when declared.  Every feature it does *not* declare
must be `Unsupported` with a reason naming it: never emulated, never silently ignored.

Rows with no visible key are judged by the backend's declarations (padded rows here; fully
masked rows in test_backends_semantics.py), so outputs are compared on rows that see a key
and gradients with dL/dY zero on the others.  Runtime: JAX compiles once per static
configuration and dtype (all problems share one shape); torch-flex-compiled compiles ~20 s
per configuration, so it runs the combined problem in float32 only.
"""
from __future__ import annotations

import numpy as np
import pytest

from attnspec.backends.base import Unsupported  # noqa: E402
from attnspec.backends.registry import resolve  # noqa: E402
from attnspec.specs import error_budget  # noqa: E402
from attnspec.specs.fp8 import is_fp8  # noqa: E402
from attnspec.specs.problem import FEATURE_TEXT, FEATURES, alibi_slopes, validate, visible  # noqa: E402
from tests._helpers import judged_dtype  # noqa: E402
from tests.plugins.cases import available  # noqa: E402

CPU_BUILTINS = ("numpy-naive", "numpy-tiled", "torch-math", "torch-sdpa-cpu", "torch-sdpa-cpu-math",
                "torch-sdpa-cpu-flash", "jax-naive", "jax-dpa", "torch-flex", "torch-flex-compiled")
COMPILES_SLOWLY = {"torch-flex-compiled"}  # ~20 s per configuration: the combined problem in float32 only
_BACKENDS = {name: resolve(name) for name in CPU_BUILTINS}
B, HQ, HKV, LQ, LK, E = 2, 4, 2, 5, 7, 8  # one shape for every problem: JAX compiles per shape
_WIDTH = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64, "float8_e4m3fn": 8, "float8_e5m2": 8}


def _fields(feature: str, rng, alignment: str = "top_left") -> dict:
    """The problem fields that switch `feature` on (values chosen so no row is emptied by them alone)."""
    if feature == "gqa":
        return {"enable_gqa": True}
    if feature == "bias":
        bias = rng.standard_normal((1, HQ, LQ, LK))  # (1, Hq, Lq, Lk): broadcast over the batch
        bias[rng.random(bias.shape) < 0.25] = -np.inf  # -inf: hidden
        bias[..., 0] = 0.5  # key 0 stays visible
        return {"bias": bias}
    if feature == "causal_bottom_right":  # Lq < Lk: bottom-right and top-left differ
        return {"is_causal": True, "causal_alignment": "bottom_right"}
    if feature == "window":
        return {"window": (2, 1), "causal_alignment": alignment}
    if feature == "seq_lengths":
        return {"q_lengths": np.array([LQ, 3]), "kv_lengths": np.array([LK, 4])}  # batch 1: rows 3, 4 padded
    if feature == "seq_positions":  # a chunk after cached keys, a left-padded cache: per-sequence diagonals
        return {"positions": "per_sequence", "q_lengths": np.array([3, LQ]), "kv_lengths": np.array([LK, 6]),
                "kv_starts": np.array([0, 1]), "is_causal": True, "causal_alignment": "bottom_right"}
    if feature == "segment_ids":
        return {"q_segment_ids": np.array([[0, 0, 1, 1, 1], [0, 1, 1, 2, 2]]),
                "kv_segment_ids": np.array([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 2, 2]])}
    if feature == "softcap":
        return {"softcap": 1.0}  # below the largest scores: it bites
    if feature == "alibi":
        return {"alibi_slopes": alibi_slopes(HQ), "is_causal": True, "causal_alignment": alignment}
    if feature == "sinks":  # near the scores, one far above them, one head without (-inf)
        return {"sinks": np.array([0.5, -1.0, 4.0, -np.inf])}
    if feature == "descale":  # one per batch element (broadcast over its KV heads), float32 values
        return {f"{x}_descale": rng.uniform(0.25, 2.0, (B, 1)).astype(np.float32).astype(np.float64) for x in "qkv"}
    if feature == "lse":
        mask = rng.random((LQ, LK)) > 0.3  # (Lq, Lk)
        mask[:, 0] = True
        return {"mask": mask}
    raise AssertionError(feature)


def _problem(features, seed: int = 0, dtype: str = "float64") -> dict:
    """q, k, v, grad_out and the fields of a problem using `features`, inputs exact in `dtype`."""
    rng = np.random.default_rng(seed)
    alignment = "bottom_right" if "causal_bottom_right" in features else "top_left"
    fields = {}
    for f in features:
        fields.update(_fields(f, rng, alignment))
    hkv = HKV if fields.get("enable_gqa") else HQ
    q, k, v = rng.standard_normal((B, HQ, LQ, E)), rng.standard_normal((B, hkv, LK, E)), rng.standard_normal((B, hkv, LK, E))
    grad_out = rng.standard_normal((B, HQ, LQ, E))  # (B, Hq, Lq, Ev)
    rows = visible(validate(q, k, v, **fields)).any(axis=-1)  # (B, Hq, Lq) rows that see a key
    grad_out[~rows] = 0  # what an empty row outputs is a declared choice, not judged here
    arrays = {n: error_budget.round_to(x, dtype) for n, x in dict(q=q, k=k, v=v, grad_out=grad_out).items()}
    if "bias" in fields:  # fp8 kernels take a bias in float32 (Backend._call_of)
        fields["bias"] = error_budget.round_to(fields["bias"], "float32" if is_fp8(dtype) else dtype)
    return {**arrays, "fields": fields, "rows": rows}


def _judged(backend, dtype: str) -> str:
    """The budget that applies: the declared effective precision when it is narrower (fp8: the declared
    computation's)."""
    if is_fp8(dtype):
        return judged_dtype(backend, dtype)
    eff = backend.semantics.effective_precision
    return eff if eff and _WIDTH[eff] < _WIDTH[dtype] else dtype


def _check(backend, p, dtype: str, lse: bool, grads: bool) -> None:
    """Forward (with the LSE when asked: one call returns both), padded rows, backward."""
    name, judged, f = backend.name, _judged(backend, dtype), p["fields"]
    q, k, v, rows = p["q"], p["k"], p["v"], p["rows"]
    out = backend.forward(q, k, v, dtype=dtype, return_lse=lse, **f)  # (B, Hq, Lq, Ev) or with (B, Hq, Lq)
    out, got_lse = out if lse else (out, None)
    verdict = error_budget.check_forward(out, q, k, v, dtype=judged, rows=rows, **f)
    assert verdict, f"{name} {dtype} {sorted(f)}: {verdict.message}"
    if "q_lengths" in f and backend.semantics.padded_rows == "zeros":
        padded = np.arange(LQ) >= np.asarray(f["q_lengths"])[:, None, None]  # (B, 1, Lq)
        assert np.all(out[np.broadcast_to(padded, rows.shape)] == 0), f"{name}: padded rows are not zeros"
    if lse:
        verdict = error_budget.check_lse(got_lse, q, k, v, dtype=judged, **f)
        assert verdict, f"{name} {dtype} {sorted(f)}: {verdict.message}"
    if grads and not is_fp8(dtype) and "q_descale" not in f:  # fp8 inputs and descales are forward-only
        got = backend.backward(q, k, v, p["grad_out"], dtype=dtype, **f)
        assert len(got) == (4 if "bias" in f and backend.capabilities.bias_gradient else 3), f"{name}: {len(got)} grads"
        for verdict in error_budget.check_backward(got, q, k, v, p["grad_out"], dtype=judged, **f):
            assert verdict, f"{name} {dtype} {sorted(f)}: {verdict.message}"


def _declared(name):
    return [f for f in FEATURES if f in _BACKENDS[name].capabilities.features]


_SINGLE = [(n, f) for n in CPU_BUILTINS if n not in COMPILES_SLOWLY for f in _declared(n)]


@pytest.mark.parametrize("name,feature", _SINGLE, ids=[f"{n}-{f}" for n, f in _SINGLE])
def test_each_declared_feature_matches_the_reference(name, feature):
    """In the backend's widest dtype (float64: the tightest budget tells a semantic slip from
    rounding); the combined problem below runs every dtype."""
    backend = available(_BACKENDS, name)
    dtype = max(backend.capabilities.dtypes, key=_WIDTH.get)
    _check(backend, _problem([feature], dtype=dtype), dtype, lse=feature == "lse", grads=backend.capabilities.gradients)


@pytest.mark.parametrize("name", CPU_BUILTINS)
def test_every_declared_feature_at_once_in_every_dtype(name):
    backend = available(_BACKENDS, name)
    declared = [f for f in _declared(name) if f != "lse"]
    assert declared, f"{name} declares no optional feature"
    dtypes = ("float32",) if name in COMPILES_SLOWLY else backend.capabilities.dtypes
    for dtype in dtypes:
        p = _problem(declared, seed=1, dtype=dtype)
        _check(backend, p, dtype, lse=backend.supports("lse"), grads=backend.capabilities.gradients)


_UNDECLARED = [(n, f) for n in CPU_BUILTINS for f in FEATURES if f not in _BACKENDS[n].capabilities.features]


@pytest.mark.parametrize("name,feature", _UNDECLARED, ids=[f"{n}-{f}" for n, f in _UNDECLARED])
def test_each_undeclared_feature_is_unsupported_naming_it(name, feature):
    backend = available(_BACKENDS, name)
    p = _problem([feature])
    dtype = "float32"
    says = "bottom_right" if feature == "causal_bottom_right" else FEATURE_TEXT[feature]
    with pytest.raises(Unsupported, match=None) as refused:
        backend.forward(p["q"], p["k"], p["v"], dtype=dtype, return_lse=feature == "lse", **p["fields"])
    assert says in str(refused.value), f"{name}: {refused.value}"
    assert f"{name}" in str(refused.value)


def test_flex_backends_declare_no_gradients_on_cpu():
    """FlexAttention has no backward on CPU (torch 2.13): declared, so a skip with the reason."""
    for name in ("torch-flex", "torch-flex-compiled"):
        backend = available(_BACKENDS, name)
        p = _problem([])
        with pytest.raises(Unsupported, match="computes no gradients"):
            backend.backward(p["q"], p["k"], p["v"], p["grad_out"], dtype="float32")


def test_jax_dpa_window_maps_exactly_to_local_window_size():
    """Our window (left, right), top-left, is JAX's local_window_size=(left, right): off by one
    on either side would move the output far past the float32 budget (checked on (0, 0) and
    (1, 0), the narrowest windows, where one key more or less changes every row)."""
    backend = available(_BACKENDS, "jax-dpa")
    p = _problem([])
    for window in ((0, 0), (1, 0), (0, 2), (3, None)):
        out = backend.forward(p["q"], p["k"], p["v"], dtype="float32", window=window)
        verdict = error_budget.check_forward(out, p["q"], p["k"], p["v"], dtype="float32", window=window)
        assert verdict, f"window {window}: {verdict.message}"
        wider = (window[0] + 1, window[1])
        assert not error_budget.check_forward(out, p["q"], p["k"], p["v"], dtype="float32", window=wider)


def test_backends_command_lists_each_feature_as_declared(capsys):
    """`attnspec backends --json` has supports: {feature: bool}; the table has one column per feature."""
    import json

    from attnspec.cli import main

    assert main(["backends", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    for name, backend in _BACKENDS.items():
        assert rows[name]["supports"] == {f: f in backend.capabilities.features for f in FEATURES}, name
    assert rows["jax-dpa"]["padded_rows"] == "zeros" and rows["torch-math"]["bias_gradient"]
    assert main(["backends"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("features declared"))
    header = lines[start + 1].split()
    # the field table's order
    assert header[:4] == ["name", "bias", "dbias", "gqa"] and "lse" in header and "padded_rows" in header
    cells = dict(zip(header, next(li for li in lines[start:] if li.startswith("torch-sdpa-cpu-flash ")).split(), strict=False))
    assert (cells["gqa"], cells["bias"], cells["dbias"], cells["window"], cells["lse"]) == ("yes", "yes", ".", ".", "yes")


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "float16"])
def test_eager_flex_uniform_hooks_equal_per_field_hooks_bit_for_bit(dtype):
    """Eager torch-flex writes small problems' hooks with every field as tensor data (absent
    ones their identity: bias 0, slope 0, no cap, every key visible) so dynamo stops retracing;
    large problems and compiled flex keep hooks with only the given fields.  The identities are
    exact, so both give the same bits: each feature alone and all of them together."""
    from attnspec.backends.flex_backends import TorchFlex

    uniform, per_field = TorchFlex(), TorchFlex()
    per_field.UNIFORM_MAX_SCORES = 0  # every problem "large": the per-field hooks
    for backend in (uniform, per_field):
        available({"torch-flex": backend}, "torch-flex")
    declared = [f for f in FEATURES if f in TorchFlex.capabilities.features]  # "lse": a boolean mask too
    for features in [[]] + [[f] for f in declared] + [declared]:
        p = _problem(features, seed=3, dtype=dtype)
        outs = [b.forward(p["q"], p["k"], p["v"], dtype=dtype, return_lse=True, **p["fields"])
                for b in (uniform, per_field)]
        for got, want, what in zip(outs[0], outs[1], ("output", "lse"), strict=True):
            assert np.array_equal(got, want, equal_nan=True), f"{features} {dtype}: {what} differs"


@pytest.mark.parametrize("name", ["torch-flex", "torch-flex-compiled"])
def test_flex_gives_zero_query_rows_an_empty_output(name):
    """No query row (Lq = 0, or batch 0): flex_attention itself returns the empty output; the
    adapter's hooks indexed their empty tensors and raised IndexError - hidden behind flex's
    declared Lk = 0 deviation until the edges grid ran each zero size in a dtype of its own."""
    backend = available(_BACKENDS, name)
    for B, Lq in ((1, 0), (0, 8)):
        q, k = np.zeros((B, 2, Lq, 16)), np.zeros((B, 2, 16, 16))  # (B, H, Lq, E), (B, H, Lk, E)
        mask = np.ones((Lq, 16), dtype=bool)  # (Lq, Lk)
        for causal in (False, True):
            out = backend.forward(q, k, k, mask, causal, None, "float32", window=(2, 1), softcap=4.0)
            assert out.shape == (B, 2, Lq, 16)
