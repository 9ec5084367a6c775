"""Plain functions with flash-attention's signatures, called that way (issue 30).

A function whose parameters use flash-attention's names is a backend of its own call format, fed
in flash-attention's layouts - NumPy arrays, or torch tensors on the declared device with
``declare(framework="torch", device=...)`` (a Triton or CUDA varlen kernel; the real
``flash_attn.flash_attn_varlen_func`` declared so):

- ``flash_attn_func(q, k, v, ..., softmax_scale, causal, ...)`` (no lengths, no cache): the padded call
  in flash-attention's layout - q ``(B, Lq, Hq, E)``, k/v ``(B, Lk, Hkv, E)``, out ``(B, Lq, Hq, Ev)``;
- ``flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)``:
  the ``packed`` format - q ``(total_q, Hq, E)``, k/v ``(total_k, Hkv, E)``, ``cu_seqlens_*`` int32;
- ``flash_attn_with_kvcache(q, k_cache, v_cache, ..., cache_seqlens, cache_leftpad, block_table, ...)``:
  the ``paged-NHD`` format - q ``(B, Lq, Hq, E)``, caches ``(num_pages, page_size, Hkv, E)``;
  with FlashInfer's one K/V tensor instead, ``fn(q, paged_kv_cache, ..., cache_seqlens, block_table,
  ...)``: the ``paged-stacked-NHD`` format - ``paged_kv_cache (num_pages, 2, page_size, Hkv, E)``,
  index 0 of axis 1 the keys, 1 the values (so Ev == E).

Keywords passed when the problem uses them and the signature has them: ``softmax_scale``,
``causal``, ``window_size=(left, right)`` (-1 unbounded), ``softcap``, ``alibi_slopes`` (Hq,),
``seqused_k``, ``cache_leftpad``, the sinks (``learnable_sink``, ``s_aux`` or ``sinks``: ``(Hq,)``),
``return_softmax_lse`` or flash-attention 2's ``return_attn_probs`` (then ``(out, lse[, ...])``, lse
``(Hq, total_q)`` varlen, ``(B, Hq, Lq)`` padded and kvcache; a function that returns its LSE unasked,
as FA3's, has it dropped); fp8 inputs' ``q_descale``, ``k_descale``, ``v_descale`` (FA3's names;
FlashInfer's and vLLM's ``k_scale``, ``v_scale`` alike) as ``(B, Hkv)`` float32, row b sequence b's
(one per tensor as it is).  Both align causal, window and ALiBi bottom-right per sequence, as
flash-attention does; a problem that needs another alignment, or padded query rows in a kvcache
call (it has no query lengths), is declined with the reason.  Forward only over NumPy; over torch,
a padded or varlen function's backward is autograd through its call (the gradient families run a varlen
one packed).
"""
from __future__ import annotations

import inspect
from dataclasses import replace

import numpy as np

from attnspec.backends.base import Backend, Unsupported
from attnspec.backends.plain import FunctionBackend, _full_descale, numpy_arrays_hint, renamed
from attnspec.backends.torch_backends import TorchBackend

PADDED = ("q", "k", "v", "softmax_scale", "causal")  # flash_attn_func: flash-attention's names, no lengths
VARLEN = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")
KVCACHE = ("k_cache", "v_cache", "cache_seqlens")
STACKED = ("paged_kv_cache", "cache_seqlens")  # the kvcache form over FlashInfer's one K/V tensor
# parameter -> the feature it takes (beyond what the format itself carries)
_OPTIONAL = {"window_size": "window", "softcap": "softcap", "alibi_slopes": "alibi", "return_softmax_lse": "lse",
             "return_attn_probs": "lse",
             "q_descale": "descale", "k_descale": "descale", "v_descale": "descale", "k_scale": "descale",
             "v_scale": "descale", "sinks": "sinks", "learnable_sink": "sinks", "s_aux": "sinks"}
DESCALES = ("q_descale", "k_descale", "v_descale")


def _names(fn) -> set:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def flash_form(fn) -> str:
    """"varlen", "kvcache", "padded" or "" (not a flash-attention signature)."""
    names = _names(fn)
    if set(VARLEN) <= names:
        return "varlen"
    if set(KVCACHE) <= names or set(STACKED) <= names:
        return "kvcache"
    if set(PADDED) <= names:
        return "padded"
    return ""


