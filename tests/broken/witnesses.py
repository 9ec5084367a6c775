"""Hand-made problems on which each broken implementation visibly differs from the reference.

They prove the bugs are real independently of the suite (a teeth test against a bug that never
shows would be vacuous).  Each returns keyword arguments for Backend.forward/backward plus
``op`` ("forward", "backward" or "lse": the forward's log-sum-exp), ``dtype`` and ``fields`` (the
optional problem fields).  tests/test_teeth.py runs each in every dtype its kernel declares,
its inputs rounded to that dtype; the variants' inputs are on a k/8 grid, exact in every dtype.
"""
from __future__ import annotations

import numpy as np


def _qkv(Lq, Lk, E=8, Ev=8, seed=0, spread=1.0, batch=(1, 2)):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(batch + (Lq, E)) * spread  # (B, H, Lq, E)
    k = rng.standard_normal(batch + (Lk, E)) * spread  # (B, H, Lk, E)
    v = rng.standard_normal(batch + (Lk, Ev))  # (B, H, Lk, Ev)
    return q, k, v


def _problem(q, k, v, mask=None, is_causal=False, scale=None, op="forward", dtype="float64", seed=1, **fields):
    kw = dict(q=q, k=k, v=v, mask=mask, is_causal=is_causal, scale=scale, dtype=dtype, op=op, fields=fields)
    if op == "backward":
        rng = np.random.default_rng(seed)
        kw["grad_out"] = rng.standard_normal(q.shape[:-1] + (v.shape[-1],))  # (B, H, Lq, Ev)
    return kw


def _random_mask(Lq, Lk, seed=3):
    mask = np.random.default_rng(seed).random((Lq, Lk)) < 0.6  # (Lq, Lk)
    mask[:, 0] = True  # no empty rows: the bug, not the spec's open choice, must show
    return mask


def default_path(seed=0):
    return _problem(*_qkv(5, 7, E=16, seed=seed))


def with_mask(seed=0):
    return _problem(*_qkv(5, 7, seed=seed), mask=_random_mask(5, 7))


def causal_square(seed=0):
    return _problem(*_qkv(6, 6, seed=seed), is_causal=True)


def causal_rectangular(seed=0):
    return _problem(*_qkv(2, 5, seed=seed), is_causal=True)


def explicit_scale(seed=0):
    return _problem(*_qkv(4, 6, seed=seed), scale=0.7)


def huge_logits(seed=0):
    return _problem(*_qkv(3, 5, seed=seed, spread=40.0))  # logits ~ 1e3: exp overflows in float64


def fully_masked_row(seed=0):
    mask = _random_mask(4, 6)
    mask[2] = False  # (4, 6) row 2 sees nothing
    return _problem(*_qkv(4, 6, seed=seed), mask=mask)


def growing_max(seed=0):
    """Keys whose norms grow along the sequence, so later key blocks raise the running maximum."""
    q, k, v = _qkv(4, 40, seed=seed)
    k = k * np.linspace(0.2, 3.0, 40)[:, None]  # (B, H, 40, E)
    q = np.abs(q)
    k = np.abs(k)
    return _problem(q, k, v)


def first_block_masked(seed=0):
    mask = np.ones((3, 20), dtype=bool)  # (3, 20)
    mask[0, :8] = False  # row 0 sees keys 8.. only: its first 8-key block is empty
    return _problem(*_qkv(3, 20, seed=seed), mask=mask)


def short_tail(seed=0):
    return _problem(*_qkv(3, 5, seed=seed))


def long_masked(seed=0):
    return _problem(*_qkv(3, 80, seed=seed), mask=_random_mask(3, 80))


def long_float32(seed=0):
    return _problem(*_qkv(4, 300, E=64, Ev=16, seed=seed), dtype="float32")


def gradient(seed=0):
    return _problem(*_qkv(4, 6, seed=seed), op="backward")


def gradient_causal(seed=0):
    return _problem(*_qkv(5, 5, seed=seed), is_causal=True, op="backward")


# ---- the variants (issues 9 and 11) ----------------------------------------------------------

def _grid(shape, seed, spread=1.0):
    """Normal values on a k/8 grid within +-4 * spread: exact in float16 and bfloat16 too."""
    x = np.random.default_rng(seed).standard_normal(shape) * spread  # like shape
    return np.clip(np.round(x * 8), -32 * spread, 32 * spread) / 8


def _heads(Hq, Hkv, Lq, Lk, E=8, B=1, seed=0):
    return _grid((B, Hq, Lq, E), seed), _grid((B, Hkv, Lk, E), seed + 1), _grid((B, Hkv, Lk, E), seed + 2)


def grouped(seed=0):
    """4 query heads on 2 KV heads: head h must read KV head h // 2 (1, 0, 1 would be h % 2)."""
    return _problem(*_heads(4, 2, 5, 6, seed=seed), enable_gqa=True)


def grouped_gradient(seed=0):
    return _problem(*_heads(4, 2, 5, 6, seed=seed), op="backward", enable_gqa=True)


def biased(seed=0):
    """A float bias (no zeros, no -inf) with scale 0.5: a scaled bias and a bias read as bool both show."""
    q, k, v = _heads(2, 2, 4, 6, seed=seed)
    bias = _grid((1, 2, 4, 6), seed + 3, spread=2.0)  # (B, H, Lq, Lk)
    bias = np.where(bias == 0, 0.5, bias)
    return _problem(q, k, v, scale=0.5, bias=bias)


def causal_bottom_right(seed=0):
    """Lq = 3 < Lk = 6 asked bottom-right: query 0 sees keys 0..3, not only key 0."""
    return _problem(*_heads(2, 2, 3, 6, seed=seed), is_causal=True, causal_alignment="bottom_right")


def sinks(seed=0):
    """4 query heads on 2 KV heads, distinct sinks near the scores, cap 1, scale 0.5: a sink dropped,
    counted twice, scaled, capped, read by KV head or given a value each shows."""
    return _problem(*_heads(4, 2, 4, 6, seed=seed), scale=0.5, enable_gqa=True, softcap=1.0,
                    sinks=np.array([1.5, -0.5, 2.0, 0.75]))


def sinks_lse(seed=0):
    """The LSE with sinks: logaddexp(lse, s_h) where it is declared to include them."""
    return {**sinks(seed), "op": "lse"}


def lse(seed=0):
    return _problem(*_heads(2, 2, 4, 6, seed=seed), scale=0.5, op="lse")


def windowed(seed=0):
    """Window (2, 1) on a square problem without causal: both edges matter on every inner row."""
    return _problem(*_heads(1, 1, 8, 8, seed=seed), window=(2, 1))


def window_bottom_right(seed=0):
    """Window (1, 0) bottom-right with Lq = 3 < Lk = 7: query i sees keys i + 3 and i + 4."""
    return _problem(*_heads(1, 1, 3, 7, seed=seed), window=(1, 0), causal_alignment="bottom_right")


def softcapped_causal(seed=0):
    """Cap 1 on a causal problem: a hidden key scored -cap still gets weight ~exp(-2) of the visible."""
    return _problem(*_heads(1, 1, 5, 5, seed=seed), is_causal=True, softcap=1.0)


def padded(seed=0):
    """Two sequences of 3 and 5 queries (5 and 6 keys) in a batch padded to 5 and 6."""
    return _problem(*_heads(2, 2, 5, 6, B=2, seed=seed), q_lengths=np.array([3, 5]), kv_lengths=np.array([5, 6]))


def packed(seed=0):
    """Three packed sequences: queries [0, 0, 1, 1, 2], keys [0, 0, 0, 1, 1, 2, 2]."""
    return _problem(*_heads(1, 1, 5, 7, seed=seed), q_segment_ids=np.array([[0, 0, 1, 1, 2]]),
                    kv_segment_ids=np.array([[0, 0, 0, 1, 1, 2, 2]]))


def padded_unequal(seed=0):
    """Two sequences of different lengths (keys 2 and 6, queries 4 and 5) in a batch padded to 6."""
    return _problem(*_heads(2, 2, 5, 6, B=2, seed=seed), q_lengths=np.array([4, 5]), kv_lengths=np.array([2, 6]))


def packed_unequal(seed=0):
    """Two sequences packed differently: [0, 0, 1, 1] / [0, 0, 0, 1, 1, 1] and [0, 1, 1, 1] / [0, 1, 1, 1, 1, 1]."""
    return _problem(*_heads(1, 1, 4, 6, B=2, seed=seed), q_segment_ids=np.array([[0, 0, 1, 1], [0, 1, 1, 1]]),
                    kv_segment_ids=np.array([[0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1]]))


def chunked_prefill(seed=0):
    """Issue 30: a chunk of 3 queries after 1 cached key (4 keys) and one decode query after 5 (6 keys),
    positions per sequence, causal bottom-right: the padded lengths' diagonal (Lk - Lq = 3) is wrong for
    both; the first sequence is shorter than the padded seqlen_k."""
    return _problem(*_heads(2, 2, 3, 6, B=2, seed=seed), is_causal=True, causal_alignment="bottom_right",
                    positions="per_sequence", q_lengths=np.array([3, 1]), kv_lengths=np.array([4, 6]))


