"""Drawing the optional problem fields: one draw per feature of specs.fields, at a documented rate.

Each optional feature a backend takes natively (`Capabilities.features`) is drawn at DRAW_RATE,
independently - grouped KV heads included; a test may require some (``need``) or rule some out
(``avoid``).  Values are exact in the dtype under test, like the inputs.  A field with a value
per sequence (lengths, segment ids) is drawn for each sequence on its own, on a batch of two or
more: a kernel that reads the first sequence's value for the whole batch fails.  Backends that
compile per shape and static argument (JAX, compiled flex) take their static choices from a
fixed table (`compiled_configs`) and small menus (windows, softcap).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st

from attnspec.specs import fields as F
from attnspec.specs.masks import alibi_slopes

# features a draw may add, each at DRAW_RATE where the backend takes it natively (the field table's
# ``drawn`` rows); the bottom-right alignment is drawn with the diagonal fields it moves, and the
# LSE is a call option
OPTIONAL = F.DRAWN
DRAW_RATE = 0.25
PER_SEQUENCE = F.PER_SEQUENCE  # a value per sequence: drawn on a batch of 2+
# 0: a real bound, no key before the diagonal (a kernel that reads the left bound by truthiness, `if left:`,
# takes it as unbounded; drawn with right 0 too, one key a row); 129: wider than two 64-key tiles (a left bound
# applied only near the diagonal)
WINDOW_LEFT, WINDOW_RIGHT = (None, 1, 2, 3, 8, 129, 0), (None, 0, 1, 2)
COMPILED_WINDOWS = ((2, 1), (None, 0), (3, None))
# ALiBi's slopes: a model's own H heads (1), or one rank's H heads of a model split over 2 or 4 ranks (Megatron,
# vLLM and FlashInfer take the rank's slice of the whole model's slopes: flashinfer#1606)
TP_RANKS = (1, 2, 4)
# (Hq, Hkv); Hypothesis favours the first: a group of 2 with 2 KV heads (MQA, Hkv = 1, hides a
# head index taken modulo Hkv or always 0); groups of 5 and 7 over 2 KV heads (Qwen's 40/8, 28/4):
# a query-head-to-KV-head map right for groups up to 4 or powers of two only
GQA_HEADS = ((4, 2), (6, 3), (2, 1), (4, 1), (6, 2), (10, 2))
# head counts that are not powers of two, where ALiBi's standard slopes interpolate
ODD_HEADS, ODD_GQA_HEADS = (3, 6, 5, 12), ((6, 3), (6, 2), (12, 4), (3, 1), (14, 2))
# (B, 1, 1, Lk): a key-padding bias, one row per sequence (a batch stride of 0 gives every sequence the first's)
BIAS_SHAPES = ("(Lq, Lk)", "(B, H, Lq, Lk)", "(1, H, 1, Lk)", "(B, 1, Lq, Lk)", "(B, 1, 1, Lk)", "(B, H, 1, Lk)")
# hidden_pairs' structures; leading runs half of them
HIDDEN_STRUCTURES = ("leading run", "scattered", "leading run", "middle block", "leading run", "whole rows")
SOFTCAP_STEPS = (-2, -1, 0, 1)  # log2 of the cap against the largest score: below, near, above it


class Config(NamedTuple):
    """A compiling backend's static choices for one problem (see `compiled_configs`)."""

    kind: int        # index into the mask kinds the test allows (modulo their number)
    scale: int       # index into the scales it allows
    window: int      # index into COMPILED_WINDOWS
    features: frozenset  # the optional fields used
    shape: int       # index into the shape menu (draws.COMPILED_SHAPES or COMPILED_GQA_SHAPES)
    grouped: bool    # fewer KV heads than query heads, where the backend takes them


