"""A Case: one attention problem as float64 NumPy arrays *and* the NumPy code that rebuilds it.

The statements in ``code`` are executed to make the arrays, so the reproducer printed on a
failure is, by construction, what was run (a ``np.array([...])`` literal carries the very array
its text spells and is copied rather than parsed: tests/test_suite_machinery.py checks both agree
bit for bit).  They define ``q, k, v, mask`` and ``fields`` (the
optional problem fields of `specs.problem.validate`: bias, grouped heads, causal alignment,
window, lengths, segment ids, softcap, ALiBi slopes), which every call passes on as
``backend.forward(q, k, v, mask, is_causal=..., scale=..., dtype=..., **fields)``.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

import numpy as np

from attnspec.specs.problem import Problem, validate, visible


@dataclass(frozen=True)
class Case:
    """One attention problem in (B, H, L, E) layout (K/V may have fewer heads: grouped)."""

    q: np.ndarray  # (B, Hq, Lq, E)
    k: np.ndarray  # (B, Hkv, Lk, E)
    v: np.ndarray  # (B, Hkv, Lk, Ev)
    mask: np.ndarray | None  # broadcastable to (B, Hq, Lq, Lk), True = takes part
    is_causal: bool
    scale: float | None
    code: tuple = ()  # statements defining q, k, v, mask, fields
    label: str = ""
    fields: dict = field(default_factory=dict)  # optional problem fields (specs.problem.VARIANT_DEFAULTS)

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

    def visible(self) -> np.ndarray:
        """(B, H, Lq, Lk) bool: the pairs that take part (every field counted)."""
        return visible(self.problem)

    def judged_rows(self) -> np.ndarray:
        """(B, H, Lq) bool: rows with at least one visible key (the only rows the spec judges)."""
        return self.visible().any(axis=-1)

    @property
    def call_kwargs(self) -> dict:
        """Keyword arguments of backend.forward besides q, k, v and dtype."""
        return dict(mask=self.mask, is_causal=self.is_causal, scale=self.scale, **self.fields)

    def then(self, *lines: str, **extra) -> "Case":
        """Run more NumPy statements on (q, k, v, mask, fields); the new case records them."""
        env = {"np": np, "q": self.q.copy(), "k": self.k.copy(), "v": self.v.copy(),
               "mask": None if self.mask is None else self.mask.copy(), "fields": dict(self.fields), **extra}
        exec("\n".join(lines), env)  # noqa: S102 - our own generated statements
        return dataclasses.replace(self, q=env["q"], k=env["k"], v=env["v"], mask=env["mask"],
                                   fields=env["fields"], code=self.code + _imports(extra) + tuple(lines))

    def with_identity_values(self) -> "Case":
        """V = identity (Ev = Lk): the output is then the weight matrix itself."""
        d = self.dims
        return self.then(f"v = np.broadcast_to(np.eye({d['Lk']}), ({d['B']}, {d['Hkv']}, {d['Lk']}, {d['Lk']})).copy()")

    def with_fields(self, comment: str = "", **changes) -> "Case":
        """Scalar fields changed (None or False removes one), recorded as statements."""
        lines = ["fields = dict(fields)" + (f"  # {comment}" if comment else "")]
        for name, value in changes.items():
            if isinstance(value, np.ndarray):
                raise ValueError(f"with_fields takes scalar fields; give {name} through then()")
            lines.append(f"fields.pop({name!r}, None)" if value is None or value is False
                         else f"fields[{name!r}] = {value!r}")
        return self.then(*lines)

    def rounded(self, dtype: str) -> "Case":
        """A hand-written case (the seeds') rounded to dtype, so every input is exact in it."""
        if dtype == "float64":
            return self
        fn = "round_bfloat16(x)" if dtype == "bfloat16" else f"x.astype(np.{dtype})"
        return self.then(f"q, k, v = (np.asarray({fn}, dtype=np.float64) for x in (q, k, v))",
                         round_bfloat16=_round_bf16)

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


def _imports(extra: dict) -> tuple:
    """Import statements for the functions `then` lent its statements, so the code runs on its own."""
    return tuple(f"from {f.__module__} import {f.__name__}" + ("" if f.__name__ == name else f" as {name}")
                 for name, f in extra.items() if callable(f) and getattr(f, "__module__", None))


def _short(x) -> str:
    if isinstance(x, np.ndarray):
        return f"{x.dtype.name}{x.shape}" if x.size > 8 else np.array2string(x, separator=",").replace("\n", "")
    return repr(x)


def _round_bf16(x):
    from attnspec.specs.error_budget import round_bfloat16
    return round_bfloat16(x)


class Literal(str):
    """``name = np.array([...])`` that also carries the array it spells: running the statement is a
    copy of it, not a parse (a drawn problem's literals took ~1 ms to parse, twice a draw)."""

    name: str
    value: np.ndarray


def literal(name: str, x: np.ndarray) -> Literal:
    """``name = np.array([...])``: exact (repr of a float round-trips; -inf included)."""
    if x.dtype == bool:
        text, value = f"{name} = np.array({x.tolist()!r}, dtype=bool)", np.array(x, dtype=bool)
    elif np.issubdtype(x.dtype, np.integer):
        text, value = f"{name} = np.array({x.tolist()!r})", np.array(x, dtype=np.int64)
    else:
        value = np.array(x, dtype=np.float64)
        text = f"{name} = np.array({repr(value.tolist()).replace('-inf', '-np.inf')})"
    line = Literal(text)
    line.name, line.value = name, value
    return line


def run(lines, env: dict) -> dict:
    """Execute statements into env (which has ``np``); a Literal sets its variable to a copy of its value."""
    pending = []
    for line in (*lines, None):
        if line is None or isinstance(line, Literal):
            if pending:
                exec("\n".join(pending), env)  # noqa: S102 - our own generated statements
                pending = []
            if line is not None:
                env[line.name] = line.value.copy()
        else:
            pending.append(line)
    return env


def fields_literal(fields: dict) -> str:
    """``dict(...)`` naming array fields by variable (defined by earlier statements) and values by repr."""
    parts = [f"{k}={k}" if isinstance(v, np.ndarray) else f"{k}={v!r}" for k, v in fields.items()]
    return f"dict({', '.join(parts)})"


def build(lines, proto: Case) -> Case:
    """Execute statements that define q, k, v, mask (and optionally fields) into a Case like proto."""
    env = run(lines, {"np": np})
    return dataclasses.replace(proto, q=env["q"], k=env["k"], v=env["v"], mask=env.get("mask"),
                               fields=env.get("fields", {}), code=tuple(lines))


def seed_case(label: str, q, k, v, mask=None, is_causal=False, scale=None) -> Case:
    """A hand-written problem (a seed's worked example) as a Case in (B=1, H=1) layout."""
    arrays = [np.asarray(x, dtype=np.float64).reshape((1, 1) + np.shape(x)[-2:]) for x in (q, k, v)]
    lines = [literal(n, a) for n, a in zip("qkv", arrays)]
    lines.append("mask = None" if mask is None else literal("mask", np.asarray(mask, dtype=bool)))
    lines.append("fields = {}")
    return build(lines, Case(None, None, None, None, bool(is_causal), scale, label=label))
