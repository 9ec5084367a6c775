"""Hypothesis strategies: attention problems as float64 NumPy arrays, exact in the dtype under test.

A `Case` carries its arrays *and* the NumPy statements that rebuild them (``code``):
small problems are spelled out element by element (``np.array([...])``, so Hypothesis
shrinks them entry by entry), large ones as a seed plus a distribution
(``rng = np.random.default_rng(SEED)``).  The statements are executed to make the
arrays, so the reproducer printed on a failure is, by construction, what was run.

Every input value is exactly representable in the dtype under test (a grid of k/8 for
16-bit formats, float32 values for float32), so the adapter's cast loses nothing and the
reference sees the very numbers the backend sees.  Score magnitudes are capped per dtype
(`SCORE_CAP`) so that no correct computation overflows, while still reaching deep into
softmax saturation (score gaps of hundreds).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from specs.problem import causal_mask

LOW_PRECISION = ("float16", "bfloat16")
SMALL_MAX_LEN, SMALL_MAX_DIM = 5, 4  # element-wise up to these (at most 40 entries an array)
MEDIUM_LENGTHS, MEDIUM_DIMS = (7, 8, 9, 16, 17, 31, 32, 33, 64, 65), (7, 8, 16, 32, 64)  # block edges +-1
LARGE_LENGTHS, LARGE_DIMS = (100, 127, 128, 129, 200, 256, 257, 300), (64, 80, 128, 256)  # the seeds' d_k
LARGE_WORK = 257 * 257 * 64  # Lq * Lk * max(E, Ev) cap: 257 x 257 x 64 or 257 x 64 x 256, not 300 x 300 x 256
REGIMES = ("small", "small", "small", "medium", "medium", "large")  # element-wise half the time
BATCH_HEADS = ((1, 1), (1, 2), (2, 1), (2, 3))
# Compiling backends (JAX) get a fixed menu so a run compiles a bounded set of programs;
# Ev == Lk so the weight probe (V = identity) reuses the same shapes.
# E == Ev == Lk also suits backends that need Ev == E (jax.nn.dot_product_attention).
COMPILED_SHAPES = ((1, 1, 1, 1, 1, 1), (2, 3, 5, 3, 3, 3), (1, 2, 3, 6, 6, 6), (1, 1, 17, 64, 64, 64),
                   (1, 1, 129, 256, 256, 256))
# |score| <= 2048 in float32/float64: deep saturation (gaps of hundreds; exp overflows past 88 in
# float32 without the max subtraction) yet far from overflow.  The 16-bit formats hold the scores
# themselves (XLA, PyTorch's math path), and one rounding of a score S moves its weight by u*S
# (specs/error_budget.py puts that in the floor): past u*S ~ 2^-5 the budget could no longer tell
# a bug from rounding, so float16 stops at 64 (e^-64 is saturation enough) and bfloat16 at 8.
SCORE_CAP = {"float16": 2.0**6, "bfloat16": 2.0**3, "float32": 2.0**11, "float64": 2.0**11}
MASK_KINDS = ("none", "causal", "mask", "empty_rows", "causal_mask")
SCALES = (None, 0.5, 0.125, 1.0, 2.0, 4.0, 0.25)


@dataclass(frozen=True)
class Case:
    """One attention problem (B, H, L, E layout) and the NumPy code that rebuilds it."""

    q: np.ndarray  # (B, H, Lq, E)
    k: np.ndarray  # (B, H, Lk, E)
    v: np.ndarray  # (B, H, Lk, Ev)
    mask: np.ndarray | None  # (Lq, Lk) or (B, H, Lq, Lk), True = takes part
    is_causal: bool
    scale: float | None
    code: tuple = ()  # statements defining q, k, v, mask
    label: str = ""

    @property
    def dims(self) -> dict:
        (B, H, Lq, E), Lk, Ev = self.q.shape, self.k.shape[-2], self.v.shape[-1]
        return dict(B=B, H=H, Lq=Lq, Lk=Lk, E=E, Ev=Ev)

    def visible(self, alignment: str = "top_left") -> np.ndarray:
        """(B, H, Lq, Lk) bool: pairs that take part under the backend's causal alignment."""
        d = self.dims
        vis = np.ones((d["B"], d["H"], d["Lq"], d["Lk"]), dtype=bool)  # (B, H, Lq, Lk)
        if self.mask is not None:
            vis = vis & self.mask
        if self.is_causal:
            vis = vis & causal_mask(d["Lq"], d["Lk"], alignment)
        return vis

    def then(self, *lines: str, **extra) -> "Case":
        """Run more NumPy statements on (q, k, v, mask); the new case records them."""
        env = {"np": np, "q": self.q.copy(), "k": self.k.copy(), "v": self.v.copy(),
               "mask": None if self.mask is None else self.mask.copy(), **extra}
        exec("\n".join(lines), env)  # noqa: S102 - our own generated statements
        return dataclasses.replace(self, q=env["q"], k=env["k"], v=env["v"], mask=env["mask"],
                                   code=self.code + tuple(lines))

    def with_identity_values(self) -> "Case":
        """V = identity (Ev = Lk): the output is then the weight matrix itself."""
        d = self.dims
        return self.then(f"v = np.broadcast_to(np.eye({d['Lk']}), ({d['B']}, {d['H']}, {d['Lk']}, {d['Lk']})).copy()")

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
        return (f"Case({head}B={d['B']} H={d['H']} Lq={d['Lq']} Lk={d['Lk']} E={d['E']} Ev={d['Ev']}, "
                f"mask={mask}, is_causal={self.is_causal}, scale={self.scale!r})")