def _codes(n: int) -> tuple:
    """(m, n codes): distinct vectors of GF(2)^m (as ints) outside the span of the two lowest bits
    (the counters' bits) and of the two highest (the grouping's), m the least that has n of them."""
    m = 4
    while True:
        low, high = {0, 1, 2, 3}, {0, 2**(m - 1), 2**(m - 2), 2**(m - 1) + 2**(m - 2)}
        codes = tuple(c for c in range(1, 2**m) if c not in low and c not in high)
        if len(codes) >= n:
            return m, codes[:n]
        m += 1


def _parity(r: int, code: int) -> bool:
    return bin(r & code).count("1") % 2 == 1


def compiled_configs(features: tuple | None = None) -> tuple:
    """A fixed table of static configurations for backends that compile per static argument.

    Drawn field by field, jax-dpa's static combinations (mask kind x scale x window x which of
    bias and lengths are given, per shape, dtype and call) made a new set of programs in every run;
    from a table, the programs a run builds repeat from run to run, while every array's values stay
    drawn.  Built, not searched (a covering array of strength 2 over any number of fields): the
    rows are r = 0 .. 2^m - 1; each field gets a distinct code c in GF(2)^m and row r uses it when
    r & c has odd parity.  For two distinct nonzero codes the pair of parities takes each of its four
    values in a quarter of the rows, so every field is in half the rows, every pair of fields
    together (and apart) in a quarter, and row 0 has none.  The grouping is the two highest bits of r
    (a quarter of the rows) and the mask kind and scale count with the lowest ones (kind r, scale
    r // 2); no code lies in the span of either pair, so each field is in half of the grouped rows
    and half of each kind's and scale's.  A new field takes the next code, doubling the rows when
    they run out; nothing here names a field.
    """
    fields = tuple(f for f in (OPTIONAL if features is None else features) if f not in F.IN_SHAPE)
    m, codes = _codes(len(fields))
    top = 3 << (m - 2)
    return tuple(Config(kind=r, scale=r // 2, window=r + r // 4, shape=r + r // 2,
                        features=frozenset(f for f, c in zip(fields, codes, strict=True) if _parity(r, c)),
                        grouped=r & top == top) for r in range(2**m))


COMPILED_CONFIGS = compiled_configs()


def compiled_config(draw, need: frozenset, avoid: frozenset):
    """A row of COMPILED_CONFIGS with every needed field and no avoided one (None: no such row)."""
    rows = tuple(c for c in COMPILED_CONFIGS if (need - {"gqa"}) <= c.features and not avoid & c.features
                 and ("gqa" not in need or c.grouped) and not ("gqa" in avoid and c.grouped))
    if not rows:
        return None
    return rows[draw(st.integers(0, len(rows) - 1), label="static configuration (compiling backend)")]


def chosen_features(draw, supported, need: frozenset, avoid: frozenset, config=None) -> frozenset:
    """Which optional features this problem uses: those needed, plus each supported one at DRAW_RATE.

    One byte a feature, one draw for all; the zero byte, where shrinking goes, leaves it out."""
    if config is not None:
        grouped = {"gqa"} if config.grouped else set()
        return frozenset(((config.features | grouped) & frozenset(supported) - avoid) | need)
    raw = draw(st.binary(min_size=len(OPTIONAL), max_size=len(OPTIONAL)),
               label="optional features (a byte each: 192 and up = used)")
    return frozenset(need) | {name for name, byte in zip(OPTIONAL, raw, strict=True)
                              if name in supported and name not in avoid and byte >= (1 - DRAW_RATE) * 256}


class Drawing(NamedTuple):
    """What a field's draw needs to know of the problem drawn so far."""

    shape: tuple
    fmt: str                # the dtype whose budget judges the results (values exact in it)
    score: float            # the largest score term S of q and k as drawn
    cap: float              # the dtype's score cap (draws.SCORE_CAP)
    compiled: bool
    config: Config | None
    allow_empty_rows: bool
    hides: bool             # a bias may hide keys (-inf) without emptying a row the test needs whole
    need: frozenset


