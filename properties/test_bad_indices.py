"""Bad index arguments handed to a backend's own packed and paged hooks (issue 30, item 5).

The harness validates what it lowers (`specs.formats.validate_*`: a ValueError naming the argument);
a kernel called by a serving engine gets whatever the engine computed.  One question per bad input -
non-monotone cu_seqlens (keys or queries), cu_seqlens[-1] beyond the tensor, seqused_k over its sequence,
max_seqlen_q below a sequence's queries (a grid sized by it leaves rows unwritten), a
page id past the pool or negative, a block table too short for cache_seqlens - asks what the hook
does when handed it directly (`backends/bad_indices.py`: NaN guard memory around every tensor, so a
stray read shows).  Like the semantics profile: the answer (refused, or silently read out of bounds,
or silently took numbers) is recorded; judged only where `Semantics.rejects_bad_indices` is declared
True, when anything but a refusal fails.  A backend that reads out of bounds is a finding, not a
crash of the suite: whatever the hook raises or returns is the answer.  Asked in one dtype a backend
(float32 where it takes it): index arithmetic does not depend on the values' dtype, and a compiled
kernel's call (flex's block masks) costs a second or so each.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from attnspec.backends import bad_indices as BI
from attnspec.properties import serving_calls as S
from attnspec.properties.case import Case
from attnspec.properties.explore import prop
from attnspec.properties.test_semantics import _answer

if TYPE_CHECKING:
    from attnspec.properties.target import Target

DECLARED = {True: "refused", False: "unchecked", None: None}  # Semantics.rejects_bad_indices, as an answer


def asked_dtype(target: Target) -> str:
    """The one dtype the questions are asked in: float32 where the backend takes it, else its first."""
    dtypes = target.caps.dtypes
    return "float32" if "float32" in dtypes else dtypes[0]


def _probe_case(kind: str):
    """The question's one grid entry: the valid problem the probe lowers (what a reproducer shows)."""
    fmt, what = BI.BAD_INPUTS[kind]

    def grid(target: Target):
        q, k, v, fields = BI.problem(fmt, target.caps.fit_head_dim(4))
        return [(Case(q, k, v, None, False, None, fields, label=f"valid {fmt} probe; made bad: {what}"), {})]
    return grid


def _question(kind: str):
    fmt, what = BI.BAD_INPUTS[kind]
    question = f"bad_index_{kind}"

    def check(target: Target, case: Case, params: dict):
        if target.dtype != asked_dtype(target):
            import pytest
            pytest.skip(f"asked once a backend, in {asked_dtype(target)} (index arithmetic is the dtype's alike)")
        if fmt == "packed":
            S.skip_without(target, "packed")
        elif not S.paged_layouts(target):
            import pytest
            pytest.skip(f"{target.name} takes no paged call (declares {', '.join(target.caps.formats)})")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NaN guard memory is read on purpose
            observed, _ = target.call_backend(f"{fmt} call with {what}", BI.probe, target.backend, kind, target.dtype)
        declared = target.backend.semantics.rejects_bad_indices
        # judged where refusal is declared and the valid probe ran (else nothing to hold it to)
        judged = declared is True and observed.startswith(("refused", "silent"))
        _answer(target, question, observed, DECLARED[declared], question,
                agrees=observed.startswith("refused") if judged else None, declaration="rejects_bad_indices")
    check.__name__ = f"test_{question}"
    check.__module__ = __name__
    check.__doc__ = f"{fmt}: {what}, handed to the backend's own hook: refused, or what it silently did."
    return prop(requires=S.REQUIRES, grid=_probe_case(kind))(check)


test_bad_index_cu_seqlens_decreasing = _question("cu_seqlens_decreasing")
test_bad_index_cu_seqlens_past_tokens = _question("cu_seqlens_past_tokens")
test_bad_index_seqused_k_over_sequence = _question("seqused_k_over_sequence")
test_bad_index_cu_seqlens_q_decreasing = _question("cu_seqlens_q_decreasing")
test_bad_index_max_seqlen_q_short = _question("max_seqlen_q_short")
test_bad_index_page_id_past_pool = _question("page_id_past_pool")
test_bad_index_page_id_negative = _question("page_id_negative")
test_bad_index_table_too_short = _question("table_too_short")