def paged_leftpad(seed=0):
    """Issue 30: two decode-chunk rows against caches left-padded by 2 and 1 (keys [2, 7) and [1, 5))."""
    return _problem(*_heads(2, 2, 2, 7, B=2, seed=seed), is_causal=True, causal_alignment="bottom_right",
                    positions="per_sequence", kv_lengths=np.array([7, 5]), kv_starts=np.array([2, 1]))


def paged_sinks(seed=0):
    """Issue 31 in issue 30's paged call (op "paged": 2-key pages): caches of 7 and 5 keys (4 and 3 pages, the
    second left-padded by 1), two queries each, sinks near the scores - a sink dropped by the paged path,
    or counted once per page, shows."""
    return {**_problem(*_heads(2, 2, 2, 7, B=2, seed=seed), positions="per_sequence", kv_lengths=np.array([7, 5]),
                       kv_starts=np.array([0, 1]), sinks=np.array([0.5, 1.25])), "op": "paged"}


def shared_prefix(seed=0):
    """Issue 30: two sequences of 20 and 18 keys whose first 16 are the same (one 16-key page their block
    tables share, forward_via_format's page size), two decode-chunk queries each."""
    q, k, v = _heads(2, 2, 2, 20, B=2, seed=seed)
    k[1, :, :16], v[1, :, :16] = k[0, :, :16], v[0, :, :16]
    return _problem(q, k, v, is_causal=True, causal_alignment="bottom_right", positions="per_sequence",
                    kv_lengths=np.array([20, 18]))


def decode_step(seed=0):
    """Issue 30: one decode query a sequence against caches of 5 and 3 keys (causal bottom-right: each
    query sees every key, the newest included)."""
    return _problem(*_heads(2, 2, 1, 5, B=2, seed=seed), is_causal=True, causal_alignment="bottom_right",
                    positions="per_sequence", kv_lengths=np.array([5, 3]))


def chunk_after_cache(seed=0):
    """Issue 30: prefill chunks of 3 queries after caches of 3 and 1 keys (6 and 4 keys in all), causal
    bottom-right: the chunk's queries see the keys before the chunk too."""
    return _problem(*_heads(2, 2, 3, 6, B=2, seed=seed), is_causal=True, causal_alignment="bottom_right",
                    positions="per_sequence", kv_lengths=np.array([6, 4]))


def mixed_batch(seed=0):
    """Issue 30: a decode (1 query after 4 keys) first, then a prefill chunk (3 queries, 6 keys), causal
    bottom-right: the chunk's first two queries must not see its last keys."""
    return _problem(*_heads(2, 2, 3, 6, B=2, seed=seed), is_causal=True, causal_alignment="bottom_right",
                    positions="per_sequence", q_lengths=np.array([1, 3]), kv_lengths=np.array([4, 6]))


# ALiBi's slopes for 6 heads (the 4 of 4 heads, then every other one of 8): specs.problem.alibi_slopes(6),
# written out because nothing here reads specs (tests/test_teeth.py checks they agree)
ALIBI_SLOPES_6 = np.array([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3])


def alibi_6_heads(seed=0):
    """6 heads (not a power of two), 6 keys: the slopes 2^(-8h/6) are not the standard ones."""
    return _problem(*_heads(6, 6, 6, 6, seed=seed), alibi_slopes=ALIBI_SLOPES_6)


def first_tile_bias_hidden(seed=0):
    """80 keys: row 0 sees keys 64.. only, its first 64-key tile hidden by a -inf bias; row 1 a
    finite bias, row 2 every key (a tile kernel without a -inf guard: NaN in row 0 only)."""
    q, k, v = _heads(2, 2, 3, 80, seed=seed)
    bias = _grid((1, 2, 3, 80), seed + 3)  # (B, H, Lq, Lk)
    bias[..., 0, :64] = -np.inf
    bias[..., 2, :] = 0.0
    return _problem(q, k, v, bias=bias)


def ds_scale_underflow(seed=0):
    """dS * scale below half float16's smallest subnormal (3e-8) while dS is above it, multiplied
    by |q| = 20 in every one of 8 rows (issue 29): a kernel that rounds dS * scale to float16
    before dK = (dS scale)^T Q loses both dK rows (~2e-6) where the plain computation keeps them.
    E = 128 (scale 0.088); key 1 scores 15.7 below key 0 (weight 1.5e-7); V = (0, 1), dY = 1."""
    sign = np.where(np.random.default_rng(seed).random(128) < 0.5, -1.0, 1.0)  # (E,)
    q = np.broadcast_to(20.0 * sign, (1, 1, 8, 128)).copy()  # (B, H, Lq, E)
    k = np.stack([np.zeros(128), -0.0694 * sign])[None, None]  # (B, H, 2, E)
    v = np.array([[[[0.0], [1.0]]]])  # (B, H, 2, 1)
    kw = _problem(q, k, v, op="backward")
    kw["grad_out"] = np.ones((1, 1, 8, 1))  # (B, H, Lq, Ev)
    return kw


# ---- issue 31: conventions (tests/test_teeth.py's _verdicts judges the ops below) -----------------

def empty_row_lse(seed=0):
    """Query 1 sees nothing: its LSE must be the declared empty_lse (the reference's -inf)."""
    q, k, v = _heads(2, 2, 4, 6, seed=seed)
    mask = np.ones((4, 6), dtype=bool)
    mask[1] = False
    return _problem(q, k, v, mask=mask, op="lse")


def merge_states(seed=0):
    """op "merge": two states of (B, H, Lq, Ev) = (1, 2, 4, 8): rows alike, rows 3 apart, a row where one
    is empty and one where both are (exactly (0, -inf))."""
    rng = np.random.default_rng(seed)
    o_a, o_b = (np.round(rng.standard_normal((1, 2, 4, 8)) * 8) / 8 for _ in range(2))  # (B, H, Lq, Ev)
    lse_a = np.array([[[0.5, 2.0, -np.inf, -np.inf]] * 2])  # (B, H, Lq)
    lse_b = np.array([[[0.25, -1.0, 1.5, -np.inf]] * 2])
    o_a[..., 2:, :], o_b[..., 3, :] = 0.0, 0.0  # empty states hold zeros
    kw = _problem(*_heads(2, 2, 4, 6, seed=seed), op="merge")
    kw["states"] = ((o_a, lse_a), (o_b, lse_b))
    return kw


def merge_list(seed=0):
    """op "merge" of four states (a list merge: FA3's flash_attn_combine) of (B, H, Lq, Ev) = (1, 2, 4, 8): row 0
    alike, row 1 the last state 1e4 above the others (dropping it, or shifting by the first, shows), row 2 the
    first state empty, row 3 every state empty (exactly (0, -inf))."""
    rng = np.random.default_rng(seed)
    outs = np.round(rng.standard_normal((4, 1, 2, 4, 8)) * 8) / 8  # each (B, H, Lq, Ev)
    lses = np.array([[[[0.5, 1.0, -np.inf, -np.inf]] * 2], [[[0.25, -1.0, 1.5, -np.inf]] * 2],
                     [[[-0.5, 2.0, 0.75, -np.inf]] * 2], [[[1.0, 1e4, 0.0, -np.inf]] * 2]])  # (4, B, H, Lq)
    outs[0, ..., 2:, :], outs[1:, ..., 3, :] = 0.0, 0.0  # empty states hold zeros
    kw = _problem(*_heads(2, 2, 4, 6, seed=seed), op="merge")
    kw["states"] = tuple(zip(outs, lses, strict=True))
    return kw


def knob_tail(seed=0):
    """op "knobs": Lk = 7 at block_size 4 (a partial last block), against the reference."""
    kw = _problem(*_heads(2, 2, 3, 7, seed=seed), op="knobs")
    kw["knobs"] = {"block_size": 4}
    return kw


def backward_knob_tail(seed=0):
    """op "backward" at knobs block_size 16: 5 queries against 21 keys (a 5-key tail tile), causal off."""
    kw = _problem(*_qkv(5, 21, E=16, Ev=16, seed=seed), op="backward")
    kw["knobs"] = {"block_size": 16}
    return kw


def repeated_backward(seed=0):
    """op "repeat_backward": the same backward four times, bitwise (judged where deterministic is declared)."""
    return {**_problem(*_heads(2, 2, 6, 9, seed=seed), op="backward"), "op": "repeat_backward"}


def batch_rows(seed=0):
    """op "batch": three sequences, each alone and together, bitwise (judged where batch_invariant is declared)."""
    return _problem(*_heads(2, 2, 4, 9, B=3, seed=seed), op="batch")