class FlashFunctionBackend(Backend):
    """A plain function with flash-attention's padded, varlen or kvcache signature over NumPy arrays."""

    def __init__(self, fn, name: str):
        from attnspec.backends.plain import Declaration, declared
        self.fn, self.name, self.form = fn, name, flash_form(fn)
        self.params = _names(fn)
        decl = getattr(fn, "__attnspec__", None) or Declaration()
        self.declaration = decl
        self.env_vars = decl.env
        caps, sem = declared(fn, decl, False, f"a plain function with flash-attention's {self.form} signature")
        serving = {"seq_lengths", "seq_positions"} if self.form != "padded" else set()  # flash_attn_func: no lengths
        features = {"gqa"} | serving | {f for p, f in _OPTIONAL.items() if p in self.params}
        if decl.features is not None:
            features = set(decl.features)
        self.stacked = "paged_kv_cache" in self.params  # one (num_pages, 2, P, Hkv, E) tensor: Ev == E
        paged = "paged-stacked-NHD" if self.stacked else "paged-NHD"
        fmt = {"varlen": ("packed",), "padded": ("padded",)}.get(
            self.form, (paged,) + (("append",) if {"k", "v"} <= self.params else ()))
        # its q, k, v (total, H, E) may be a fused projection's head slices, as models hand them
        self.capabilities = replace(caps, features=frozenset(features), formats=fmt, masks=False,
                                    mask_with_causal=True, equal_head_dims=caps.equal_head_dims or self.stacked,
                                    layouts=tuple(dict.fromkeys(caps.layouts + ("head_slice",))))
        self.semantics = replace(sem, causal_alignment="bottom_right")  # per sequence, flash-attention's

    def raise_hint(self, error: Exception) -> str:
        return numpy_arrays_hint(self.fn, error)  # flash-attn's own functions take torch tensors only

    def native_dtype(self, y):
        return str(np.asarray(y).dtype)

    to_native, from_native = FunctionBackend.to_native, FunctionBackend.from_native  # fp8: ml_dtypes' arrays

    def _host(self, x):
        """An int argument or a length as NumPy (a native one fetched from its device)."""
        return None if x is None else np.asarray(x)

    def _swap(self, x, a: int, b: int):
        return np.ascontiguousarray(np.swapaxes(x, a, b))

    def _slopes(self, x):
        return x

    def _options(self, call) -> dict:
        kw = {"softmax_scale": call.scale, "causal": bool(call.is_causal)}
        if call.window is not None:
            kw["window_size"] = tuple(-1 if w is None else int(w) for w in call.window)
        if call.softcap is not None:
            kw["softcap"] = float(call.softcap)
        if call.alibi_slopes is not None:
            kw["alibi_slopes"] = self._slopes(call.alibi_slopes)
        if call.return_lse:  # FA3's and vLLM's name, or flash-attention 2's
            kw["return_attn_probs" if "return_attn_probs" in self.params - {"return_softmax_lse"}
               else "return_softmax_lse"] = True
        if call.sinks is not None:  # (Hq,) float32, under the name fn uses (FA4's learnable_sink, vLLM's s_aux)
            kw["sinks"] = call.sinks
        kw = renamed(self.fn, kw)
        missing = sorted(set(kw) - self.params - {"softmax_scale", "causal"})
        if missing:
            raise Unsupported(f"{self.name} has no parameter {', '.join(missing)}")
        return {n: x for n, x in kw.items() if n in self.params}

    def _descales(self, call, B: int, Hkv: int) -> dict:
        """The call's descales as FA3 takes them, (B, Hkv) float32, under the names fn uses (plain.ALIASES)."""
        # already native and float32 (specs.fields casts descales "wide"): broadcast only, as a plain function's
        kw = {n: _full_descale(getattr(call, n), (B, Hkv)) for n in DESCALES if getattr(call, n) is not None}
        kw = renamed(self.fn, kw)
        missing = sorted(set(kw) - self.params)
        if missing:
            raise Unsupported(f"{self.name} has no parameter {', '.join(missing)}")
        return kw

    def _aligned(self, call, q_lens, kv_lens) -> None:
        """Decline a problem whose alignment is not flash-attention's bottom-right per sequence."""
        diagonal = call.is_causal or call.window is not None or call.alibi_slopes is not None
        if diagonal and call.causal_alignment != "bottom_right" and (np.asarray(q_lens) != np.asarray(kv_lens)).any():
            raise Unsupported(f"{self.name} aligns causal, window and ALiBi bottom-right per sequence "
                              f"(asked: {call.causal_alignment})")

    def native_packed(self, q, k, v, args, call):
        cu_q, cu_k = self._host(args.cu_seqlens_q), self._host(args.cu_seqlens_k)
        used = np.diff(cu_k) if args.seqused_k is None else self._host(args.seqused_k)
        self._aligned(call, np.diff(cu_q), used)
        kw = dict(cu_seqlens_q=args.cu_seqlens_q, cu_seqlens_k=args.cu_seqlens_k, max_seqlen_q=args.max_seqlen_q,
                  max_seqlen_k=args.max_seqlen_k, **self._options(call), **self._descales(call, len(cu_q) - 1, k.shape[1]))
        if args.seqused_k is not None:
            if "seqused_k" not in self.params:
                raise Unsupported(f"{self.name} has no parameter seqused_k")
            kw["seqused_k"] = args.seqused_k
        return self._result(self.fn(q, k, v, **kw), call)  # (total_q, Hq, Ev), or (out, lse (Hq, total_q))

    def _result(self, y, call):
        """out, or (out, lse) when asked: flash-attention 2 returns (out, lse, S_dmask), FA3 (out, lse) unasked."""
        if isinstance(y, (tuple, list)):
            return (y[0], y[1]) if call.return_lse else y[0]
        return y

    def native_attention(self, q, k, v, call):
        """flash_attn_func: q (B, Lq, Hq, E), k/v (B, Lk, Hkv, E|Ev) -> (B, Hq, Lq, Ev)[, lse (B, Hq, Lq)]."""
        if self.form != "padded":
            raise Unsupported(f"{self.name} takes its own format's call ({self.form}), not a padded one")
        self._aligned(call, [q.shape[-2]], [k.shape[-2]])
        kw = {**self._options(call), **self._descales(call, q.shape[0], k.shape[-3])}
        y = self._result(self.fn(*(self._swap(x, 1, 2) for x in (q, k, v)), **kw), call)
        if call.return_lse:
            return self._swap(y[0], 1, 2), y[1]  # (B, Hq, Lq, Ev), (B, Hq, Lq)
        return self._swap(y, 1, 2)  # (B, Lq, Hq, Ev) -> (B, Hq, Lq, Ev)

    _new_keys: dict = {}  # k=, v= of an append, for the one call (native_paged_append)

    def native_paged_append(self, q, k_cache, v_cache, k_new, v_new, args, call):
        """flash_attn_with_kvcache(k=, v=): the new keys (B, n, Hkv, D) appended in place, then attention."""
        self._new_keys = {"k": k_new, "v": v_new}
        try:
            return self.native_paged(q, k_cache, v_cache, args, call)
        finally:
            self._new_keys = {}

    def native_paged(self, q, k_cache, v_cache, args, call):
        B, Lq = q.shape[0], q.shape[2]
        lens = self._host(args.cache_seqlens)
        pads = np.zeros_like(lens) if args.cache_leftpad is None else self._host(args.cache_leftpad)
        if call.q_lengths is not None and (self._host(call.q_lengths) < Lq).any():
            raise Unsupported(f"{self.name} takes every query row as real (flash_attn_with_kvcache has no query "
                              "lengths): padded query rows are not its problem")
        self._aligned(call, np.full(B, Lq), lens - pads + (self._new_keys["k"].shape[1] if self._new_keys else 0))
        Hkv = k_cache.shape[3 if self.stacked else 2]  # (pages, [2,] P, Hkv, E)
        kw = dict(cache_seqlens=args.cache_seqlens, block_table=args.block_table, **self._options(call),
                  **self._descales(call, B, Hkv))
        if args.cache_leftpad is not None:
            if "cache_leftpad" not in self.params:
                raise Unsupported(f"{self.name} has no parameter cache_leftpad")
            kw["cache_leftpad"] = args.cache_leftpad
        kw.update(self._new_keys)
        if self.stacked:  # k_cache is the one tensor (serving.py), v_cache None
            y = self.fn(self._swap(q, 1, 2), paged_kv_cache=k_cache, **kw)  # q (B, Lq, Hq, E)
        else:
            y = self.fn(self._swap(q, 1, 2), k_cache, v_cache, **kw)
        y = self._result(y, call)
        if call.return_lse:
            return self._swap(y[0], 1, 2), y[1]  # (B, Hq, Lq, Ev), (B, Hq, Lq)
        return self._swap(y, 1, 2)  # (B, Lq, Hq, Ev) -> (B, Hq, Lq, Ev)


