"""A small fused attention in Triton, forward and backward, plugged into the suite as a backend.

The forward is FlashAttention's: one program per block of BLOCK queries of one (batch, head),
an online softmax over key blocks (running max m, running sum l, the accumulator rescaled by
exp(m_old - m_new)), P rounded to the input dtype before P V, everything else in float32, and
the row's log-sum-exp kept for the backward.  The backward recomputes P = exp(S - lse) block by
block: one kernel per key block accumulates dV = P^T dO and dK = scale dS^T Q, another per
query block dQ = scale dS K, with dS = P (dO V^T - D), D = rowsum(dO * O).  Causal masks are
top-left, boolean masks are read per block; a row that sees no key is zeros (the -inf guard:
a block where a row's running max is still -inf shifts by 0, and its lse is +inf so the
backward's P is 0).  Head dims of any size (padded to a power of two, at least 16), any Lq, Lk.

Run the suite on it (from the repository root):

    TRITON_INTERPRET=1 pytest properties --backend docs.examples.triton_attention:TritonAttention   # CPU
    pytest properties --backend docs.examples.triton_attention:TritonAttention                      # CUDA

On CPU Triton's interpreter runs the kernels with NumPy: float16 and float32 only, since its
tl.dot multiplies bfloat16 bit patterns as integers (Triton 3.9: results ~1e8 off).  On CUDA it
runs float16, bfloat16 and float32.  The adapter is a `backends.torch_backends.TorchBackend`
subclass: torch tensors in, the backward through autograd (the Function below).
"""
from __future__ import annotations

import os

from attnspec.backends.base import BackendUnavailable, Capabilities, Semantics
from attnspec.backends.torch_backends import TorchBackend

try:  # triton and torch are optional: the backend reports them missing when it loads
    import torch
    import triton
    import triton.language as tl
except ImportError as e:  # noqa: F841 - kept for the message
    _MISSING = f"triton is not installed ({e}; pip install 'attnspec[triton]')"
else:
    _MISSING = None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