def fp8_descales(seed=0):
    """fp8 inputs (rounded to the format by the teeth test), 4 query heads on 2 KV heads, a batch of 2, 9
    keys (three blocks of 4): every (batch, KV head) its own descales, none a power of two of another's -
    a descale dropped, doubled, read per tensor, from the neighbouring head or the first batch element
    each shows."""
    q, k, v = _heads(4, 2, 5, 9, B=2, seed=seed)
    q, k = q * 8, k * 8  # on the k/8 grid: fp8 rounds them, the descales bring the scores back
    qd = np.array([[0.11, 0.23], [0.17, 0.05]], dtype=np.float32).astype(np.float64)  # (B, Hkv)
    kd = np.array([[0.07, 0.19], [0.13, 0.29]], dtype=np.float32).astype(np.float64)
    vd = np.array([[1.3, 0.7], [0.45, 2.1]], dtype=np.float32).astype(np.float64)
    return _problem(q, k, v, enable_gqa=True, q_descale=qd, k_descale=kd, v_descale=vd)


def fp8_p_rounding(seed=0):
    """op "p_rounding": properties/test_fp8.py's probe of what P is rounded to before P V, judged as declared."""
    return {"op": "p_rounding", "dtype": "float8_e4m3fn", "fields": {}}


def bad_indices(seed=0):
    """op "bad_index": each bad index argument of its formats handed to the backend's own hook
    (attnspec.backends.bad_indices builds the calls; this problem only carries the op): every one refused
    where rejects_bad_indices is declared."""
    return _problem(*_heads(2, 2, 3, 4, seed=seed), op="bad_index")


CONVENTIONS = (empty_row_lse, merge_states, merge_list, knob_tail, backward_knob_tail, repeated_backward, batch_rows,
               bad_indices)


ALL = (default_path, with_mask, causal_square, causal_rectangular, explicit_scale, huge_logits,
       fully_masked_row, growing_max, first_block_masked, short_tail, long_masked, long_float32,
       gradient, gradient_causal, grouped, grouped_gradient, biased, causal_bottom_right, lse, windowed,
       window_bottom_right, softcapped_causal, padded, packed, padded_unequal, packed_unequal, alibi_6_heads,
       first_tile_bias_hidden, ds_scale_underflow, chunked_prefill, paged_leftpad, sinks, sinks_lse,
       paged_sinks, fp8_descales) + CONVENTIONS


def many_work_items(seed=0):
    """B 3 x H 32 x two 64-query tiles = 192 (batch, head, tile) items: more than 132 programs."""
    return _problem(*_heads(32, 32, 128, 16, B=3, seed=seed))


def few_queries_long_cache(seed=0):
    """16 queries against 1024 keys: a split-KV path; each row's own statistics must merge its chunks."""
    return _problem(*_heads(2, 2, 16, 1024, seed=seed))


def head_dim_512(seed=0):
    """E = 512: past a 256-wide template."""
    return _problem(*_heads(1, 1, 4, 6, E=512, seed=seed))


def grouped_by_5(seed=0):
    """10 query heads on 2 KV heads (groups of 5): heads 5-9 must read KV head 1."""
    return _problem(*_heads(10, 2, 4, 6, seed=seed), enable_gqa=True)


def wide_window(seed=0):
    """Causal window (129, 0) at L = 257: rows past 193 must not see the keys of two blocks back."""
    return _problem(*_heads(1, 1, 257, 257, seed=seed), is_causal=True, window=(129, 0))


def explicit_scale_not_dyadic(seed=0):
    """scale = 0.3 on normal inputs, E = 64: float16 keeps 0.29993, off by 2.4e-4 relative."""
    return _problem(*_qkv(9, 65, E=64, Ev=64, seed=seed), scale=0.3)


def key_padding_bias(seed=0):
    """A (B, 1, 1, Lk) bias, two sequences, the second padded past key 3: it must not see keys 4-5."""
    q, k, v = _heads(2, 2, 4, 6, B=2, seed=seed)
    bias = _grid((2, 1, 1, 6), seed + 3)  # (B, 1, 1, Lk)
    bias[1, ..., 4:] = -np.inf
    return _problem(q, k, v, bias=bias)


# ---- a kernel's own paths the draws seldom reach (tests/broken/path_bugs.py) ----------------------------

def split_kv_grouped(seed=0):
    """A decode of 8 query heads on 2 KV heads against 1000 keys (a split-KV path): head h reads KV head h // 4."""
    return _problem(*_heads(8, 2, 1, 1000, seed=seed), enable_gqa=True)


def split_kv_causal_top_left(seed=0):
    """16 queries against 1000 keys, causal top-left: query i sees keys 0..i only."""
    return _problem(*_heads(2, 2, 16, 1000, seed=seed), is_causal=True)


def window_past_a_block(seed=0):
    """Causal window (100, 0) at L = 257: rows 192..227 see keys of the first 128-key block (row 192 from
    key 92), which the query tile's last row (255) does not."""
    return _problem(*_heads(1, 1, 257, 257, seed=seed), is_causal=True, window=(100, 0))


def backward_past_128_rows(seed=0):
    """The backward at 257 query rows: rows 128..255 need their own rowsum(dO * O)."""
    return _problem(*_qkv(257, 9, seed=seed), op="backward")


def merge_tied(seed=0):
    """op "merge": two states whose LSEs tie exactly in every row: the merge is their mean."""
    rng = np.random.default_rng(seed)
    o_a, o_b = (np.round(rng.standard_normal((1, 2, 4, 8)) * 8) / 8 for _ in range(2))  # (B, H, Lq, Ev)
    lse = np.array([[[0.5, 2.0, -1.0, 0.0]] * 2])  # (B, H, Lq)
    kw = _problem(*_heads(2, 2, 4, 6, seed=seed), op="merge")
    kw["states"] = ((o_a, lse), (o_b, lse.copy()))
    return kw


def merge_nine(seed=0):
    """op "merge" of nine states (one past a combine built for eight): the ninth 3 above the others."""
    rng = np.random.default_rng(seed)
    outs = np.round(rng.standard_normal((9, 1, 2, 4, 8)) * 8) / 8  # each (B, H, Lq, Ev)
    lses = np.round(rng.standard_normal((9, 1, 2, 4)) * 8) / 8  # (9, B, H, Lq)
    lses[8] += 3.0
    kw = _problem(*_heads(2, 2, 4, 6, seed=seed), op="merge")
    kw["states"] = tuple(zip(outs, lses, strict=True))
    return kw


def long_decode(seed=0):
    """Issue 30's per-sequence call: one decode query each against caches of 1000 and 513 keys (past
    512-key splits, neither a multiple)."""
    return _problem(*_heads(2, 2, 1, 1000, B=2, seed=seed), positions="per_sequence", kv_lengths=np.array([1000, 513]))


def deep_leftpad(seed=0):
    """Caches of 300 and 290 keys left-padded by 129 and 256 (past a 128-key block): keys [129, 300) and
    [256, 290) are the sequences'."""
    return _problem(*_heads(2, 2, 2, 300, B=2, seed=seed), positions="per_sequence", kv_lengths=np.array([300, 290]),
                    kv_starts=np.array([129, 256]))


def split_kv_softcap(seed=0):
    """A decode against 512 keys (a split-KV path) with softcap 1: every score capped within +-1."""
    return _problem(*_heads(2, 2, 1, 512, seed=seed), softcap=1.0)


def split_kv_window(seed=0):
    """A decode against 600 keys, causal bottom-right, window (8, 0): the query sees keys 591..599 only."""
    return _problem(*_heads(2, 2, 1, 600, seed=seed), is_causal=True, causal_alignment="bottom_right", window=(8, 0))


# ---- one instantiation of a kernel template (tests/broken/template_bugs.py) ------------------------------

def mla_prefill(seed=0):
    """E = 192, Ev = 128 (MLA prefill): V's rows read at V's own pitch."""
    return _problem(*_qkv(4, 8, E=192, Ev=128, seed=seed))


def backward_hdim_80(seed=0):
    """The backward at head dim 80: all 80 components make P, all 80 columns of dQ, dK, dV are written."""
    return _problem(*_qkv(3, 5, E=80, Ev=80, seed=seed), op="backward")


def backward_bottom_right_past_a_block(seed=0):
    """The backward, causal bottom-right, 9 queries against 257 keys: every row sees keys 128..248."""
    return _problem(*_qkv(9, 257, seed=seed), is_causal=True, op="backward", causal_alignment="bottom_right")


def long_row_one_sign(seed=0):
    """q = 0 (every weight 1/2048) and values in [1, 2): the output is each value column's mean."""
    q, k, _ = _qkv(4, 2048, seed=seed)
    v = 1.0 + np.random.default_rng(seed + 7).random(k.shape)  # (B, H, Lk, Ev)
    return _problem(np.zeros_like(q), k, v)


# ---- serving edges the draws leave unjudged (tests/broken/serving_edge_bugs.py) --------------------------

