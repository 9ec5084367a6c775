"""Bad behaviour fails alone and by name; declined combinations skip with their reason;
pinned PyTorch kernels never fall back to another kernel.
"""
from __future__ import annotations

import numpy as np
import pytest

from attnspec.backends.base import BackendFailure, BackendUnavailable, Unsupported  # noqa: E402
from attnspec.backends.numpy_backends import NumpyTiled  # noqa: E402
from attnspec.backends.registry import resolve, select  # noqa: E402
from attnspec.specs import error_budget  # noqa: E402
from tests._helpers import qkv  # noqa: E402
from tests.plugins.cases import random_cases  # noqa: E402

PLUGIN = "tests.plugins.fake_plugin"
CASE = random_cases()[0]  # (2, 3, 5, 8) queries, causal, broadcast batch


@pytest.mark.parametrize("attr,says", [
    ("raises", r"forward raised RuntimeError: kernel exploded"),
    ("wrong_shape", r"forward output has shape \(2, 3, 4, 8\), expected \(2, 3, 5, 8\) \(returned a ndarray\)"),
    ("wrong_dtype", r"forward output has dtype float16, expected float64"),
    ("returns_none", r"forward output is None, expected an array of shape \(2, 3, 5, 8\)"),
])
def test_misbehaving_function_fails_naming_itself_and_what_it_returned(attr, says):
    name = f"{PLUGIN}:{attr}"
    with pytest.raises(BackendFailure, match=f"backend '{name}': {says}") as info:
        resolve(name).forward(*CASE.args())
    assert info.value.backend == name


@pytest.mark.parametrize("attr,says", [
    ("BadBackward", r"backward returned tuple of 2, expected \(dq, dk, dv\)"),
    ("WrongGradShape", r"dk has shape \(3, 7, 8\), expected \(1, 3, 7, 8\)"),
])
def test_misbehaving_backward_fails_by_name(attr, says):
    backend = resolve(f"{PLUGIN}:{attr}")
    with pytest.raises(BackendFailure, match=f"backend '{backend.name}': {says}"):
        backend.backward(*CASE.args()[:3], CASE.grad_out, *CASE.args()[3:])


def test_only_the_bad_backend_fails():
    backends = select([f"{PLUGIN}:raises", "numpy-naive", f"{PLUGIN}:wrong_shape", f"{PLUGIN}:sdpa"])
    verdicts = {}
    for backend in backends:
        try:
            out = backend.forward(*CASE.args())
            verdicts[backend.name] = bool(error_budget.check_forward(out, *CASE.args(), dtype="float64"))
        except BackendFailure as e:
            verdicts[backend.name] = e.backend
    assert verdicts == {f"{PLUGIN}:raises": f"{PLUGIN}:raises", "numpy-naive": True,
                        f"{PLUGIN}:wrong_shape": f"{PLUGIN}:wrong_shape", f"{PLUGIN}:sdpa": True}


def test_undeclared_combinations_are_unsupported_with_reason():
    with pytest.raises(Unsupported, match="numpy-naive does not support dtype bfloat16 .*float16, float32, float64"):
        resolve("numpy-naive").forward(*CASE.args(), dtype="bfloat16")
    if not _cuda():
        for name in ("torch-sdpa-cuda-flash", "torch-sdpa-cuda-math"):
            with pytest.raises(BackendUnavailable, match="no CUDA device"):
                resolve(name).forward(*CASE.args(), dtype="float64")
    else:  # flash declares the 16-bit dtypes only; math declares float64 and computes it
        with pytest.raises(Unsupported, match="torch-sdpa-cuda-flash does not support dtype float64"):
            resolve("torch-sdpa-cuda-flash").forward(*CASE.args(), dtype="float64")
        out = resolve("torch-sdpa-cuda-math").forward(*CASE.args(), dtype="float64")
        assert error_budget.check_forward(out, *CASE.args(), dtype="float64")
    flash = resolve("torch-sdpa-cuda-flash")
    assert not flash.capabilities.masks and set(flash.capabilities.dtypes) == {"float16", "bfloat16"}


