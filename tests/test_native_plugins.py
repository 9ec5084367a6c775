"""Framework-native plug-ins: a torch function and a JAX function, copied out of README, pass the suite.

README's two ten-line functions (over torch tensors / jax arrays, no NumPy, no backward written)
are written into a folder outside the checkout and run as their author would:
``pytest --pyargs attnspec.properties --backend mypkg.attn_torch:sdpa`` (the ci profile keeps it
bounded), gradients checked in float16, bfloat16 and float32.  README's two backend classes
(TorchBackend and JaxBackend subclasses) are checked on the output, gradient and LSE properties.
In process: what a function declaring a framework receives (its tensors, dtype, device, layout),
an LSE cut from a padded buffer by its declared rule, and a missing framework or device as a skip
with its reason, never a run elsewhere.
"""
from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
import pytest

from attnspec.backends.base import BackendFailure
from attnspec.backends.plain import declare
from attnspec.backends.registry import resolve
from tests.test_suite_plugin import ROOT, _env, _project, _pytest

GRADIENT_PROPERTIES = ("gradients_match_reference", "gradient_scaling_law")


def readme_block(first_line: str) -> str:
    """The python block of README that starts with `first_line` (a file name comment), as printed."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    found = [b for b in blocks if b.startswith(first_line + "\n")]
    assert len(found) == 1, f"README has {len(found)} python blocks starting {first_line!r}"
    return found[0]


def _suite(project, backend, *extra):
    proc = _pytest(["--pyargs", "attnspec.properties", "--backend", backend, "--attnspec-json", "out.json", *extra],
                   project, _env(ATTNSPEC_PROFILE="ci"))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return json.loads((project / "out.json").read_text())["conformance"]


@pytest.mark.slow
@pytest.mark.parametrize("module,framework", [("attn_torch", "torch"), ("attn_jax", "jax")])
def test_readmes_framework_function_passes_the_suite_with_gradients_in_every_float_dtype(tmp_path, module, framework):
    pytest.importorskip(framework)
    source = readme_block(f"# mypkg/{module}.py")
    assert "import numpy" not in source and "backward" not in source  # its own tensors, autograd's backward
    assert len([x for x in source.split("def sdpa", 1)[1].splitlines() if x.strip()]) <= 10
    project = _project(tmp_path, {"mypkg/__init__.py": "", f"mypkg/{module}.py": source})
    rows = _suite(project, f"mypkg.{module}:sdpa")
    assert not [r for r in rows if r["status"] in ("failed", "error", "crashed", "timed_out")]
    checked = {(r["property"], r["dtype"]) for r in rows if r["status"] == "passed" and r["examples"] > 0}
    for prop in GRADIENT_PROPERTIES + ("matches_reference",):
        for dtype in ("float16", "bfloat16", "float32"):
            assert (prop, dtype) in checked, (prop, dtype, sorted(checked))


@pytest.mark.slow
def test_readmes_backend_classes_pass_the_output_gradient_and_lse_properties(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    files = {f"mypkg/{m}.py": readme_block(f"# mypkg/{m}.py") for m in ("flash_torch", "flash_jax")}
    project = _project(tmp_path, {"mypkg/__init__.py": "", **files})
    props = ("matches_reference", "gradients_match_reference", "lse_matches_reference")
    for backend in ("mypkg.flash_torch:MyFlash", "mypkg.flash_jax:MyJax"):
        rows = _suite(project, backend, "-k", " or ".join(props))
        passed = {(r["property"], r["dtype"]) for r in rows if r["status"] == "passed" and r["examples"] > 0}
        assert {(p, d) for p in props for d in ("float16", "bfloat16", "float32")} <= passed, (backend, rows)


# ---- in process --------------------------------------------------------------------------------

def _problem(seed=0, B=2, H=3, Lq=5, Lk=7, E=8, Ev=4):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s) for s in ((B, H, Lq, E), (B, H, Lk, E), (B, H, Lk, Ev)))


def _torch_reference(query, key, value, attn_mask=None, is_causal=False, scale=None):  # (B, H, L, E)
    s = query @ key.transpose(-1, -2) * (query.shape[-1] ** -0.5 if scale is None else scale)
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf"))
    return s.softmax(-1) @ value


def test_a_torch_function_receives_its_tensors_in_its_layout_dtype_and_device():
    torch = pytest.importorskip("torch")
    seen = []

    @declare(framework="torch", layout="BLHE")
    def spy(query, key, value, attn_mask=None, is_causal=False, scale=None):
        seen.append((type(query), query.dtype, query.device.type, tuple(query.shape), tuple(key.shape),
                     None if attn_mask is None else tuple(attn_mask.shape)))
        out = _torch_reference(*(x.transpose(1, 2) for x in (query, key, value)), attn_mask, is_causal, scale)
        return out.transpose(1, 2)  # (B, Lq, H, Ev)

    backend = resolve_function(spy)
    q, k, v = _problem()
    mask = np.random.default_rng(1).random((5, 7)) < 0.8
    mask[:, 0] = True
    expected = resolve("numpy-naive").forward(q, k, v, mask)
    for dtype, tol in (("float32", 1e-5), ("bfloat16", 5e-2), ("float16", 5e-3)):  # well inside each dtype's rounding
        out = backend.forward(q, k, v, mask, dtype=dtype)
        assert seen[-1] == (torch.Tensor, getattr(torch, dtype), "cpu", (2, 5, 3, 8), (2, 7, 3, 8), (2, 3, 5, 7))
        assert np.abs(out - expected).max() < tol
    g = np.random.default_rng(2).standard_normal((2, 3, 5, 4))
    got = backend.backward(q, k, v, g, mask, dtype="float32")  # autograd: no backward written
    want = resolve("numpy-naive").backward(q, k, v, g, mask)
    assert all(np.abs(a - b).max() < 1e-5 for a, b in zip(got, want, strict=True))
    # a 2-D problem (no batch, no head axis) folds to (1, L, 1, E) and comes back (Lq, Ev)
    assert backend.forward(q[0, 0], k[0, 0], v[0, 0], dtype="float32").shape == (5, 4)
    assert seen[-1][3] == (1, 5, 1, 8)


def resolve_function(fn):
    from attnspec.backends.plain import function_backend
    return function_backend(fn, getattr(fn, "__name__", "fn"))


def test_a_jax_function_receives_jax_arrays_and_is_differentiated_by_vjp():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    seen = []

    @declare(framework="jax", dtypes=("bfloat16", "float32"), layout="BLHE")
    def spy(query, key, value, attn_mask=None, is_causal=False, scale=None):  # (B, L, H, E)
        seen.append((isinstance(query, jax.Array), str(query.dtype), tuple(query.shape)))
        q, k, v = (jnp.swapaxes(x, 1, 2) for x in (query, key, value))  # (B, H, L, E)
        s = q @ jnp.swapaxes(k, -1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
        return jnp.swapaxes(jax.nn.softmax(s, axis=-1) @ v, 1, 2)  # (B, Lq, H, Ev)

    backend = resolve_function(spy)
    q, k, v = _problem()
    assert np.abs(backend.forward(q, k, v, dtype="bfloat16") - resolve("numpy-naive").forward(q, k, v)).max() < 5e-2
    assert seen[-1] == (True, "bfloat16", (2, 5, 3, 8))
    g = np.random.default_rng(2).standard_normal((2, 3, 5, 4))
    got, want = backend.backward(q, k, v, g, dtype="float32"), resolve("numpy-naive").backward(q, k, v, g)
    assert all(np.abs(a - b).max() < 1e-5 for a, b in zip(got, want, strict=True))


def _padded_lse_function(padding_returned):
    import torch

    @declare(framework="torch", dtypes=("float32",), features=("lse",), lse_padding=16)
    def padded(query, key, value, attn_mask=None, is_causal=False, scale=None, return_lse=False):
        s = query @ key.transpose(-1, -2) * (query.shape[-1] ** -0.5 if scale is None else scale)
        out = s.softmax(-1) @ value
        if not return_lse:
            return out
        B, H, Lq = s.shape[:3]
        buf = torch.full((B, H, padding_returned(Lq)), 1e9)  # rows past Lq: whatever the kernel left there
        buf[:, :, :Lq] = s.logsumexp(-1)
        return out, buf
    return padded


def test_an_lse_in_a_padded_buffer_is_cut_by_its_declared_rule():
    pytest.importorskip("torch")
    q, k, v = _problem(Lq=5)
    _, want = resolve("numpy-naive").forward(q, k, v, return_lse=True)
    _, got = resolve_function(_padded_lse_function(lambda L: -(-L // 16) * 16)).forward(
        q, k, v, dtype="float32", return_lse=True)
    assert got.shape == want.shape and np.abs(got - want).max() < 1e-5
    wrong = resolve_function(_padded_lse_function(lambda L: L + 1))
    with pytest.raises(BackendFailure, match=r"lse has shape \(2, 3, 6\); lse_layout BHL with lse_padding=16 "
                                             r"expects \(2, 3, 16\)"):
        wrong.forward(q, k, v, dtype="float32", return_lse=True)


def test_a_missing_device_or_framework_is_a_skip_with_its_reason_never_the_cpu(monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("jax")
    cuda = resolve_function(declare(_torch_reference, framework="torch", device="cuda"))
    assert cuda.capabilities.device == "cuda"
    if not torch.cuda.is_available():
        assert cuda.availability() == (False, "no CUDA device")
    import jax
    if not any(d.platform == "gpu" for d in jax.devices()):
        gpu = resolve_function(declare(lambda query, key, value, attn_mask=None, is_causal=False, scale=None: query,
                                       framework="jax", device="gpu"))
        ok, why = gpu.availability()
        assert not ok and "GPU" in why
    monkeypatch.setitem(sys.modules, "torch", None)  # torch not installed
    fresh = resolve_function(declare(lambda query, key, value, attn_mask=None, is_causal=False, scale=None: query,
                                     framework="torch"))
    ok, why = fresh.availability()
    assert not ok and why.startswith("torch is not installed")


@pytest.mark.parametrize("kwargs,message", [
    (dict(framework="tensorflow"), "framework must be one of numpy, torch, jax; got 'tensorflow'"),
    (dict(framework="torch", device="tpu"), "device for framework 'torch' must be one of cpu, cuda; got 'tpu'"),
    (dict(framework="jax", layout="BLH"), "layout must be one of BHLE, BLHE; got 'BLH'"),
    (dict(layout="BLHE"), "layout needs framework='torch' or 'jax'"),
    (dict(framework="torch", backward=lambda *a: a), "a torch function's backward is its autograd"),
    (dict(dtypes=("bfloat16",)), "dtypes for framework 'numpy' must be a non-empty tuple of float16, float32, float64"),
    (dict(framework="torch", lse_padding=0), "lse_padding must be a positive int or None; got 0"),
    (dict(env="TRITON_INTERPRET"), "env must be a tuple of environment variable names"),
])
def test_declare_refuses_what_it_cannot_use_naming_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        declare(_torch_reference, **kwargs)


@pytest.mark.slow
def test_an_nn_module_and_an_autograd_functions_own_backward_are_checked(tmp_path):
    """An nn.Module instance and a function calling an autograd.Function plug in as declared; the
    autograd.Function's hand-written backward is what is checked: a dQ without its scale is rejected
    by the gradient property in every dtype while its forward passes."""
    pytest.importorskip("torch")
    from attnspec.properties.runner import run_suite

    names = ["tests.plugins.native:module_sdpa", "tests.plugins.native:function_sdpa", "tests.plugins.native:wrong_dq"]
    result = run_suite(names, json_path=str(tmp_path / "out.json"), profile="ci", cwd=ROOT,
                       extra_args=["-k", "test_matches_reference or test_gradients_match_reference"])
    status = {(r["backend"].split(":")[1], r["property"], r["dtype"]): r["status"] for r in result.conformance}
    for dtype in ("float16", "bfloat16", "float32"):
        for name in ("module_sdpa", "function_sdpa"):
            assert status[(name, "matches_reference", dtype)] == "passed", result.output[-3000:]
            assert status[(name, "gradients_match_reference", dtype)] == "passed", result.output[-3000:]
        assert status[("wrong_dq", "matches_reference", dtype)] == "passed", result.output[-3000:]
        assert status[("wrong_dq", "gradients_match_reference", dtype)] == "failed", result.output[-3000:]


def test_fields_reach_a_torch_function_folded_to_its_batch():
    """Grouped KV heads, a bias (one float attn_mask (B, H, Lq, Lk), as PyTorch's signature takes it) and
    kv_lengths (B,) reach the function folded from the problem's two leading dims; the result matches
    the reference, and so do the gradients, dBias (declared: bias_gradient) summed back to its shape."""
    torch = pytest.importorskip("torch")
    seen = {}

    @declare(framework="torch", dtypes=("float32",), bias_gradient=True)
    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
             kv_lengths=None):
        seen.update(q=tuple(query.shape), k=tuple(key.shape), mask=tuple(attn_mask.shape), mask_dtype=attn_mask.dtype,
                    lengths=tuple(kv_lengths.shape))
        keep = torch.arange(key.shape[-2]) < kv_lengths[:, None, None, None]  # (B, 1, 1, Lk)
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask.masked_fill(~keep, float("-inf")), scale=scale,
            enable_gqa=enable_gqa)

    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s) for s in ((2, 3, 4, 5, 8), (2, 3, 2, 7, 8), (2, 3, 2, 7, 8)))  # Hq 4, Hkv 2
    bias = rng.standard_normal((4, 5, 7))  # (Hq, Lq, Lk): broadcast over the leading dims
    lengths = np.array([[7, 3, 1], [2, 7, 5]])  # (2, 3): one per sequence
    fields = dict(enable_gqa=True, bias=bias, kv_lengths=lengths)
    got = resolve_function(sdpa).forward(q, k, v, dtype="float32", **fields)
    want = resolve("numpy-naive").forward(q, k, v, **fields)
    assert seen == dict(q=(6, 4, 5, 8), k=(6, 2, 7, 8), mask=(6, 4, 5, 7), mask_dtype=torch.float32, lengths=(6,))
    assert got.shape == want.shape and np.abs(got - want).max() < 1e-5  # float32 rounding of a 7-key softmax
    g = rng.standard_normal(want.shape)
    grads = resolve_function(sdpa).backward(q, k, v, g, dtype="float32", **fields)
    ref = resolve("numpy-naive").backward(q, k, v, g, **fields)
    assert len(grads) == 4 and grads[3].shape == bias.shape
    assert all(np.abs(a - b).max() < 1e-4 for a, b in zip(grads, ref, strict=True))  # float32, sums over 6 sequences


def test_fold4d_round_trips_both_layouts_and_cuts_an_lse_in_either_axis_order():
    """Framework-neutral (here NumPy's ops): (..., H, L, E) -> the declared layout -> back; an LSE laid
    out (B, L, H) in a buffer padded to a multiple of 4 comes back (..., Lq)."""
    from attnspec.backends.declarations import Call
    from attnspec.backends.layout4d import Fold4D

    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((2, 3, 4, 5, 8)), rng.standard_normal((1, 3, 4, 7, 8)), rng.standard_normal((4, 7, 6))
    for layout, axes in (("BHLE", (6, 4, 5, 8)), ("BLHE", (6, 5, 4, 8))):
        fold = Fold4D(q, k, v, Call(), np.broadcast_to, np.swapaxes, layout)
        fq, fk, fv = fold.qkv(q, k, v)
        assert fq.shape == axes and fk.shape[0] == 6 and fv.shape[-1] == 6
        # an output in the layout's axis order (here q's first 6 columns) comes back exactly: only moved
        np.testing.assert_array_equal(fold.output(fq[..., :6]), q[..., :6])
    fold = Fold4D(q, k, v, Call(), np.broadcast_to, np.swapaxes, "BLHE")
    lse = rng.standard_normal((2, 3, 4, 5))  # (..., H, Lq)
    buf = np.full((6, 8, 4), np.nan)  # (B, rows rounded up to 8, H)
    buf[:, :5] = np.swapaxes(lse.reshape(6, 4, 5), 1, 2)
    np.testing.assert_array_equal(fold.lse(buf, "BLH", padding=4), lse)
    with pytest.raises(ValueError, match=r"the lse has shape \(6, 5, 4\); lse_layout BLH with lse_padding=4 "
                                         r"expects \(6, 8, 4\)"):
        fold.lse(buf[:, :5], "BLH", padding=4)
    with pytest.raises(ValueError, match=r"the output has shape \(6, 4, 5, 6\); layout BLHE expects \(6, 5, 4, 6\)"):
        fold.output(np.zeros((6, 4, 5, 6)))