def packed_queries_without_keys(seed=0):
    """op "packed": the first of two sequences has 2 queries and no key: its rows are zeros."""
    return {**_problem(*_heads(2, 2, 2, 5, B=2, seed=seed), positions="per_sequence", kv_lengths=np.array([0, 5])),
            "op": "packed"}


def paged_all_left_padding(seed=0):
    """op "paged": a cache of 3 keys that are all left padding (kv_starts = kv_lengths) beside one of 5."""
    return {**_problem(*_heads(2, 2, 1, 5, B=2, seed=seed), positions="per_sequence", kv_lengths=np.array([3, 5]),
                       kv_starts=np.array([3, 0])), "op": "paged"}


def paged_decode_lse(seed=0):
    """op "paged" with its LSE: one decode query a sequence against 5 and 7 keys."""
    return {**_problem(*_heads(2, 2, 1, 7, B=2, seed=seed), positions="per_sequence", kv_lengths=np.array([5, 7])),
            "op": "paged", "return_lse": True}


def paged_decode_window(seed=0):
    """op "paged" (2-key pages): decodes against 7 and 6 keys, causal bottom-right, window (2, 0): keys 4..6
    and 3..5; the second's edge (key 3) falls inside a page."""
    return {**_problem(*_heads(2, 2, 1, 7, B=2, seed=seed), is_causal=True, causal_alignment="bottom_right",
                       positions="per_sequence", kv_lengths=np.array([7, 6]), window=(2, 0)), "op": "paged"}


def paged_large_pages(seed=0):
    """op "paged" in 256-key pages: a decode against 300 and 200 keys, slots 128 and up of a page read."""
    return {**_problem(*_heads(2, 2, 1, 300, B=2, seed=seed), positions="per_sequence", kv_lengths=np.array([300, 200])),
            "op": "paged", "page_size": 256}


def paged_pool_halves(seed=0):
    """op "paged" in 4-key pages, K and V the halves of one (pages, 2, P, Hkv, E) pool (vLLM's FlashInfer
    layout): a decode against 9 and 6 keys, each page read at the pool's stride."""
    return {**_problem(*_heads(2, 2, 1, 9, B=2, seed=seed), positions="per_sequence", kv_lengths=np.array([9, 6])),
            "op": "paged", "page_size": 4, "cache_view": "pool_halves"}


def paged_padded_pages(seed=0):
    """op "paged" in 4-key pages, each page followed by 16 elements of padding (vLLM's page_size_padded): 3 KV
    heads of 8, a slot 24 elements and a page 112, no whole number of slots; a decode against 9 and 6 keys."""
    return {**_problem(*_heads(3, 3, 1, 9, B=2, seed=seed), positions="per_sequence", kv_lengths=np.array([9, 6])),
            "op": "paged", "page_size": 4, "cache_view": "padded_pages"}


def packed_head_slices(seed=0):
    """op "packed", q, k, v handed as heads 1..2 of tensors four heads wide (a fused QKV projection's views)."""
    return {**_problem(*_heads(2, 2, 2, 5, B=2, seed=seed), positions="per_sequence", kv_lengths=np.array([3, 5])),
            "op": "packed", "layout": "head_slice"}


# ---- paths a fourth review reached (tests/broken/reach_bugs.py, path_bugs.py's long paged decodes) -------

def wide_causal(seed=0):
    """E = 192 (its own template), causal at L 6: query i sees keys 0..i only."""
    return _problem(*_qkv(6, 6, E=192, Ev=192, seed=seed), is_causal=True)


def wide_grouped(seed=0):
    """E = 160, 4 query heads on 2 KV heads: head h reads KV head h // 2."""
    return _problem(*_heads(4, 2, 5, 6, E=160, seed=seed), enable_gqa=True)


def wide_past_64_rows(seed=0):
    """E = 256 at Lq 129: rows 64..127 (a second 64-row tile) written too."""
    return _problem(*_qkv(129, 9, E=256, Ev=256, seed=seed))


def split_kv_lse(seed=0):
    """op "lse": a decode against 1000 keys (a split-KV path): the LSE of all of them, not of the first 512."""
    return _problem(*_heads(2, 2, 1, 1000, seed=seed), op="lse")


def empty_query_tile(seed=0):
    """Lq 129 against Lk 33, causal bottom-right: rows 0..95 see no key (zeros), a whole 64-row tile of them."""
    return _problem(*_heads(1, 1, 129, 33, seed=seed), is_causal=True, causal_alignment="bottom_right")


def empty_rows_lse(seed=0):
    """op "lse": Lq 6 against Lk 3, causal bottom-right: rows 0..2 see no key, their LSE -inf."""
    return _problem(*_heads(2, 2, 6, 3, seed=seed), is_causal=True, causal_alignment="bottom_right", op="lse")


def decode_masked(seed=0):
    """A decode against 600 keys with a mask hiding every other key."""
    q, k, v = _heads(2, 2, 1, 600, seed=seed)
    return _problem(q, k, v, mask=(np.arange(600) % 2 == 0)[None, :])


def split_kv_key_lengths(seed=0):
    """Decodes against 1000 keys, the second sequence's cache 617 long: keys 617.. are padding."""
    return _problem(*_heads(2, 2, 1, 1000, B=2, seed=seed), kv_lengths=np.array([1000, 617]))


def long_prefill_bottom_right(seed=0):
    """Lq 768 against Lk 800, causal bottom-right: query i sees keys 0..i + 32."""
    return _problem(*_heads(1, 1, 768, 800, seed=seed), is_causal=True, causal_alignment="bottom_right")


def grouped_head_bias(seed=0):
    """4 query heads on 2 KV heads and a per-query-head bias (B, 4, Lq, Lk): each head its own."""
    q, k, v = _heads(4, 2, 4, 6, seed=seed)
    return _problem(q, k, v, enable_gqa=True, bias=_grid((1, 4, 4, 6), seed + 3, spread=2.0))


def split_kv_sinks(seed=0):
    """A decode against 600 keys with sinks 3 and 7 (a large share of each row's mass)."""
    return _problem(*_heads(2, 2, 1, 600, seed=seed), sinks=np.array([3.0, 7.0]))


def split_kv_alibi_top_left(seed=0):
    """4 queries against 600 keys, ALiBi top-left (non-causal): query i's distances are |i - j|."""
    return _problem(*_heads(2, 2, 4, 600, seed=seed), alibi_slopes=np.array([2.0 ** -4, 2.0 ** -6]))


def split_kv_key_padding_bias(seed=0):
    """4 queries against 600 keys, a (B, 1, 1, Lk) bias, the second sequence padded past key 400."""
    q, k, v = _heads(2, 2, 4, 600, B=2, seed=seed)
    bias = _grid((2, 1, 1, 600), seed + 3)  # (B, 1, 1, Lk)
    bias[1, ..., 400:] = -np.inf
    return _problem(q, k, v, bias=bias)


def head_broadcast_mask(seed=0):
    """A (B, 1, 1, Lk) boolean mask over 2 heads, the second sequence padded past key 3."""
    q, k, v = _heads(2, 2, 4, 6, B=2, seed=seed)
    mask = np.ones((2, 1, 1, 6), dtype=bool)  # (B, 1, 1, Lk)
    mask[1, ..., 4:] = False
    return _problem(q, k, v, mask=mask)


def grouped_head_bias_gradient(seed=0):
    """The backward of grouped_head_bias: dBias per query head."""
    q, k, v = _heads(4, 2, 4, 6, seed=seed)
    return _problem(q, k, v, op="backward", enable_gqa=True, bias=_grid((1, 4, 4, 6), seed + 3, spread=2.0))


def paged_long_decode_grouped(seed=0):
    """op "paged": decodes of 4 query heads on 2 KV heads against caches of 600 and 513 keys."""
    return {**_problem(*_heads(4, 2, 1, 600, B=2, seed=seed), positions="per_sequence", enable_gqa=True,
                       kv_lengths=np.array([600, 513])), "op": "paged"}


def paged_long_decode_alibi(seed=0):
    """op "paged": decodes against caches of 600 and 513 keys with ALiBi."""
    return {**_problem(*_heads(2, 2, 1, 600, B=2, seed=seed), positions="per_sequence",
                       kv_lengths=np.array([600, 513]), alibi_slopes=np.array([2.0 ** -3, 2.0 ** -5]),
                       causal_alignment="bottom_right"), "op": "paged"}


# every correct implementation agrees on these too (tests/test_teeth.py)
ALL += (wide_causal, empty_rows_lse, head_broadcast_mask, grouped_head_bias, split_kv_key_padding_bias)


def backward_empty_rows(seed=0):
    """The backward of a problem whose query 2 sees no key (a mask), 4 query heads on 2 KV heads."""
    q, k, v = _heads(4, 2, 5, 6, seed=seed)
    mask = _random_mask(5, 6)  # (Lq, Lk)
    mask[2] = False  # (Lq, Lk) query 2 sees nothing
    return _problem(q, k, v, mask=mask, op="backward", enable_gqa=True)