if _MISSING is None:
    @triton.jit
    def _scores(q, k_ptrs, m_ptrs, rows, cols, Lq, Lk, scale, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
                k_ok):
        """(scale q k^T with hidden pairs at -inf, which pairs are seen) for one block of queries and keys."""
        k = tl.load(k_ptrs, mask=k_ok, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (BLOCK, BLOCK) float32
        seen = (rows[:, None] < Lq) & (cols[None, :] < Lk)
        if CAUSAL:
            seen = seen & (cols[None, :] <= rows[:, None])
        if HAS_MASK:
            seen = seen & (tl.load(m_ptrs, mask=seen, other=0) != 0)
        return tl.where(seen, s, float("-inf")), seen

    @triton.jit
    def _forward(Q, K, V, M, O, LSE, scale, Lq, Lk, E, Ev, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,  # noqa: E741 - O: the output, as Q K V
                 BLOCK: tl.constexpr, BE: tl.constexpr, BEV: tl.constexpr):
        bh = tl.program_id(1)
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        de, dv = tl.arange(0, BE), tl.arange(0, BEV)
        q = tl.load(Q + bh * Lq * E + rows[:, None] * E + de[None, :],
                    mask=(rows[:, None] < Lq) & (de[None, :] < E), other=0.0)
        m_i = tl.full([BLOCK], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK], tl.float32)
        acc = tl.zeros([BLOCK, BEV], tl.float32)
        for start in range(0, Lk, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            s, seen = _scores(q, K + bh * Lk * E + cols[:, None] * E + de[None, :],
                              M + bh * Lq * Lk + rows[:, None] * Lk + cols[None, :], rows, cols, Lq, Lk, scale,
                              HAS_MASK, CAUSAL, (cols[:, None] < Lk) & (de[None, :] < E))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # the -inf guard: a row that saw nothing yet
            p = tl.exp(s - shift[:, None])
            alpha = tl.exp(m_i - shift)
            v = tl.load(V + bh * Lk * Ev + cols[:, None] * Ev + dv[None, :],
                        mask=(cols[:, None] < Lk) & (dv[None, :] < Ev), other=0.0)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            m_i = m_new
        out = acc / tl.where(l_i == 0, 1.0, l_i)[:, None]
        tl.store(O + bh * Lq * Ev + rows[:, None] * Ev + dv[None, :], out.to(O.dtype.element_ty),
                 mask=(rows[:, None] < Lq) & (dv[None, :] < Ev))
        lse = tl.where(l_i == 0, float("inf"), m_i + tl.log(tl.where(l_i == 0, 1.0, l_i)))  # empty rows: +inf
        tl.store(LSE + bh * Lq + rows, lse, mask=rows < Lq)

    @triton.jit
    def _backward_kv(Q, K, V, M, DO, LSE, D, DK, DV, scale, Lq, Lk, E, Ev, HAS_MASK: tl.constexpr,
                     CAUSAL: tl.constexpr, BLOCK: tl.constexpr, BE: tl.constexpr, BEV: tl.constexpr):
        """dK and dV of one block of keys, over every block of queries."""
        bh = tl.program_id(1)
        cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        de, dv = tl.arange(0, BE), tl.arange(0, BEV)
        k_ok, v_ok = (cols[:, None] < Lk) & (de[None, :] < E), (cols[:, None] < Lk) & (dv[None, :] < Ev)
        v = tl.load(V + bh * Lk * Ev + cols[:, None] * Ev + dv[None, :], mask=v_ok, other=0.0)
        dk = tl.zeros([BLOCK, BE], tl.float32)
        dvacc = tl.zeros([BLOCK, BEV], tl.float32)
        for start in range(0, Lq, BLOCK):
            rows = start + tl.arange(0, BLOCK)
            q = tl.load(Q + bh * Lq * E + rows[:, None] * E + de[None, :],
                        mask=(rows[:, None] < Lq) & (de[None, :] < E), other=0.0)
            do = tl.load(DO + bh * Lq * Ev + rows[:, None] * Ev + dv[None, :],
                         mask=(rows[:, None] < Lq) & (dv[None, :] < Ev), other=0.0)
            lse = tl.load(LSE + bh * Lq + rows, mask=rows < Lq, other=float("inf"))
            delta = tl.load(D + bh * Lq + rows, mask=rows < Lq, other=0.0)
            s, seen = _scores(q, K + bh * Lk * E + cols[:, None] * E + de[None, :],
                              M + bh * Lq * Lk + rows[:, None] * Lk + cols[None, :], rows, cols, Lq, Lk, scale,
                              HAS_MASK, CAUSAL, k_ok)
            p = tl.where(seen, tl.exp(s - lse[:, None]), 0.0)  # (BLOCK queries, BLOCK keys)
            dvacc += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision="ieee")
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision="ieee")
        tl.store(DK + bh * Lk * E + cols[:, None] * E + de[None, :], (dk * scale).to(DK.dtype.element_ty), mask=k_ok)
        tl.store(DV + bh * Lk * Ev + cols[:, None] * Ev + dv[None, :], dvacc.to(DV.dtype.element_ty), mask=v_ok)

    @triton.jit
    def _backward_q(Q, K, V, M, DO, LSE, D, DQ, scale, Lq, Lk, E, Ev, HAS_MASK: tl.constexpr,
                    CAUSAL: tl.constexpr, BLOCK: tl.constexpr, BE: tl.constexpr, BEV: tl.constexpr):
        """dQ of one block of queries, over every block of keys."""
        bh = tl.program_id(1)
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        de, dv = tl.arange(0, BE), tl.arange(0, BEV)
        q_ok = (rows[:, None] < Lq) & (de[None, :] < E)
        q = tl.load(Q + bh * Lq * E + rows[:, None] * E + de[None, :], mask=q_ok, other=0.0)
        do = tl.load(DO + bh * Lq * Ev + rows[:, None] * Ev + dv[None, :],
                     mask=(rows[:, None] < Lq) & (dv[None, :] < Ev), other=0.0)
        lse = tl.load(LSE + bh * Lq + rows, mask=rows < Lq, other=float("inf"))
        delta = tl.load(D + bh * Lq + rows, mask=rows < Lq, other=0.0)
        dq = tl.zeros([BLOCK, BE], tl.float32)
        for start in range(0, Lk, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            k_ok = (cols[:, None] < Lk) & (de[None, :] < E)
            s, seen = _scores(q, K + bh * Lk * E + cols[:, None] * E + de[None, :],
                              M + bh * Lq * Lk + rows[:, None] * Lk + cols[None, :], rows, cols, Lq, Lk, scale,
                              HAS_MASK, CAUSAL, k_ok)
            p = tl.where(seen, tl.exp(s - lse[:, None]), 0.0)
            v = tl.load(V + bh * Lk * Ev + cols[:, None] * Ev + dv[None, :],
                        mask=(cols[:, None] < Lk) & (dv[None, :] < Ev), other=0.0)
            ds = p * (tl.dot(do, tl.trans(v), input_precision="ieee") - delta[:, None])
            k = tl.load(K + bh * Lk * E + cols[:, None] * E + de[None, :], mask=k_ok, other=0.0)
            dq += tl.dot(ds.to(k.dtype), k, input_precision="ieee")
        tl.store(DQ + bh * Lq * E + rows[:, None] * E + de[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=q_ok)


def _sizes(q, v):
    """The kernels' compile-time sizes: a query/key block, the head dims padded to a power of two >= 16."""
    block = 16 if _interpreting() else 64  # the interpreter: small blocks, so small problems span several
    return dict(BLOCK=block, BE=max(16, triton.next_power_of_2(q.shape[-1])),
                BEV=max(16, triton.next_power_of_2(v.shape[-1])))


class _Attention(object if _MISSING else torch.autograd.Function):
    """softmax(scale q k^T) v on (BN, L, E) contiguous tensors; mask (BN, Lq, Lk) int8 or None."""

    @staticmethod
    def forward(ctx, q, k, v, mask, causal, scale):
        BN, Lq, E = q.shape
        Lk, Ev = k.shape[1], v.shape[2]
        o = torch.empty((BN, Lq, Ev), dtype=q.dtype, device=q.device)
        lse = torch.empty((BN, Lq), dtype=torch.float32, device=q.device)
        sizes = _sizes(q, v)
        m = q if mask is None else mask  # a placeholder pointer when there is no mask
        if BN and Lq:
            _forward[(triton.cdiv(Lq, sizes["BLOCK"]), BN)](q, k, v, m, o, lse, scale, Lq, Lk, E, Ev,
                                                              HAS_MASK=mask is not None, CAUSAL=causal, **sizes)
        ctx.save_for_backward(q, k, v, o, lse, mask)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, mask = ctx.saved_tensors
        do = do.contiguous()
        BN, Lq, E = q.shape
        Lk, Ev = k.shape[1], v.shape[2]
        delta = (do.float() * o.float()).sum(-1).contiguous()  # (BN, Lq) D = rowsum(dO * O)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        sizes, m = _sizes(q, v), q if mask is None else mask
        flags = dict(HAS_MASK=mask is not None, CAUSAL=ctx.causal, **sizes)
        if BN and Lk and Lq:
            _backward_kv[(triton.cdiv(Lk, sizes["BLOCK"]), BN)](q, k, v, m, do, lse, delta, dk, dv, ctx.scale,
                                                                  Lq, Lk, E, Ev, **flags)
            _backward_q[(triton.cdiv(Lq, sizes["BLOCK"]), BN)](q, k, v, m, do, lse, delta, dq, ctx.scale,
                                                                 Lq, Lk, E, Ev, **flags)
        return dq, dk, dv, None, None, None


def attention(q, k, v, mask=None, is_causal=False, scale=None):
    """torch tensors (..., H, L, E), leading dims broadcast; mask (..., Lq, Lk) bool, True = visible."""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2],
                                   () if mask is None else mask.shape[:-2])
    Lq, Lk, BN = q.shape[-2], k.shape[-2], batch.numel()

    def flat(x, rows):  # (..., L, D) -> (BN, L, D), contiguous; autograd sums the broadcast back
        return x.expand(*batch, rows, x.shape[-1]).reshape(BN, rows, x.shape[-1]).contiguous()

    m = None if mask is None else mask.expand(*batch, Lq, Lk).reshape(BN, Lq, Lk).to(torch.int8).contiguous()
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    out = _Attention.apply(flat(q, Lq), flat(k, Lk), flat(v, Lk), m, bool(is_causal), scale)
    return out.reshape(*batch, Lq, v.shape[-1])


