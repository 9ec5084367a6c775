"""PyTorch backends: explicit ops, SDPA's default dispatch, and one name per pinned kernel.

torch is imported in ``load`` (never at module import).  A pinned kernel runs under
``torch.nn.attention.sdpa_kernel([that kernel])`` only, so PyTorch cannot fall back to
another one: a combination the kernel refuses becomes ``Unsupported`` carrying
PyTorch's own reason (the "... not used because ..." warnings it emits).

What SDPA takes natively (checked on torch 2.13 CPU, each pinned kernel): a float
``attn_mask`` added to the scaled scores (our bias), ``enable_gqa=True`` (key/value with
Hkv heads), and ``torch.nn.attention.bias.causal_lower_right`` (bottom-right causal).  It
refuses ``attn_mask`` together with ``is_causal``: the triangle is folded into the mask then
(base folds a boolean mask, `_sdpa_mask` folds a bias), which is PyTorch's own definition.
A bias *and* a boolean mask become one float mask, -inf where the boolean is False, as SDPA's
documented equivalent code does.  The log-sum-exp: only the CPU flash op
(``aten._scaled_dot_product_flash_attention_for_cpu``) returns it - natural log of the
scaled, masked scores, (B, H, Lq), float32 for 16-bit inputs - so torch-sdpa-cpu-flash
declares ``lse`` and calls that op when asked for it.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import replace

import numpy as np

from attnspec.backends import torch_formats
from attnspec.backends.base import LAYOUTS, Backend, BackendUnavailable, Call, Capabilities, Deviation, Semantics, Unsupported
from attnspec.specs.fields import EVERY_FEATURE

_ALL = ("float16", "bfloat16", "float32", "float64")
_HALF = ("float16", "bfloat16")
_FP8 = ("float8_e4m3fn", "float8_e5m2")  # forward-only (specs.fp8)
_EVERY_FEATURE = EVERY_FEATURE  # the whole definition (specs.fields)
_SDPA_FEATURES = frozenset(("gqa", "bias", "causal_bottom_right"))


def _import_torch():
    try:
        import torch
    except ImportError as e:
        raise BackendUnavailable(f"torch is not installed ({e})") from None
    return torch


class TorchBackend(Backend):
    """Conversion, device handling and the autograd backward; a subclass defines ``attention``.

    ``attention(q, k, v, call)`` gets torch tensors (..., H, L, E) on ``device`` in the dtype under
    test and returns the output (..., Lq, Ev), or (output, lse (..., Lq)) when ``call.return_lse``;
    `fold` gives the (B, N, L, E) views a fused kernel takes.  The forward runs under no_grad; the
    backward is ``torch.autograd.grad`` through ``attention`` (dBias too with ``bias_gradient``).
    ``device = "cuda"`` without a GPU is BackendUnavailable: a skip with its reason.
    """

    device = "cpu"
    capabilities = Capabilities(dtypes=_ALL, device="cpu", gradients=True)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left")

    def load(self):
        self.torch = _import_torch()
        if self.device == "cuda" and not self.torch.cuda.is_available():
            raise BackendUnavailable("no CUDA device")

    def to_native(self, x, dtype):
        t = self.torch.from_numpy(np.ascontiguousarray(x))
        if dtype is not None:
            t = t.to(getattr(self.torch, dtype))
        return t.to(self.device)

    def relayout(self, x, layout):
        """The same values with other strides (Backend.relayout): what a model hands SDPA mid-graph."""
        if layout == "transposed":  # the innermost axis not contiguous (pytorch/pytorch#187506)
            return x.transpose(-1, -2).contiguous().transpose(-1, -2)
        if layout == "offset":  # a view into a larger buffer, storage offset 7
            view = self.torch.empty(x.numel() + 7, dtype=x.dtype, device=x.device)[7:].view(x.shape)
            return view.copy_(x)
        if layout == "permuted":  # stored (B, L, H, E), viewed (B, H, L, E)
            return x.transpose(-3, -2).contiguous().transpose(-3, -2) if x.dim() >= 3 else x
        if layout == "head_slice" and x.dim() >= 3:  # a fused QKV projection's slice, NaN heads beside it
            axis = self.heads_axis(x) % x.dim()
            wide = list(x.shape)
            wide[axis] += 2
            return self.torch.full(wide, float("nan"), dtype=x.dtype, device=x.device).narrow(
                axis, 1, x.shape[axis]).copy_(x)
        if layout == "expanded":  # batch stride 0 (pytorch/pytorch#191937)
            if x.dim() < 3 or not bool((x == x[:1]).all()):
                raise ValueError("an expanded layout needs equal batch slices")
            return x[:1].expand(x.shape)
        return x

    def from_native(self, y):
        y = y.detach()
        if y.dtype == self.torch.bfloat16 or y.dtype.itemsize == 1 and y.dtype.is_floating_point:
            y = y.float()  # exact: every bfloat16 and fp8 value is a float32 (NumPy has no such types)
        return y.cpu().numpy()

    def sync(self, y):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def attention(self, q, k, v, call):
        """The public hook (see the class); the built-ins define `_attention`, which calls this."""
        raise NotImplementedError(f"{type(self).__name__} defines no attention(q, k, v, call)")

    def _attention(self, q, k, v, call):
        return self.attention(q, k, v, call)

    def _attend(self, q, k, v, mask, is_causal, scale):
        """PyTorch's classic call on native tensors (output only)."""
        return self._attention(q, k, v, Call(mask=mask, is_causal=is_causal, scale=scale))

    def native_attention(self, q, k, v, call):
        with self.torch.no_grad():
            return self._attention(q, k, v, call)  # (..., Lq, Ev), or with (..., Lq) lse

    def native_attention_backward(self, q, k, v, grad_out, call):
        with_bias = call.bias is not None and self.capabilities.bias_gradient
        sinks = () if call.sinks is None else (call.sinks,)  # dSink last, in the sinks' dtype
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v) + ((call.bias,) if with_bias else ()) + sinks]
        call = replace(call, bias=leaves[3] if with_bias else call.bias, return_lse=False,
                       sinks=leaves[-1] if sinks else None)
        y = self._attention(*leaves[:3], call)  # (..., Lq, Ev)
        # expand() sums broadcast gradients back to each input's shape, GQA groups included
        return self.torch.autograd.grad(y, leaves, grad_out)