def backward_empty_query_tile(seed=0):
    """The backward of empty_query_tile: rows 0..95 see no key, a whole 64-row tile of them."""
    return _problem(*_heads(1, 1, 129, 33, seed=seed), is_causal=True, causal_alignment="bottom_right",
                    op="backward")


# a fifth review's paths (tests/broken/backward_block_bugs.py, split_path_bugs.py): past a 128-key block or tile
SEGMENTS_257 = np.repeat(np.arange(3), (100, 120, 37))[None]  # (1, 257) segments across 128-key blocks


def backward_window_257(seed=0):
    """The backward of a causal window (100, 0) at L 257: dK, dV of a key block's last keys need the next tile."""
    return _problem(*_heads(2, 2, 257, 257, seed=seed), is_causal=True, window=(100, 0), op="backward")


def backward_window_grouped(seed=0):
    """The backward of a causal window (8, 0) at L 130 with 4 query heads on 2 KV heads."""
    return _problem(*_heads(4, 2, 130, 130, seed=seed), is_causal=True, window=(8, 0), enable_gqa=True, op="backward")


def backward_query_broadcast_bias(seed=0):
    """The backward of a (1, 1, 1, Lk) bias under 257 queries: dBias sums every query tile's rows."""
    return _problem(*_heads(2, 2, 257, 65, seed=seed), bias=_grid((1, 1, 1, 65), seed + 3, spread=2.0), op="backward")


def backward_batch_broadcast_bias(seed=0):
    """The backward of a (1, H, Lq, Lk) bias over 2 sequences: dBias sums the batch."""
    return _problem(*_heads(2, 2, 9, 17, B=2, seed=seed), bias=_grid((1, 2, 9, 17), seed + 3, spread=2.0),
                    op="backward")


def backward_key_lengths_tail(seed=0):
    """The backward with key lengths 257 and 200: keys 200..255 of sequence 1 are padding in a tail block."""
    return _problem(*_heads(2, 2, 9, 257, B=2, seed=seed), kv_lengths=np.array([257, 200]), op="backward")


def backward_alibi_long(seed=0):
    """The backward with ALiBi against 257 keys (distances past key 127)."""
    return _problem(*_heads(2, 2, 33, 257, seed=seed), alibi_slopes=np.array([2.0 ** -1, 2.0 ** -4]), op="backward")


def backward_segments_long(seed=0):
    """The backward with segments 100, 120 and 37 long at L 257 (boundaries inside 128-row tiles)."""
    return _problem(*_heads(2, 2, 257, 257, seed=seed), q_segment_ids=SEGMENTS_257, kv_segment_ids=SEGMENTS_257,
                    op="backward")


def backward_softcap_long(seed=0):
    """The backward with a softcap of 1 against 257 keys (tanh' on every key block)."""
    return _problem(*_heads(2, 2, 20, 257, seed=seed), softcap=1.0, op="backward")


def dsink_long(seed=0):
    """op "dsink": dSink with 200 queries (two 128-row tiles) against 30 keys."""
    return {**_problem(*_heads(2, 2, 200, 30, seed=seed), sinks=np.array([1.0, 3.0]), op="backward"), "op": "dsink"}


def packed_split_kv_ragged(seed=0):
    """op "packed": 6, 3 and 5 queries against 600, 520 and 100 keys (a split-KV path), LSE too."""
    return {**_problem(*_heads(2, 2, 6, 600, B=3, seed=seed), q_lengths=np.array([6, 3, 5]),
                       kv_lengths=np.array([600, 520, 100]), positions="per_sequence"), "op": "packed"}


def paged_chunk_long_cache(seed=0):
    """op "paged": 4 queries a sequence, causal bottom-right, against caches of 600 and 530 keys."""
    return {**_problem(*_heads(2, 2, 4, 600, B=2, seed=seed), is_causal=True, causal_alignment="bottom_right",
                       positions="per_sequence", kv_lengths=np.array([600, 530])), "op": "paged"}


def paged_long_decode_window(seed=0):
    """op "paged": causal decodes with a window (100, 0) against caches of 1000 and 700 keys."""
    return {**_problem(*_heads(2, 2, 1, 1000, B=2, seed=seed), is_causal=True, causal_alignment="bottom_right",
                       positions="per_sequence", kv_lengths=np.array([1000, 700]), window=(100, 0)), "op": "paged"}


def paged_long_decode_alibi_left_padded(seed=0):
    """op "paged": causal decodes with ALiBi against caches of 1000 and 700 keys, left-padded by 3 and 40."""
    return {**_problem(*_heads(2, 2, 1, 1000, B=2, seed=seed), is_causal=True, causal_alignment="bottom_right",
                       positions="per_sequence", kv_lengths=np.array([1000, 700]), kv_starts=np.array([3, 40]),
                       alibi_slopes=np.array([2.0 ** -1, 2.0 ** -5])), "op": "paged"}


def sinks_window_257(seed=0):
    """Sinks under a causal window (100, 0) at L 257: query tiles past key block 0 keep their sink."""
    return _problem(*_heads(2, 2, 257, 257, seed=seed), is_causal=True, window=(100, 0), sinks=np.array([1.0, 3.0]))


def split_kv_softcap_alibi(seed=0):
    """A causal bottom-right decode against 1000 keys with a softcap of 1 and ALiBi."""
    return _problem(*_heads(2, 2, 1, 1000, seed=seed), is_causal=True, causal_alignment="bottom_right", softcap=1.0,
                    alibi_slopes=np.array([2.0 ** -4, 2.0 ** -8]))


def split_kv_grouped_window(seed=0):
    """16 queries against 1000 keys, 8 query heads on 2 KV heads, causal bottom-right, window (2, 0)."""
    return _problem(*_heads(8, 2, 16, 1000, seed=seed), is_causal=True, causal_alignment="bottom_right",
                    enable_gqa=True, window=(2, 0))


def split_kv_grouped_sinks(seed=0):
    """A decode against 1000 keys, 4 query heads on 2 KV heads, one sink a query head."""
    return _problem(*_heads(4, 2, 1, 1000, seed=seed), enable_gqa=True, sinks=np.array([4.0, -2.0, 1.0, 6.0]))


def fp8_split_kv_descales(seed=0):
    """fp8 decodes against 600 keys (a split-KV path), 4 query heads on 2 KV heads, descales per (batch, KV head)."""
    q, k, v = _heads(4, 2, 1, 600, B=2, seed=seed)
    q, k = q * 8, k * 8  # on the k/8 grid: fp8 rounds them, the descales bring the scores back
    qd = np.array([[0.11, 0.23], [0.17, 0.05]], dtype=np.float32).astype(np.float64)  # (B, Hkv)
    kd = np.array([[0.07, 0.19], [0.13, 0.29]], dtype=np.float32).astype(np.float64)
    vd = np.array([[1.3, 0.7], [0.45, 2.1]], dtype=np.float32).astype(np.float64)
    return _problem(q, k, v, enable_gqa=True, q_descale=qd, k_descale=kd, v_descale=vd)


ALL += (backward_window_257, backward_key_lengths_tail, backward_alibi_long, backward_segments_long,
        backward_softcap_long, dsink_long, backward_query_broadcast_bias, sinks_window_257, split_kv_softcap_alibi,
        split_kv_grouped_window, split_kv_grouped_sinks, fp8_split_kv_descales)


# a sixth review's strides and ratios (tests/broken/stride_bugs.py)
def decode_group_of_3(seed=0):
    """Decodes of 6 query heads on 2 KV heads (a group of 3: no power of two)."""
    return _problem(*_heads(6, 2, 1, 20, B=2, seed=seed), enable_gqa=True)


def mqa_decode_group_of_16(seed=0):
    """Decodes of 16 query heads on 1 KV head over two sequences (MQA; a group past an 8-row tile)."""
    return _problem(*_heads(16, 1, 1, 20, B=2, seed=seed), enable_gqa=True)


def _broadcast_mask(shape, seed):
    keep = np.random.default_rng(seed).random(shape) < 0.5  # (b, h, lq, Lk)
    keep[..., -1] = True  # every row sees its last key
    return keep


def mask_over_heads(seed=0):
    """A (B, 1, Lq, Lk) boolean mask (a model's mask expanded over heads)."""
    return _problem(*_heads(2, 2, 9, 20, B=2, seed=seed), mask=_broadcast_mask((2, 1, 9, 20), seed + 5))


def mask_over_batch(seed=0):
    """A (1, H, Lq, Lk) boolean mask over two sequences."""
    return _problem(*_heads(2, 2, 9, 20, B=2, seed=seed), mask=_broadcast_mask((1, 2, 9, 20), seed + 5))


def mask_over_queries(seed=0):
    """A (B, H, 1, Lk) boolean mask (a key mask per head) under 9 queries."""
    return _problem(*_heads(2, 2, 9, 20, B=2, seed=seed), mask=_broadcast_mask((2, 2, 1, 20), seed + 5))


