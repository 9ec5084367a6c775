"""The Backend interface: what the suite judges and the benchmarks time.

An adapter subclasses `Backend` and implements five small hooks over *native* values:
``load`` (import the framework, check device), ``to_native``, ``from_native``,
``native_forward`` and optionally ``native_backward``; ``sync`` waits for the device.
The public methods (`forward`, `backward`, `prepare`) do conversion and checking once,
here, so every adapter stays a screen long.  Importing this module loads no framework.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specs.problem import validate  # the definition's checks; never the reference

FULLY_MASKED_CHOICES = ("zeros", "nan", "mean_of_values", "error")
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
OPS = ("forward", "forward_backward")


class Unsupported(Exception):
    """A combination the backend declares it does not support (a skip, with its reason)."""


class BackendUnavailable(Unsupported):
    """The framework or device is missing (a skip, with its reason)."""


class BackendFailure(AssertionError):
    """The backend misbehaved: raised, or returned the wrong shape or dtype."""

    def __init__(self, backend: str, what: str):
        super().__init__(f"backend {backend!r}: {what}")
        self.backend = backend
        self.what = what


@dataclass(frozen=True)
class Capabilities:
    dtypes: tuple = ("float64", "float32")
    device: str = "cpu"
    gradients: bool = False
    masks: bool = True
    causal: bool = True
    equal_head_dims: bool = False  # needs Ev == E (value's last dim equal to query's): flash kernels


@dataclass(frozen=True)
class Semantics:
    """Declared behaviour where the spec leaves a choice; None = not declared."""

    fully_masked: str | None = None      # one of FULLY_MASKED_CHOICES
    causal_alignment: str | None = None  # one of CAUSAL_ALIGNMENTS
    notes: tuple = field(default_factory=tuple)  # free text: e.g. "softmax runs in float32"
    # The narrowest float type a step runs in when it caps accuracy below the input's
    # (jax.nn.dot_product_attention's softmax is float32 even for float64 input): judge
    # results of wider dtypes against this dtype's budget.  None = the input dtype.
    effective_precision: str | None = None


class Backend:
    name: str = "unnamed"
    capabilities: Capabilities = Capabilities()
    semantics: Semantics = Semantics()

    # -- hooks for adapters -------------------------------------------------------
    def load(self) -> None:
        """Import the framework and check the device; raise BackendUnavailable(reason)."""

    def to_native(self, x: np.ndarray, dtype: str):
        """A float64/bool NumPy array to a native value (dtype is None for masks)."""
        return x if dtype is None else x.astype(dtype)

    def from_native(self, y) -> np.ndarray:
        """A native result to NumPy; bfloat16 comes back as float32 (exactly)."""
        return np.asarray(y)

    def native_dtype(self, y) -> str:
        return str(y.dtype).replace("torch.", "")

    def native_forward(self, q, k, v, mask, is_causal: bool, scale: float | None):
        raise NotImplementedError

    def native_backward(self, q, k, v, grad_out, mask, is_causal: bool, scale: float | None):
        """(dq, dk, dv) natively; only for capabilities.gradients."""
        raise Unsupported(f"{self.name} computes no gradients")

    def sync(self, y) -> None:
        """Wait until y is computed (CUDA synchronize, JAX block_until_ready)."""

    # -- public API ---------------------------------------------------------------
    def availability(self) -> tuple[bool, str]:
        try:
            self.load()
        except BackendUnavailable as e:
            return False, str(e)
        except ImportError as e:
            return False, f"import failed: {e}"
        return True, "available"

    def check_supported(self, dtype: str, op: str = "forward", mask=None, is_causal=False) -> None:
        """Raise Unsupported (with the reason) for a combination this backend declines."""
        self.load()
        caps = self.capabilities
        if dtype not in caps.dtypes:
            raise Unsupported(f"{self.name} does not support dtype {dtype} (supports {', '.join(caps.dtypes)})")
        if op == "forward_backward" and not caps.gradients:
            raise Unsupported(f"{self.name} computes no gradients")
        if mask is not None and not caps.masks:
            raise Unsupported(f"{self.name} takes no boolean mask")
        if is_causal and not caps.causal:
            raise Unsupported(f"{self.name} has no causal mode")

    def _check_shapes(self, q, v) -> None:
        if self.capabilities.equal_head_dims and np.shape(v)[-1] != np.shape(q)[-1]:
            raise Unsupported(f"{self.name} needs value's last dimension equal to query's (Ev == E); "
                              f"got E={np.shape(q)[-1]}, Ev={np.shape(v)[-1]}")

    def _natives(self, dtype, *arrays):
        return [None if a is None else self.to_native(np.asarray(a, dtype=np.float64), dtype) for a in arrays]

    def _check(self, what: str, y, shape: tuple, dtype: str) -> np.ndarray:
        if y is None:
            raise BackendFailure(self.name, f"{what} is None, expected an array of shape {tuple(shape)}")
        try:
            got_dtype = self.native_dtype(y)
            out = self.from_native(y)
        except Exception as e:  # noqa: BLE001 - any failure to convert is the backend's
            raise BackendFailure(self.name, f"{what} could not be converted to NumPy: {type(e).__name__}: {e}") from e
        if tuple(out.shape) != tuple(shape):
            raise BackendFailure(self.name, f"{what} has shape {tuple(out.shape)}, expected {tuple(shape)} "
                                            f"(returned a {type(y).__name__})")
        if got_dtype != dtype:
            raise BackendFailure(self.name, f"{what} has dtype {got_dtype}, expected {dtype}")
        return out

    def _call(self, what, fn, *args):
        try:
            return fn(*args)
        except (Unsupported, BackendFailure):
            raise
        except Exception as e:  # noqa: BLE001 - a raising backend fails alone, clearly
            raise BackendFailure(self.name, f"{what} raised {type(e).__name__}: {e}") from e

    def forward(self, q, k, v, mask=None, is_causal=False, scale=None, dtype="float64") -> np.ndarray:
        """Output (..., Lq, Ev) as NumPy in `dtype` (bfloat16 -> float32).  Inputs: float64 NumPy."""
        validate(q, k, v, mask, is_causal, scale)  # a caller's mistake is a ValueError, not the backend's failure
        self.check_supported(dtype, "forward", mask, is_causal)
        self._check_shapes(q, v)
        qn, kn, vn = self._natives(dtype, q, k, v)
        mn = None if mask is None else self.to_native(np.asarray(mask, dtype=bool), None)
        y = self._call("forward", self.native_forward, qn, kn, vn, mn, bool(is_causal), scale)
        return self._check("forward output", y, _out_shape(q, k, v), dtype)

    def backward(self, q, k, v, grad_out, mask=None, is_causal=False, scale=None, dtype="float64"):
        """(dQ, dK, dV) as NumPy, each shaped like its input."""
        validate(q, k, v, mask, is_causal, scale)
        if np.shape(grad_out) != _out_shape(q, k, v):
            raise ValueError(f"grad_out must be shaped like the output {_out_shape(q, k, v)}; got {np.shape(grad_out)}")
        self.check_supported(dtype, "forward_backward", mask, is_causal)
        self._check_shapes(q, v)
        qn, kn, vn, gn = self._natives(dtype, q, k, v, grad_out)
        mn = None if mask is None else self.to_native(np.asarray(mask, dtype=bool), None)
        grads = self._call("backward", self.native_backward, qn, kn, vn, gn, mn, bool(is_causal), scale)
        if not isinstance(grads, (tuple, list)) or len(grads) != 3:
            raise BackendFailure(self.name, f"backward returned {type(grads).__name__}, expected (dq, dk, dv)")
        return tuple(self._check(f"d{n}", g, np.shape(x), dtype) for n, g, x in zip("qkv", grads, (q, k, v)))

    def prepare(self, q, k, v, mask=None, is_causal=False, scale=None, dtype="float32", op="forward"):
        """Convert once; return a no-argument callable that runs the native call and syncs."""
        validate(q, k, v, mask, is_causal, scale)
        self.check_supported(dtype, op, mask, is_causal)
        self._check_shapes(q, v)
        qn, kn, vn, gn = self._natives(dtype, q, k, v, np.ones(_out_shape(q, k, v)))
        mn = None if mask is None else self.to_native(np.asarray(mask, dtype=bool), None)
        if op == "forward":
            def run():
                y = self.native_forward(qn, kn, vn, mn, is_causal, scale)
                self.sync(y)
                return y
        else:
            def run():
                grads = self.native_backward(qn, kn, vn, gn, mn, is_causal, scale)
                self.sync(grads[0])
                return grads
        return run

    def describe(self) -> dict:
        ok, why = self.availability()
        c, s = self.capabilities, self.semantics
        return {"name": self.name, "available": ok, "reason": why, "device": c.device,
                "dtypes": list(c.dtypes), "gradients": c.gradients, "masks": c.masks, "causal": c.causal,
                "equal_head_dims": c.equal_head_dims,
                "fully_masked": s.fully_masked, "causal_alignment": s.causal_alignment,
                "effective_precision": s.effective_precision, "notes": list(s.notes)}

    def __repr__(self) -> str:
        return f"<Backend {self.name}>"


def _out_shape(q, k, v) -> tuple:
    batch = np.broadcast_shapes(np.shape(q)[:-2], np.shape(k)[:-2], np.shape(v)[:-2])
    return tuple(batch) + (np.shape(q)[-2], np.shape(v)[-1])
