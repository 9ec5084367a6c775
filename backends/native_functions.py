"""Plain functions over a framework's own tensors: torch (autograd) and JAX (jax.vjp).

``declare(framework="torch", device="cuda", layout="BLHE", dtypes=...)`` on a function with
PyTorch's signature makes it one of these: it receives torch tensors (or jax arrays) on its
device, in the dtype under test (bfloat16 and float16 natively), rank 4 in the declared layout
(backends/layout4d.LAYOUTS_4D); a mask or bias comes as one ``attn_mask`` (B, H, Lq, Lk) as for a
NumPy function, lengths (B,), segment ids (B, L), ALiBi slopes (H,).  It returns the output in
its layout, or ``(output, lse)`` when it has ``return_lse`` (the LSE laid out and padded as
declared: ``lse_layout``, ``lse_padding``).  Its backward is the framework's: torch autograd
through the call (an ``nn.Module`` or a function calling an ``autograd.Function`` works the
same), ``jax.vjp`` of the jitted call.  A missing framework or device is `BackendUnavailable`
(a skip with its reason), never a run on another device.

The classes are `TorchBackend` / `JaxBackend` subclasses: a backend that needs more (its own
conversion, a kernel option) subclasses those directly (README: "Plugging yours in").  Packed
and paged call formats (cu_seqlens, block tables) are call formats of their own, declared
beside the layout, not layouts.  Importing this module loads no framework.
"""
from __future__ import annotations

from attnspec.backends.jax_backends import JaxBackend
from attnspec.backends.layout4d import Fold4D
from attnspec.backends.plain import declared, renamed
from attnspec.backends.torch_backends import TorchBackend
from attnspec.specs.fields import FIELDS

_PER_SEQUENCE = {"q_lengths": False, "kv_lengths": False, "q_segment_ids": True, "kv_segment_ids": True}
_JAX_PLATFORMS = {"cpu": "cpu", "gpu": "gpu", "tpu": "tpu"}


class NativeFunction:
    """What the torch and JAX function backends share: the declaration, and the call in its layout."""

    def _declare(self, fn, name, decl):
        self.fn, self.name, self.declaration = fn, name, decl
        self.env_vars = decl.env
        self.capabilities, self.semantics = declared(
            fn, decl, decl.backward is not False, f"a {decl.framework} function ({decl.layout}, {decl.device})")

    def _ops(self):
        """(broadcast_to, swap, where) in the framework's own ops."""
        raise NotImplementedError

    def call_function(self, q, k, v, call):
        """The function on (..., H, L, E) tensors: folded to its layout, its result unfolded."""
        broadcast_to, swap, where = self._ops()
        decl = self.declaration
        fold = Fold4D(q, k, v, call, broadcast_to, swap, decl.layout)
        attn_mask = None if call.mask is None else fold.scores(call.mask)
        if call.bias is not None:  # PyTorch's signature takes one mask: a float one when there is a bias
            bias = fold.scores(call.bias)
            attn_mask = bias if attn_mask is None else where(attn_mask, bias, float("-inf"))
        kw = dict(attn_mask=attn_mask, is_causal=call.is_causal, scale=call.scale)
        for f in FIELDS:  # the fields it declares through its parameters, when the problem uses them
            value = getattr(call, f.name)
            if f.name == "bias" or f.feature not in self.capabilities.features or value is None or (
                    not hasattr(value, "shape") and value == f.off):
                continue
            if f.name in _PER_SEQUENCE:
                value = fold.per_sequence(value, _PER_SEQUENCE[f.name])
            elif f.name in ("alibi_slopes", "sinks"):  # one per query head
                value = fold.slopes(value)
            kw[f.name] = value
        if call.return_lse:
            kw["return_lse"] = True
        y = self.fn(*fold.qkv(q, k, v), **renamed(self.fn, kw))
        if not call.return_lse:
            return fold.output(y)
        if not isinstance(y, (tuple, list)) or len(y) != 2:
            raise ValueError(f"asked for return_lse, it returned {type(y).__name__}, expected (output, lse)")
        return fold.output(y[0]), fold.lse(y[1], decl.lse_layout, decl.lse_padding)


class TorchFunction(NativeFunction, TorchBackend):
    """A function over torch tensors on its device; gradients by autograd through the call."""

    def __init__(self, fn, name, decl):
        self._declare(fn, name, decl)
        self.device = decl.device

    def _ops(self):
        return (lambda x, shape: x.expand(*shape), lambda x, a, b: x.transpose(a, b),
                lambda m, x, fill: x.masked_fill(~m, fill))

    def attention(self, q, k, v, call):
        return self.call_function(q, k, v, call)


class JaxFunction(NativeFunction, JaxBackend):
    """A function over jax arrays on its device, jitted; gradients by jax.vjp of the jitted call."""

    def __init__(self, fn, name, decl):
        self._declare(fn, name, decl)
        self.platform = _JAX_PLATFORMS[decl.device]

    def _ops(self):
        jnp = self.jnp
        return jnp.broadcast_to, jnp.swapaxes, lambda m, x, fill: jnp.where(m, x, fill)

    def attention(self, q, k, v, call):
        return self.call_function(q, k, v, call)

    def _run(self, op, call, args, with_dbias=False):
        # plain jit: programs kept across processes are keyed by an adapter's source, not a user's function
        _, jitted = self._jitted(op, call, with_dbias)
        return jitted(*args)


def for_framework(framework: str):
    return {"torch": TorchFunction, "jax": JaxFunction}[framework]


__all__ = ["JaxFunction", "NativeFunction", "TorchFunction", "for_framework"]