def bias_over_queries(seed=0):
    """A (B, H, 1, Lk) bias under 9 queries, two sequences."""
    return _problem(*_heads(2, 2, 9, 20, B=2, seed=seed), bias=_grid((2, 2, 1, 20), seed + 3, spread=2.0))


def backward_head_dim_59(seed=0):
    """The backward at head dim 59 (no multiple of 8)."""
    return _problem(*_heads(2, 2, 9, 20, E=59, seed=seed), op="backward")


def backward_causal_more_queries(seed=0):
    """The causal top-left backward of 200 queries against 65 keys."""
    return _problem(*_heads(2, 2, 200, 65, seed=seed), is_causal=True, op="backward")


def backward_group_of_16(seed=0):
    """The backward of 16 query heads on 1 KV head."""
    return _problem(*_heads(16, 1, 9, 20, seed=seed), enable_gqa=True, op="backward")


def knob_splits_long(seed=0):
    """op "knobs": 4 queries against 600 keys at num_splits 7 (600 mod 7 = 5 keys in no whole split)."""
    kw = _problem(*_heads(2, 2, 4, 600, seed=seed), op="knobs")
    kw["knobs"] = {"num_splits": 7}
    return kw


ALL += (decode_group_of_3, mqa_decode_group_of_16, mask_over_heads, mask_over_batch, mask_over_queries,
        bias_over_queries, backward_head_dim_59, backward_causal_more_queries, backward_group_of_16)


def split_kv_wide_values(seed=0):
    """16 queries against 600 keys (a split-KV path) with a value head twice the query's (E 8, Ev 16)."""
    q, k, _ = _heads(2, 2, 16, 600, seed=seed)
    return _problem(q, k, _grid((1, 2, 600, 16), seed + 2))


def split_kv_softcap_scale(seed=0):
    """A decode against 600 keys with a softcap of 1 and an explicit scale of 0.3."""
    return _problem(*_heads(2, 2, 1, 600, seed=seed), scale=0.3, softcap=1.0)


def split_kv_window_right(seed=0):
    """16 queries against 600 keys, a non-causal window (300, 200): keys past query i + 200 hidden."""
    return _problem(*_heads(2, 2, 16, 600, seed=seed), window=(300, 200))


def split_kv_empty_split_row(seed=0):
    """16 queries against 600 keys, row 2 sees only its last key (two 256-key splits see nothing of it)."""
    mask = np.ones((16, 600), dtype=bool)
    mask[2, :-1] = False
    return _problem(*_heads(2, 2, 16, 600, seed=seed), mask=mask)


def backward_window_asymmetric(seed=0):
    """The backward at L 257 under a non-causal window (200, 10): row 256 sees keys 56.. of key block 0."""
    return _problem(*_heads(2, 2, 257, 257, seed=seed), op="backward", window=(200, 10))


def backward_window_left_unbounded(seed=0):
    """The backward at L 257 under a window unbounded on the left, (None, 20)."""
    return _problem(*_heads(2, 2, 257, 257, seed=seed), op="backward", window=(None, 20))


def backward_no_queries(seed=0):
    """The backward with no query (Lq = 0) against 20 keys: dK = dV = 0."""
    return _problem(*_heads(2, 2, 0, 20, seed=seed), op="backward")


ALL += (split_kv_wide_values, split_kv_softcap_scale, split_kv_window_right, split_kv_empty_split_row,
        backward_window_asymmetric, backward_window_left_unbounded, backward_no_queries)


def backward_group_of_3(seed=0):
    """The backward of 6 query heads on 2 KV heads (a group of 3: no shift divides by it)."""
    return _problem(*_heads(6, 2, 9, 20, seed=seed), enable_gqa=True, op="backward")


def dsink_grouped(seed=0):
    """op "dsink": dSink of 4 query heads on 2 KV heads, one sink a query head."""
    return {**_problem(*_heads(4, 2, 9, 20, seed=seed), enable_gqa=True, sinks=np.array([1.0, -2.0, 0.5, 3.0]),
                       op="backward"), "op": "dsink"}


ALL += (backward_group_of_3, dsink_grouped)


def per_sequence_with_mask(seed=0):
    """Positions per sequence (causal bottom-right, key lengths 6 and 4) beside a mask that hides scattered keys."""
    mask = _random_mask(3, 6)  # (Lq, Lk)
    return _problem(*_heads(2, 2, 3, 6, B=2, seed=seed), mask=mask, is_causal=True, causal_alignment="bottom_right",
                    positions="per_sequence", kv_lengths=np.array([6, 4]))


def segments_out_of_order(seed=0):
    """Segment ids whose runs are not in increasing order (2, 2, 0, 0, 1, 1): a binary search finds no key."""
    ids = np.array([[2, 2, 0, 0, 1, 1]])
    return _problem(*_heads(2, 2, 6, 6, seed=seed), q_segment_ids=ids, kv_segment_ids=ids)


def key_lengths_causal_bottom_right(seed=0):
    """Key lengths 7 and 4 with no query lengths, 3 queries, causal bottom-right: the padded diagonal (o = 4),
    so the second sequence's rows see all of its 4 keys; aligned at its own length (o = 1) row 0 sees 2."""
    return _problem(*_heads(2, 2, 3, 7, B=2, seed=seed), is_causal=True, causal_alignment="bottom_right",
                    kv_lengths=np.array([7, 4]))


def window_more_queries_than_keys(seed=0):
    """12 queries against 5 keys, causal bottom-right (o = -7), window (2, 2): row 9 sees keys 0..2."""
    return _problem(*_heads(2, 2, 12, 5, seed=seed), is_causal=True, causal_alignment="bottom_right", window=(2, 2))


def window_with_segments_apart(seed=0):
    """Segments whose query and key runs start apart (queries 0 0 0 1 1 1 1, keys 0 0 1 1 1 1 1), causal window
    (2, 0): query 3 sees keys 2 and 3 on the diagonal, only key 2 from its segment's start."""
    return _problem(*_heads(2, 2, 7, 7, seed=seed), is_causal=True, window=(2, 0),
                    q_segment_ids=np.array([[0, 0, 0, 1, 1, 1, 1]]), kv_segment_ids=np.array([[0, 0, 1, 1, 1, 1, 1]]))


ALL += (per_sequence_with_mask, segments_out_of_order, key_lengths_causal_bottom_right, window_more_queries_than_keys,
        window_with_segments_apart)


# ---- what travels beside the output, a ninth review (tests/broken/companion_bugs.py, fp8_bugs.py) -----------

def lse_permuted_layout(seed=0):
    """op "lse", q, k, v handed stored (B, L, H, E) (the permuted layout): 3 heads, 5 queries - the LSE read
    in another order lands on other rows."""
    return {**_problem(*_heads(3, 3, 5, 9, seed=seed), op="lse"), "layout": "permuted"}


def knob_splits_lse(seed=0):
    """op "knobs" with the LSE: 4 queries against 12 keys at num_splits 3, output and LSE against the reference."""
    kw = _problem(*_heads(2, 2, 4, 12, seed=seed), op="knobs")
    kw["knobs"], kw["return_lse"] = {"num_splits": 3}, True
    return kw


def merge_transposed(seed=0):
    """op "merge" of three states (B, H, Lq, Ev) = (1, 3, 4, 8) handed as transposed views: each row's LSEs
    apart, a dense read takes another row's."""
    rng = np.random.default_rng(seed)
    outs = np.round(rng.standard_normal((3, 1, 3, 4, 8)) * 8) / 8  # each (B, H, Lq, Ev)
    lses = np.round(rng.standard_normal((3, 1, 3, 4)) * 16) / 8  # (3, B, H, Lq)
    kw = _problem(*_heads(3, 3, 4, 6, seed=seed), op="merge")
    kw["states"], kw["layout"] = tuple(zip(outs, lses, strict=True)), "transposed"
    return kw


def fp8_compact_descales(seed=0):
    """fp8 inputs, 4 query heads on 2 KV heads, a batch of 2: descales shaped (B, 1), (1, Hkv) and (Hkv,) (each
    broadcast to (B, Hkv)), entries 2 to 10 times apart."""
    q, k, v = _heads(4, 2, 5, 9, B=2, seed=seed)
    q, k = q * 8, k * 8  # on the k/8 grid: fp8 rounds them, the descales bring the scores back
    qd = np.array([[0.11], [0.03]], dtype=np.float32).astype(np.float64)  # (B, 1)
    kd = np.array([[0.07, 0.29]], dtype=np.float32).astype(np.float64)  # (1, Hkv)
    vd = np.array([0.45, 2.1], dtype=np.float32).astype(np.float64)  # (Hkv,)
    return _problem(q, k, v, enable_gqa=True, q_descale=qd, k_descale=kd, v_descale=vd)