def _round_bf16(x):
    from specs.error_budget import round_bfloat16
    return round_bfloat16(x)


def literal(name: str, x: np.ndarray) -> str:
    """``name = np.array([...])``: exact (repr of a float round-trips)."""
    if x.dtype == bool:
        return f"{name} = np.array({x.tolist()!r}, dtype=bool)"
    return f"{name} = np.array({np.asarray(x, dtype=np.float64).tolist()!r})"


def _elements(dtype: str):
    if dtype in LOW_PRECISION:  # k/8 with |k| <= 32: exact in bfloat16 (8 bits) and float16
        return st.integers(-32, 32).map(lambda i: i / 8)
    ties = st.integers(-4, 4).map(float)
    width = 32 if dtype == "float32" else 64
    return st.one_of(ties, st.floats(-4, 4, width=width, allow_subnormal=False))


def _amplitude_cap(dtype, qmax, kmax, E, scale) -> int:
    """Powers of two to divide q and k by so max|score| <= SCORE_CAP (before and after scaling)."""
    eff = max(1.0, scale if scale is not None else 1.0)
    bound, shift = qmax * kmax * E * eff, 0
    while bound > SCORE_CAP[dtype]:
        bound, shift = bound / 4, shift + 1  # q and k each halved
    return shift


@st.composite
def shapes(draw, compiled: bool = False, regimes=REGIMES, equal_dims: bool = False, probe: bool = False):
    """(B, H, Lq, Lk, E, Ev); small ones first so shrinking goes there.

    equal_dims: the backend needs Ev == E; with probe (V = identity, so Ev becomes Lk) also E == Lk.
    """
    if compiled:  # the largest menu shape only where large problems are drawn at all
        menu = COMPILED_SHAPES if "large" in regimes else COMPILED_SHAPES[:-1]
        return draw(st.sampled_from(menu), label="shape")
    B, H = draw(st.sampled_from(BATCH_HEADS), label="batch, heads")
    regime = draw(st.sampled_from(regimes), label="regime")
    if regime == "small":
        (B, H), L, D = (B, min(H, 3 - B)), st.integers(1, SMALL_MAX_LEN), st.integers(1, SMALL_MAX_DIM)
    elif regime == "medium":
        L, D = st.sampled_from(MEDIUM_LENGTHS), st.sampled_from(MEDIUM_DIMS)
    else:  # realistic: one (batch, head) keeps it quick
        (B, H), L, D = (1, 1), st.sampled_from(LARGE_LENGTHS), st.sampled_from(LARGE_DIMS)
    Lq, Lk = draw(L, label="Lq"), draw(L, label="Lk")
    if equal_dims and probe:  # E = Ev = Lk; a long query side is what stays cheap
        return (B, H, Lq if Lq * Lk * Lk <= LARGE_WORK else 16, Lk, Lk, Lk)
    E = draw(D, label="E")
    Ev = E if equal_dims else draw(D, label="Ev")
    if regime == "large" and Lq * Lk * max(E, Ev) > LARGE_WORK:  # keep a realistic size quick
        E, Ev = min(E, 64), min(Ev, 64)
        Lk = Lk if Lq * Lk * max(E, Ev) <= LARGE_WORK else 64
    return (B, H, Lq, Lk, E, Ev)


def _is_small(shape) -> bool:
    B, H, Lq, Lk, E, Ev = shape
    return max(Lq, Lk) <= SMALL_MAX_LEN and max(E, Ev) <= SMALL_MAX_DIM


@st.composite
def _values_small(draw, shape, dtype):
    B, H, Lq, Lk, E, Ev = shape
    el = _elements(dtype)
    arrays = {}
    for name, dims in (("q", (B, H, Lq, E)), ("k", (B, H, Lk, E)), ("v", (B, H, Lk, Ev))):
        n = int(np.prod(dims))
        flat = draw(st.lists(el, min_size=n, max_size=n), label=name)
        arrays[name] = np.array(flat, dtype=np.float64).reshape(dims)
    return [literal(n, a) for n, a in arrays.items()]


def _recipe(dtype: str, dist: str, dims: tuple) -> str:
    if dtype in LOW_PRECISION:  # a k/8 grid, exact in every format
        base = {"normal": f"np.clip(np.round(rng.standard_normal({dims}) * 8), -32, 32) / 8",
                "ties": f"rng.integers(-2, 3, {dims}) / 1.0"}[dist]
        return base
    base = {"normal": f"rng.standard_normal({dims})", "ties": f"rng.integers(-2, 3, {dims}) / 1.0"}[dist]
    return f"({base}).astype(np.float32).astype(np.float64)" if dtype == "float32" else base


