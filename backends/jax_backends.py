"""JAX backends: jnp ops (jax-naive) and jax.nn.dot_product_attention (jax-dpa, -cudnn).

jax is imported in ``load``.  float64 needs JAX's x64 mode: it is switched on with
``jax.enable_x64`` around each conversion and call, never globally.  Each backend jits its
forward and its vjp once per static configuration and reuses them; jit itself caches per shape
and dtype, so a benchmark's timed call never retraces.  jax-dpa's static configuration is what
the library takes as Python values (causal, alignment, window, scale, which arrays are given,
whether the LSE is returned); jax-naive, our own jnp, takes every field as an argument (only
grouped heads and the LSE are static), so a run of the suite compiles per shape and dtype only.

jax.nn.dot_product_attention (jax 0.10.2, implementation="xla") takes natively: a bias (added
to the scaled logits), a boolean mask, key/value with fewer heads (grouped: query head n reads
KV head n // (N // K)), ``query_seq_lengths`` / ``key_value_seq_lengths`` (B,) int32,
``local_window_size=(L, R)`` and, with ``return_residual``, the log-sum-exp.  The window maps
exactly: JAX keeps key j for query i when i - L <= j <= i + R (top-left, inclusive), which is
our ``window=(left, right)`` with top_left alignment, L = left, R = right; an unbounded side
(None) becomes max(Lq, Lk), past every key.  The residual is the natural-log LSE of the scaled,
biased, masked logits, computed in float32 and cast to the input dtype, shaped (B, T, N).

Opt-in: ``ATTNSPEC_JAX_CACHE=DIR`` keeps compiled programs across processes (backends/jax_programs.py:
JAX's persistent compilation cache in DIR/xla, whole executables in DIR/programs).  attnspec's own
checkout turns it on for its runs (conftest.py: ~/.cache/attnspec).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import replace

import numpy as np

from attnspec.backends import jax_programs
from attnspec.backends.base import Backend, BackendUnavailable, Capabilities, Deviation, Semantics, Unsupported
from attnspec.specs.fields import EVERY_FEATURE, FIELDS

_ALL = ("float16", "bfloat16", "float32", "float64")
_EVERY_FEATURE = EVERY_FEATURE  # the whole definition (specs.fields)
_ARRAYS = ("mask",) + tuple(f.name for f in FIELDS if f.cast != "value")  # traced, not static (specs.fields)


class JaxBackend(Backend):
    """Conversion, x64 scoping, jit caching and the jax.vjp backward; a subclass defines ``attention``.

    ``attention(q, k, v, call)`` gets jax arrays (..., H, L, E) on ``platform``'s device, in the
    dtype under test, inside ``jax.jit``: the call's arrays (mask, bias, lengths, ...) are traced,
    its other fields (is_causal, scale, window, ...) Python values the program is specialised on.
    It returns the output, or (output, lse) when ``call.return_lse``; the backward is ``jax.vjp``
    of it.  A missing platform is BackendUnavailable (a skip with its reason).  The built-ins
    define ``_attend(q, k, v, arrays, call)`` instead, with the arrays apart.
    """

    platform = "cpu"
    compiles_per_shape = True  # the first call at a new shape or dtype traces and compiles
    capabilities = Capabilities(dtypes=_ALL, device="cpu", gradients=True)

    def load(self):
        try:
            import jax
            import jax.numpy as jnp
        except ImportError as e:
            raise BackendUnavailable(f"jax is not installed ({e})") from None
        self.jax, self.jnp = jax, jnp
        try:
            self.jax_device = jax.devices(self.platform)[0]
        except RuntimeError:
            raise BackendUnavailable(f"no {self.platform.upper()} device for JAX") from None
        if not hasattr(self, "_compiled"):
            self._compiled = {}
            jax_programs.from_environment(jax)

    def attention(self, q, k, v, call):
        raise NotImplementedError(f"{type(self).__name__} defines no attention(q, k, v, call)")

    def _attend(self, q, k, v, arrays, call):
        return self.attention(q, k, v, replace(call, **arrays))

    def _x64(self, wide: bool):
        if not wide:
            return contextlib.nullcontext()
        scoped = getattr(self.jax, "enable_x64", None)  # jax >= 0.8; older: jax.experimental's
        if scoped is None:
            from jax.experimental import enable_x64 as scoped
        return scoped(True)

    def to_native(self, x, dtype):
        # cast by NumPy (ml_dtypes for bfloat16): jnp.asarray(x, dtype) compiles a conversion per
        # shape (74 of 259 compiles in two test modules); the suite's inputs are exact in the dtype
        x = np.asarray(x).astype(self.jnp.dtype(dtype or bool))
        with self._x64(dtype == "float64"):
            return self.jax.device_put(x, self.jax_device)

    def from_native(self, y):
        y = np.asarray(y)
        return y.astype(np.float32) if y.dtype.name == "bfloat16" else y  # exact widening

    def sync(self, y):
        y.block_until_ready()

    def _static(self, call, op):
        """(the call a jitted function is specialised on, its cache key): every field but the arrays."""
        present = tuple(getattr(call, n) is not None for n in _ARRAYS)
        static = replace(call, return_lse=call.return_lse and op == "forward", **dict.fromkeys(_ARRAYS))
        return static, (op, static.is_causal, static.causal_alignment, static.window, static.softcap,
                        static.scale, static.enable_gqa, static.return_lse, present)

    def _jitted(self, op, call, with_dbias=False):
        """(key, the jitted forward or vjp) for this call's static fields; arrays are arguments."""
        static, key = self._static(call, op)
        with_dsink = call.sinks is not None  # dSink (Hq,) last (issue 31)
        key += (with_dbias, with_dsink)
        if key not in self._compiled:
            def forward(q, k, v, arrays):
                return self._attend(q, k, v, arrays, static)  # (..., Lq, Ev) or with (..., Lq)

            def backward(q, k, v, grad_out, arrays):
                names = (("bias",) if with_dbias else ()) + (("sinks",) if with_dsink else ())
                _, pullback = self.jax.vjp(lambda a, b, c, *d: forward(a, b, c, {**arrays, **dict(zip(names, d, strict=True))}),
                                           q, k, v, *(arrays[n] for n in names))
                return pullback(grad_out)  # (dq, dk, dv[, dbias][, dsink]), each shaped like its input

            self._compiled[key] = self.jax.jit(forward if op == "forward" else backward)
        return key, self._compiled[key]

    def _run(self, op, call, args, with_dbias=False):
        """The jitted forward or vjp on args (through a kept program when the suite keeps them)."""
        key, jitted = self._jitted(op, call, with_dbias)
        return jax_programs.call(self, key, jitted, args)

    def _arrays(self, call, q, k, with_dbias=False) -> dict:
        return {n: getattr(call, n) for n in _ARRAYS if getattr(call, n) is not None}

    def native_attention(self, q, k, v, call):
        with self._x64(q.dtype == np.float64):
            return self._run("forward", call, (q, k, v, self._arrays(call, q, k)))

    def native_attention_backward(self, q, k, v, grad_out, call):
        with_dbias = call.bias is not None and self.capabilities.bias_gradient
        with self._x64(q.dtype == np.float64):
            return tuple(self._run("backward", call, (q, k, v, grad_out, self._arrays(call, q, k, with_dbias)),
                                   with_dbias))