ALL += (lse_permuted_layout, knob_splits_lse, merge_transposed, fp8_compact_descales)


# ---- declarations past the first probes' regimes, a tenth review (tests/broken/declaration_bugs.py) -------

def batch_of_four(seed=0):
    """op "batch": four sequences of 2 heads (8 work items), each alone (2) and together, bitwise."""
    return _problem(*_heads(2, 2, 4, 9, B=4, seed=seed), op="batch")


def repeated_backward_300_keys(seed=0):
    """op "repeat_backward" against 300 keys (past two 128-key blocks), four times, bitwise."""
    return {**_problem(*_heads(2, 2, 6, 300, seed=seed), op="backward"), "op": "repeat_backward"}


def knob_splits_1100_keys(seed=0):
    """op "knobs": 4 queries against 1100 keys at num_splits 2 (bitwise the default's where knob_exact is declared)."""
    kw = _problem(*_heads(2, 2, 4, 1100, seed=seed), op="knobs")
    kw["knobs"] = {"num_splits": 2}
    return kw


def backward_key_bias_per_head(seed=0):
    """The backward with a (B, H, 1, Lk) bias under 9 queries, two sequences: dBias sums dS over the queries."""
    return _problem(*_heads(2, 2, 9, 20, B=2, seed=seed), op="backward", bias=_grid((2, 2, 1, 20), seed + 3, spread=2.0))


def empty_launches(seed=0):
    """op "empty_sizes": Lq = 0 and Lk = 0 against a call with rows: the output's dtype the same."""
    return _problem(*_heads(2, 2, 3, 5, seed=seed), op="empty_sizes")


ALL += (batch_of_four, repeated_backward_300_keys, knob_splits_1100_keys, backward_key_bias_per_head, empty_launches)


def backward_alibi_bottom_right(seed=0):
    """The backward with ALiBi, bottom-right, no causal: 3 queries against 7 keys (distances offset by 4)."""
    return _problem(*_heads(2, 2, 3, 7, seed=seed), op="backward", causal_alignment="bottom_right",
                    alibi_slopes=np.array([0.5, 0.25]))


def dsink_window(seed=0):
    """op "dsink": sinks under a causal window (2, 0) at L 9: p_sink of each row from its three keys."""
    kw = _problem(*_heads(2, 2, 9, 9, seed=seed), is_causal=True, op="backward", sinks=np.array([1.0, -0.5]),
                  window=(2, 0))
    kw["op"] = "dsink"
    return kw


ALL += (backward_alibi_bottom_right, dsink_window)


# ---- an eleventh review (tests/broken/review11_bugs.py) ------------------------------------------------------

def window_left_zero(seed=0):
    """A window (0, 1) at L 6: each query sees its own key and the next, none before."""
    return _problem(*_heads(2, 2, 6, 6, seed=seed), window=(0, 1))


def mla_chunk_bottom_right(seed=0):
    """MLA's (E, Ev) = (192, 128): 8 queries against 24 keys, causal bottom-right (a chunk against its cache)."""
    q, k, _ = _heads(2, 2, 8, 24, E=192, seed=seed)
    v = _grid((1, 2, 24, 128), seed + 2)  # (B, Hkv, Lk, Ev)
    return _problem(q, k, v, is_causal=True, causal_alignment="bottom_right")


def wide_non_causal_rows(seed=0):
    """Head dim 160, non-causal, 100 queries (past one 64-row tile) against 33 keys."""
    return _problem(*_heads(2, 2, 100, 33, E=160, seed=seed))


def hdim256_window(seed=0):
    """Head dim 256, causal L 9 under a window (2, 0)."""
    return _problem(*_heads(2, 2, 9, 9, E=256, seed=seed), is_causal=True, window=(2, 0))


def alibi_rank_slopes(seed=0):
    """ALiBi on 4 heads with rank 1's slopes of an 8-head model split over 2 ranks: 2^-5 .. 2^-8, causal L 8."""
    return _problem(*_heads(4, 4, 8, 8, seed=seed), is_causal=True, alibi_slopes=2.0 ** -np.arange(5.0, 9.0))


def backward_left_padding(seed=0):
    """The backward with left padding: keys [3, 8) and [0, 6) of 8, 3 queries, causal bottom-right."""
    return _problem(*_heads(2, 2, 3, 8, B=2, seed=seed), op="backward", is_causal=True,
                    causal_alignment="bottom_right", positions="per_sequence",
                    kv_starts=np.array([3, 0], dtype=np.int32), kv_lengths=np.array([8, 6], dtype=np.int32))


def backward_causal_e80(seed=0):
    """The backward at head dim 80, causal L 6."""
    return _problem(*_heads(2, 2, 6, 6, E=80, seed=seed), op="backward", is_causal=True)


def merge_wide(seed=0):
    """op "merge" of three finite states 512 values wide (B, H, Lq) = (1, 2, 3)."""
    rng = np.random.default_rng(seed)
    outs = np.round(rng.standard_normal((3, 1, 2, 3, 512)) * 8) / 8  # each (B, H, Lq, Ev)
    lses = np.round(rng.standard_normal((3, 1, 2, 3)) * 16) / 8  # (3, B, H, Lq)
    kw = _problem(*_heads(2, 2, 3, 6, seed=seed), op="merge")
    kw["states"] = tuple(zip(outs, lses, strict=True))
    return kw


def decode_lse_group_of_3(seed=0):
    """op "lse" of a decode (Lq = 1) with 6 query heads on 2 KV heads (groups of 3), a batch of 2, 9 keys."""
    return _problem(*_heads(6, 2, 1, 9, B=2, seed=seed), op="lse", enable_gqa=True)


def softcap_backward_grouped(seed=0):
    """The backward under a softcap 1 with 4 query heads on 2 KV heads, L 6."""
    return _problem(*_heads(4, 2, 6, 6, seed=seed), op="backward", enable_gqa=True, softcap=1.0)


ALL += (window_left_zero, mla_chunk_bottom_right, wide_non_causal_rows, hdim256_window, alibi_rank_slopes,
        backward_left_padding, backward_causal_e80, merge_wide, decode_lse_group_of_3, softcap_backward_grouped)


# ---- a twelfth review (tests/broken/review12_bugs.py) -------------------------------------------------------

def sinks_over_40_heads(seed=0):
    """Sinks on 40 query heads (-3 .. 5, each head its own), 2 queries against 3 keys: heads 32.. read their own."""
    return _problem(*_heads(40, 40, 2, 3, seed=seed), sinks=np.arange(40) % 9 - 3.0)


def alibi_over_40_heads(seed=0):
    """ALiBi on 40 heads with slopes 2^0 .. 2^-9 in turn, causal L 4: heads 32.. have slopes of their own."""
    return _problem(*_heads(40, 40, 4, 4, seed=seed), is_causal=True, alibi_slopes=2.0 ** -(np.arange(40) % 10.0))


def groups_of_20(seed=0):
    """40 query heads on 2 KV heads (groups of 20): heads 8..19 read KV head 0, 20..39 KV head 1."""
    return _problem(*_heads(40, 2, 2, 3, seed=seed), enable_gqa=True)


def decode_past_2048_keys(seed=0):
    """A decode against 2100 keys: keys 2048 and up take part."""
    return _problem(*_heads(2, 2, 1, 2100, seed=seed))


def softcap_large_launch(seed=0):
    """A softcap 1 over 2 sequences x 64 heads (128 work items of one 64-query tile), 2 queries against 3 keys."""
    return _problem(*_heads(64, 64, 2, 3, B=2, seed=seed), softcap=1.0)


def packed_repeated_boundary(seed=0):
    """op "packed": three sequences of 2, 0 and 3 queries (cu_seqlens_q 0, 2, 2, 5) against 4, 3 and 5 keys."""
    return {**_problem(*_heads(2, 2, 3, 5, B=3, seed=seed), positions="per_sequence", is_causal=True,
                       causal_alignment="bottom_right", q_lengths=np.array([2, 0, 3]), kv_lengths=np.array([4, 3, 5])),
            "op": "packed"}


def sink_only_rows_lse(seed=0):
    """op "lse": 3 queries against 2 keys, causal bottom-right (query 0 sees no key), sinks 1 and 3: that row's LSE
    is its sink's."""
    return _problem(*_heads(2, 2, 3, 2, seed=seed), op="lse", is_causal=True, causal_alignment="bottom_right",
                    sinks=np.array([1.0, 3.0]))


def query_lengths_alone(seed=0):
    """Query lengths 2 and 4 with no key lengths at Lq = Lk = 4: every query sees all 4 keys."""
    return _problem(*_heads(2, 2, 4, 4, B=2, seed=seed), q_lengths=np.array([2, 4]))


def segments_interleaved(seed=0):
    """Segment ids 0, 1, 0, 1, 0 on both sides: query 0 sees keys 0, 2 and 4, not 1 and 3."""
    ids = np.array([[0, 1, 0, 1, 0]])
    return _problem(*_heads(2, 2, 5, 5, seed=seed), q_segment_ids=ids, kv_segment_ids=ids)


