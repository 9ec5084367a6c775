"""Graded defects: torch-math with one error of relative size d, to measure detection power.

    temperature  the softmax sees scale * (1 + d)                  (a wrong default scale, a folded log2 e)
    gain         the output is multiplied by 1 + d                 (a wrong final normalisation)
    tail         the row sum misses a fraction d of the mass of the last 16-key block the row
                 weighs (a block loop that mishandles its last block; all of it when Lk <= 16)
    rescale      an online softmax over 16-key blocks rescales its running sum by alpha^(1 + d),
                 alpha = exp(m_old - m_new), while the accumulator gets alpha (exact when the
                 first block a row sees holds its maximum)

Each is built on torch-math (every dtype, with NumPy's missing bfloat16; forward, backward
through autograd, every field, the log-sum-exp), so at d = 0 it *is* torch-math.  Name one as
a plug-in ``tests.defects:<defect>_<d>[_<dtype>]``: d in Python's float syntax without a dot
(``3e-3``, ``1e-05``, ``0``) - `backends.registry.resolve` splits attributes at dots - and
an optional dtype (float16, bfloat16, float32, float64) to declare that one only, e.g.
``pytest properties --backend tests.defects:gain_3e-3_float16``.  In Python: ``make("gain", 3e-3)``.
"""
from __future__ import annotations

import re
from dataclasses import replace

from attnspec.backends.torch_backends import TorchMath

DEFECTS = ("temperature", "gain", "tail", "rescale")
DTYPES = ("float16", "bfloat16", "float32", "float64")  # declared when none is named
FP8 = ("float8_e4m3fn", "float8_e5m2")  # named only: torch-math's fp8 path (float32 inside, bfloat16 out)
BLOCK = 16  # keys per block of the block-structured defects
_NAME = re.compile(r"^(%s)_([0-9eE+-]+)(?:_(%s))?$" % ("|".join(DEFECTS), "|".join(DTYPES + FP8)))