def test_numpy_tiled_block_must_be_a_positive_int():
    for bad in (0, -3, 2.5, True, "128"):
        with pytest.raises(ValueError, match="block must be a positive int"):
            NumpyTiled(block=bad)


def _cuda():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _torch_available():
    ok, why = resolve("torch-sdpa-cpu-flash").availability()
    if not ok:
        pytest.skip(why)


def test_pinned_flash_refuses_with_pytorchs_reason_instead_of_falling_back():
    _torch_available()
    from attnspec.backends.base import Capabilities
    from attnspec.backends.torch_backends import TorchSdpaCpuFlash

    q, k, v = qkv(0, batch=(1, 2), Lq=4, Lk=5, E=8, Ev=6)
    with pytest.raises(Unsupported, match=r"torch-sdpa-cpu-flash needs value's last dimension equal to query's "
                                          r"\(Ev == E\); got E=8, Ev=6"):
        resolve("torch-sdpa-cpu-flash").forward(q, k, v)  # declared: refused before PyTorch is called

    class Undeclared(TorchSdpaCpuFlash):  # the same kernel, had the declaration been forgotten
        capabilities = Capabilities(dtypes=("float64",), device="cpu", gradients=True)

    with pytest.raises(Unsupported, match="torch-sdpa-cpu-flash: PyTorch's FLASH_ATTENTION kernel refuses this call: "
                                          "Flash attention requires q,k,v to have the same last dimension"):
        Undeclared().forward(q, k, v)  # PyTorch's refusal, never another kernel's answer
    # the default dispatch may choose another kernel: that is what it declares
    out = resolve("torch-sdpa-cpu").forward(q, k, v)
    assert error_budget.check_forward(out, q, k, v, dtype="float64")


@pytest.mark.parametrize("name,grad_fn", [("torch-sdpa-cpu-flash", "ScaledDotProductFlashAttentionForCpuBackward0"),
                                          ("torch-sdpa-cpu-math", "UnsafeViewBackward0")])
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_pinned_kernel_is_the_kernel_that_runs(name, grad_fn, dtype):
    """The autograd node of the output names the kernel that produced it."""
    _torch_available()
    backend = resolve(name)
    backend.load()
    q, k, v, mask, causal, scale = random_cases()[2].args()  # mask AND causal: folded into one mask
    qn, kn, vn = (backend.to_native(x, dtype).requires_grad_(True) for x in (q, k, v))
    y = backend._attend(qn, kn, vn, backend.to_native(mask, None), causal, scale)  # (1, 2, 12, 8)
    names, node = [], y.grad_fn
    while node is not None and len(names) < 4:  # reshape/view nodes may sit on top
        names.append(node.name())
        node = node.next_functions[0][0] if node.next_functions else None
    if dtype == "bfloat16" and name.endswith("math"):
        grad_fn = "ToCopyBackward0"  # the CPU math kernel computes 16-bit formats in float32
    assert grad_fn in names, f"{name} {dtype}: autograd chain {names}"
    if name.endswith("math"):
        assert not any("Flash" in n for n in names)


def test_jax_dpa_declines_value_width_other_than_query_width():
    backend = resolve("jax-dpa")
    ok, why = backend.availability()
    if not ok:
        pytest.skip(why)
    q, k, v = qkv(0, batch=(2,), Lq=4, Lk=5, E=8, Ev=3)
    with pytest.raises(Unsupported, match=r"jax-dpa needs value's last dimension equal to query's \(Ev == E\); got E=8, Ev=3"):
        backend.forward(q, k, v, dtype="float32")
    with pytest.raises(Unsupported, match="jax-dpa does not support dtype float16"):
        backend.forward(q, k, v[..., :8], dtype="float16")


def test_jax_float64_leaves_x64_mode_off():
    backend = resolve("jax-naive")
    ok, why = backend.availability()
    if not ok:
        pytest.skip(why)
    import jax

    before = jax.config.jax_enable_x64
    out = backend.forward(*CASE.args(), dtype="float64")
    assert out.dtype == np.float64 and jax.config.jax_enable_x64 == before
    assert error_budget.check_forward(out, *CASE.args(), dtype="float64")