class TritonAttention(TorchBackend):
    """This file's kernel as a suite backend: CUDA when there is a GPU, else Triton's interpreter
    (TRITON_INTERPRET=1, set before triton is imported), which declares no bfloat16 (its tl.dot)."""

    name = "triton-example"
    env_vars = ("TRITON_INTERPRET",)  # interpreted or compiled: a reproducer restores the run's choice
    # head dims to 256: three (64 x 256) tiles a program are as much as a GPU's shared memory holds
    capabilities = Capabilities(dtypes=("float16", "bfloat16", "float32"), device="cuda", gradients=True,
                                max_head_dim=256)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left",
                          notes=("online softmax over key blocks (64 on CUDA, 16 interpreted), float32 inside",))

    def __init__(self):
        if _MISSING is None and _interpreting():
            self.device = "cpu"
            self.capabilities = Capabilities(dtypes=("float16", "float32"), device="cpu", gradients=True)
            self.semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", notes=(
                "Triton's interpreter (TRITON_INTERPRET=1): no bfloat16, its tl.dot multiplies bfloat16 bit patterns",))
        else:
            self.device = "cuda"

    def load(self):
        if _MISSING is not None:
            raise BackendUnavailable(_MISSING)
        super().load()  # torch, and for CUDA a device ("no CUDA device"; set TRITON_INTERPRET=1 for the CPU)

    def _attention(self, q, k, v, call):
        return attention(q, k, v, call.mask, call.is_causal, call.scale)