class TorchMath(TorchBackend):
    """The textbook computation in torch ops, every field of the problem (ours: nothing to refuse).

    Masks are built from indices here, never from `specs`; a guarded row max keeps empty rows at zero.
    """

    name = "torch-math"
    capabilities = Capabilities(dtypes=_ALL + _FP8, device="cpu", gradients=True,
                                features=_EVERY_FEATURE | {"seq_positions", "sinks", "descale"}, layouts=LAYOUTS,
                                bias_gradient=True, formats=("padded", "packed", "paged-NHD", "paged-HND",
                                                             "paged-stacked-NHD", "paged-stacked-HND"))
    # fp8 inputs: dequantised to float32 (x.float() * descale), the math in float32, P not rounded, the
    # output in bfloat16 - PyTorch's quantised SDPA's output dtype
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros",
                          output_dtypes=tuple((d, "bfloat16") for d in _FP8),
                          p_dtypes=tuple((d, "float32") for d in _FP8), deviations=(
        # torch 2.13 CPU, found by the suite: q = torch.ones(3, 31, 7, dtype=torch.bfloat16); q[:, 16] = nan;
        # torch.bmm(q, torch.ones(3, 7, 7, dtype=torch.bfloat16))[:, 15] is NaN (float16/float32, or a
        # batch of 1 or 2, or 24 rows: no leak)
        Deviation("nan_in_padding_changes_nothing", "torch.bmm in bfloat16 on CPU lets a NaN in one row of "
                  "its left operand reach the row before it (batch 3, 31 x 7 @ 7 x 7: row 16 -> row 15), so a "
                  "NaN in a padded query row reaches the last real rows' scores (docs/findings.md: torch-bmm-bf16-nan)",
                  dtypes=("bfloat16",)),))

    native_packed = torch_formats.gathered_packed  # its own gather (torch indexing) into a padded batch
    native_paged = torch_formats.gathered_paged
    native_packed_backward = torch_formats.gathered_packed_backward  # autograd through the same gather

    def native_merge_states(self, o_parts, lse_parts):
        """vLLM's merge_attn_states over any number of states: each weighed by exp(its LSE - the merged LSE),
        in float32 at least; a merged LSE of -inf (all empty) weighs nothing, never exp(-inf - -inf)."""
        t = self.torch
        lse = t.logsumexp(lse_parts, dim=0)  # (..., Lq): -inf where every state is empty
        ref = t.where(t.isfinite(lse), lse, t.zeros_like(lse))
        wide = t.promote_types(o_parts.dtype, t.float32)
        out = (o_parts.to(wide) * t.exp(lse_parts - ref).to(wide)[..., None]).sum(dim=0)  # (..., Lq, Ev)
        return out.to(o_parts.dtype), lse

    def _unpadded(self, x, call):
        """Keys or values past kv_lengths and before kv_starts zeroed: padding is never read (0 * NaN
        would reach the output)."""
        if call.kv_lengths is None and call.kv_starts is None:
            return x
        j = self.torch.arange(x.shape[-2], device=x.device)  # (Lk,)
        padded = self.torch.zeros_like(j, dtype=self.torch.bool)  # (Lk,)
        if call.kv_lengths is not None:
            padded = padded | (j >= call.kv_lengths[..., None, None])  # (..., 1, Lk)
        if call.kv_starts is not None:
            padded = padded | (j < call.kv_starts[..., None, None])  # (..., 1, Lk) left padding
        return x.masked_fill(padded[..., None], 0)  # (..., Hkv, Lk, ·)

    def _diagonal_offset(self, call, Lq: int, Lk: int, device):
        """Query 0's diagonal: Lk - Lq bottom-right, else 0; with per-sequence positions one value per
        sequence, (..., 1, 1, 1): kv_len_b - q_len_b bottom-right, kv_start_b top-left."""
        if call.positions != "per_sequence":
            return Lk - Lq if call.causal_alignment == "bottom_right" else 0
        torch = self.torch
        i64 = dict(dtype=torch.int64, device=device)
        q_len = torch.as_tensor(Lq, **i64) if call.q_lengths is None else call.q_lengths.to(torch.int64)
        kv_len = torch.as_tensor(Lk, **i64) if call.kv_lengths is None else call.kv_lengths.to(torch.int64)
        start = torch.as_tensor(0, **i64) if call.kv_starts is None else call.kv_starts.to(torch.int64)
        o = kv_len - q_len + 0 * start if call.causal_alignment == "bottom_right" else start + 0 * (q_len + kv_len)
        return o[..., None, None, None]  # (..., 1, 1, 1): over heads, queries, keys

    def _dequantised(self, q, k, v, call, dtype=None):
        """q, k, v (fp8: as float32) times their descales (..., Hkv) (a query group shares its KV head's)."""
        dtype = dtype or self.torch.float32

        def times(x, d):
            x = x.to(dtype)
            if d is None:
                return x
            d = d.to(dtype)
            if d.dim() and x.shape[-3] != d.shape[-1]:
                d = d.repeat_interleave(x.shape[-3] // d.shape[-1], dim=-1)  # (..., Hq)
            return x * (d[..., None, None] if d.dim() else d)  # (..., H, L, D)
        return times(q, call.q_descale), times(k, call.k_descale), times(v, call.v_descale)

    def _attention(self, q, k, v, call):
        torch = self.torch
        if call.dtype in _FP8:  # dequantised, the math in float32, the output rounded to bfloat16
            qd, kd, vd = self._dequantised(q, k, v, call)
            y = self._attention(qd, kd, vd, replace(call, dtype="float32", q_descale=None, k_descale=None,
                                                    v_descale=None))
            return (y[0].to(torch.bfloat16), y[1]) if call.return_lse else y.to(torch.bfloat16)
        if any(d is not None for d in (call.q_descale, call.k_descale, call.v_descale)):  # descales in any dtype
            q, k, v = self._dequantised(q, k, v, call, q.dtype)
            call = replace(call, q_descale=None, k_descale=None, v_descale=None)
        k, v = self._unpadded(k, call), self._unpadded(v, call)
        if call.enable_gqa:  # query head h reads KV head h // group
            k, v = (x.repeat_interleave(q.shape[-3] // x.shape[-3], dim=-3) for x in (k, v))  # (..., Hq, Lk, ·)
        Lq, Lk = q.shape[-2], k.shape[-2]
        s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if call.scale is None else call.scale)  # (..., Lq, Lk)
        if call.softcap is not None:
            s = torch.tanh(s / call.softcap) * call.softcap
        if call.bias is not None:
            s = s + call.bias  # (..., Hq, Lq, Lk) -inf entries stay -inf
        rows = torch.arange(Lq, device=s.device)[:, None]  # (Lq, 1)
        cols = torch.arange(Lk, device=s.device)[None, :]  # (1, Lk)
        diag = rows + self._diagonal_offset(call, Lq, Lk, s.device)  # (Lq, 1) or (..., 1, Lq, 1) query i's diagonal
        if call.alibi_slopes is not None:
            wide = torch.promote_types(s.dtype, torch.float32)  # distances exact, one rounding to s's dtype
            dist = (diag - cols).abs().to(wide)  # (Lq, Lk)
            s = s - (call.alibi_slopes.to(wide)[:, None, None] * dist).to(s.dtype)  # (..., Hq, Lq, Lk)
        hidden = torch.zeros(Lq, Lk, dtype=torch.bool, device=s.device)  # (Lq, Lk)
        left, right = call.window if call.window is not None else (None, None)
        if call.is_causal:
            hidden = hidden | (cols > diag)
        if right is not None:
            hidden = hidden | (cols > diag + right)
        if left is not None:
            hidden = hidden | (cols < diag - left)
        if call.mask is not None:
            hidden = hidden | ~call.mask  # (..., Lq, Lk)
        if call.kv_lengths is not None:
            hidden = hidden | (cols >= call.kv_lengths[..., None, None, None])  # (..., 1, 1, Lk)
        if call.kv_starts is not None:  # left padding: hidden, and zeroed above (never read)
            hidden = hidden | (cols < call.kv_starts[..., None, None, None])  # (..., 1, 1, Lk)
        if call.q_lengths is not None:
            hidden = hidden | (rows >= call.q_lengths[..., None, None, None])  # (..., 1, Lq, 1)
        if call.q_segment_ids is not None:
            hidden = hidden | (call.q_segment_ids[..., None, :, None] != call.kv_segment_ids[..., None, None, :])
        s = s.masked_fill(hidden, float("-inf"))  # (..., Hq, Lq, Lk)
        row_max = s.amax(dim=-1, keepdim=True).detach() if Lk else s.new_full(s.shape[:-1] + (1,), float("-inf"))
        sink = None if call.sinks is None else call.sinks.to(s.dtype)[:, None, None]  # (Hq, 1, 1) one per query head
        if sink is not None:  # a virtual key of value 0: in the maximum and the denominator only
            row_max = torch.maximum(row_max, sink.detach())  # (..., Lq, 1)
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        e = torch.exp(s - row_max)  # (..., Lq, Lk) exp(-inf) = 0 on hidden pairs
        total = e.sum(dim=-1, keepdim=True)  # (..., Lq, 1)
        if sink is not None:
            total = total + torch.exp(sink - row_max)  # (..., Lq, 1)
        out = (e / torch.where(total == 0, torch.ones_like(total), total)) @ v  # (..., Lq, Ev)
        if not call.return_lse:
            return out
        lse = torch.where(total > 0, row_max + torch.log(total), torch.full_like(total, float("-inf")))  # (..., Lq, 1)
        return out, lse[..., 0]


def fold(q, k, v, call):
    """(B, N, L, ·) views every fused kernel accepts, and the output's leading dims.

    Leading dims broadcast and fold into (B, N); with grouped heads key/value keep Hkv heads.
    The output comes back with ``y.reshape(*batch, Lq, Ev)``; backends/layout4d.Fold4D does the
    same for any framework, and the (B, L, H, E) layout, masks and lengths too.
    """
    if call.enable_gqa:
        lead = tuple(np.broadcast_shapes(tuple(q.shape[:-3]), tuple(k.shape[:-3]), tuple(v.shape[:-3])))
        batch, kv_batch = lead + (q.shape[-3],), lead + (k.shape[-3],)
    else:
        batch = kv_batch = tuple(np.broadcast_shapes(*(tuple(x.shape[:-2]) for x in (q, k, v))))
    B = math.prod(batch[:-1]) if batch else 1

    def four(x, dims):
        x = x.expand(*dims, *x.shape[-2:])  # (..., L, E) broadcast
        return x.reshape(B, dims[-1] if dims else 1, *x.shape[-2:])  # (B, N, L, E)

    return four(q, batch), four(k, kv_batch), four(v, kv_batch), batch


_fold = fold  # its name before it was public (flex_backends imports it)


class TorchSdpa(TorchBackend):
    """F.scaled_dot_product_attention; `kernel` None = PyTorch's own dispatch."""

    kernel: str | None = None  # an SDPBackend member name, e.g. "FLASH_ATTENTION"
    capabilities = Capabilities(dtypes=_ALL, device="cpu", gradients=True, features=_SDPA_FEATURES,
                                bias_gradient=True, mask_with_causal=False, layouts=LAYOUTS)

    def _attention(self, q, k, v, call):
        Lq, Ev = q.shape[-2], v.shape[-1]
        q, k, v, batch = fold(q, k, v, call)  # (B, N, L, ·)
        attn_mask, is_causal = self._sdpa_mask(call, batch, Lq, k.shape[-2])
        if call.return_lse:
            y, lse = self._with_lse(q, k, v, attn_mask, is_causal, call)  # (B, N, Lq, Ev), (B, N, Lq)
            return y.reshape(*batch, Lq, Ev), lse.reshape(*batch, Lq)
        args = dict(attn_mask=attn_mask, is_causal=is_causal, scale=call.scale, enable_gqa=call.enable_gqa)
        if self.kernel is None:
            y = self.torch.nn.functional.scaled_dot_product_attention(q, k, v, **args)  # (B, N, Lq, Ev)
        else:
            y = self._pinned(q, k, v, args)  # (B, N, Lq, Ev)
        return y.reshape(*batch, Lq, Ev)  # (..., Lq, Ev)

    def _sdpa_mask(self, call, batch, Lq, Lk):
        """(attn_mask, is_causal) as SDPA takes them: one mask (bool, float or CausalBias), never both."""
        torch = self.torch
        mask, bias, is_causal = call.mask, call.bias, call.is_causal
        bottom_right = call.causal_alignment == "bottom_right" and Lq != Lk
        if is_causal and (mask is not None or bias is not None):  # SDPA refuses a mask with is_causal
            tri = torch.ones(Lq, Lk, dtype=torch.bool, device=_device_of(call)).tril(Lk - Lq if bottom_right else 0)
            mask = tri if mask is None else mask & tri  # (..., Lq, Lk)
            is_causal = False
        if bias is not None and mask is not None:
            bias = bias.masked_fill(~mask, float("-inf"))  # (..., Lq, Lk) one float mask
        attn_mask = bias if bias is not None else mask
        if attn_mask is None and is_causal and bottom_right:
            from torch.nn.attention.bias import causal_lower_right

            return causal_lower_right(Lq, Lk), False
        if attn_mask is not None and attn_mask.dim() > 2:  # its leading dims fold like q's
            attn_mask = attn_mask.expand(*batch, Lq, Lk).reshape(-1, batch[-1], Lq, Lk)  # (B, N, Lq, Lk)
        return attn_mask, is_causal

    def _with_lse(self, q, k, v, attn_mask, is_causal, call):
        raise Unsupported(f"{self.name}: PyTorch's SDPA returns no log-sum-exp")

    def _pinned(self, q, k, v, args):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with warnings.catch_warnings(record=True) as caught, sdpa_kernel([getattr(SDPBackend, self.kernel)]):
            warnings.simplefilter("always")
            try:
                return self.torch.nn.functional.scaled_dot_product_attention(q, k, v, **args)
            except RuntimeError as e:
                if "No available kernel" not in str(e) and "No viable backend" not in str(e):
                    raise
                why = [_plain(w.message) for w in caught if "not used because" not in str(w.message)]
                raise Unsupported(f"{self.name}: PyTorch's {self.kernel} kernel refuses this call: "
                                  f"{'; '.join(why) or str(e).splitlines()[0]}") from None


def _device_of(call):
    """The device of the call's mask or bias."""
    for x in (call.mask, call.bias):
        if x is not None:
            return x.device
    return "cpu"


def _plain(message) -> str:
    return str(message).split(" (Triggered internally")[0].strip()


class TorchSdpaCpu(TorchSdpa):
    name = "torch-sdpa-cpu"
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left",
                          notes=("PyTorch's dispatch picks the kernel (CPU, torch 2.13: flash; math when Ev != E "
                                 "or when the bias needs a gradient)",))


class TorchSdpaCpuMath(TorchSdpa):
    name, kernel = "torch-sdpa-cpu-math", "MATH"
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left",
                          notes=("float16/bfloat16 are computed in float32 on CPU",))


