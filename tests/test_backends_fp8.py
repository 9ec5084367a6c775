"""FP8 in the backends (issue 31): what they declare, what they decline, the emulated paths, the plain functions."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from attnspec.backends import registry
from attnspec.backends.base import Capabilities, Unsupported
from attnspec.backends.declarations import Semantics
from attnspec.backends.numpy_fp8 import round_p
from attnspec.specs import error_budget, fp8

E4M3 = "float8_e4m3fn"


def _problem(B=2, Hq=4, Hkv=2, Lq=5, Lk=9, E=8, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (fp8.round_fp8(rng.standard_normal(s) * 100, E4M3)
               for s in ((B, Hq, Lq, E), (B, Hkv, Lk, E), (B, Hkv, Lk, E)))
    descales = dict(q_descale=np.array([[0.01, 0.02], [0.015, 0.03]]), k_descale=np.array([[0.02, 0.01], [0.01, 0.03]]),
                    v_descale=np.array([[0.5, 2.0], [1.0, 0.25]]))
    return q, k, v, descales


def test_numpy_tileds_own_p_rounding_agrees_with_the_spec():
    """Two implementations, one answer: backends/numpy_fp8's magic-number rounding and specs.fp8's."""
    rng = np.random.default_rng(1)
    p = (rng.random(100_000) * 2.0 ** rng.integers(-24, 1, 100_000)).astype(np.float32)
    for name in fp8.FP8_DTYPE_NAMES:
        np.testing.assert_array_equal(round_p(p, name).astype(np.float64), fp8.round_fp8(p.astype(np.float64), name))


@pytest.mark.parametrize("name", ["numpy-tiled", "torch-math"])
@pytest.mark.parametrize("dtype", fp8.FP8_DTYPE_NAMES)
def test_the_emulated_fp8_paths_meet_their_declared_budget(name, dtype):
    from attnspec.properties.target import Session, Target
    backend = registry.resolve(name)
    if not backend.availability()[0]:
        pytest.skip(backend.availability()[1])
    q, k, v, d = _problem()
    q, k, v = (fp8.round_fp8(x, dtype) for x in (q, k, v))
    out = backend.forward(q, k, v, dtype=dtype, enable_gqa=True, is_causal=True, **d)
    budget = Target(Session(backend, name), dtype).budget_dtype
    assert budget.startswith(dtype + "(")
    assert error_budget.check_forward(out, q, k, v, is_causal=True, dtype=budget, enable_gqa=True, **d)
    wrong = backend.forward(q, k, v, dtype=dtype, enable_gqa=True, is_causal=True,
                            **{**d, "k_descale": d["k_descale"][:, ::-1].copy()})  # the heads' descales swapped
    assert not error_budget.check_forward(wrong, q, k, v, is_causal=True, dtype=budget, enable_gqa=True, **d)


def test_fp8_is_forward_only_and_per_tensor_backends_decline_per_head_descales():
    backend = registry.resolve("numpy-tiled")
    q, k, v, d = _problem()
    with pytest.raises(Unsupported, match="forward_backward"):
        backend.backward(q, k, v, np.ones(q.shape), dtype=E4M3, enable_gqa=True, **d)

    class PerTensor(type(backend)):
        capabilities = Capabilities(dtypes=(E4M3,), features=frozenset({"gqa", "descale"}),
                                    descale_granularity="tensor")
    with pytest.raises(Unsupported, match="one descale per tensor"):
        PerTensor().forward(q, k, v, dtype=E4M3, enable_gqa=True, **d)
    one = {n: np.array(0.02) for n in d}  # the same descales as one per tensor: taken
    assert np.isfinite(PerTensor().forward(q, k, v, dtype=E4M3, enable_gqa=True, **one)).all()


def test_bad_fp8_declarations_are_named():
    with pytest.raises(ValueError, match="descale_granularity"):
        Capabilities(descale_granularity="row")
    with pytest.raises(ValueError, match="fp8_query"):
        Capabilities(fp8_query="float8_e5m2")
    with pytest.raises(ValueError, match="p_dtypes"):
        Semantics(p_dtypes=(("float16", E4M3),))
    assert Semantics(p_dtypes=((E4M3, "bfloat16"),)).p_dtype(E4M3) == "bfloat16"
    assert Semantics().p_dtype(E4M3) is None


def test_plain_functions_get_ml_dtypes_arrays_and_their_own_descale_names():
    pytest.importorskip("ml_dtypes")
    from tests.plugins import fp8_functions as F
    q, k, v, d = _problem()
    quantised = registry.resolve("tests.plugins.fp8_functions:sdpa_quantized")
    out = quantised.forward(q, k, v, dtype=E4M3, enable_gqa=True, **d)
    from attnspec.properties.target import Session, Target
    budget = Target(Session(quantised, "q"), E4M3).budget_dtype
    assert budget == "float8_e4m3fn(p=float8_e4m3fn,out=bfloat16)"
    assert error_budget.check_forward(out, q, k, v, dtype=budget, enable_gqa=True, **d)
    kv = registry.resolve("tests.plugins.fp8_functions:sdpa_fp8_kv")  # FlashInfer's k_scale / v_scale, bfloat16 q
    assert kv.capabilities.fp8_query == "bfloat16" and "descale" in kv.capabilities.features
    one = dict(k_descale=np.array(0.02), v_descale=np.array(0.5))
    out = kv.forward(q * 0.01, k, v, dtype=E4M3, enable_gqa=True, **one)  # q * 0.01: exact in bfloat16
    budget = Target(Session(kv, "kv"), E4M3).budget_dtype
    assert error_budget.check_forward(out, q * 0.01, k, v, dtype=budget, enable_gqa=True, **one)
    with pytest.raises(Unsupported, match="takes no q_descale"):
        kv.forward(q, k, v, dtype=E4M3, enable_gqa=True, q_descale=np.array(0.5), **one)
    assert F.sdpa_quantized.__attnspec__.fp8["p_dtypes"]


def test_a_numpy_function_without_ml_dtypes_declines_fp8(monkeypatch):
    pytest.importorskip("ml_dtypes")  # the twin itself imports it; then it goes missing for the call
    backend = registry.resolve("tests.plugins.fp8_functions:sdpa_quantized")
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes now raises ImportError
    q, k, v, d = _problem()
    with pytest.raises(Unsupported, match="need ml_dtypes"):
        backend.forward(q, k, v, dtype=E4M3, enable_gqa=True, **d)


def test_the_cuda_fp8_backends_are_skipped_with_their_reason_here():
    for name in ("torch-sdpa-fp8-cuda", "flash-attn3-fp8-cuda"):
        backend = registry.resolve(name)
        ok, why = backend.availability()
        if ok:
            pytest.skip("a GPU is here: tools/gpu_check.sh runs them")
        assert why and ("CUDA" in why or "not installed" in why), why
        assert backend.semantics.p_dtype(E4M3) == E4M3 and backend.output_dtype(E4M3) == "bfloat16"


def _fa3_varlen():
    """A user's FA3-style varlen function over ml_dtypes' fp8 arrays, declared: flash_twins.varlen (which
    applies row b of each (B, Hkv) descale to sequence b) on the fp8 values, float32 out."""
    pytest.importorskip("ml_dtypes")
    from attnspec.backends.plain import declare, function_backend
    from tests.broken import flash_twins

    @declare(dtypes=fp8.FP8_DTYPE_NAMES, output_dtypes={d: "float32" for d in fp8.FP8_DTYPE_NAMES},
             p_dtypes={d: "float32" for d in fp8.FP8_DTYPE_NAMES})
    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=None,
                               softmax_scale=None, causal=False, q_descale=None, k_descale=None, v_descale=None):
        for d in (q_descale, k_descale, v_descale):
            assert d is None or (d.shape == (len(cu_seqlens_q) - 1, k.shape[1]) and d.dtype == np.float32), d
        q, k, v = (np.asarray(x, dtype=np.float32) for x in (q, k, v))
        return flash_twins.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                                  softmax_scale, causal, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    return function_backend(flash_attn_varlen_func, "fa3-varlen-twin")


@pytest.mark.parametrize("name", ["numpy-tiled", "torch-math", "a plain FA3 varlen function"])
@pytest.mark.parametrize("dtype", fp8.FP8_DTYPE_NAMES)
def test_packed_and_paged_calls_at_fp8_read_each_sequences_descales(name, dtype):
    """A packed and a paged call at fp8: sequence b reads row b of the (B, Hkv) descales - within the declared
    computation's budget; the rows swapped between the sequences, the same calls are off."""
    from attnspec.backends.serving import forward_packed, forward_paged
    from attnspec.properties.target import Session, Target
    backend = _fa3_varlen() if name.startswith("a plain") else registry.resolve(name)
    if not backend.availability()[0]:
        pytest.skip(backend.availability()[1])
    q, k, v, d = _problem()
    q, k, v = (fp8.round_fp8(x, dtype) for x in (q, k, v))
    fields = dict(enable_gqa=True, positions="per_sequence", kv_lengths=np.array([9, 4]), **d)
    budget = Target(Session(backend, backend.name), dtype).budget_dtype
    swapped = {n: x[::-1].copy() for n, x in d.items()}  # (B, Hkv): sequence 0 given sequence 1's row
    calls = [lambda f: forward_packed(backend, q, k, v, dtype, tail=2, unused=1, rng=0, q_lengths=np.array([5, 3]), **f)]
    if any(f.startswith("paged") for f in backend.capabilities.formats):
        calls.append(lambda f: forward_paged(backend, q, k, v, dtype, page_size=3, rng=0, **f))
    for call in calls:
        rows = {"q_lengths": np.array([5, 3])} if len(calls) == 1 or call is calls[0] else {}
        assert error_budget.check_forward(call(fields), q, k, v, dtype=budget, **rows, **fields)
        assert not error_budget.check_forward(call({**fields, **swapped}), q, k, v, dtype=budget, **rows, **fields)