class JaxNaive(JaxBackend):
    """The textbook computation in jnp, every field of the problem (ours); masks from indices."""

    name = "jax-naive"
    capabilities = Capabilities(dtypes=_ALL, device="cpu", gradients=True, features=_EVERY_FEATURE | {"sinks"},
                                bias_gradient=True)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros")

    # One jitted program per shape and dtype: every field is an argument (an absent one its identity:
    # no cap, bias 0, slope 0, every key visible), not a constant the program is specialised on.
    # Specialised per field, a run of the suite compiled per draw (causal, window, softcap, scale,
    # which arrays...); the identities are exact, so the results are those of the specialised program.
    # The LSE is always computed (a forward and a forward with its LSE are one program) and grouped
    # heads follow from the shapes: 207 programs in a run of the suite, not 369 (JAX's cache empty).
    def _static(self, call, op):
        static, _ = super()._static(call, op)
        return replace(static, return_lse=op == "forward", enable_gqa=False), (op,)

    def native_attention(self, q, k, v, call):
        out, lse = super().native_attention(q, k, v, call)  # (..., Lq, Ev), (..., Lq)
        return (out, lse) if call.return_lse else out

    _prepared = None  # (call, its shapes, arrays): the last call's arguments, reused (benchmarks repeat one)

    def _arrays(self, call, q, k, with_dbias=False) -> dict:
        """Every field as a device array: the same kind of argument, given or absent (jit compiles
        apart for device-placed and host arguments)."""
        sig = (with_dbias, q.shape, k.shape, q.dtype)
        if self._prepared is not None and self._prepared[0] is call and self._prepared[1] == sig:
            return self._prepared[2]
        arrays = self.jax.device_put(self._host_arrays(call, q, k, with_dbias), self.jax_device)  # one batched put
        self._prepared = (call, sig, arrays)
        return arrays

    def _host_arrays(self, call, q, k, with_dbias) -> dict:
        wide = np.float64 if q.dtype == np.float64 else np.float32  # alibi_slopes' dtype
        batch, Lq, Lk, E = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1]
        lead = batch[:-1]  # lengths and segment ids broadcast over these (not the head axis)
        unlimited = Lq + Lk  # a window side this wide hides no key
        left, right = call.window if call.window is not None else (None, None)
        a = {"mask": np.ones((1, 1), bool), "bias": np.zeros((1, 1), q.dtype),
             "q_lengths": np.full(lead, Lq, np.int32), "kv_lengths": np.full(lead, Lk, np.int32),
             "q_segment_ids": np.zeros(lead + (Lq,), np.int32), "kv_segment_ids": np.zeros(lead + (Lk,), np.int32),
             "alibi_slopes": np.zeros(q.shape[-3:-2], wide),  # (Hq,), or () without a head axis
             "sinks": np.full(q.shape[-3:-2], -np.inf, wide),  # no sink: exp(-inf - m) = 0 exactly
             "scale": np.asarray(1.0 / math.sqrt(E) if call.scale is None else call.scale, q.dtype),
             "capped": np.asarray(call.softcap is not None),
             "cap": np.asarray(1.0 if call.softcap is None else call.softcap, q.dtype),
             "causal": np.asarray(call.is_causal),
             "offset": np.asarray(Lk - Lq if call.causal_alignment == "bottom_right" else 0, np.int32),
             "left": np.asarray(unlimited if left is None else left, np.int32),
             "right": np.asarray(unlimited if right is None else right, np.int32)}
        given = super()._arrays(call, q, k, with_dbias)
        given = {name: np.asarray(x) for name, x in given.items()}
        a.update(given)
        if math.prod(q.shape[:-1]) * Lk <= self.CANONICAL_MAX_SCORES:
            # mask and bias at the scores' shape, given or not: one program whatever shape they were
            # given in (5 bias and 4 mask shapes are drawn), or none; not for dbias (the given shape)
            scores = q.shape[:-2] + (Lq, Lk)
            for name in ("mask",) + (() if with_dbias else ("bias",)):
                x = a[name]
                a[name] = np.ascontiguousarray(np.broadcast_to(x, np.broadcast_shapes(x.shape, scores)))
        return a

    CANONICAL_MAX_SCORES = 1 << 16  # B * H * Lq * Lk up to which masks and biases are broadcast

    def _attend(self, q, k, v, a, call):
        jnp, lax = self.jnp, self.jax.lax
        Lq, Lk = q.shape[-2], k.shape[-2]

        def at_rank(x, tail=()):  # lengths (...,) or segment ids (..., ·): 1-axes after the leading
            lead = x.shape[:x.ndim - len(tail)]  # axes, to the scores' rank (none without a head axis)
            return x.reshape(lead + (1,) * (q.ndim - len(lead) - len(tail)) + tail)

        q_len, kv_len = at_rank(a["q_lengths"]), at_rank(a["kv_lengths"])  # (..., 1, 1, 1)
        q_seg = at_rank(a["q_segment_ids"][..., :, None], (Lq, 1))  # (..., 1, Lq, 1)
        kv_seg = at_rank(a["kv_segment_ids"][..., None, :], (1, Lk))  # (..., 1, 1, Lk)
        # padding is never read: 0 * NaN there would reach the output
        padded = jnp.arange(Lk)[:, None] >= kv_len  # (..., 1, Lk, 1)
        k, v = (jnp.where(padded, jnp.zeros((), x.dtype), x) for x in (k, v))  # (..., Hkv, Lk, ·)
        if q.ndim >= 3 and k.shape[-3] != q.shape[-3]:  # grouped (validated): query head h reads KV head h // group
            k, v = (jnp.repeat(x, q.shape[-3] // x.shape[-3], axis=-3) for x in (k, v))  # (..., Hq, Lk, ·)
        s = (q @ jnp.swapaxes(k, -1, -2)) * a["scale"]  # (..., Lq, Lk)
        s = jnp.where(a["capped"], jnp.tanh(s / a["cap"]) * a["cap"], s)
        s = s + a["bias"]  # (..., Hq, Lq, Lk)
        rows, cols = jnp.arange(Lq)[:, None], jnp.arange(Lk)[None, :]  # (Lq, 1), (1, Lk)
        diag = rows + a["offset"]  # (Lq, 1) query i's diagonal
        wide = jnp.promote_types(s.dtype, jnp.float32)  # distances exact, one rounding to s's dtype
        dist = jnp.abs(diag - cols).astype(wide)  # (Lq, Lk)
        s = s - (a["alibi_slopes"].astype(wide)[..., None, None] * dist).astype(s.dtype)  # (..., Hq, Lq, Lk)
        vis = (cols <= diag) | ~a["causal"]  # (Lq, Lk)
        vis = vis & (cols <= diag + a["right"]) & (cols >= diag - a["left"])
        vis = vis & a["mask"]  # (..., Lq, Lk)
        vis = vis & (cols < kv_len) & (rows < q_len) & (q_seg == kv_seg)  # (..., Hq|1, Lq, Lk)
        s = jnp.where(vis, s, -jnp.inf)  # (..., Hq, Lq, Lk)
        sink = a["sinks"].astype(s.dtype)[..., None, None]  # (Hq, 1, 1): a virtual key of value 0
        row_max = lax.stop_gradient(jnp.maximum(s.max(axis=-1, keepdims=True, initial=-jnp.inf), sink))  # (..., Lq, 1)
        row_max = jnp.where(jnp.isfinite(row_max), row_max, 0)
        e = jnp.exp(s - row_max)  # (..., Lq, Lk) exp(-inf) = 0 on hidden pairs
        total = e.sum(axis=-1, keepdims=True) + jnp.exp(sink - row_max)  # (..., Lq, 1) the sink in the denominator
        out = (e / jnp.where(total == 0, 1, total)) @ v  # (..., Lq, Ev)
        if not call.return_lse:
            return out
        lse = jnp.where(total > 0, row_max + jnp.log(jnp.where(total > 0, total, 1)), -jnp.inf)  # (..., Lq, 1)
        return out, lse[..., 0]


class JaxDpa(JaxBackend):
    """jax.nn.dot_product_attention(implementation='xla'); layout (B, T, N, H) in the adapter."""

    name = "jax-dpa"
    implementation = "xla"
    # float16 on CPU: XLA:CPU has no float16 dot with float32 accumulation (jax 0.10.2 raises
    # "precision 'F16_F16_F32' is not supported by dot_general on CPU")
    capabilities = Capabilities(dtypes=("bfloat16", "float32", "float64"), device="cpu", gradients=True,
                                equal_head_dims=True, features=frozenset(("gqa", "bias", "window", "seq_lengths",
                                                                          "lse")), bias_gradient=True)
    semantics = Semantics(
        fully_masked="mean_of_values", causal_alignment="top_left", effective_precision="float32",
        padded_rows="zeros",
        notes=("softmax runs in float32 even for float64 input (jax _dot_product_attention_core): "
               "float64 results are float32-accurate",
               "masks with a large finite negative, so an all-masked row averages the values",
               "rows past query_seq_lengths are zeroed (the output is multiplied by the padding mask)",
               "local_window_size=(L, R) is top-left: window=(left, right) maps to L=left, R=right",
               "no float16 on CPU (XLA:CPU lacks the float16 dot it asks for)",
               "bfloat16 with Lq = Lk = 1 on CPU: XLA:CPU fails to compile it "
               "(ALG_DOT_BF16_BF16_F32 not supported by the ElementalIrEmitter): declared unsupported"),
        deviations=(Deviation("nan_in_padding_changes_nothing",
                              "key_value_seq_lengths hides padded keys from the softmax but the weights "
                              "(exact zeros) still multiply the padded values: NaN there gives 0 * NaN = NaN "
                              "rows (jax 0.10.2, implementation='xla')"),))

    def native_attention(self, q, k, v, call):
        with self._refusals(q, k):
            return super().native_attention(q, k, v, call)

    def native_attention_backward(self, q, k, v, grad_out, call):
        with self._refusals(q, k):
            return super().native_attention_backward(q, k, v, grad_out, call)

    @contextlib.contextmanager
    def _refusals(self, q, k):
        """What the library does not take is Unsupported, with its reason."""
        # jax 0.10.2, XLA:CPU: a 1x1 bfloat16 score matrix lowers to an elemental dot that
        # cannot accumulate in float32 and the compile fails; other shapes run.
        if self.platform == "cpu" and str(q.dtype) == "bfloat16" and q.shape[-2] == k.shape[-2] == 1:
            raise Unsupported(f"{self.name}: XLA:CPU cannot compile a bfloat16 call with Lq = Lk = 1 "
                              "(ALG_DOT_BF16_BF16_F32 not supported by the ElementalIrEmitter)")
        try:
            yield
        except NotImplementedError as e:  # JAX's "this implementation does not take that" (cuDNN's checks)
            raise Unsupported(f"{self.name}: jax.nn.dot_product_attention refuses this call: {e}") from None

    def _arrays(self, call, q, k, with_dbias=False) -> dict:
        """The mask and bias broadcast to the scores' shape on the host, as `_attend` broadcasts them
        before the library sees them: one program whatever shape they were drawn in (a bias drawn
        in 4 shapes was 4 programs).  dBias needs the given shape: that bias stays as it is."""
        arrays = super()._arrays(call, q, k, with_dbias)
        scores = q.shape[:-2] + (q.shape[-2], k.shape[-2])  # (..., Hq, Lq, Lk)
        for name in ("mask",) + (() if with_dbias else ("bias",)):
            x = arrays.get(name)
            full = None if x is None else np.broadcast_shapes(x.shape, scores)
            if full is not None and full != tuple(x.shape):
                arrays[name] = self.jax.device_put(np.ascontiguousarray(np.broadcast_to(np.asarray(x), full)),
                                                   self.jax_device)  # (..., Hq, Lq, Lk)
        return arrays

    def _window(self, call, Lq, Lk):
        """local_window_size for our top-left window; None (unbounded) reaches past every key."""
        if call.window is None:
            return None
        return tuple(max(Lq, Lk) if w is None else w for w in call.window)

    def _attend(self, q, k, v, a, call):
        jnp = self.jnp
        Lq, Lk = q.shape[-2], k.shape[-2]
        if call.enable_gqa:
            lead = jnp.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
            batch, kv_batch = lead + q.shape[-3:-2], lead + k.shape[-3:-2]
        else:
            batch = kv_batch = jnp.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        B = math.prod(batch[:-1]) if batch else 1

        def bthn(x, dims):
            x = jnp.broadcast_to(x, dims + x.shape[-2:]).reshape((B, dims[-1] if dims else 1) + x.shape[-2:])
            return jnp.swapaxes(x, 1, 2)  # (B, L, N, H)

        def bnts(x):  # a mask or bias: (..., Lq, Lk) -> (B, N, Lq, Lk)
            return None if x is None else jnp.broadcast_to(x, batch + (Lq, Lk)).reshape((B, -1, Lq, Lk))

        def per_batch(x):  # lengths broadcast over the leading dims before the head axis: (B,)
            return None if x is None else jnp.broadcast_to(x, batch[:-1]).reshape((B,)).astype(jnp.int32)

        y = self.jax.nn.dot_product_attention(
            bthn(q, batch), bthn(k, kv_batch), bthn(v, kv_batch), bias=bnts(a.get("bias")), mask=bnts(a.get("mask")),
            scale=call.scale, is_causal=call.is_causal, query_seq_lengths=per_batch(a.get("q_lengths")),
            key_value_seq_lengths=per_batch(a.get("kv_lengths")), local_window_size=self._window(call, Lq, Lk),
            implementation=self.implementation, return_residual=call.return_lse)  # (B, Lq, N, Ev), lse (B, Lq, N)
        out, lse = y if call.return_lse else (y, None)
        out = jnp.swapaxes(out, 1, 2).reshape(batch + (Lq, v.shape[-1]))  # (..., Lq, Ev)
        if lse is None:
            return out
        return out, jnp.swapaxes(lse, 1, 2).reshape(batch + (Lq,))  # (..., Lq)


class JaxDpaCudnn(JaxDpa):
    name, implementation, platform = "jax-dpa-cudnn", "cudnn", "gpu"
    # head dims: jax 0.11.2 on an H200 raises "The head dim must be <= 256 and a multiple of 8"
    capabilities = Capabilities(dtypes=("float16", "bfloat16"), device="gpu", gradients=True, equal_head_dims=True,
                                head_dim_multiple=8, max_head_dim=256,
                                features=frozenset(("gqa", "bias", "seq_lengths", "lse")))
    semantics = Semantics(fully_masked=None, causal_alignment="top_left",
                          notes=("cuDNN fused attention (jax.nn.dot_product_attention(implementation='cudnn')); "
                                 "run on an NVIDIA H200 with jax 0.11.2 (tools/gpu_check.sh)",
                                 "a call cuDNN's checks refuse (JAX raises NotImplementedError) is Unsupported, "
                                 "with JAX's reason"),
                          deviations=(Deviation("nan_in_padding_changes_nothing",
                                                "NaN in a padded key or value reaches every row (jax 0.11.2, H200, "
                                                "implementation='cudnn': B=1 Hq=4 Hkv=2 Lq=3 Lk=8 E=8, "
                                                "kv_lengths=[7]); jax-dpa's XLA path does the same"),))