class TorchSdpaCpuFlash(TorchSdpa):
    name, kernel = "torch-sdpa-cpu-flash", "FLASH_ATTENTION"
    # no dBias: the CPU flash kernel refuses an attn_mask that requires grad ("No available kernel")
    capabilities = Capabilities(dtypes=_ALL, device="cpu", gradients=True, equal_head_dims=True, layouts=LAYOUTS,
                                features=_SDPA_FEATURES | {"lse"}, mask_with_causal=False)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left",
                          notes=("CPU flash kernel accepts boolean and float masks, grouped KV heads and float64 "
                                 "(checked on torch 2.13)",
                                 "the log-sum-exp comes from aten._scaled_dot_product_flash_attention_for_cpu "
                                 "(float32 for 16-bit inputs; 0, not -inf, on a fully masked row)"))

    def _with_lse(self, q, k, v, attn_mask, is_causal, call):
        torch = self.torch
        from torch.nn.attention.bias import CausalBias

        if isinstance(attn_mask, CausalBias):  # causal_lower_right: the op takes tensors only
            attn_mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(k.shape[-2] - q.shape[-2])
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # the op takes q's dtype, as SDPA converts it
            attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype).masked_fill(~attn_mask, float("-inf"))
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=call.scale)  # (B, N, Lq, Ev), (B, N, Lq)