def test_a_plain_function_gets_per_head_descales_as_batch_by_kv_heads():
    """A descale in a form that broadcasts to (B, Hkv) - (Hkv,), (B, 1) - reaches a function as (B, Hkv),
    contiguous (as plain.declare's docstring promises and FA3's CHECK_SHAPE requires); a scalar as it is."""
    pytest.importorskip("ml_dtypes")
    from attnspec.backends.plain import declare, function_backend
    seen = []

    @declare(dtypes=(E4M3,), features=("gqa", "descale"), output_dtypes={E4M3: "float32"}, p_dtypes={E4M3: "float32"})
    def fn(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, q_descale=None, k_descale=None,
           v_descale=None):
        seen.append([(np.shape(d), bool(np.asarray(d).flags.c_contiguous)) for d in (q_descale, k_descale, v_descale)])
        return np.zeros(q.shape[:-1] + v.shape[-1:], dtype=np.float32)

    q, k, v, _ = _problem()
    B, Hkv = k.shape[0], k.shape[1]
    backend = function_backend(fn, "fa3-shaped")
    backend.forward(q, k, v, dtype=E4M3, enable_gqa=True, q_descale=np.full(Hkv, 0.5), k_descale=np.full((B, 1), 0.25),
                    v_descale=np.array(2.0))
    assert seen == [[((B, Hkv), True), ((B, Hkv), True), ((), True)]]