@pytest.mark.parametrize("call", ["forward", "backward", "prepare"])
def test_a_callers_mistake_is_a_valueerror_naming_the_argument_not_a_backend_failure(call):
    from attnspec.backends.registry import resolve

    b = resolve("numpy-naive")
    q, k = np.ones((1, 3, 4)), np.ones((1, 5, 4))
    bad = {"key": (q, np.ones((1, 5, 3)), k, None, None, "query and key"),
           "scale": (q, k, k, None, -1.0, "scale"),
           "mask": (q, k, k, np.ones((3, 5)), None, "mask")}
    for q_, k_, v_, mask, scale, phrase in bad.values():
        args = (q_, k_, v_) + ((np.ones((1, 3, 4)),) if call == "backward" else ())
        with pytest.raises(ValueError, match=phrase) as info:
            getattr(b, call)(*args, mask=mask, scale=scale)
        assert not isinstance(info.value, AssertionError)  # BackendFailure is an AssertionError


def test_a_refusal_inside_jax_dot_product_attention_is_unsupported_with_its_reason(monkeypatch):
    """JAX says "not this" with NotImplementedError (cuDNN: head dims, odd lengths in training):
    a skip naming JAX's reason, never a failure of the kernel."""
    pytest.importorskip("jax")
    from attnspec.backends import jax_programs

    backend = resolve("jax-dpa")
    backend.load()  # (turns on the program cache where ATTNSPEC_JAX_CACHE says; off here: a kept program
    monkeypatch.setattr(jax_programs, "DIRECTORY", None)  # would run without tracing _attend)

    def refuses(*args, **kwargs):
        raise NotImplementedError("The head dim must be <= 256 and a multiple of 8, but got 1.")

    monkeypatch.setattr(backend, "_attend", refuses)
    with pytest.raises(Unsupported, match="jax-dpa: jax.nn.dot_product_attention refuses this call: The head dim"):
        backend.forward(*CASE.args(), dtype="float32")


def _torch_style():
    def sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None):
        return q.matmul(k)  # a torch tensor's method: NumPy's arrays have none
    return sdpa  # a new function each time: declare() marks the function it is given


def _wrong_keyword(*args, **kwargs):
    raise TypeError("sdpa() got an unexpected keyword argument 'scale'")


@pytest.mark.parametrize("declaration", [None, dict(), dict(framework="torch")])
def test_a_function_over_numpy_arrays_that_wants_tensors_is_told_how_to_declare(declaration):
    if declaration and "framework" in declaration:
        pytest.importorskip("torch")
    from attnspec import declare
    from attnspec.backends.plain import function_backend
    fn = _torch_style() if declaration is None else declare(**declaration, dtypes=("float32",))(_torch_style())
    over_numpy = "framework" not in (declaration or {})  # declaring dtypes alone keeps NumPy arrays
    with pytest.raises(BackendFailure) as info:
        function_backend(fn, "mine").forward(*CASE.args(), dtype="float32")
    # a torch function gets torch tensors: its error is its own, and a hint to declare torch would be wrong
    assert ("declare(fn, framework='torch')" in str(info.value)) is over_numpy, str(info.value)


def test_a_flash_attention_signature_over_numpy_arrays_is_told_how_to_declare():
    from attnspec.backends.plain import function_backend

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
        return q.contiguous()  # flash-attn's own functions take torch tensors only

    with pytest.raises(BackendFailure, match="no attribute 'contiguous' .*declare\\(fn, framework='torch'\\)"):
        function_backend(flash_attn_func, "flash").forward(*CASE.args()[:3])


def test_an_unrelated_raise_gets_no_framework_hint():
    from attnspec.backends.plain import function_backend
    with pytest.raises(BackendFailure, match=r"forward raised TypeError: .*keyword argument 'scale'$"):
        function_backend(_wrong_keyword, "mine").forward(*CASE.args())
