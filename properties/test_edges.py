"""Family: the shapes where kernels switch paths — a deterministic grid, every run.

Random draws find a head dimension of 72 or a key length of 129 by chance; real kernels branch
exactly there (block multiples of the lengths, head-dim templates, Lq = 1 decode paths), and so
do their bugs: flashinfer-ai/flashinfer#5090 (Lk % 64 != 0), pytorch/pytorch#153799 (NaN when
the length is not a multiple of 128), Dao-AILab/flash-attention#2896 (head dims 72/104).  Each
grid problem is seeded by its label (`row_seed`: a row added or moved leaves every other row's data as it
was; normal inputs, exact in the dtype, default scale) and judged by the error budget.  Zero sizes (Lq = 0,
Lk = 0, batch 0) are a question of the semantics profile: a row with nothing to see is the backend's
choice, "error" included (test_semantics.py).

Sampling: backends that run eagerly get the whole grid in every dtype they declare.  Backends
that compile per shape (JAX, compiled flex) would spend minutes compiling it four times, so
the grid is dealt out over their dtypes: problem i runs in dtype i mod (number of dtypes) -
every grid shape still runs every run, in one dtype.  A backend may ask for the same
(``edge_grid_over_dtypes = True``): eager flex, one dense path for every shape.

A backend's declared shape limits (`Capabilities`: head dims, lengths, causal with Lq = Lk) leave
the problems outside them out of its grid, counted by the limit in the test's JSON row ("12
outside the declared limits (E > 128: 4; ...)"): never run, so never reported as passed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from attnspec.properties.case import Case
from attnspec.properties.draws import in_format, row_seed
from attnspec.properties.explore import prop
from attnspec.properties.judge import agreement, unchanged
from attnspec.specs import fields as F
from attnspec.specs.masks import alibi_slopes
from attnspec.specs.problem import DTYPE_NAMES

if TYPE_CHECKING:
    from attnspec.properties.target import Target

# 512: past the widest template (a kernel whose loop stops at 256 truncates instead of refusing)
HEAD_DIMS = (8, 16, 32, 59, 64, 72, 80, 96, 111, 128, 160, 192, 256, 512)
LENGTHS = (1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257)
MASKED_KEYS = (63, 64, 65, 127, 128, 129, 255, 256, 257)  # a kernel's masked path past its first key tile
DECODE_KEYS = (512, 1024, 2048)
# a split-KV (flash-decoding) path runs only for few queries against long keys, with code of its own:
# its KV-head map, its causal alignment and its mask are checked there too, at a length no split size
# divides (a split count rounded down drops the tail)
SPLIT_KEYS = 1000
# windows wider than two 64-key tiles: a kernel that applies the left bound only in the tiles
# nearest the diagonal (flash-attention's n_masking_steps) lets the keys of a farther tile through
# (100, 0): a bound no key block edge meets, so a kernel that finds a query tile's first key block from
# the tile's last row (not its first) drops keys its first rows see
# (0, 3): a left bound of 0, no key before the diagonal (a kernel that reads it by truthiness runs it unbounded)
WINDOWS = ((129, 0, True), (64, 64, False), (100, 0, True), (0, 3, False))
# (E, Ev) pairs with their own kernel instantiations: DeepSeek's MLA prefill (192, 128) and decode
# (576, 512), and a value head half or twice the query's (a template that reads V with K's row pitch,
# or sizes the output by E, is right wherever Ev = E)
UNEQUAL_HEAD_DIMS = ((192, 128), (128, 64), (64, 128))
WIDE_HEAD_DIMS = (160, 192, 256)


class Edge(NamedTuple):
    """One grid problem."""

    label: str
    B: int
    H: int
    Lq: int
    Lk: int
    E: int
    causal: bool = False
    masked: bool = False  # hidden keys at tile scale (`tile_mask`), as a mask or a -inf bias
    # optional fields (specs.fields), e.g. a window; never mutated (grid_case copies it); "bias": None draws a
    # (B, H, Lq, Lk) bias, a shape draws one of that shape (broadcast over the axes of size 1)
    fields: dict = {}
    scale: float | None = None  # None: the default 1/sqrt(E)
    # "bias": a (B, 1, 1, Lk) bias, -inf past each sequence's length; "mask": the same keys as a (B, 1, 1, Lk)
    # boolean mask (a model's attention mask expanded over heads and queries)
    key_padding: str | None = None
    Hkv: int | None = None  # KV heads (None: H); fewer: grouped heads (enable_gqa)
    alignment: str | None = None  # the causal alignment asked where Lq != Lk (None: Lq = Lk, none needed)
    Ev: int | None = None  # value's head dim (None: E)
    # "normal": standard normal q, k, v; "uniform positive": q = 0 (every score 0, every weight 1/Lk) and
    # values in [1, 2), so P V sums Lk terms of one sign: an accumulator kept in a 16-bit format grows
    # to ~1.5 Lk and rounds at each step (drawn values of both signs random-walk instead)
    inputs: str = "normal"
    empty_rows: tuple = ()  # query rows whose every key is hidden too (masked only): rows that see no key
    # masked only: the hidden keys' shape, broadcast over its axes of size 1 (None: (Lq, Lk), `tile_mask`'s);
    # e.g. (B, 1, Lq, Lk), a model's mask expanded over heads, or (B, H, 1, Lk), a key mask per head
    mask_shape: tuple | None = None

    def needs(self) -> set:
        """The features a backend must take to run this problem (the field table's, by field)."""
        names = set(self.fields) | ({"bias"} if self.key_padding == "bias" else set())
        names |= {"enable_gqa"} if self.Hkv not in (None, self.H) else set()
        return {F.BY_NAME[n].feature for n in names}

    @property
    def value_dim(self) -> int:
        return self.Ev or self.E


def grid() -> list[Edge]:
    """Every edge problem."""
    rows = [Edge(f"head dim {E}", 1, 2, 9, 65, E) for E in HEAD_DIMS]
    rows += [Edge(f"Lq {L}", 1, 2, L, 33, 64) for L in LENGTHS]
    rows += [Edge(f"Lk {L}", 1, 2, 7, L, 64) for L in LENGTHS]
    rows += [Edge(f"causal L {L}", 1, 1, L, L, 32, causal=True) for L in LENGTHS]
    rows += [Edge(f"masked Lk {L}", 1, 2, 5, L, 32, masked=True) for L in MASKED_KEYS]
    rows += [Edge(f"decode Lk {L}", 2, 2, 1, L, 64) for L in DECODE_KEYS]
    # a few queries against a long cache (speculative decode, chunked prefill): split-KV paths that merge
    # the chunks by one row's statistics are right at Lq = 1 only
    rows += [Edge(f"16 queries, Lk {L}", 2, 2, 16, L, 64) for L in DECODE_KEYS]
    # the split-KV path's own code: grouped heads (a group of 4 and one of 5), causal in each alignment
    # (a decode path that hard-wires bottom-right), hidden keys at tile scale
    L = SPLIT_KEYS
    rows += [Edge(f"decode Lk {L}, 8 query heads on 2 KV heads", 2, 8, 1, L, 64, Hkv=2),
             Edge(f"16 queries, Lk {L}, 10 query heads on 2 KV heads", 1, 10, 16, L, 64, Hkv=2)]
    rows += [Edge(f"16 queries, Lk {L}, causal {a.replace('_', '-')}", 1, 2, 16, L, 32, causal=True, alignment=a)
             for a in ("top_left", "bottom_right")]
    # hidden keys go in as a mask and as a -inf bias on alternate rows (a backend taking both): the long
    # masked rows come twice, so each form meets the split path whatever their place in the grid
    rows += [Edge(f"16 queries, masked Lk {L}{twice}", 1, 2, 16, L, 32, masked=True) for twice in ("", ", again")]
    # and the variants a decode path must carry over from prefill (a split path with no softcap, window,
    # ALiBi or bias argument drops it): a window wider than a 512-key split, ALiBi's bottom-right distances
    rows += [Edge(f"decode Lk {L}, softcap 1", 1, 2, 1, L, 64, fields={"softcap": 1.0}),
             Edge(f"decode Lk {L}, bias", 1, 2, 1, L, 64, fields={"bias": None}),
             Edge(f"decode Lk {L}, causal bottom-right, ALiBi", 1, 2, 1, L, 64, causal=True, alignment="bottom_right",
                  fields={"alibi_slopes": np.array([2.0 ** -4, 2.0 ** -8])}),
             Edge(f"16 queries, Lk {L}, causal bottom-right, window (600, 0)", 1, 2, 16, L, 32, causal=True,
                  alignment="bottom_right", fields={"window": (600, 0)})]
    # the fields a split path must read too: a mask at Lq = 1, per-sequence key lengths, sinks, a bias
    # broadcast over queries (a split path that addresses it as (..., Lq, Lk) reads past row 0)
    rows += [*(Edge(f"decode, masked Lk {L}{twice}", 1, 2, 1, L, 32, masked=True) for twice in ("", ", again")),
             Edge(f"decode Lk {L}, key lengths {L} and 617", 2, 2, 1, L, 64,
                  fields={"kv_lengths": np.array([L, 617], dtype=np.int32)}),
             # key lengths with no query lengths, causal bottom-right: the diagonal stays the padded one (a call
             # routed to a KV-cache kernel aligns each sequence at its own cache length, 617 - 16 here)
             Edge(f"16 queries, Lk {L}, causal bottom-right, key lengths {L} and 617", 2, 2, 16, L, 32, causal=True,
                  alignment="bottom_right", fields={"kv_lengths": np.array([L, 617], dtype=np.int32)}),
             Edge(f"decode Lk {L}, sinks", 1, 2, 1, L, 64, fields={"sinks": np.array([3.0, 7.0])}),
             # ... on equal scores and values of one sign: the sinks take 2 % and 52 % of each row's weight
             # whatever the draw, so a dropped sink moves the output by most of its size even in bfloat16
             Edge(f"decode Lk {L}, sinks, uniform scores, positive values", 1, 2, 1, L, 64, inputs="uniform positive",
                  fields={"sinks": np.array([3.0, 7.0])}),
             # ALiBi's distances in each alignment (a split path may take the decode's, to the last key)
             *(Edge(f"16 queries, Lk {L}, ALiBi {a.replace('_', '-')}", 1, 2, 16, L, 64, alignment=a,
                    fields={"alibi_slopes": np.array([2.0 ** -4, 2.0 ** -8])}) for a in ("top_left", "bottom_right")),
             Edge(f"16 queries, Lk {L}, key-padding bias (B, 1, 1, Lk)", 2, 2, 16, L, 32, key_padding="bias")]
    # two fields at once on the split path (each alone above): a softcap with ALiBi (the order: cap, then
    # ALiBi), a window under grouped heads (a pack-GQA row index is no query position), sinks under grouped
    # heads (one sink a query head, not a KV head's)
    rows += [Edge(f"decode Lk {L}, causal bottom-right, softcap 1 and ALiBi", 1, 2, 1, L, 64, causal=True,
                  alignment="bottom_right", fields={"softcap": 1.0, "alibi_slopes": np.array([2.0 ** -4, 2.0 ** -8])}),
             Edge(f"16 queries, Lk {L}, 8 query heads on 2 KV heads, causal bottom-right, window (2, 0)", 1, 8, 16, L,
                  32, causal=True, alignment="bottom_right", Hkv=2, fields={"window": (2, 0)}),
             Edge(f"decode Lk {L}, 4 query heads on 2 KV heads, sinks", 1, 4, 1, L, 64, Hkv=2,
                  fields={"sinks": np.array([4.0, -2.0, 1.0, 6.0])})]
    # what a split path's own launcher must pass on: a value head wider than the query's (an accumulator
    # sized by E drops columns), an explicit scale beside a softcap (a launcher that folds 1/sqrt(E) into
    # the cap), a non-causal window's right bound (a decode kernel that takes only the left)
    rows += [Edge(f"16 queries, Lk {L}, E 64, Ev 128", 1, 2, 16, L, 64, Ev=128),
             Edge(f"decode Lk {L}, softcap 1, explicit scale 0.3", 1, 2, 1, L, 64, scale=0.3, fields={"softcap": 1.0}),
             Edge(f"16 queries, Lk {L}, window (300, 200)", 1, 2, 16, L, 32, fields={"window": (300, 200)})]
    # broadcast shapes of a boolean mask (or the same -inf bias) and a bias a kernel must address by their own
    # strides: over heads (a model's expanded mask), over the batch, over queries (a key mask per head)
    rows += [Edge(f"masked (B, H, Lq, Lk) as {shape}", 2, 2, 9, 65, 32, masked=True, mask_shape=dims)
             for shape, dims in (("(B, 1, Lq, Lk)", (2, 1, 9, 65)), ("(1, H, Lq, Lk)", (1, 2, 9, 65)),
                                 ("(B, H, 1, Lk)", (2, 2, 1, 65)))]
    rows += [Edge("bias (B, H, 1, Lk)", 2, 2, 9, 65, 32, fields={"bias": (2, 2, 1, 65)})]
    # decodes under grouped heads a decode kernel maps on its own: a group of 3 (no power of two: a shift is
    # no division), a group of 16 (more than an 8-row tile packs) on one KV head over two sequences (MQA: a
    # KV cache read with batch stride 0 gives every sequence the first's)
    rows += [Edge("decode, 6 query heads on 2 KV heads", 2, 6, 1, 65, 64, Hkv=2),
             Edge("decode, 16 query heads on 1 KV head, 2 sequences", 2, 16, 1, 65, 64, Hkv=1)]
    # a sink under a window whose query tiles start past key block 0 (a kernel that folds the sink in at
    # block 0 leaves those tiles' rows without it)
    rows += [Edge("window (100, 0) causal L 257, sinks", 1, 2, 257, 257, 32, causal=True,
                  fields={"window": (100, 0), "sinks": np.array([1.0, 3.0])})]
    rows += [Edge(f"E {E}, Ev {Ev}", 1, 2, 65, 129, E, Ev=Ev) for E, Ev in UNEQUAL_HEAD_DIMS]
    # MLA's prefill template (192, 128) on a chunk against its cache: causal bottom-right with more keys than
    # queries (a template that masks top-left whatever is asked hides the chunk's own prefix)
    rows += [Edge("E 192, Ev 128, Lq 65, Lk 129, causal bottom-right", 1, 2, 65, 129, 192, Ev=128, causal=True,
                  alignment="bottom_right")]
    rows += [Edge(f"MLA decode: E 576, Ev 512, Lk {L}, 8 query heads on 1 KV head", 1, 8, 1, L, 576, Hkv=1, Ev=512)]
    # a long row's sum in one 16-bit accumulator (allow_fp16_accumulation, tl.dot(out_dtype=float16))
    rows += [Edge("uniform scores, positive values, Lk 2048", 1, 2, 4, 2048, 64, inputs="uniform positive")]
    # more (batch, head, 64-query tile) work items than a GPU has SMs (3 x 32 x 4 = 384 > 132 on an
    # H100): a persistent kernel that runs one wave and never strides its grid leaves the rest unwritten
    rows += [Edge("many work items: B 3, H 32, Lq 256", 3, 32, 256, 64, 16)]
    rows += [Edge(f"window ({left}, {right}){' causal' if causal else ''} L 257", 1, 2, 257, 257, 32, causal=causal,
                  fields={"window": (left, right)}) for left, right, causal in WINDOWS]
    # an explicit scale that is no power of two (the draws' powers of two are exact in every format: a
    # kernel that keeps the scale it is given in a 16-bit parameter passes them), on normal inputs
    rows += [Edge("explicit scale 0.3", 1, 2, 9, 65, 64, scale=0.3)]
    # the padding bias models build from an attention mask: one row a sequence, broadcast over heads
    # and queries (a kernel that reads it with batch stride 0 gives every sequence the first's)
    rows += [Edge("key-padding bias (B, 1, 1, Lk)", 3, 2, 9, 65, 32, key_padding="bias")]
    # ... and as a boolean mask (B, 1, 1, Lk) (Hugging Face's key-padding mask): a kernel that expands it
    # over heads with batch stride 0 gives every sequence the first one's keys
    rows += [Edge("key-padding mask (B, 1, 1, Lk)", 3, 2, 9, 65, 32, key_padding="mask")]
    # a per-head bias under grouped heads: read at the KV head's index, query heads of a group share one
    rows += [Edge("bias (B, H, Lq, Lk), 4 query heads on 2 KV heads", 1, 4, 9, 65, 32, Hkv=2, fields={"bias": None})]
    # the wide templates (160, 192, 256: flash-attention's instantiations of their own) each have their own
    # causal branch, KV-head map and query tiling: causal past two 64-row tiles, and grouped heads
    rows += [Edge(f"head dim {E}, causal L 129", 1, 2, 129, 129, E, causal=True) for E in WIDE_HEAD_DIMS]
    rows += [Edge(f"head dim {E}, 4 query heads on 2 KV heads", 1, 4, 9, 65, E, Hkv=2) for E in WIDE_HEAD_DIMS]
    # ... their non-causal tiling past two 64-row query tiles (a template whose non-causal launch sizes its grid
    # for 128-row tiles while running 64-row ones leaves rows unwritten), and a window in each (a template
    # launched with no left bound: pegainfer#818's head-dim 256 entry points)
    rows += [Edge(f"head dim {E}, Lq 129, Lk 65", 1, 2, 129, 65, E) for E in WIDE_HEAD_DIMS]
    # ... a softcap in each (a dispatch whose wide templates take no softcap argument: kekzl/imp#688)
    rows += [Edge(f"head dim {E}, softcap 2", 1, 2, 9, 65, E, fields={"softcap": 2.0}) for E in WIDE_HEAD_DIMS]
    rows += [Edge(f"head dim {E}, window (8, 0) causal L 129", 1, 2, 129, 129, E, causal=True,
                  fields={"window": (8, 0)}) for E in WIDE_HEAD_DIMS]
    # more queries than keys, causal bottom-right: rows 0..95 see no key, whole 64-row query tiles among them
    # (flash-attention#1778: a tile that exits early leaves its rows unwritten, whatever was declared)
    rows += [Edge("Lq 129, Lk 33, causal bottom-right: 96 rows see no key", 1, 2, 129, 33, 32, causal=True,
                  alignment="bottom_right")]
    # ... under a window: its diagonal offset Lk - Lq is negative (a kernel that clamps it at 0, or keeps it
    # unsigned, hides every key of the window's rows)
    rows += [Edge("Lq 129, Lk 33, causal bottom-right, window (4, 4)", 1, 2, 129, 33, 32, causal=True,
                  alignment="bottom_right", fields={"window": (4, 4)})]
    # packed documents under a window: the window is measured on the padded diagonal, not from each segment's
    # start (position ids that restart per document), here where the query and key segments start apart;
    # the ids' runs are not in increasing order (a kernel that finds a segment's keys by binary search)
    runs = {"q_segment_ids": ((7, 100), (2, 100), (5, 57)), "kv_segment_ids": ((7, 90), (2, 120), (5, 47))}
    rows += [Edge("segments 7, 2, 5 starting apart, window (8, 0) causal L 257", 1, 2, 257, 257, 32, causal=True,
                  fields={"window": (8, 0), **{name: np.repeat([i for i, _ in r], [n for _, n in r])[None]
                                              for name, r in runs.items()}})]
    # a long prefill's own tiling (PyTorch's CPU flash takes 256-row query tiles from Lq 768; 769: three whole
    # tiles and one row of a fourth): causal with more keys than queries in each alignment
    rows += [Edge(f"Lq 769, Lk 800, causal {a.replace('_', '-')}", 1, 1, 769, 800, 16, causal=True, alignment=a)
             for a in ("top_left", "bottom_right")]
    # ... under hidden keys, as a (Lq, Lk) mask and as a key mask (B, 1, 1, Lk) (a dispatch to that tiling that
    # drops the mask: a long padded batch attends to its padding)
    rows += [Edge("Lq 769, masked Lk 800", 1, 1, 769, 800, 16, masked=True),
             Edge("Lq 769, Lk 800, key mask (B, 1, 1, Lk)", 2, 1, 769, 800, 16, masked=True, mask_shape=(2, 1, 1, 800))]
    return rows + _wide_rows()


def _wide_rows() -> list[Edge]:
    """Past the draws' head counts, groups and key lengths (at most 14 heads, groups of 7, 2048 keys): a table
    of 32 per-head sinks or ALiBi slopes (gpt-oss-120b: 64 heads; BLOOM: 112), a pack of at most 8 query heads a
    KV head (Llama-3.1-405B: groups of 16), a split-KV buffer sized for 2048 keys; each field once at a launch
    of more (batch, head, 64-query tile) work items than a GPU has SMs (3 x 40 x 2 = 240 > 132: a launch
    heuristic that picks another kernel instantiation there); rows that see only their sink (their LSE is the
    sink's logit); and the fields' own broadcast forms the draws reach by chance only."""
    wide = dict(B=3, H=40, Lq=65, Lk=65, E=32)
    rows = [Edge("40 query heads on 2 KV heads (groups of 20), 3 sequences, Lq 65", **wide, Hkv=2),
            # ... decoding (a decode kernel's 16-head tile that takes its KV head from the tile's first head
            # reads the wrong one for heads 16..19 of a group of 20: FlashML-org/FreeToken#177)
            Edge("decode, 40 query heads on 2 KV heads (groups of 20), 3 sequences", **{**wide, "Lq": 1}, Hkv=2),
            Edge("sinks over 40 heads, 3 sequences, Lq 65", **wide, fields={"sinks": np.arange(40) % 9 - 3.0}),
            Edge("ALiBi over 40 heads, 3 sequences, Lq 65", **wide, fields={"alibi_slopes": alibi_slopes(40)}),
            Edge("softcap 1 over 3 sequences x 40 heads, Lq 65", **wide, fields={"softcap": 1.0})]
    rows += [Edge("decode Lk 4100", 1, 2, 1, 4100, 64), Edge("16 queries, Lk 4100", 1, 2, 16, 4100, 64)]
    # ... causal in each alignment (a split-KV launch past 4096 keys built without its causal flag for a chunk of
    # queries: Dao-AILab/flash-attention#1647's 16+ splits), and a window of 4096 keys over 5000 (a launcher
    # that maps a left bound as wide as its compiled context to "no window": Mistral's and Gemma's 4096)
    rows += [Edge(f"16 queries, Lk 4100, causal {a.replace('_', '-')}", 1, 2, 16, 4100, 64, causal=True, alignment=a)
             for a in ("top_left", "bottom_right")]
    rows += [Edge("decode Lk 5000, causal bottom-right, window (4096, 0)", 1, 2, 1, 5000, 64, causal=True,
                  alignment="bottom_right", fields={"window": (4096, 0)})]
    # DeepSeek's 128 query heads on one KV head, decoding (a grid that packs at most 64 query heads a KV head
    # and launches one tile leaves heads 64.. unwritten); one sequence with key lengths (a padding path gated on
    # a batch of more than one: huggingface/transformers#46773)
    rows += [Edge("decode, 128 query heads on 1 KV head", 1, 128, 1, 65, 64, Hkv=1),
             Edge("one sequence, key lengths 40 of 65", 1, 2, 9, 65, 32,
                  fields={"kv_lengths": np.array([40], dtype=np.int32)})]
    # more queries than keys, causal bottom-right, with sinks: rows 0..95 see only their sink (output 0, LSE s_h)
    rows += [Edge("Lq 129, Lk 33, causal bottom-right, sinks: 96 rows see only the sink", 1, 2, 129, 33, 32,
                  causal=True, alignment="bottom_right", fields={"sinks": np.array([1.0, 3.0])})]
    # one bias for every sequence, a row a head (a relative-position bias); query lengths with no key lengths
    # at Lq = Lk (a self-attention shortcut that unpads the keys by the queries' lengths); segment ids that
    # come back (interleaved documents: a kernel that turns an id into its keys' first..last span)
    rows += [Edge("bias (1, H, Lq, Lk) over 2 sequences", 2, 2, 9, 65, 32, fields={"bias": (1, 2, 9, 65)}),
             Edge("query lengths 40 and 65, no key lengths, L 65", 2, 2, 65, 65, 32,
                  fields={"q_lengths": np.array([40, 65], dtype=np.int32)}),
             Edge("segment ids interleaved 0, 1, 2, 0, 1, 2, ... L 65", 1, 2, 65, 65, 32,
                  fields={name: (np.arange(65) % 3)[None] for name in ("q_segment_ids", "kv_segment_ids")})]
    return rows


def tile_mask(Lq: int, Lk: int, rng) -> np.ndarray:
    """(Lq, Lk) hidden-key structures at tile scale, every row seeing its last key: row 0 sees only
    past its first 128 keys (or only its last key) - a first key block fully hidden -; row 1 a
    block of 64 hidden in the middle; past 512 keys, rows 2 and 3 see nothing in whole split-KV chunks
    (a chunk whose row sum is 0 must merge as nothing, never as an LSE of +inf); the others a random
    half hidden.  Kernels that skip, drop or
    mis-rescale a masked block (a dispatcher's mask-less long path; a running max of -inf over a
    hidden first block) fail here every run, not by the chance of a draw."""
    keep = rng.random((Lq, Lk)) < 0.5  # (Lq, Lk)
    keep[0] = np.arange(Lk) >= min(128, Lk - 1)
    if Lq > 1:
        keep[1] = ~((np.arange(Lk) >= 64) & (np.arange(Lk) < 128)) if Lk > 128 else np.arange(Lk) % 2 == 1
    if Lq > 3 and Lk > 512:  # past a split-KV chunk: row 2 sees only its last key, row 3 its first 64 and last
        keep[2], keep[3] = False, np.arange(Lk) < 64  # (Lk,) each: whole chunks of the row see nothing
    keep[:, -1] = True
    return keep


def grid_case(edge: Edge, dtype: str, as_bias: bool = False) -> Case:
    B, H, Lq, Lk, E, Ev, label = edge.B, edge.H, edge.Lq, edge.Lk, edge.E, edge.value_dim, edge.label
    rng = np.random.default_rng(row_seed(label))
    Hkv = edge.Hkv or H
    q = in_format(rng.standard_normal((B, H, Lq, E)), dtype)  # (B, H, Lq, E)
    k = in_format(rng.standard_normal((B, Hkv, Lk, E)), dtype)  # (B, Hkv, Lk, E)
    v = in_format(rng.standard_normal((B, Hkv, Lk, Ev)), dtype)  # (B, Hkv, Lk, Ev)
    if edge.inputs == "uniform positive":
        q, v = np.zeros_like(q), in_format(1.0 + rng.random(v.shape), dtype)  # (B, H, Lq, E), (B, Hkv, Lk, Ev)
    fields = dict(edge.fields)
    if "bias" in fields:  # drawn here, per dtype and seed, (B, H, Lq, Lk) or the shape the edge gives
        fields["bias"] = in_format(rng.standard_normal(fields["bias"] or (B, H, Lq, Lk)), dtype)  # (B, H, Lq, Lk)
    if Hkv != H:
        fields["enable_gqa"] = True
    if edge.alignment not in (None, "top_left"):  # top-left is the field's off value: not stored
        fields["causal_alignment"] = edge.alignment
    if edge.key_padding:
        lengths = [max(1, Lk - 17 * b) for b in range(B)]  # the first sequence whole, the others padded
        padded = np.arange(Lk) >= np.array(lengths)[:, None, None, None]  # (B, 1, 1, Lk)
        if edge.key_padding == "mask":
            return Case(q, k, v, ~padded, edge.causal, edge.scale, fields, label=label)
        bias = in_format(rng.standard_normal((B, 1, 1, Lk)), dtype)  # (B, 1, 1, Lk)
        bias[padded] = -np.inf
        fields["bias"] = bias
    if not edge.masked:
        return Case(q, k, v, None, edge.causal, edge.scale, fields, label=label)
    keep = tile_mask(Lq, Lk, rng)  # (Lq, Lk)
    keep[list(edge.empty_rows)] = False  # (Lq, Lk) these rows see no key
    if edge.mask_shape is not None:  # every slice its own half of the keys hidden, each row its last key seen
        keep = rng.random(edge.mask_shape) < 0.5  # (b, h, lq, Lk) broadcast over the axes of size 1
        keep[..., -1] = True
    if as_bias:  # a backend without boolean masks takes the same hidden keys as a -inf bias
        return Case(q, k, v, None, edge.causal, edge.scale, {**fields, "bias": np.where(keep, 0.0, -np.inf)},
                    label=label)
    return Case(q, k, v, keep, edge.causal, edge.scale, fields, label=label)


def _mine(target: Target, i: int) -> bool:
    if not (target.compiled or target.backend.edge_grid_over_dtypes):
        return True
    dtypes = [d for d in DTYPE_NAMES if d in target.caps.dtypes]
    return target.dtype in dtypes and dtypes.index(target.dtype) == i % len(dtypes)


def _limit(why: str) -> str:
    """A broken limit as a kind ("E=160 > 128" -> "E > 128"): the count groups the sizes it left out."""
    name, _, rest = why.partition("=")
    return f"{name} {rest.split(' ', 1)[1]}" if " " in rest else why


def grid_problems(target: Target, rows: list[Edge] | None = None) -> list:
    """The problems of a grid (`grid()` unless `rows`) this target runs; those its declared limits
    exclude (Capabilities.outside) are left out by construction and counted on the target, by the
    limit (its JSON row says so)."""
    out, left, n = [], {}, 0
    hides = target.caps.masks or target.supports("bias")
    for i, edge in enumerate(grid() if rows is None else rows):
        if (not _mine(target, i) or (edge.causal and not target.caps.causal) or (edge.masked and not hides)
                or (edge.key_padding == "mask" and not target.caps.masks)
                or not all(target.supports(f) for f in edge.needs())
                or (edge.alignment is not None and edge.alignment not in target.alignments)):
            continue
        broken = target.caps.outside(edge.E, edge.value_dim, edge.Lq, edge.Lk, edge.causal)
        if edge.value_dim != edge.E and not target.caps.equal_head_dims and target.equal_head_dims:
            broken.append(f"Ev={edge.value_dim} != E={edge.E}")  # found by asking (Target.equal_head_dims)
        if broken:
            n += 1
            for why in dict.fromkeys(_limit(w) for w in broken):
                left[why] = left.get(why, 0) + 1
            continue
        # hidden keys in every form the backend takes: a backend with masks and a bias gets every other
        # masked shape as a -inf bias (a kernel's -inf bias path is not its mask path)
        as_bias = not target.caps.masks or (target.supports("bias") and i % 2 == 1)
        case = grid_case(edge, target.dtype, as_bias=as_bias)
        out.append((target.exact(case), {}))  # fp8: q, k, v rounded to its formats
    target.left_out, target.outside_limits = n, left
    return out


@prop(grid=grid_problems)
def test_edge_shapes_match_reference(target: Target, case: Case, params: dict):
    """Every grid shape (head dims, block edges of Lq and Lk, causal block edges, masked key tiles, decode,
    a few queries against long keys with each variant, value head dims other than the query's, a long
    row of one sign, many work items, windows wider than two key tiles, a non-dyadic explicit scale,
    a key-padding bias and mask, rows that see no key)."""
    out = agreement(target, case)
    if target.backend.semantics.fully_masked == "zeros":  # a row that sees nothing is judged by the declaration
        unchanged("edge_shapes_match_reference", np.zeros_like(out), out, ~case.judged_rows(), "a row that sees no key")
    if case.fields.get("sinks") is not None:  # a row that sees only its finite sink: no open choice, the sink takes
        # all its weight (exp(s_h) / exp(s_h)) and its value is 0 - whatever a fully masked row is declared to give
        unchanged("edge_shapes_match_reference", np.zeros_like(out), out, case.sink_only_rows(),
                  "a row that sees only its sink (its output is 0 by definition, not the fully masked row's choice)")
