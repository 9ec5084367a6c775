"""Family: gradients — dQ, dK, dV against the reference, and the seeds' scaling law.

Seed 003: "el /sqrt(d_k) sobrevive al backward — aparece en dL/dQ y dL/dK".  Drawn problems here
have no fully masked row (every row sees key 0): such a row's output is the implementation's
choice (`Semantics.fully_masked`), so its gradient is too - except where the output is declared
zeros: a constant passes no gradient, and `backward_empty_rows_pass_nothing` checks exactly that
on a fixed grid (a NaN there spreads into dK and dV through the sums over rows).
The backward costs ~3 forwards here (reference and plain too): half the examples, and lengths
to 65 (block edges 16, 32, 64 +-1); a fixed grid (`BACKWARD_EDGES`) takes the backward past them.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from attnspec.properties import test_edges as edges  # a module: pytest collects no property here
from attnspec.properties.case import Case
from attnspec.properties.distribution import cases
from attnspec.properties.draws import SEEDS
from attnspec.properties.explore import prop
from attnspec.properties.judge import Failed, check_gradients, grad_out, require, rule_of, verdict, worst
from attnspec.specs import error_budget, sink_budget
from attnspec.specs.invariants import gradient_scaling, shown

if TYPE_CHECKING:
    from attnspec.properties.target import Target

# whole rows only: bottom-right causal with Lq > Lk, lengths and windows can hide every key of a row
WHOLE_ROWS = cases(allow_empty_rows=False, regimes=("small", "small", "medium"))


def whole_rows(case) -> bool:
    return bool(case.judged_rows().all())


def grad_seed(draw, case: Case, target: Target) -> dict:
    return {"grad_seed": draw(SEEDS, label="grad_out seed")}


@prop(seeds=True, gradients=True, draw=WHOLE_ROWS, keep=whole_rows, params=grad_seed, seed_params={"grad_seed": 0})
def test_gradients_match_reference(target: Target, case: Case, params: dict):
    check_gradients("gradients_match_reference", target, case, grad_out(case, target.dtype, params["grad_seed"]))


def _scaling(draw, case: Case, target: Target) -> dict:
    log2c = 1 if target.compiled else (1, -1, 2)[draw(st.integers(0, 2), label="log2 c")]
    return {"log2c": log2c, **grad_seed(draw, case, target)}


@prop(seeds=True, gradients=True, draw=WHOLE_ROWS, keep=whole_rows, params=_scaling,
      seed_params={"log2c": 1, "grad_seed": 0})
def test_gradient_scaling_law(target: Target, case: Case, params: dict):
    """Gradients at (q/c, k/c, scale*c^2) are (c dQ, c dK, dV) at (q, k, scale): same scores, dQ = dS K scale."""
    c = 2.0 ** params["log2c"]  # a power of two: q/c, k/c and scale*c^2 are exact
    g = grad_out(case, target.dtype, params["grad_seed"])
    scale = case.scale if case.scale is not None else 1.0 / math.sqrt(case.dims["E"])
    base = case.replace(scale=scale)
    moved = base.replace(q=base.q / c, k=base.k / c, scale=scale * c * c)
    grads = target.backward(base, g)[:3]  # (dq, dk, dv) at (q, k, scale)
    scaled = target.backward(moved, g)[:3]  # at (q/c, k/c, scale c^2)
    budgets = error_budget.backward_allowed(base.problem, None, None, g, dtype=target.budget_dtype, rule=rule_of(target))
    # each side is within its budget and the moved problem's budget is c times this one's for dQ
    # and dK (same scores; they, their plain errors and magnitudes all scale by c): (c + c) x
    # budget; dV does not scale at all (same weights), so its two budgets are equal: 2 x budget
    tol = tuple(2 * m * budgets[i][0] for i, m in enumerate((c, c, 1.0)))
    require(gradient_scaling(grads, scaled, c, atol=tol))


SEGMENTS_257 = np.repeat(np.arange(3, dtype=np.int32), (100, 120, 37))[None]  # (1, 257) across 128-key blocks

# The backward's own tiling, where the draws (lengths to ~129) seldom or never go: query rows past 128
# (a pre-pass computing D = rowsum(dO * O) in blocks its launch grid does not cover leaves rows 128..255
# of every 256 at zero, and dQ and dK wrong there), key tails past two tiles, causal, grouped heads and
# hidden key tiles.  Every row sees a key (a row's gradient with nothing to see is the backend's choice).
BACKWARD_EDGES = [
    edges.Edge("backward Lq 257, Lk 65", 1, 2, 257, 65, 32),
    edges.Edge("backward causal L 129", 1, 1, 129, 129, 32, causal=True),
    edges.Edge("backward Lq 129, Lk 255, 4 query heads on 2 KV heads", 2, 4, 129, 255, 32, Hkv=2),
    # dBias of a per-head bias under grouped heads: one per query head, never the group's sum or first's
    edges.Edge("backward bias (B, H, Lq, Lk), 4 query heads on 2 KV heads", 1, 4, 33, 65, 32, Hkv=2,
               fields={"bias": None}),
    edges.Edge("backward Lq 65, masked Lk 129", 1, 2, 65, 129, 32, masked=True),
    # bottom-right causal with more keys than queries past a key block: a backward that starts key block
    # n's query loop at n * BN / BM (the top-left bound) leaves the rows before that block out of it
    edges.Edge("backward Lq 65, Lk 257, causal bottom-right", 1, 2, 65, 257, 32, causal=True, alignment="bottom_right"),
    # long keys no 128-key block divides (a dQ accumulated per key chunk past 1024 keys that stops at the last
    # whole chunk)
    edges.Edge("backward Lq 9, Lk 1100", 1, 2, 9, 1100, 32),
    # the backward's head-dim templates (a dispatch sending 65..128 to the 64 kernel) and unequal value heads
    *(edges.Edge(f"backward E {E}", 1, 2, 33, 65, E) for E in (80, 128, 256)),
    # ... over three sequences (a pre-pass rowsum(dO * O) indexed by the first sequence's offsets in the head-dim
    # 256 template gives the others its D: NVIDIA/TransformerEngine#3216)
    edges.Edge("backward E 256, 3 sequences", 3, 2, 33, 65, 256),
    edges.Edge("backward E 192, Ev 128", 1, 2, 33, 65, 192, Ev=128),
    # ... causal in each (a dispatch switch whose causal arm reaches one template as non-causal), MLA's (192,
    # 128) bottom-right with more keys than queries (a chunk against its cache)
    *(edges.Edge(f"backward E {E}, causal L 65", 1, 2, 65, 65, E, causal=True) for E in (80, 128, 256)),
    edges.Edge("backward E 192, Ev 128, Lq 33, Lk 65, causal bottom-right", 1, 2, 33, 65, 192, Ev=128, causal=True,
               alignment="bottom_right"),
    # each variant a backward recomputes past its first 128-key block and 128-row query tile (the draws'
    # lengths stop near 65): a window's key-block range in the dK/dV pass and its rows in a pack-GQA dQ pass,
    # ALiBi's distance in later key blocks, the softcap's tanh' on every block, segments across block
    # edges, dSink summed over every query tile, padded keys' dK = dV = 0, and dBias summed over the axes a
    # bias is broadcast on (queries, batch)
    edges.Edge("backward window (100, 0) causal L 257", 1, 2, 257, 257, 32, causal=True, fields={"window": (100, 0)}),
    edges.Edge("backward window (64, 64) L 257", 1, 2, 257, 257, 32, fields={"window": (64, 64)}),
    # a window with left != right (a dK/dV pass whose query-tile range swaps them), and one unbounded on the
    # left (flash-attention's -1 taken as a width: dQ of a later query tile skips the key blocks before it)
    edges.Edge("backward window (200, 10) L 257", 1, 2, 257, 257, 32, fields={"window": (200, 10)}),
    edges.Edge("backward window (None, 20) L 257", 1, 2, 257, 257, 32, fields={"window": (None, 20)}),
    # a left bound of 0 (a backward that reads it by truthiness recomputes the row unbounded on the left)
    edges.Edge("backward window (0, 3) L 65", 1, 2, 65, 65, 32, fields={"window": (0, 3)}),
    edges.Edge("backward window (100, 0) causal L 257, 4 query heads on 2 KV heads", 1, 4, 257, 257, 32, causal=True,
               Hkv=2, fields={"window": (100, 0)}),
    edges.Edge("backward Lq 129, Lk 257, causal bottom-right, ALiBi", 1, 2, 129, 257, 32, causal=True,
               alignment="bottom_right", fields={"alibi_slopes": np.array([2.0 ** -4, 2.0 ** -8])}),
    edges.Edge("backward Lq 129, Lk 257, ALiBi", 1, 2, 129, 257, 32,
               fields={"alibi_slopes": np.array([2.0 ** -4, 2.0 ** -8])}),
    # ALiBi's distances without causal, bottom-right asked (a backward that measures them top-left where no
    # causal flag says which); sinks under a window (dSink's p_sink from the windowed row's LSE)
    edges.Edge("backward Lq 129, Lk 257, ALiBi, bottom-right", 1, 2, 129, 257, 32, alignment="bottom_right",
               fields={"alibi_slopes": np.array([2.0 ** -4, 2.0 ** -8])}),
    edges.Edge("backward L 257, sinks, window (64, 0) causal", 1, 2, 257, 257, 32, causal=True,
               fields={"sinks": np.array([1.0, -2.0]), "window": (64, 0)}),
    edges.Edge("backward Lq 129, Lk 257, softcap 1", 1, 2, 129, 257, 32, fields={"softcap": 1.0}),
    # ... under grouped heads (a tanh' recompute that expands K by tiling, h % Hkv, not h // g)
    edges.Edge("backward softcap 1, 4 query heads on 2 KV heads", 1, 4, 33, 65, 32, Hkv=2, fields={"softcap": 1.0}),
    edges.Edge("backward L 257, segments 100, 120 and 37 long", 1, 2, 257, 257, 32,
               fields={"q_segment_ids": SEGMENTS_257, "kv_segment_ids": SEGMENTS_257}),
    edges.Edge("backward Lq 257, Lk 129, sinks", 1, 2, 257, 129, 32, fields={"sinks": np.array([1.0, -2.0])}),
    edges.Edge("backward key lengths 257, 200 and 100", 3, 2, 65, 257, 32,
               fields={"kv_lengths": np.array([257, 200, 100], dtype=np.int32)}),
    # left padding (kv_starts, per-sequence positions): a backward launcher that drops it recomputes the rows
    # over the padding keys and measures the diagonal from the padded start
    edges.Edge("backward left padding: keys [3, 65) and [0, 50), causal bottom-right", 2, 2, 33, 65, 32, causal=True,
               alignment="bottom_right", fields={"positions": "per_sequence",
                                                 "kv_starts": np.array([3, 0], dtype=np.int32),
                                                 "kv_lengths": np.array([65, 50], dtype=np.int32)}),
    edges.Edge("backward Lq 257, key-padding bias (B, 1, 1, Lk)", 2, 2, 257, 65, 32, key_padding="bias"),
    edges.Edge("backward bias (1, H, Lq, Lk) over 2 sequences", 2, 2, 129, 65, 32, fields={"bias": (1, 2, 129, 65)}),
    # a bias broadcast over heads only (a model's 4-D mask or relative bias shared by its heads): dBias the sum of
    # every head's dS, never the last head's store
    edges.Edge("backward bias (B, 1, Lq, Lk) over 2 sequences", 2, 2, 33, 65, 32, fields={"bias": (2, 1, 33, 65)}),
    # a per-head key bias broadcast over queries (T5-style relative position, a per-head padding bias): dBias
    # is the sum of dS over every query row, never one row's
    edges.Edge("backward bias (B, H, 1, Lk) over 2 sequences", 2, 2, 129, 65, 32, fields={"bias": (2, 2, 1, 65)}),
    # head dims no multiple of 8 (a vectorised store's tail columns), causal top-left with more queries than
    # keys (the dK/dV pass's query loop bounded by the keys' length), a group of 16 query heads on one KV head
    # (a pack-GQA backward in tiles of 8 heads that stores each tile's dK, dV instead of adding them)
    *(edges.Edge(f"backward E {E}", 1, 2, 9, 65, E) for E in (59, 111)),
    edges.Edge("backward Lq 129, Lk 65, causal top-left", 1, 2, 129, 65, 32, causal=True, alignment="top_left"),
    edges.Edge("backward 16 query heads on 1 KV head", 1, 16, 9, 65, 16, Hkv=1),
    # a group of 3 (a backward mapping query heads by a shift), and sinks under grouped heads (dSink a query
    # head's, never added at its KV head's index)
    edges.Edge("backward 6 query heads on 2 KV heads", 1, 6, 33, 65, 32, Hkv=2),
    edges.Edge("backward sinks, 4 query heads on 2 KV heads", 1, 4, 33, 65, 32, Hkv=2,
               fields={"sinks": np.array([1.0, -2.0, 0.5, 3.0])}),
]


@prop(gradients=True, grid=lambda target: edges.grid_problems(target, BACKWARD_EDGES))
def test_backward_edges_match_reference(target: Target, case: Case, params: dict):
    """dQ, dK, dV (dBias, dSink) against the reference on a fixed grid: 257 query rows, 255 keys, causal at 129
    and bottom-right past a key block, grouped heads, hidden key tiles, head dims 80 to 256, Ev != E, and each
    variant past a 128-key block: windows, ALiBi, a softcap, segments, sinks, key lengths, broadcast biases
    (dealt over the dtypes for a backend that compiles per shape, as the edge grid)."""
    g = grad_out(case, target.dtype, 0)
    if case.fields.get("sinks") is not None:  # dSink_h: a sum over every query tile of every sequence
        _, dsink = target.backward(case, g, return_dsink=True)
        v = sink_budget.check_dsink(dsink, case.problem, grad_out=g, dtype=target.budget_dtype, rule=rule_of(target))
        require(verdict("backward_edges_match_reference", bool(v), v.where, v.amount, f"dsink: {v.message}", v.limit))
    check_gradients("backward_edges_match_reference", target, case, g)


# Rows that see no key, under a backend that declares their output zeros: whole 16..64-row query tiles of
# them (bottom-right causal, Lq > Lk), single rows and a 16-row tile among rows that see keys (a mask or a
# -inf bias), and under grouped heads (the NaN of one query head's row reaches its group's dK and dV)
BACKWARD_EMPTY_ROWS = [
    edges.Edge("backward Lq 129, Lk 33, causal bottom-right: 96 rows see no key", 1, 2, 129, 33, 32, causal=True,
               alignment="bottom_right"),
    edges.Edge("backward Lq 65, masked Lk 129, rows 0, 32..47 and 64 see no key", 1, 2, 65, 129, 32, masked=True,
               empty_rows=(0, *range(32, 48), 64)),
    edges.Edge("backward Lq 33, masked Lk 65, 4 query heads on 2 KV heads, rows 5 and 32 see no key", 1, 4, 33, 65,
               32, masked=True, Hkv=2, empty_rows=(5, 32)),
]


def _empty_row_problems(target: Target) -> list:
    if target.backend.semantics.fully_masked != "zeros":
        import pytest
        pytest.skip(f"{target.name} declares fully_masked = {target.backend.semantics.fully_masked!r}: the gradient "
                    "of a row that sees no key is judged where its output is declared zeros")
    return edges.grid_problems(target, BACKWARD_EMPTY_ROWS)


@prop(gradients=True, grid=_empty_row_problems)
def test_backward_empty_rows_pass_nothing(target: Target, case: Case, params: dict):
    """Where a row that sees no key is declared zeros, its output is a constant: dQ is zero on that row and
    dK, dV (and dBias) are the reference's, finite (flash-attention#443: a backward that recomputes
    exp(s - LSE) with LSE = -inf there puts NaN in the row's dQ and, through the sums, in dK and dV)."""
    check_gradients("backward_empty_rows_pass_nothing", target, case, grad_out(case, target.dtype, 0))


