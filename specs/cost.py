"""What attention costs: FLOPs and the bytes of a materialised score matrix.

Forward: QK^T is Lq*Lk dot products of length E (a multiply and an add each: 2*E
FLOPs), and weights.V is Lq*Ev dot products of length Lk: 2*Lq*Lk*(E + Ev) per head, i.e.
4*B*H*Lq*Lk*E when Ev = E.  The softmax (exp, sum, divide: O(Lq*Lk)) is left out, as
FLOP counts of attention conventionally do - it is a factor E smaller.  Under a causal
mask only the visible pairs are counted (a kernel that skips masked tiles does that
work; one that computes and discards them does more than this count).
Backward: 2.5x the forward (dV, dA, dQ, dK are four matmuls of the forward's size, plus
recomputing QK^T: 5 against 2), the convention of FlashAttention's benchmarks.
"""
from __future__ import annotations

BACKWARD_FACTOR = 2.5


def _positive(**sizes) -> None:
    for name, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive integer; got {n!r}")


def visible_pairs(Lq: int, Lk: int, causal: bool = False) -> int:
    """How many (query, key) pairs take part: Lq*Lk, or top-left causal j <= i."""
    _positive(Lq=Lq, Lk=Lk)
    if not causal:
        return Lq * Lk
    full_rows = min(Lq, Lk)  # row i sees i+1 keys while i < Lk, then all Lk
    return full_rows * (full_rows + 1) // 2 + max(0, Lq - Lk) * Lk


def forward_flops(B: int, H: int, Lq: int, Lk: int, E: int, Ev: int | None = None,
                  causal: bool = False) -> int:
    """2*pairs*E for QK^T plus 2*pairs*Ev for weights.V, over B*H heads."""
    Ev = E if Ev is None else Ev
    _positive(B=B, H=H, E=E, Ev=Ev)
    return 2 * B * H * visible_pairs(Lq, Lk, causal) * (E + Ev)


def backward_flops(B: int, H: int, Lq: int, Lk: int, E: int, Ev: int | None = None,
                   causal: bool = False) -> float:
    return BACKWARD_FACTOR * forward_flops(B, H, Lq, Lk, E, Ev, causal)


def score_matrix_bytes(B: int, H: int, Lq: int, Lk: int, itemsize: int) -> int:
    """Memory of one materialised (B, H, Lq, Lk) score (or weight) matrix."""
    _positive(B=B, H=H, Lq=Lq, Lk=Lk, itemsize=itemsize)
    return B * H * Lq * Lk * itemsize