def _grid_values(draw, dims, fmt: str, amplitude: float, label: str) -> np.ndarray:
    """Exact values: k/8 steps for 16-bit formats, float32 values for float32; |x| <= amplitude."""
    raw = np.random.default_rng(draw(st.integers(0, 2**31 - 1), label=f"{label} seed")).uniform(-amplitude, amplitude,
                                                                                                dims)
    if fmt in ("float16", "bfloat16"):
        return np.round(raw * 8) / 8
    return raw.astype(np.float32).astype(np.float64) if fmt == "float32" else raw


def _lead(Lk: int) -> tuple:
    """Lengths of a leading run of hidden keys: a key block's width (and one more), longer runs, half."""
    return tuple(dict.fromkeys([t for t in (64, 65, 128, 129, 256, 257) if t < Lk] + [Lk - 1, max(1, Lk // 2)]))


def hidden_pairs(draw, dims: tuple, label: str) -> np.ndarray:
    """Which pairs a mask or a -inf bias hides (dims (..., Lq, Lk)): scattered, or the structures at
    which kernels' key blocks switch paths.

    A leading run of hidden keys as long as a key block (64: flash-attention's and Triton's tutorial
    BLOCK_N at some head dims; 128: FlexAttention's block, flash-attention 2/3's; 256) or longer, in
    about half the rows - those rows see keys only past the first block, whose running max stays
    -inf (the bug the issue's Triton kernel had); a hidden block in the middle of every row; some
    rows hidden whole.  Leading runs come first: Hypothesis favours them.
    """
    Lk = dims[-1]
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1), label=f"{label}: hidden pairs seed"))
    structure = HIDDEN_STRUCTURES[draw(st.integers(0, len(HIDDEN_STRUCTURES) - 1), label=f"{label}: hidden structure")]
    if structure == "scattered":
        share = (0.1, 0.5)[draw(st.integers(0, 1), label=f"{label}: hidden share")]
        return rng.random(dims) < share
    hidden = np.zeros(dims, dtype=bool)
    if structure == "leading run":
        runs = _lead(Lk)
        t = runs[draw(st.integers(0, len(runs) - 1), label=f"{label}: leading hidden run")]
        rows = rng.random(dims[:-1]) < 0.5  # about half the rows, and the first
        rows[..., 0] = True
        hidden[..., :t] = rows[..., None]
    elif structure == "middle block":
        width = max(1, min(next((t for t in (128, 64) if 2 * t < Lk), Lk // 3), Lk - 2))
        at = 1 + int(rng.integers(0, max(1, Lk - width - 1)))  # key 0 and the last key stay
        hidden[..., at:at + width] = True
    else:  # whole rows
        hidden[rng.random(dims[:-1]) < 0.25] = True
    return hidden


def draw_bias(draw, env: Drawing) -> dict:
    """A broadcastable float bias, |bias| <= what the scores leave of the cap (a power of two, at least
    1/4), sometimes with -inf entries (`hidden_pairs`' structures; where a row must stay whole, key
    0 stays)."""
    B, H, _, Lq, Lk = env.shape[:5]
    room = min(env.cap / 4, env.cap - env.score)
    shape = BIAS_SHAPES[draw(st.integers(0, len(BIAS_SHAPES) - 1), label="bias shape")]
    dims = {"(Lq, Lk)": (Lq, Lk), "(B, H, Lq, Lk)": (B, H, Lq, Lk), "(1, H, 1, Lk)": (1, H, 1, Lk),
            "(B, 1, Lq, Lk)": (B, 1, Lq, Lk), "(B, 1, 1, Lk)": (B, 1, 1, Lk), "(B, H, 1, Lk)": (B, H, 1, Lk)}[shape]
    bias = _grid_values(draw, dims, env.fmt, float(2.0 ** np.floor(np.log2(max(room, 0.25)))), "bias")
    if env.hides and draw(st.booleans(), label="bias hides keys (-inf)"):
        hidden = hidden_pairs(draw, dims, "bias")
        if not env.allow_empty_rows:
            hidden[..., 0] = False  # key 0 stays: a row the test needs whole (causal rows see key 0)
        bias[hidden] = -np.inf
    return {"bias": bias}


def draw_window(draw, env: Drawing) -> dict:
    if env.config is not None:
        return {"window": COMPILED_WINDOWS[env.config.window % len(COMPILED_WINDOWS)]}
    if env.compiled:
        return {"window": COMPILED_WINDOWS[draw(st.integers(0, len(COMPILED_WINDOWS) - 1), label="window")]}
    left = WINDOW_LEFT[draw(st.integers(0, len(WINDOW_LEFT) - 1), label="window left")]
    right = WINDOW_RIGHT[draw(st.integers(0, len(WINDOW_RIGHT) - 1), label="window right")]
    return {"window": (left, right) if (left, right) != (None, None) else (2, 2)}


def _lengths(draw, B: int, L: int, lo: int, allow_empty: bool, label: str) -> np.ndarray:
    """A length per sequence, each drawn on its own: mostly the upper half (padding, not one key);
    0 or 1 sometimes.  Two bytes a sequence; sequence b's cut is offset by b, so the lengths of a
    batch differ wherever there is room (a kernel reading the first sequence's for all fails)."""
    keep = min(L, max(lo, (L + 1) // 2, 2))  # at least two rows or keys stay: one would judge nothing
    raw = np.frombuffer(draw(st.binary(min_size=2 * B, max_size=2 * B), label=f"{label} (two bytes a sequence)"),
                        dtype=np.uint8).reshape(B, 2).astype(np.int64)
    # sequence b's cut is offset by b: equal bytes (shrunk, or zero-filled) still give unequal lengths
    cut = L - (raw[:, 0] + np.arange(B)) % (L - keep + 1)  # (B,)
    tiny = allow_empty and L >= 2
    return np.where(tiny & (raw[:, 1] >= 240), raw[:, 1] % 2, cut)  # 1 in 16: a length of 0 or 1


def draw_lengths(draw, env: Drawing) -> dict:
    B, _, _, Lq, Lk = env.shape[:5]
    out = {"q_lengths": _lengths(draw, B, Lq, 0 if env.allow_empty_rows else Lq, env.allow_empty_rows, "q_lengths"),
           "kv_lengths": _lengths(draw, B, Lk, 1, env.allow_empty_rows, "kv_lengths")}
    # key lengths alone a quarter of the time (a batch of queries against caches of their own lengths): the
    # diagonal stays the padded one, so a kernel that aligns each sequence at its own key length (a call
    # routed to flash_attn_with_kvcache's cache_seqlens) shows under causal, windows and ALiBi
    if draw(st.integers(0, 3), label="key lengths alone (0 = no query lengths)") == 0:
        del out["q_lengths"]
    return out


def draw_segments(draw, env: Drawing) -> dict:
    """Packed sequences: runs of segment ids per sequence, each its own; the same segments on both sides."""
    B, _, _, Lq, Lk = env.shape[:5]
    most = min(3, max(2, min(Lq, Lk) // 2)) if min(Lq, Lk) >= 2 else 1  # two segments show a boundary
    choices = tuple(dict.fromkeys((min(2, most), most, 1)))
    first = draw(st.integers(0, len(choices) - 1), label="segments (first sequence; the next ones the next counts)")
    # segments a sequence, the counts taken in turn along the batch: a batch mixes them, so a kernel that
    # reads the first sequence's segment ids for every sequence packs the others wrongly
    n = np.array([choices[(first + b) % len(choices)] for b in range(B)])[:, None]  # (B, 1)
    out = {}
    for side, L in (("q", Lq), ("kv", Lk)):
        # a byte a position, offset by the sequence's index: equal bytes (shrunk, zero-filled) still pack
        # the sequences of a batch differently
        raw = np.frombuffer(draw(st.binary(min_size=B * L, max_size=B * L), label=f"{side} segment ids"),
                            dtype=np.uint8).reshape(B, L).astype(np.int64)
        out[f"{side}_segment_ids"] = np.sort((raw + np.arange(B)[:, None]) % n, axis=-1)
    # the ids relabelled by one permutation on both sides: equal ids still meet, but the runs need not be in
    # increasing order (a kernel that finds a segment's keys by binary search assumes sorted ids)
    labels = np.array(draw(st.permutations(range(3)), label="segment labels (a permutation of 0, 1, 2)"))
    return {name: labels[ids] for name, ids in out.items()}


def draw_softcap(draw, env: Drawing) -> dict:
    """A cap below, near or above the largest score (a power of two: exact in every format)."""
    if env.compiled:
        return {"softcap": 4.0}
    j = SOFTCAP_STEPS[draw(st.integers(0, len(SOFTCAP_STEPS) - 1), label="softcap vs largest score (log2)")]
    return {"softcap": float(2.0 ** (np.floor(np.log2(max(env.score, 2.0**-4))) + j))}


def draw_alibi(draw, env: Drawing) -> dict:
    """The standard slopes of H heads, or one tensor-parallel rank's H of a model with TP_RANKS times as many
    (a kernel that recomputes the standard slopes from its head count, not the caller's, passes the first)."""
    H, Lq, Lk = env.shape[1], env.shape[3], env.shape[4]
    ranks = TP_RANKS[draw(st.integers(0, len(TP_RANKS) - 1), label="ALiBi: the model's heads over H (tensor parallel)")]
    rank = draw(st.integers(0, ranks - 1), label="ALiBi: this rank") if ranks > 1 else 0
    slopes = alibi_slopes(H * ranks)[rank * H:(rank + 1) * H]  # (H,)
    if env.fmt in ("float16", "bfloat16") and "alibi" not in env.need \
            and float(np.max(slopes)) * max(Lq, Lk) > env.cap / 2:  # distances x slopes past the cap
        return {}
    return {"alibi_slopes": slopes}


def draw_sinks(draw, env: Drawing) -> dict:
    """One logit per query head, from far below a row's scores to far above (the sink then takes most
    of the row), a head's sink -inf (none) now and then; multiples of 1/4 up to 16: exact in bfloat16."""
    H = env.shape[1]
    quarters = draw(st.lists(st.integers(-64, 64), min_size=H, max_size=H), label="sinks (quarters)")
    sinks = np.asarray(quarters, dtype=np.float64) / 4  # (Hq,)
    none = draw(st.integers(0, 2 * H), label="a head without a sink (index; past H: none)")
    if none < H and H > 1:
        sinks[none] = -np.inf
    return {"sinks": sinks}


# feature -> its draw (grouped heads are drawn with the shape, the alignment with positions)
DRAWS = {"bias": draw_bias, "window": draw_window, "seq_lengths": draw_lengths, "segment_ids": draw_segments,
         "softcap": draw_softcap, "alibi": draw_alibi, "sinks": draw_sinks}


def draw_fields(draw, env: Drawing, use: frozenset, alignments: tuple) -> dict:
    """The optional fields of the features in `use`, in the table's order; the causal alignment where
    positions matter (bottom-right first where the backend takes both)."""
    fields = {}
    if env.shape[1] != env.shape[2]:
        fields["enable_gqa"] = True
    alignment = alignments[0] if len(alignments) == 1 else None
    if len(alignments) > 1:
        alignment = ("bottom_right", "top_left")[draw(st.integers(0, 1), label="causal alignment")]
    if alignment not in (None, "top_left"):  # top-left is the field's off value: not stored
        fields["causal_alignment"] = alignment
    for feature in dict.fromkeys(f.feature for f in F.FIELDS):
        if feature in use and feature in DRAWS:
            fields.update(DRAWS[feature](draw, env))
    return fields
