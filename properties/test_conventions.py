"""Conventions kernels differ on (issue 31): the LSE's base, the LSE of an empty row, repeated calls,
batch invariance.  Questions like the semantics profile's (test_semantics.py): a declared answer
(`Semantics.lse_base`, `empty_lse`, `deterministic`, `batch_invariant`) is judged, an undeclared one
recorded.  Each runs on one fixed probe.

- lse_base: FlashInfer returns log2-sum-exp2 (flashinfer#2113); a declared base 2 is converted to
  natural by `Backend.forward`, an undeclared one is read as observed, so the LSE properties judge
  the values either way.
- empty_row_lse: FA2 returns +inf for a row that sees nothing, FA3 -inf (the LSE properties leave
  such rows open; this says what they hold).
- repeated calls: the forward bitwise equal over repeats (every backend), the backward too (where it
  computes gradients): Dao-AILab/flash-attention#2244, `deterministic=True` still nondeterministic.
- batch invariance: a sequence's rows bitwise the same alone and among others (vLLM's
  VLLM_BATCH_INVARIANT, FlashInfer's fixed_split_size).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnspec.properties.conventions import LN2, base_of, bitwise, empty_lse_of, probe
from attnspec.properties.explore import prop
from attnspec.properties.judge import grad_out
from attnspec.properties.test_semantics import _answer, _probe, _run

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target

REPEATS = 2  # calls compared: a random reduction order shows at once (each call costs a compiling backend's time)
_SMALL = (1, 2, 3, 4)  # (B, H, Lq, Lk): the semantics profile's probe shape, which a compiling backend has built
# past two 128-key blocks (a backward that adds each key block's dQ in a race order, a split that acts only past
# one block), a batch of two: for eager backends
_BIG = (2, 2, 24, 300)
# a batch wide enough that batch x heads (128 work items) passes a split heuristic's threshold (a GPU's ~100 SMs;
# fewer items: split the keys), which a batch of three (6 items) leaves on the split path alone and in the batch
_WIDE_BATCH = 64


def _sized(target: Target, seed: int, batch: int | None = None) -> Case:
    """The probe at _BIG for an eager backend; at _SMALL (batch: B) for one that compiles per shape, so the
    questions add no program or one (JAX's and compiled flex's compiles dominate their cost)."""
    shape = _SMALL if target.compiled else _BIG
    return probe(target, shape=((batch or shape[0]),) + shape[1:], seed=seed)


def _with_lse(target: Target, case: Case):
    """(out, lse) as the backend returned them (a declared base 2 back in base 2), or an answer string."""
    try:
        out, lse = target.forward(case, return_lse=True)
    except Exception as e:  # noqa: BLE001 - an answer like the semantics profile's (_run)
        res, _ = _run(target, case)
        if isinstance(res, str):
            return res, None
        raise e
    return out, (lse / LN2 if target.backend.semantics.lse_base == "2" else lse)


def _empty_row_probe(target: Target):
    case = probe(target)
    mask = np.ones(case.q.shape[:-1] + case.k.shape[-2:-1], dtype=bool)  # (B, H, Lq, Lk)
    mask[..., 1, :] = False  # query 1 sees nothing
    return case.replace(mask=mask)


def _lse_probe(target: Target):
    return _empty_row_probe(target) if target.caps.masks else probe(target)


@prop(requires=("lse",), grid=_probe(_lse_probe))
def test_lse_base(target: Target, case: Case, params: dict):
    """The base of the returned log-sum-exp (on the rows that see keys): e (the spec's) or 2 (FlashInfer)."""
    out, lse = _with_lse(target, case)
    if lse is not None and target.backend.semantics.lse_base is None:  # what Target read it as: the raw call
        _, lse = target.call_backend("forward", target.backend.forward, case.q, case.k, case.v, dtype=target.dtype,
                                     return_lse=True, **case.call_kwargs)
    observed = out if lse is None else base_of(target, lse, case)
    _answer(target, "lse_base", observed, target.backend.semantics.lse_base, "lse_base")


@prop(requires=("lse",), needs=("masks",), grid=_probe(_empty_row_probe))
def test_empty_row_lse(target: Target, case: Case, params: dict):
    """The LSE of a row with no visible key: -inf (FA3, the reference), +inf (FA2), NaN or a fill value."""
    out, lse = _with_lse(target, case)
    observed = out if lse is None else empty_lse_of(lse[..., 1])
    _answer(target, "empty_lse", observed, target.backend.semantics.empty_lse, "empty_row_lse")


def _declared_bitwise(flag) -> str | None:
    return None if flag is None else "bitwise" if flag else None


@prop(grid=_probe(lambda t: _sized(t, 3)))
def test_repeated_forward(target: Target, case: Case, params: dict):
    """The same call repeated: bitwise the same output (judged where `deterministic` is declared)."""
    first = target.forward(case)
    observed = "bitwise" if all(bitwise(first, target.forward(case)) for _ in range(REPEATS - 1)) else "differs"
    _answer(target, "deterministic_forward", observed, _declared_bitwise(target.backend.semantics.deterministic),
            "repeated_forward", declaration="deterministic")


@prop(gradients=True, grid=_probe(lambda t: _sized(t, 4)))
def test_repeated_backward(target: Target, case: Case, params: dict):
    """The same backward repeated: bitwise the same dQ, dK, dV (FA3 #2244: deterministic=True was not)."""
    g = grad_out(case, target.dtype, seed=4)  # (B, H, Lq, Ev)
    first = target.backward(case, g)
    same = all(all(bitwise(a, b) for a, b in zip(first, target.backward(case, g), strict=True))
               for _ in range(REPEATS - 1))
    _answer(target, "deterministic_backward", "bitwise" if same else "differs",
            _declared_bitwise(target.backend.semantics.deterministic), "repeated_backward", declaration="deterministic")


@prop(grid=_probe(lambda t: _sized(t, 5, batch=2 if t.compiled else _WIDE_BATCH)))
def test_batch_invariance(target: Target, case: Case, params: dict):
    """The last sequence's rows bitwise the same alone and in the batch (of 64: past a split heuristic's
    work-item threshold; two where it compiles)."""
    whole = target.forward(case)  # (B, H, Lq, Ev)
    alone = target.forward(case.replace(q=case.q[-1:], k=case.k[-1:], v=case.v[-1:]))  # (1, H, Lq, Ev)
    same = bitwise(alone[0], whole[-1])
    _answer(target, "batch_invariant", "bitwise" if same else "differs",
            _declared_bitwise(target.backend.semantics.batch_invariant), "batch_invariance")