class TorchFlashFunction(FlashFunctionBackend):
    """flash-attention's padded, varlen or kvcache signature over torch tensors on the declared device, in
    the dtype under test (bfloat16 natively); the int arguments int32 tensors on that device, as
    flash-attention takes them.  The forward under no_grad; a padded or varlen function's backward through
    autograd (``backward=False`` in its declaration: none).  No torch, or no GPU for a CUDA
    function: BackendUnavailable (a skip with its reason)."""

    def __init__(self, fn, name: str):
        super().__init__(fn, name)
        self.device = self.declaration.device
        # padded, varlen: the backward is autograd through the call (flash-attention's is an autograd.Function)
        self.capabilities = replace(self.capabilities, gradients=self.form in ("varlen", "padded")
                                    and self.declaration.backward is not False)

    load, to_native, from_native, sync, relayout = (TorchBackend.load, TorchBackend.to_native, TorchBackend.from_native,
                                                    TorchBackend.sync, TorchBackend.relayout)  # torch-math's (torch
    # is imported by load, not here)

    def native_dtype(self, y) -> str:
        return str(y.dtype).removeprefix("torch.")

    def _host(self, x):
        return None if x is None else (x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x))

    def _swap(self, x, a: int, b: int):
        return x.transpose(a, b).contiguous()

    def _slopes(self, x):
        return x if hasattr(x, "detach") else self.to_native(np.asarray(x, dtype=np.float32), "float32")

    def native_packed(self, q, k, v, args, call):
        with self.torch.no_grad():
            return super().native_packed(q, k, v, args, call)

    def native_attention(self, q, k, v, call):
        with self.torch.no_grad():
            return super().native_attention(q, k, v, call)

    def native_attention_backward(self, q, k, v, grad_out, call):
        """(dq, dk, dv) of flash_attn_func: autograd through the function's own call."""
        call = replace(call, return_lse=False)
        return self._autograd(lambda *x: FlashFunctionBackend.native_attention(self, *x, call), (q, k, v), grad_out)

    def native_packed_backward(self, q, k, v, grad_out, args, call):
        """(dq, dk, dv) packed: autograd through the function's own call."""
        call = replace(call, return_lse=False)
        return self._autograd(lambda *x: FlashFunctionBackend.native_packed(self, *x, args, call), (q, k, v),
                              grad_out)

    def _autograd(self, forward, inputs, grad_out):
        leaves = [x.detach().requires_grad_(True) for x in inputs]
        out = forward(*leaves)
        # an output that depends on no input (no sequence has a query: a zeros buffer) or on only some of them
        # has zero gradients there, not an autograd error; a wrong zero elsewhere is judged against the reference
        grads = (self.torch.autograd.grad(out, leaves, grad_out, allow_unused=True) if out.requires_grad
                 else (None,) * 3)
        return tuple(self.torch.zeros_like(x) if g is None else g  # each shaped as its input
                     for x, g in zip(leaves, grads, strict=True))

    def native_paged(self, q, k_cache, v_cache, args, call):
        with self.torch.no_grad():
            return super().native_paged(q, k_cache, v_cache, args, call)


def for_framework(framework: str):
    """The backend class of a flash-attention-signature function over `framework`'s tensors."""
    if framework == "numpy":
        return FlashFunctionBackend
    if framework == "torch":
        return TorchFlashFunction
    raise ValueError(f"a function with flash-attention's signature takes NumPy arrays or torch tensors "
                     f"(declare(framework='torch')); got framework {framework!r}")
