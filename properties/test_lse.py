"""Family: the log-sum-exp — lse_i = log sum_j exp(s_ij) over the visible final scores (natural log).

Backends that return it (flash kernels, PyTorch's CPU flash op, JAX's residual) are checked on
it, and on what it is for: attention over two key chunks, merged through their LSEs
(`specs.reference.merge`, flash-decoding's split-KV), equals attention over all keys.  Bugs
this catches: an LSE without the scale or scaled twice (HKUSTDial/flash-sparse-attention#106),
log2 instead of ln, an LSE of the wrong row (Dao-AILab/flash-attention#2388).
"""
from __future__ import annotations

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

from attnspec.specs import error_budget, reference
from attnspec.specs.invariants import Verdict

from attnspec.properties.judge import draw_case, fail_unless, judged_rows, output_tolerance, requires, worst
from attnspec.properties.reuse import integers

# chunks of keys cannot carry fields tied to key positions (causal, windows, ALiBi, lengths)
_POSITIONAL = frozenset({"window", "alibi", "seq_lengths"})


@given(data=st.data())
def test_lse_matches_reference(target, data):
    requires(target, "lse")
    case = draw_case(data, target)
    out, lse = target.forward(case, return_lse=True)  # (B, H, Lq, Ev), (B, H, Lq)
    rows = judged_rows(case)  # (B, H, Lq) rows with no visible key: the LSE is left open
    verdict = error_budget.check_lse(lse, case.problem, dtype=target.budget_dtype, rows=rows)
    fail_unless(verdict, "lse_matches_reference", target, case, return_lse=True,
                checks=("print(np.abs(lse - expected.lse)[visible.any(-1)].max())  # natural log of the scaled scores",))


def _chunk(case, lo: int, hi: int):
    """The keys lo..hi-1 of the case (and their mask, bias and segment columns)."""
    return case.then(f"k, v = k[..., {lo}:{hi}, :], v[..., {lo}:{hi}, :]  # keys {lo}..{hi - 1}",
                     f"mask = mask if mask is None or mask.shape[-1] == 1 else mask[..., {lo}:{hi}]",
                     "fields = dict(fields)",
                     f"if 'bias' in fields and fields['bias'].shape[-1] > 1: fields['bias'] = fields['bias'][..., {lo}:{hi}]",
                     f"if 'kv_segment_ids' in fields: fields['kv_segment_ids'] = fields['kv_segment_ids'][..., {lo}:{hi}]")


@given(data=st.data())
def test_split_merge_identity(target, data):
    """Attention over keys [0, c) and [c, Lk) merged through their LSEs equals attention over all keys."""
    requires(target, "lse")
    case = draw_case(data, target, kinds=("none", "mask", "empty_rows"), avoid=_POSITIONAL)
    Lk = case.dims["Lk"]
    assume(Lk >= 2)
    # a backend that compiles per shape splits in the middle: two chunk shapes per menu shape, not
    # a program for every split point drawn
    c = Lk // 2 if target.compiled else data.draw(integers(1, Lk - 1), label="split after key")
    full, _ = target.forward(case, return_lse=True)  # (B, H, Lq, Ev)
    parts = []
    for lo, hi in ((0, c), (c, Lk)):
        part = _chunk(case, lo, hi)
        out, lse = target.forward(part, return_lse=True)  # (B, H, Lq, Ev), (B, H, Lq)
        seen = judged_rows(part)  # a row that sees nothing in a chunk adds nothing, whatever it returned
        parts.append((np.where(seen[..., None], out, 0.0), np.where(seen, lse, -np.inf)))
    merged, _ = reference.merge(parts)  # (B, H, Lq, Ev)
    rows = judged_rows(case)
    # each chunk's output and LSE are within their budgets; the merge is exact arithmetic on them
    atol = output_tolerance(case, target.budget_dtype) + sum(
        output_tolerance(_chunk(case, lo, hi), target.budget_dtype) for lo, hi in ((0, c), (c, Lk))) + \
        error_budget.lse_allowed(case.problem, dtype=target.budget_dtype)[0] * float(np.max(np.abs(case.v), initial=0))
    where, amount = worst(np.abs(merged - full), np.broadcast_to(rows[..., None], full.shape))
    verdict = Verdict("split_merge_identity", amount <= atol, where, amount,
                      f"keys split after {c - 1}: the LSE-merged output at {where} differs from the full output by "
                      f"{amount:.6g} (allowed {atol:.3g})")
    fail_unless(verdict, "split_merge_identity", target, case, return_lse=True, checks=(
        "parts = []",
        f"for lo, hi in ((0, {c}), ({c}, k.shape[-2])):",
        "    kw = dict(call_kwargs, mask=None if mask is None else mask[..., lo:hi])",
        "    if 'bias' in kw and kw['bias'].shape[-1] > 1: kw['bias'] = kw['bias'][..., lo:hi]",
        "    if 'kv_segment_ids' in kw: kw['kv_segment_ids'] = kw['kv_segment_ids'][..., lo:hi]",
        f"    parts.append(backend.forward(q, k[..., lo:hi, :], v[..., lo:hi, :], dtype={target.dtype!r}, "
        "return_lse=True, **kw))",
        "merged, _ = reference.merge(parts)",
        "print(np.abs(merged - out).max())  # must be ~0"))
