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


# -- masked problems and bytes moved (benchmarks: rates over useful work, decode bandwidth) --------

def pairs_visible(Lq: int, Lk: int, causal: bool = False, causal_alignment: str = "top_left",
                  window=None) -> int:
    """(query, key) pairs a causal and/or windowed problem keeps, either causal alignment.

    Query i's diagonal is d = i + o (o = Lk - Lq bottom-right aligned, else 0); it sees keys
    max(0, d - left) .. min(Lk - 1, d + right, d if causal), as specs.problem.window_mask and
    causal_mask define them (None = unbounded).  Summed row by row: O(Lq), exact.
    """
    _positive(Lq=Lq, Lk=Lk)
    if causal_alignment not in ("top_left", "bottom_right"):
        raise ValueError(f"causal_alignment must be 'top_left' or 'bottom_right'; got {causal_alignment!r}")
    left, right = (None, None) if window is None else window
    for name, w in (("window left", left), ("window right", right)):
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 0):
            raise ValueError(f"{name} must be None or a non-negative integer; got {w!r}")
    o = Lk - Lq if causal_alignment == "bottom_right" else 0
    total = 0
    for d in range(o, Lq + o):  # d = i + o, one query row at a time
        hi = Lk - 1 if right is None else min(Lk - 1, d + right)
        if causal:
            hi = min(hi, d)
        lo = 0 if left is None else max(0, d - left)
        total += max(0, hi - lo + 1)
    return total


def useful_flops(B: int, Hq: int, Lq: int, Lk: int, E: int, Ev: int | None = None, causal: bool = False,
                 causal_alignment: str = "top_left", window=None) -> int:
    """Forward FLOPs over the visible pairs only (grouped KV heads change bytes, not FLOPs)."""
    Ev = E if Ev is None else Ev
    _positive(B=B, Hq=Hq, E=E, Ev=Ev)
    return 2 * B * Hq * pairs_visible(Lq, Lk, causal, causal_alignment, window) * (E + Ev)


def prefill_lengths(T: int, B: int) -> list[int]:
    """The sequence lengths of a mixed varlen prefill of B sequences, the longest T: T, T/2, T/4, ...
    (each at least 1), repeating every four sequences - the benchmarks' packed batch."""
    _positive(T=T, B=B)
    return [max(1, T >> (b % 4)) for b in range(B)]


def kv_bytes(B: int, Hkv: int, Lk: int, E: int, Ev: int | None, itemsize: int) -> int:
    """Bytes of the keys and values: what one decode step must read at least once."""
    Ev = E if Ev is None else Ev
    _positive(B=B, Hkv=Hkv, Lk=Lk, E=E, Ev=Ev, itemsize=itemsize)
    return B * Hkv * Lk * (E + Ev) * itemsize


def bytes_moved(B: int, Hq: int, Hkv: int, Lq: int, Lk: int, E: int, Ev: int | None, itemsize: int) -> int:
    """The least memory traffic of a forward call: read Q, K, V once, write the output once."""
    Ev = E if Ev is None else Ev
    _positive(B=B, Hq=Hq, Lq=Lq)
    return kv_bytes(B, Hkv, Lk, E, Ev, itemsize) + B * Hq * Lq * (E + Ev) * itemsize