@st.composite
def _values_large(draw, shape, dtype):
    B, H, Lq, Lk, E, Ev = shape
    seed = draw(st.integers(0, 2**31 - 1), label="seed")
    lines = [f"rng = np.random.default_rng({seed})"]
    for name, dims in (("q", (B, H, Lq, E)), ("k", (B, H, Lk, E)), ("v", (B, H, Lk, Ev))):
        dist = draw(st.sampled_from(("normal", "ties")), label=f"{name} distribution")
        lines.append(f"{name} = {_recipe(dtype, dist, dims)}")
    return lines


@st.composite
def _mask_lines(draw, kind, shape, compiled, allow_empty_rows, small):
    B, H, Lq, Lk, _, _ = shape
    if kind in ("none", "causal"):
        return ["mask = None"]
    full = compiled or draw(st.booleans(), label="mask per batch and head")
    dims = (B, H, Lq, Lk) if full else (Lq, Lk)
    if small:  # draw the *hidden* pairs, so shrinking heads for "everything visible"
        n = int(np.prod(dims))
        hidden = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n), label="hidden pairs")).reshape(dims)
        lines = [literal("mask", ~hidden)]
    else:
        p = draw(st.sampled_from((0.9, 0.5, 0.1)), label="visible fraction")
        lines = ["rng_mask = np.random.default_rng(%d)" % draw(st.integers(0, 2**31 - 1), label="mask seed"),
                 f"mask = rng_mask.random({dims}) < {p}"]
    if kind == "empty_rows":
        rows = draw(st.lists(st.integers(0, Lq - 1), min_size=1, max_size=max(1, Lq // 2), unique=True),
                    label="fully masked rows")
        lines.append(f"mask[..., {sorted(rows)}, :] = False")
    if not allow_empty_rows:
        lines.append("mask[..., :, 0] = True  # every row sees key 0")
    return lines


@st.composite
def cases(draw, dtype: str, caps, compiled: bool = False, kinds=MASK_KINDS, allow_empty_rows: bool = True,
          scales=SCALES, shape=None, regimes=REGIMES, equal_dims: bool = False, probe: bool = False):
    """A Case for `dtype` within the backend's capabilities (masks, causal)."""
    shape = shape or draw(shapes(compiled, regimes, equal_dims, probe), label="shape")
    kinds = [k for k in kinds if (caps.masks or "mask" not in k) and (caps.causal or "causal" not in k)]
    if not allow_empty_rows:
        kinds = [k for k in kinds if k != "empty_rows"]
    kind = draw(st.sampled_from(kinds), label="mask kind")
    menu = ([s for s in scales if s in (None, 0.5)] or [0.5]) if compiled else scales  # a compile per scale
    scale = draw(st.sampled_from(menu), label="scale")
    small = _is_small(shape)
    lines = draw(_values_small(shape, dtype) if small else _values_large(shape, dtype))
    lines += draw(_mask_lines(kind, shape, compiled, allow_empty_rows, small))
    env = {"np": np}
    exec("\n".join(lines), env)  # noqa: S102 - our own generated statements
    qmax, kmax = float(np.abs(env["q"]).max()), float(np.abs(env["k"]).max())
    amp = draw(st.sampled_from(_amplitudes(dtype)), label="q, k amplitude (log2)")
    amp -= _amplitude_cap(dtype, qmax * 2.0**amp, kmax * 2.0**amp, shape[4], scale)  # saturate, never overflow
    if amp:
        lines.append(f"q, k = q * 2.0**{amp}, k * 2.0**{amp}")
        exec(lines[-1], env)  # noqa: S102
    return Case(env["q"], env["k"], env["v"], env["mask"], kind in ("causal", "causal_mask"), scale, tuple(lines))


def _amplitudes(dtype):
    """log2 of the q, k multiplier: plain, tiny (scores ~ 0, near-uniform), saturating."""
    return (0, -6, 3, 6) if dtype == "float16" else (0, -12, 3, 6)


def _build(lines, proto: Case) -> Case:
    env = {"np": np}
    exec("\n".join(lines), env)  # noqa: S102
    return dataclasses.replace(proto, q=env["q"], k=env["k"], v=env["v"], mask=env.get("mask"), code=tuple(lines))


def seed_case(label: str, q, k, v, mask=None, is_causal=False, scale=None) -> Case:
    """A hand-written problem (a seed's worked example) as a Case in (B=1, H=1) layout."""
    arrays = [np.asarray(x, dtype=np.float64).reshape((1, 1) + np.shape(x)[-2:]) for x in (q, k, v)]
    lines = [literal(n, a) for n, a in zip("qkv", arrays)]
    if mask is not None:
        lines.append(literal("mask", np.asarray(mask, dtype=bool)))
    else:
        lines.append("mask = None")
    return _build(lines, Case(None, None, None, None, bool(is_causal), scale, label=label))
