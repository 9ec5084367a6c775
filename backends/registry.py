"""Finding backends by name: built-ins, entry points and ``package.module:attr``.

Built-ins are listed as "module:Class" strings so that listing them imports nothing;
resolving one imports only its own module (whose framework loads later, in ``load``).
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys

from attnspec.backends.base import Backend
from attnspec.backends.plain import PLAIN_CALL, FunctionBackend, check_plain_call, function_backend  # noqa: F401

ENV_VAR = "ATTNSPEC_BACKENDS"
ENTRY_POINT_GROUP = "attnspec.backends"

_T, _TC, _J = "attnspec.backends.torch_backends:", "attnspec.backends.torch_cuda_backends:", "attnspec.backends.jax_backends:"
_S = "attnspec.backends.serving_cuda:"  # the serving kernels (packed, paged): CUDA only
BUILTINS = {
    "numpy-naive": "attnspec.backends.numpy_backends:NumpyNaive",
    "numpy-tiled": "attnspec.backends.numpy_backends:NumpyTiled",
    "torch-math": _T + "TorchMath",
    "torch-sdpa-cpu": _T + "TorchSdpaCpu",
    "torch-sdpa-cpu-math": _T + "TorchSdpaCpuMath",
    "torch-sdpa-cpu-flash": _T + "TorchSdpaCpuFlash",
    "torch-sdpa-cuda-flash": _TC + "TorchSdpaCudaFlash",
    "torch-sdpa-cuda-efficient": _TC + "TorchSdpaCudaEfficient",
    "torch-sdpa-cuda-cudnn": _TC + "TorchSdpaCudaCudnn",
    "torch-sdpa-cuda-math": _TC + "TorchSdpaCudaMath",
    "torch-varlen-cuda": _S + "TorchVarlenCuda",
    "flash-attn-varlen-cuda": _S + "FlashAttnVarlenCuda",
    "flash-attn-kvcache-cuda": _S + "FlashAttnKvcacheCuda",
    "flashinfer-prefill-cuda": _S + "FlashInferPrefillCuda",
    "flashinfer-decode-cuda": _S + "FlashInferDecodeCuda",
    "torch-sdpa-fp8-cuda": "attnspec.backends.fp8_cuda:TorchSdpaFp8Cuda",
    "flash-attn3-fp8-cuda": "attnspec.backends.fp8_cuda:FlashAttn3Fp8Cuda",
    "torch-flex": "attnspec.backends.flex_backends:TorchFlex",
    "torch-flex-compiled": "attnspec.backends.flex_backends:TorchFlexCompiled",
    "jax-naive": _J + "JaxNaive",
    "jax-dpa": _J + "JaxDpa",
    "jax-dpa-cudnn": _J + "JaxDpaCudnn",
    "onnxruntime-attention": "attnspec.backends.onnx_backends:OnnxRuntimeAttention",
    "openvino-sdpa": "attnspec.backends.openvino_backends:OpenVinoSdpa",
    "openvino-sdpa-f32": "attnspec.backends.openvino_backends:OpenVinoSdpaF32",
    "keras-numpy": "attnspec.backends.keras_backends:KerasNumpy",
    "keras-jax": "attnspec.backends.keras_backends:KerasJax",
    "keras-torch": "attnspec.backends.keras_backends:KerasTorch",
    "flax-linen": "attnspec.backends.flax_backends:FlaxLinen",
    "flax-nnx": "attnspec.backends.flax_backends:FlaxNnx",
    "transformers-sdpa": "attnspec.backends.transformers_backends:TransformersSdpa",
    "transformers-eager": "attnspec.backends.transformers_backends:TransformersEager",
    "transformers-gpt-oss": "attnspec.backends.transformers_backends:TransformersGptOss",
    "mlx-sdpa": "attnspec.backends.mlx_backends:MlxFastSdpa",
}


class BackendSelectionError(ValueError):
    """An unknown name, an import error, or an attribute that is not a backend."""


# Built-ins the conformance suite checks only when named: what a default run could not afford.
SUITE_OPT_IN = {
    "torch-flex-compiled": "torch.compile compiles anew for every shape, dtype and static configuration the suite "
                           "draws, which costs more than the rest of a default run (docs/measurements.md); the "
                           "suite checks it when named (--backend torch-flex-compiled), the benchmarks time it by "
                           "default; torch-flex is the same kernel family, eager (checked by attnspec run)",
}


# The libraries people run (issue 24's "zoo", the `zoo` extra): `attnspec run` checks and times them
# with the rest; a plain `pytest properties` checks them when named (their eager JAX ops compile per
# shape: keras-jax's suite is among the longest, longer still with JAX's cache cold: docs/measurements.md).
ZOO = ("keras-numpy", "keras-jax", "keras-torch", "flax-linen", "flax-nnx", "transformers-sdpa", "transformers-eager",
       "transformers-gpt-oss", "mlx-sdpa")


# Built-ins `attnspec run` checks with the rest, and a plain `pytest properties` only when named, as the zoo.
PYTEST_WHEN_NAMED = {
    "torch-flex": "flex_attention without torch.compile is PyTorch's unfused fallback (a vmap over the score and "
                  "mask functions, the whole score matrix materialised, as torch-math computes it): its calls cost "
                  "several times the other CPU backends', a third of a default `pytest properties` "
                  "(docs/measurements.md); `attnspec run` checks it, and `pytest properties --backend torch-flex`",
}


def suite_names() -> list[str]:
    """The built-ins `pytest properties` checks when no backend is named: every built-in but
    SUITE_OPT_IN, PYTEST_WHEN_NAMED and the ZOO (named, or through `attnspec run`, the last two are checked)."""
    return [n for n in builtin_names() if n not in SUITE_OPT_IN and n not in PYTEST_WHEN_NAMED and n not in ZOO]


def builtin_names() -> list[str]:
    return list(BUILTINS)


def entry_points() -> dict:
    """name -> EntryPoint for every installed plug-in in the `attnspec.backends` group."""
    from importlib.metadata import entry_points as installed

    return {ep.name: ep for ep in installed(group=ENTRY_POINT_GROUP)}


def _known() -> str:
    plugins = sorted(entry_points())
    return (f"built-ins: {', '.join(builtin_names())}; entry points: {', '.join(plugins) or 'none installed'}; "
            "or give package.module:attr")


def _import(module_name: str):
    """The module, as the user's shell imports it: a package in the current folder too (``python -m`` and
    ``python -c`` put it on sys.path; the ``pytest`` and ``attnspec`` commands do not)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        here = os.getcwd()
        top = module_name.split(".")[0]
        if e.name != top or here in sys.path or not os.path.exists(os.path.join(here, top)) and \
                not os.path.exists(os.path.join(here, top + ".py")):
            raise
        sys.path.append(here)
        return importlib.import_module(module_name)


