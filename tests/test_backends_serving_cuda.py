"""The CUDA serving adapters (backends/serving_cuda.py) on a machine without their GPU or package:
registered, importing nothing, skipped with the reason - never a silent fallback."""
import subprocess
import sys

import numpy as np
import pytest

from attnspec.backends.base import BackendUnavailable
from attnspec.backends.registry import BUILTINS, resolve, suite_names

SERVING_CUDA = {"torch-varlen-cuda": "", "flash-attn-varlen-cuda": "flash_attn",
                "flash-attn-kvcache-cuda": "flash_attn", "flashinfer-prefill-cuda": "flashinfer",
                "flashinfer-decode-cuda": "flashinfer"}


def _importable(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def test_registered_as_suite_builtins():
    for name in SERVING_CUDA:
        assert BUILTINS[name].startswith("attnspec.backends.serving_cuda:")
        assert name in suite_names()  # skipped with the reason in a default run, as torch-sdpa-cuda-* are


def test_resolving_them_loads_no_framework():
    names = ", ".join(repr(n) for n in SERVING_CUDA)
    code = ("import sys; from attnspec.backends.registry import resolve; "
            f"bs = [resolve(n) for n in ({names},)]; "
            "print(sorted(m for m in ('torch', 'flash_attn', 'flashinfer') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name", sorted(SERVING_CUDA))
def test_unavailable_with_its_reason(name):
    package = SERVING_CUDA[name]
    if _cuda() and (not package or _importable(package)):
        pytest.skip(f"{name} can run here (a GPU and {package or 'torch'}): tools/gpu_check.sh checks it")
    b = resolve(name)
    ok, why = b.availability()
    assert not ok
    if package and not _importable(package):
        assert why.startswith(f"{package} is not installed")
    else:
        assert why == "no CUDA device"
    assert b.capabilities.device == "cuda" and "padded" not in b.capabilities.formats
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 2, 3, 64)) for _ in range(3))
    with pytest.raises(BackendUnavailable, match="not installed|no CUDA device"):
        b.forward(q, k, v, dtype="float16")  # through its first format: the same skip, never a fallback


def test_flashinfer_formats_and_limits_as_declared():
    prefill, decode = resolve("flashinfer-prefill-cuda"), resolve("flashinfer-decode-cuda")
    assert prefill.capabilities.formats == ("packed", "paged-NHD", "paged-HND")
    assert decode.capabilities.formats == ("paged-NHD", "paged-HND")
    assert prefill.capabilities.fit_head_dim(40) == 64 and not prefill.capabilities.takes_head_dim(96)
    assert resolve("flash-attn-kvcache-cuda").capabilities.formats == ("paged-NHD", "append")