class Defect(TorchMath):
    """torch-math with `kind`'s defect of size `d`, declaring `dtypes`."""

    def __init__(self, kind: str, d: float, dtypes=DTYPES):
        if kind not in DEFECTS:
            raise ValueError(f"kind must be one of {', '.join(DEFECTS)}; got {kind!r}")
        if not (isinstance(d, (int, float)) and 0 <= d < 1):
            raise ValueError(f"d must be a number in [0, 1); got {d!r}")
        unknown = sorted(set(dtypes) - set(DTYPES + FP8))
        if unknown or not dtypes:
            raise ValueError(f"dtypes must be a non-empty subset of {DTYPES + FP8}; got {dtypes!r}")
        self.kind, self.d = kind, float(d)
        self.name = f"defect-{kind}-{self.d:g}" + (f"-{dtypes[0]}" if len(dtypes) == 1 else "")
        self.capabilities = replace(TorchMath.capabilities, dtypes=tuple(dtypes))

    def _attention(self, q, k, v, call):
        if call.dtype in FP8:  # torch-math's fp8 path with the defect inside: dequantised, float32, bfloat16 out
            qd, kd, vd = self._dequantised(q, k, v, call)
            res = self._attention(qd, kd, vd, replace(call, dtype="float32", q_descale=None, k_descale=None,
                                                      v_descale=None))
            bf16 = self.torch.bfloat16
            return (res[0].to(bf16), res[1]) if call.return_lse else res.to(bf16)
        if self.kind == "temperature":
            scale = q.shape[-1] ** -0.5 if call.scale is None else call.scale
            return super()._attention(q, k, v, replace(call, scale=scale * (1.0 + self.d)))
        if self.kind == "gain":
            res = super()._attention(q, k, v, call)
            return (res[0] * (1.0 + self.d), res[1]) if call.return_lse else res * (1.0 + self.d)
        return self._renormalised(q, k, v, call)

    def _renormalised(self, q, k, v, call):
        """torch-math's weights W (read through V = identity: exact), divided by the defect's row sum."""
        torch = self.torch
        Lk = k.shape[-2]
        eye = torch.eye(Lk, dtype=v.dtype, device=v.device).expand(*v.shape[:-2], Lk, Lk)  # (..., Hkv, Lk, Lk)
        res = super()._attention(q, k, eye, call)
        w, lse = res if call.return_lse else (res, None)  # (..., Lq, Lk) torch-math's own weights
        norm = None if self.d == 0 or w.numel() == 0 else self._row_sum_ratio(w.detach())  # (..., Lq, 1)
        if norm is not None:
            w = (w.to(norm.dtype) / norm).to(w.dtype)  # one more rounding, as a kernel dividing late does
        v = self._unpadded(v, call)  # (..., Hkv, Lk, Ev) as torch-math reads it
        out = w @ v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3) if call.enable_gqa else w @ v
        if lse is None:
            return out
        return out, lse if norm is None else (lse.to(norm.dtype) + torch.log(norm[..., 0])).to(lse.dtype)

    def _row_sum_ratio(self, w):
        """(..., Lq, 1) the defective row sum over the right one, in the accumulator type (so only d shows)."""
        torch = self.torch
        w = w.to(torch.float64 if w.dtype == torch.float64 else torch.float32)  # (..., Lq, Lk)
        Lk = w.shape[-1]
        if self.kind == "tail":  # the last block holding a key the row weighs
            keys = torch.arange(Lk, device=w.device)  # (Lk,)
            last = torch.where(w > 0, keys, -1).amax(dim=-1, keepdim=True)  # (..., Lq, 1)
            tail = torch.where(keys >= last // BLOCK * BLOCK, w, 0.0).sum(dim=-1, keepdim=True)  # (..., Lq, 1)
            return 1.0 - self.d * tail
        # rescale: block b's mass weighed by exp(d (m_b - M)), m_b the running max after block b
        blocks = torch.nn.functional.pad(w, (0, -Lk % BLOCK)).unflatten(-1, (-1, BLOCK))  # (..., Lq, nb, BLOCK)
        running = blocks.amax(dim=-1).cummax(dim=-1).values  # (..., Lq, nb) largest weight so far
        tiny = torch.finfo(w.dtype).tiny
        lag = torch.log(running.clamp_min(tiny) / running[..., -1:].clamp_min(tiny))  # (..., Lq, nb) m_b - M
        norm = (blocks.sum(dim=-1) * torch.exp(self.d * lag)).sum(dim=-1, keepdim=True)  # (..., Lq, 1)
        return torch.where(norm > 0, norm, torch.ones_like(norm))  # rows that see nothing stay zero


def make(kind: str, d: float, dtype: str | None = None) -> Defect:
    """The defect `kind` of size `d`, declaring `dtype` only (None: every dtype)."""
    return Defect(kind, d, (dtype,) if dtype else DTYPES)


def spec(kind: str, d: float, dtype: str | None = None) -> str:
    """The plug-in name `resolve` takes for make(kind, d, dtype): d without a dot (1.5e-3 -> 15e-4)."""
    token = "0"
    if d:
        mant, exp = f"{d:.6e}".split("e")
        whole, _, frac = mant.rstrip("0").rstrip(".").partition(".")
        token = f"{whole}{frac}e{int(exp) - len(frac)}"
    return f"tests.defects:{kind}_{token}" + (f"_{dtype}" if dtype else "")


def __getattr__(name: str) -> Defect:
    """tests.defects:<defect>_<d>[_<dtype>] (PEP 562): a fresh Defect."""
    m = _NAME.match(name)
    if not m:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (defects are named "
                             f"<{'|'.join(DEFECTS)}>_<d>[_<dtype>], e.g. gain_3e-3_float16)")
    try:
        d = float(m.group(2))
    except ValueError:
        raise AttributeError(f"{name!r}: {m.group(2)!r} is not a number (write d like 3e-3)") from None
    return make(m.group(1), d, m.group(3))
