"""A Case: one attention problem as float64 NumPy arrays, and the transforms properties apply to it.

q, k, v, the mask and the optional fields (`specs.fields`) are arrays and values exact in the
dtype under test; every call passes them on as ``backend.forward(q, k, v, mask,
is_causal=..., scale=..., dtype=..., **fields)``.  A property changes a case only through
functions of cases (``case.replace(bias=...)``, ``case.keys(0, 3)``...), so the reproducer of a
failure needs nothing but the arrays: it runs the property's own check on them again.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

import numpy as np

from attnspec.specs import fields as F
from attnspec.specs.masks import causal_mask
from attnspec.specs.problem import Problem, validate, visible

CLASSIC = ("q", "k", "v", "mask", "is_causal", "scale", "label")
DESCALES = frozenset(F.FIELDS_OF["descale"])  # fp8 inputs' descales, one per KV head (specs.fields)


@dataclass(frozen=True)
class Case:
    """One attention problem in (B, H, L, E) layout (K/V may have fewer heads: grouped)."""

    q: np.ndarray  # (B, Hq, Lq, E)
    k: np.ndarray  # (B, Hkv, Lk, E)
    v: np.ndarray  # (B, Hkv, Lk, Ev)
    mask: np.ndarray | None = None  # broadcastable to (B, Hq, Lq, Lk), True = takes part
    is_causal: bool = False
    scale: float | None = None
    fields: dict = field(default_factory=dict)  # the optional fields given (specs.fields), none at its off value
    label: str = ""

    def replace(self, **changes) -> "Case":
        """A new case: any of q, k, v, mask, is_causal, scale, label, or a field (its off value removes it)."""
        classic = {n: changes.pop(n) for n in list(changes) if n in CLASSIC}
        unknown = sorted(set(changes) - set(F.NAMES))
        if unknown:
            raise ValueError(f"Case.replace: unknown field(s) {unknown}; fields: {', '.join(F.NAMES)}")
        fields = dict(self.fields)
        for name, value in changes.items():
            if F.is_off(name, value):
                fields.pop(name, None)
            else:
                fields[name] = value
        return dataclasses.replace(self, fields=fields, **classic)

    # ---- what it is -------------------------------------------------------------------------
    @property
    def dims(self) -> dict:
        (B, H, Lq, E), (Hkv, Lk), Ev = self.q.shape, self.k.shape[-3:-1], self.v.shape[-1]
        return dict(B=B, H=H, Hkv=Hkv, Lq=Lq, Lk=Lk, E=E, Ev=Ev)

    @functools.cached_property
    def problem(self) -> Problem:
        return validate(self.q, self.k, self.v, self.mask, self.is_causal, self.scale, **self.fields)

    @property
    def alignment(self) -> str:
        return self.fields.get("causal_alignment", "top_left")

    @property
    def group(self) -> int:
        return self.dims["H"] // self.dims["Hkv"]

    @property
    def features(self) -> frozenset:
        """The optional features the problem uses (specs.fields)."""
        return self.problem.features

    def visible(self) -> np.ndarray:
        """(B, H, Lq, Lk) bool: the pairs that take part (every field counted)."""
        return visible(self.problem)

    def lengths(self, side: str) -> np.ndarray:
        """(B,) each sequence's lengths on one side ("q" or "kv"): its q_lengths / kv_lengths field, else Lq / Lk
        (a side without the field is whole)."""
        d = self.dims
        return np.broadcast_to(self.fields.get(f"{side}_lengths", d["Lq" if side == "q" else "Lk"]), (d["B"],))

    def judged_rows(self) -> np.ndarray:
        """(B, H, Lq) bool: rows with at least one visible key (the only rows the spec judges)."""
        return self.visible().any(axis=-1)

    def sink_only_rows(self) -> np.ndarray:
        """(B, H, Lq) bool: rows that see no key beside a finite sink (their output 0, their LSE with it s_h); a row
        past its sequence's q_lengths is padding, no row.  All False without sinks."""
        sinks = self.fields.get("sinks")
        if sinks is None:
            return np.zeros_like(self.judged_rows())
        q_lengths, Lq = self.fields.get("q_lengths"), self.dims["Lq"]
        real = np.arange(Lq) < np.asarray(Lq if q_lengths is None else q_lengths)[..., None, None]  # (B, 1, Lq)
        return ~self.judged_rows() & np.isfinite(np.asarray(sinks, dtype=np.float64))[:, None] & real

    @property
    def call_kwargs(self) -> dict:
        """Keyword arguments of backend.forward besides q, k, v and dtype."""
        return dict(mask=self.mask, is_causal=self.is_causal, scale=self.scale, **self.fields)

    # ---- transforms ---------------------------------------------------------------------------
    def with_identity_values(self) -> "Case":
        """V = identity (Ev = Lk): the output is then the weight matrix itself (V's descale, if any, 1)."""
        d = self.dims
        return self.replace(v=np.broadcast_to(np.eye(d["Lk"]), (d["B"], d["Hkv"], d["Lk"], d["Lk"])).copy(),
                            v_descale=None)

    def without(self, feature: str) -> "Case":
        """The same problem without one optional feature (grouped heads: K/V repeated per query head)."""
        if feature == "gqa":
            return self.repeated_kv()
        if feature == "causal_bottom_right":
            return self.replace(causal_alignment="top_left")
        return self.replace(**{name: F.OFF[name] for name in F.FIELDS_OF[feature]})

    def repeated_kv(self) -> "Case":
        """K/V repeated per query head (PyTorch's repeat_interleave), grouping off: the same problem (fp8
        descales, one per KV head, repeated with their heads)."""
        g = self.group
        descales = {n: np.repeat(d, g, axis=-1) for n, d in self.fields.items()  # (B, Hkv) -> (B, Hq)
                    if n in DESCALES and np.ndim(d) and np.shape(d)[-1] > 1}
        return self.replace(k=np.repeat(self.k, g, axis=-3), v=np.repeat(self.v, g, axis=-3), enable_gqa=False,
                            **descales)

    def dequantized(self) -> "Case":
        """The same problem with q, k, v times their descales (fp8: the values the definition reads) and no
        descales: for invariants over the values themselves (the convex hull of V, |V|)."""
        if not DESCALES & set(self.fields):
            return self
        from attnspec.specs.reference import dequantized
        q, k, v = dequantized(self.problem)
        return self.replace(q=q, k=k, v=v, **{n: None for n in DESCALES})

    def causal_as_mask(self) -> "Case":
        """The causal triangle made part of the boolean mask (permutations move it off the diagonal)."""
        if not self.is_causal:
            return self
        d = self.dims
        tri = causal_mask(d["Lq"], d["Lk"], self.alignment)  # (Lq, Lk)
        return self.replace(mask=tri if self.mask is None else self.mask & tri, is_causal=False)

    def _along(self, side: str, take) -> dict:
        """The mask and every field with an axis on `side` (specs.fields: a field's ``axes``), taken."""
        moved = F.along(self.fields, side, take)
        axis = {"query": -2, "key": -1}[side]  # the mask's axis of that side
        if self.mask is not None and self.mask.shape[axis] > 1:
            moved["mask"] = take(self.mask, axis)
        return moved

    def permuted(self, axis: str, perm) -> "Case":
        """Queries (axis "q") or keys with their values ("k") reordered, with every field tied to them."""
        perm = list(perm)
        moved = self._along("query" if axis == "q" else "key", lambda x, ax: np.take(x, perm, axis=ax))
        if axis == "q":
            return self.replace(q=self.q[..., perm, :], **moved)
        return self.replace(k=self.k[..., perm, :], v=self.v[..., perm, :], **moved)

    def keys(self, lo: int, hi: int) -> "Case":
        """Keys lo..hi-1 and their values, with every field's key columns (the mask's, bias's, segment ids')."""
        cut = self._along("key", lambda x, ax: np.take(x, range(lo, hi), axis=ax))
        return self.replace(k=self.k[..., lo:hi, :], v=self.v[..., lo:hi, :], **cut)

    def rounded(self, dtype: str) -> "Case":
        """A hand-written case (the seeds') with q, k, v rounded to dtype, so every input is exact in it."""
        if dtype == "float64":
            return self
        from attnspec.specs.plain import round_to
        r = {n: np.asarray(round_to(getattr(self, n), dtype), dtype=np.float64) for n in ("q", "k", "v")}
        return self.replace(**r)

    # ---- as text ------------------------------------------------------------------------------
    def _repr_pretty_(self, p, cycle):  # Hypothesis' printer: the short form
        p.text(repr(self))

    def __repr__(self) -> str:
        d = self.dims
        mask = "None" if self.mask is None else f"bool{self.mask.shape} ({int((~self.mask).sum())} hidden)"
        head = f"{self.label}: " if self.label else ""
        heads = f"H={d['H']}" if d["Hkv"] == d["H"] else f"Hq={d['H']} Hkv={d['Hkv']}"
        extra = "".join(f", {k}={_short(v)}" for k, v in self.fields.items() if k != "enable_gqa")
        return (f"Case({head}B={d['B']} {heads} Lq={d['Lq']} Lk={d['Lk']} E={d['E']} Ev={d['Ev']}, "
                f"mask={mask}, is_causal={self.is_causal}, scale={self.scale!r}{extra})")


def _short(x) -> str:
    if isinstance(x, np.ndarray):
        return f"{x.dtype.name}{x.shape}" if x.size > 8 else np.array2string(x, separator=",").replace("\n", "")
    return repr(x)


def seed_case(label: str, q, k, v, mask=None, is_causal=False, scale=None) -> Case:
    """A hand-written problem (a seed's worked example) as a Case in (B=1, H=1) layout."""
    q, k, v = (np.asarray(x, dtype=np.float64).reshape((1, 1) + np.shape(x)[-2:]) for x in (q, k, v))
    return Case(q, k, v, None if mask is None else np.asarray(mask, dtype=bool), bool(is_causal), scale, label=label)