def _load_attr(spec: str, name: str):
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise BackendSelectionError(f"backend {name!r}: expected package.module:attr, got {spec!r}")
    try:
        module = _import(module_name)
    except Exception as e:  # noqa: BLE001 - report any import failure by name
        raise BackendSelectionError(f"backend {name!r}: cannot import module {module_name!r}: {type(e).__name__}: {e}") from e
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    except AttributeError:
        public = sorted(n for n in vars(module) if not n.startswith("_"))
        raise BackendSelectionError(f"backend {name!r}: module {module_name!r} has no attribute {attr!r} "
                                    f"(it has: {', '.join(public[:20]) or 'nothing public'})") from None


def _check_plain_call(fn, name: str) -> None:
    why = check_plain_call(fn, name)
    if why:
        raise BackendSelectionError(f"backend {name!r}: {why}")


def _as_backend(obj, name: str) -> Backend:
    if inspect.isclass(obj):
        if not issubclass(obj, Backend):
            raise BackendSelectionError(f"backend {name!r}: class {obj.__name__} is not a subclass of "
                                        "backends.base.Backend (give a Backend, or a plain function)")
        try:
            return obj()
        except Exception as e:  # noqa: BLE001 - the plug-in's constructor is its own
            raise BackendSelectionError(f"backend {name!r}: {obj.__name__}() raised {type(e).__name__}: {e}") from e
    if isinstance(obj, Backend):
        return obj
    if callable(obj):
        _check_plain_call(obj, name)
        return function_backend(obj, name)
    raise BackendSelectionError(f"backend {name!r}: {type(obj).__name__} object is neither a Backend nor a "
                                f"function {PLAIN_CALL}")


def resolve(name: str) -> Backend:
    """A Backend for a built-in name, an entry-point name or ``package.module:attr``."""
    if not isinstance(name, str) or not name.strip():
        raise BackendSelectionError(f"backend name must be a non-empty string; got {name!r}; {_known()}")
    name = name.strip()
    if name in BUILTINS:
        return _as_backend(_load_attr(BUILTINS[name], name), name)
    plugins = entry_points() if ":" not in name else {}
    if name in plugins:
        try:
            obj = plugins[name].load()
        except Exception as e:  # noqa: BLE001 - a broken plug-in is reported, not raised raw
            raise BackendSelectionError(f"backend {name!r}: entry point {plugins[name].value!r} failed to load: "
                                        f"{type(e).__name__}: {e}") from e
        return _as_backend(obj, name)
    if ":" in name:
        return _as_backend(_load_attr(name, name), name)
    raise BackendSelectionError(f"unknown backend {name!r}; {_known()}")


def select(names=None) -> list[Backend]:
    """Backends for `names` (None: every built-in), in order, without duplicates."""
    if names is None:
        names = builtin_names()
    if isinstance(names, str):
        names = [names]
    return [resolve(n) for n in dict.fromkeys(names)]


def names_from_env(environ=None) -> list[str] | None:
    """The names in ATTNSPEC_BACKENDS (comma-separated), or None when unset or empty."""
    raw = (os.environ if environ is None else environ).get(ENV_VAR, "")
    names = [n.strip() for n in raw.split(",") if n.strip()]
    return names or None