# (B, H, Lq, Lk) with nothing to compute: no query, no key, no sequence
BACKWARD_EMPTY_SIZES = (("Lq=0", (1, 2, 0, 129)), ("Lk=0", (1, 2, 9, 0)), ("batch 0", (0, 2, 9, 129)))


def _empty_size_problems(target: Target) -> list:
    rng, E = np.random.default_rng(0), -(-4 // target.caps.head_dim_multiple) * target.caps.head_dim_multiple
    out = []
    for label, (B, H, Lq, Lk) in BACKWARD_EMPTY_SIZES:
        q, k, v = (np.round(rng.standard_normal((B, H, n, E)) * 8) / 8 for n in (Lq, Lk, Lk))  # (B, H, L, E)
        out.append((target.exact(Case(q, k, v, label=label)), {}))
    return out


@prop(gradients=True, grid=_empty_size_problems)
def test_backward_empty_sizes_pass_nothing(target: Target, case: Case, params: dict):
    """The backward with no query (dK = dV = 0: nothing flows back), no key (dQ = 0 where a row that sees
    nothing is declared zeros: its output is a constant) or no sequence: the inputs' shapes back, and those
    zeros - or an error, an answer the forward's empty_sizes question judges.  A backward that returns early
    on an empty grid hands back uninitialised (torch.empty) gradients."""
    g = grad_out(case, target.dtype, 0)  # (B, H, Lq, Ev)
    try:
        grads = target.backward(case, g)  # (dq, dk, dv[, dbias])
    except Failed as f:
        if f.verdict.name == "backend_raised":
            return
        raise
    zeros = {"dq": target.backend.semantics.fully_masked == "zeros", "dk": True, "dv": True}
    for name, grad, x in zip(("dq", "dk", "dv"), grads, (case.q, case.k, case.v), strict=False):
        got = np.asarray(grad, dtype=np.float64)
        require(verdict("backward_empty_sizes_pass_nothing", got.shape == x.shape, None, float("nan"),
                        f"{case.label}: {name} has shape {got.shape}; the input's is {x.shape}"))
        if zeros[name]:
            where, amount = worst(np.abs(got), np.ones(got.shape, dtype=bool))  # NaN counts as infinite
            require(verdict("backward_empty_sizes_pass_nothing", amount == 0.0, where if amount else None, amount,
                            f"{case.label}: {name} at {where} is {shown(got, where, amount)}; nothing flows back "
                            "there, it must be 0", 0.0))