def bias_batch_one_per_head(seed=0):
    """A (1, H, Lq, Lk) bias over 2 sequences, each head's rows its own."""
    q, k, v = _heads(2, 2, 3, 4, B=2, seed=seed)
    return _problem(q, k, v, bias=_grid((1, 2, 3, 4), seed + 5, spread=2.0))


ALL += (sinks_over_40_heads, alibi_over_40_heads, groups_of_20, decode_past_2048_keys, softcap_large_launch,
        packed_repeated_boundary, sink_only_rows_lse, query_lengths_alone, segments_interleaved,
        bias_batch_one_per_head)


def _fp8_sequences(op: str, seed=0, **fields):
    """fp8_descales' problem (each sequence and KV head its own descales) as two sequences of 9 and 6 keys,
    positions per sequence, in a format call (op "packed" or "paged", 2-key pages)."""
    p = fp8_descales(seed)
    return {**p, "fields": {**p["fields"], "positions": "per_sequence", "kv_lengths": np.array([9, 6]), **fields},
            "op": op}


def fp8_packed_descales(seed=0):
    """op "packed": two sequences (5 and 3 queries) whose descales differ; a packed call must read sequence b's."""
    return _fp8_sequences("packed", seed, q_lengths=np.array([5, 3]))


def fp8_paged_descales(seed=0):
    """op "paged": two sequences' 5 queries against 9 and 6 keys in 2-key pages, each its own descales."""
    return _fp8_sequences("paged", seed)


def fp8_paged_scales(seed=0):
    """op "paged": an fp8 KV cache as vLLM keeps one - no q descale (q 16-bit where declared), one k_scale and
    v_scale a tensor - two sequences' 5 queries against 9 and 6 keys in 2-key pages."""
    p = _fp8_sequences("paged", seed)
    fields = {**{n: x for n, x in p["fields"].items() if n != "q_descale"}, "k_descale": np.float32(0.19).item(),
              "v_descale": np.float32(1.3).item()}
    return {**p, "fields": fields}


ALL += (fp8_packed_descales, fp8_paged_descales, fp8_paged_scales)


def sink_only_rows(seed=0):
    """sink_only_rows_lse's problem, its output: query 0 sees no key, only its sink - its output is 0."""
    return _problem(*_heads(2, 2, 3, 2, seed=seed), is_causal=True, causal_alignment="bottom_right",
                    sinks=np.array([1.0, 3.0]))


ALL += (sink_only_rows,)


def fp8_p_rounding_paged(seed=0):
    """op "p_rounding_paged": test_fp8's P-rounding probe as a paged call, judged as declared."""
    return {"op": "p_rounding_paged", "dtype": "float8_e4m3fn", "fields": {}}


def packed_sinks_softcap(seed=0):
    """op "packed": sinks 3 and 7 beside a softcap of 4 (a sink capped with the scores moves by O(1)), queries 2 and 3
    against 5 and 4 keys."""
    return {**_problem(*_heads(2, 2, 3, 5, B=2, seed=seed), positions="per_sequence", q_lengths=np.array([2, 3]),
                       kv_lengths=np.array([5, 4]), sinks=np.array([3.0, 7.0]), softcap=4.0), "op": "packed"}


def packed_lse_groups(seed=0):
    """op "packed" with its LSE: 8 query heads on 2 KV heads, queries 3 and 2 against 5 and 4 keys."""
    q, k, v = _heads(8, 2, 3, 5, B=2, seed=seed)
    return {**_problem(2 * q, 2 * k, v, enable_gqa=True, positions="per_sequence", q_lengths=np.array([3, 2]),
                       kv_lengths=np.array([5, 4])), "op": "packed", "return_lse": True}


ALL += (fp8_p_rounding_paged, packed_sinks_softcap, packed_lse_groups)


def decode_group_of_20(seed=0):
    """A decode (Lq = 1) with 40 query heads on 2 KV heads (groups of 20), a batch of 2, 9 keys."""
    return _problem(*_heads(40, 2, 1, 9, B=2, seed=seed), enable_gqa=True)


def wide_softcap(seed=0):
    """Head dim 256, 4 queries against 9 keys, inputs spread 3 (scores past the cap), a softcap of 2."""
    q, k, v = _heads(2, 2, 4, 9, E=256, seed=seed)
    return _problem(3 * q, 3 * k, v, softcap=2.0)


def backward_hdim256_batch(seed=0):
    """The backward at head dim 256 over a batch of 2, 4 queries against 9 keys."""
    return _problem(*_heads(2, 2, 4, 9, E=256, B=2, seed=seed), op="backward")


ALL += (decode_group_of_20, wide_softcap, backward_hdim256_batch)


def long_keys_causal_chunk(seed=0):
    """4 queries against 4100 keys, causal top-left: query i sees keys 0..i only."""
    return _problem(*_heads(2, 2, 4, 4100, seed=seed), is_causal=True)


def wide_window_decode(seed=0):
    """A decode against 5000 keys, causal bottom-right, window (4096, 0): keys 903..4999."""
    return _problem(*_heads(2, 2, 1, 5000, seed=seed), is_causal=True, causal_alignment="bottom_right",
                    window=(4096, 0))


def one_sequence_key_lengths(seed=0):
    """One sequence, 4 queries, key lengths 5 of 9."""
    return _problem(*_heads(2, 2, 4, 9, seed=seed), kv_lengths=np.array([5]))


def long_prefill_masked(seed=0):
    """768 queries against 40 keys under a mask that hides 40 % of them (every row sees key 0)."""
    return _problem(*_heads(1, 1, 768, 40, seed=seed), mask=_random_mask(768, 40))


def mqa_decode_128_heads(seed=0):
    """A decode of 128 query heads on one KV head, 9 keys."""
    return _problem(*_heads(128, 1, 1, 9, seed=seed), enable_gqa=True)


def packed_33_sequences(seed=0):
    """op "packed": 33 sequences of one query against 3 to 7 keys."""
    q, k, v = _heads(2, 2, 1, 7, B=33, seed=seed)
    return {**_problem(q, k, v, positions="per_sequence", kv_lengths=3 + np.arange(33) % 5), "op": "packed"}


def merge_130_states(seed=0):
    """op "merge" of 130 finite states (B, H, Lq, Ev) = (1, 2, 3, 4), the last ones the heaviest."""
    rng = np.random.default_rng(seed)
    outs = np.round(rng.standard_normal((130, 1, 2, 3, 4)) * 8) / 8  # each (B, H, Lq, Ev)
    lses = np.round(rng.standard_normal((130, 1, 2, 3)) * 16) / 8 + np.linspace(0, 8, 130)[:, None, None, None]
    kw = _problem(*_heads(2, 2, 3, 6, seed=seed), op="merge")
    kw["states"] = tuple(zip(outs, lses, strict=True))
    return kw


def backward_bias_shared_by_heads(seed=0):
    """The backward with a bias (B, 1, Lq, Lk) over 2 sequences and 2 heads: dBias the sum of both heads' dS."""
    return _problem(*_heads(2, 2, 4, 9, B=2, seed=seed), op="backward", bias=_grid((2, 1, 4, 9), seed + 3, spread=2.0))


def backward_long_keys(seed=0):
    """The backward of 4 queries against 1100 keys (1024 + 76: a partial last 128-key chunk)."""
    return _problem(*_heads(2, 2, 4, 1100, seed=seed), op="backward")


ALL += (long_keys_causal_chunk, wide_window_decode, one_sequence_key_lengths, long_prefill_masked,
        mqa_decode_128_heads, packed_33_sequences, merge_130_states, backward_bias_shared_by_heads, backward_long_keys)


# ---- the paged call's own paths a sixteenth review reached (tests/broken/review16_bugs.py) ----------------

def paged_one_sequence(seed=0):
    """op "paged": one sequence, 3 queries against 9 keys in 2-key pages placed at random in the pool."""
    return {**_problem(*_heads(2, 2, 3, 9, seed=seed), positions="per_sequence", kv_lengths=np.array([9])),
            "op": "paged"}


def paged_head_dim_512(seed=0):
    """op "paged": decodes at head dim 512 against 7 and 5 keys (every component of Q.K^T counts)."""
    return {**_problem(*_heads(2, 2, 1, 7, E=512, B=2, seed=seed), positions="per_sequence",
                       kv_lengths=np.array([7, 5])), "op": "paged"}


def paged_knob_splits(seed=0):
    """op "paged" at knobs num_splits = 2: decodes against 9 and 7 keys (no split count divides them)."""
    return {**_problem(*_heads(2, 2, 1, 9, B=2, seed=seed), positions="per_sequence", kv_lengths=np.array([9, 7])),
            "op": "paged", "knobs": {"num_splits": 2}}


ALL += (paged_one_sequence, paged_head_dim_512, paged_knob_splits)
