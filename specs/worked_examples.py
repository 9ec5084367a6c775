"""The seeds' worked examples as data, each printed number recomputed and judged.

`EXAMPLES`: every printed number (`worked_examples_data`), parsed: value, printed decimals.
`SEED_PROBLEMS`: the seeds' concrete attention problems as arrays (for backend tests and
Hypothesis ``@example``s).  `check()` recomputes each number with the reference and says
whether the seed printed it right.

Judging at the printed precision: a number agrees when

    |printed - computed| <= half a unit of its last printed digit + propagated

``computed`` comes from the seed's exact inputs.  ``propagated`` is what the rounding of the
*printed intermediate* numbers the seed derived it from can explain: for each such input
the change of the result when that input moves by half a unit of its last digit (a
first-order bound).  An input printed exactly (1.0, 0.5*X) carries no rounding; inputs
whose true values the seed never gives (seed 004's scores, seed 000's causal scores) are
taken as printed and always carry their rounding.  A number outside that is an erratum:
printed and computed are kept side by side with a note - never adjusted.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from attnspec.specs import cost, invariants, reference
from attnspec.specs.worked_examples_data import K000, PRINTED, SCORES004, SEED_PROBLEMS, SOURCES, V000, X003


def run(problem: dict):
    """The reference forward of a SEED_PROBLEMS entry."""
    return reference.forward(problem["q"], problem["k"], problem["v"], problem["mask"],
                             problem["is_causal"], problem["scale"])


@dataclass(frozen=True)
class Example:
    source: str      # file name in ../shared/seeds
    quantity: str
    printed: str     # verbatim
    value: float     # parsed
    decimals: int    # digits after the decimal point as printed (6 for "8e-06")
    half_unit: float  # half a unit of the last printed digit


def parse(text: str):
    """Printed text -> (value, decimals, half_unit).  Decimal commas, U+2212 minus, "~",
    "±", "-inf", "8e-06", "268M" and "50/50" (read as one half at one decimal)."""
    t = text.strip().replace("−", "-").replace(",", ".").replace(" ", "")
    approx = t[:1] in ("~", "±")
    t = t.lstrip("~±")
    if t == "50/50":
        return 0.5, 1, 0.05
    if t.lstrip("+-") in ("∞", "inf"):
        return (-math.inf if t.startswith("-") else math.inf), 0, 0.0
    m = re.fullmatch(r"([+-]?\d+)(?:\.(\d+))?(?:e([+-]?\d+)|(M))?", t)
    if not m:
        raise ValueError(f"printed number {text!r} is not understood")
    whole, frac, exp, mega = m.groups()
    frac = frac or ""
    power = int(exp) if exp else (6 if mega else 0)
    decimals = len(frac) - power
    if approx and not frac and power == 0 and whole.strip("+-") != "0":
        decimals = -(len(whole) - len(whole.rstrip("0")))  # "~270": good to the tens
    value = float(f"{whole}.{frac or 0}") * 10.0**power
    return value, decimals, 0.5 * 10.0**-decimals


def _examples():
    out = []
    for key, rows in PRINTED.items():
        for quantity, text in rows:
            value, decimals, half = parse(text)
            out.append(Example(SOURCES[key], quantity, text, value, decimals, half))
    return out


EXAMPLES = _examples()


@dataclass(frozen=True)
class Row:
    source: str
    quantity: str
    printed: str
    value: float
    decimals: int
    computed: float
    from_printed: float | None  # the seed's own arithmetic on its printed inputs, if any
    tolerance: float
    agrees: bool
    note: str
    kind: str = "recomputed"  # "input": one of the seed's inputs, checked against its transcription only


class _Book:
    """Exact values, derivations (f, printed inputs) and notes for one source."""

    def __init__(self, key):
        self.key, self.exact, self.derive, self.notes, self.kind = key, {}, {}, {}, {}

    def put(self, q, value, derive=None, note=None, kind="value"):
        self.exact[q] = float(value)
        if derive:
            self.derive[q] = derive
        if note:
            self.notes[q] = note
        self.kind[q] = kind


def _book000() -> _Book:
    b = _Book("000")
    P = SEED_PROBLEMS["000_example"]
    fw = run(P)
    for name, arr in (("example.Q", P["q"]), ("example.K", K000), ("example.V", V000),
                      ("exercise.Q", SEED_PROBLEMS["000_exercise"]["q"])):
        for (i, j), x in np.ndenumerate(arr):
            b.put(f"{name}[{i}][{j}]", x, kind="input")
    dots = (P["q"] @ K000.T)[0]  # (3,)
    b.put("sqrt_dk", math.sqrt(2))
    for j in range(3):
        b.put(f"example.dot[{j}]", dots[j])
        b.put(f"example.scores[{j}]", fw.scores[0, j], (lambda d, r: d / r, [f"example.dot[{j}]", "sqrt_dk"]))
        b.put(f"example.exp[{j}]", math.exp(fw.scores[0, j]), (math.exp, [f"example.scores[{j}]"]))
        b.put(f"example.weights[{j}]", fw.weights[0, j],
              (lambda e, s: e / s, [f"example.exp[{j}]", "example.sum_exp"]))
    b.put("example.sum_exp", np.exp(fw.scores[0]).sum(), (lambda *e: sum(e), [f"example.exp[{j}]" for j in range(3)]))
    b.put("example.weights_sum", fw.weights[0].sum(), (lambda *w: sum(w), [f"example.weights[{j}]" for j in range(3)]),
          "the three printed weights add up to 0.999; the weights themselves sum to 1")
    for c in range(2):
        for j in range(3):
            b.put(f"example.output_terms[{c}][{j}]", fw.weights[0, j] * V000[j, c],
                  (lambda w, v=V000[j, c]: w * v, [f"example.weights[{j}]"]))
        b.put(f"example.output[{c}]", fw.output[0, c],
              (lambda *t: sum(t), [f"example.output_terms[{c}][{j}]" for j in range(3)]))
    for d in (2, 64, 512):
        b.put(f"typical_dot[d={d}]", math.sqrt(invariants.dot_product_variance(d, n=2).predicted),
              note="standard deviation of q.k for unit-variance inputs: sqrt(d)")
    sat = invariants.saturation_study(512, seed=0, n_keys=3)
    note = "mean over 2000 draws of 3 unscaled keys at d=512 (3 tokens, as in the seed's example)"
    b.put("saturated[d=512].max_weight", sat.unscaled_max_weight, note=note)
    b.put("saturated[d=512].other_weights", (1 - sat.unscaled_max_weight) / 2, note=note)
    s = np.array([2.0, -1.0, 0.5])
    for j in range(3):
        b.put(f"counterexample.scores[{j}]", s[j], kind="input")
        b.put(f"counterexample.normalised[{j}]", s[j] / s.sum(), note="scores divided by their sum, not softmax")
    C = SEED_PROBLEMS["000_causal_printed_scores"]
    cf = run(C)
    masked = np.where(cf.visible, cf.scores, -np.inf)  # (3, 3)
    for (i, j), x in np.ndenumerate(masked):
        b.put(f"causal.scores[{i}][{j}]", x, kind="rounded_input",
              note="printed without the Q, K that produced it: taken as given, not recomputable")
        ins = [f"causal.scores[{i}][{t}]" for t in range(i + 1)]
        derive = (lambda *r, j=j: float(np.exp(r[j] - max(r)) / np.exp(np.subtract(r, max(r))).sum()), ins) \
            if j <= i else None
        b.put(f"causal.weights[{i}][{j}]", cf.weights[i, j], derive,
              "recomputed by softmax from the printed scores (the example's inputs are not given)")
    b.put("causal.exp_of_minus_inf", math.exp(-math.inf))
    b.put("multihead.d_k", 512 / 8)
    ex = SEED_PROBLEMS["000_exercise"]
    for j, x in enumerate((ex["q"] @ K000.T)[0]):
        b.put(f"exercise.dot[{j}]", x)
    for j, w in enumerate(run(SEED_PROBLEMS["000_exercise_causal"]).weights[0]):
        b.put(f"exercise.causal_first_row[{j}]", w)
    return b


def _book002() -> _Book:
    b = _Book("002")
    d64, d1 = invariants.dot_product_variance(64, seed=0), invariants.dot_product_variance(1, seed=1)
    emp = "empirical over 100000 iid N(0,1) draws"
    b.put("typical_score[d_k=64]", math.sqrt(d64.predicted), note="sqrt(Var(q.k)) = sqrt(64)")
    b.put("mean_dot", d64.mean, note=f"{emp}, d=64")
    b.put("var_term", d1.empirical, note=f"{emp}, d=1")
    b.put("var_scaled[d_k=64]", d64.empirical / 64, note=f"{emp}, d=64, divided by d")
    return b


def _book003() -> _Book:
    b = _Book("003")
    P = SEED_PROBLEMS["003_causal"]
    fw = run(P)
    X, A, vis = X003, fw.weights, fw.visible
    xxt, qkt = X @ X.T, P["q"] @ P["k"].T  # (4, 4)
    masked = np.where(vis, fw.scores, -np.inf)  # (4, 4)
    b.put("sqrt_dk", 2.0)
    for (i, j), x in np.ndenumerate(X):
        b.put(f"X[{i}][{j}]", x, kind="input")
    for j in range(4):
        b.put(f"X[0].X[0].terms[{j}]", X[0, j] ** 2)
    b.put("X[0].X[0]", xxt[0, 0], (lambda *t: sum(t), [f"X[0].X[0].terms[{j}]" for j in range(4)]))
    for (i, j), x in np.ndenumerate(xxt):
        b.put(f"XXT[{i}][{j}]", x)
        b.put(f"QKT[{i}][{j}]", qkt[i, j], (lambda g: 0.25 * g, [f"XXT[{i}][{j}]"]))
        b.put(f"S[{i}][{j}]", fw.scores[i, j], (lambda g, r: g / r, [f"QKT[{i}][{j}]", "sqrt_dk"]))
        b.put(f"S_masked[{i}][{j}]", masked[i, j], (lambda s: s, [f"S[{i}][{j}]"]) if vis[i, j] else None)
        b.put(f"A[{i}][{j}]", A[i, j], (lambda w: w, [f"row{i}.softmax[{j}]"]))
    for j in range(4):
        b.put(f"row0.softmax[{j}]", A[0, j])
    for r in (1, 2, 3):
        seen = [j for j in range(4) if vis[r, j]]
        top = masked[r].max()
        b.put(f"row{r}.max", top, (lambda *x: max(x), [f"row{r}.logits[{j}]" for j in seen]))
        e = np.exp(masked[r] - top)  # (4,)
        b.put(f"row{r}.sum", e.sum(), (lambda *x: sum(x), [f"row{r}.exp[{j}]" for j in seen]))
        for j in range(4):
            ok = vis[r, j]
            b.put(f"row{r}.logits[{j}]", masked[r, j], (lambda s: s, [f"S_masked[{r}][{j}]"]) if ok else None)
            b.put(f"row{r}.shifted[{j}]", masked[r, j] - top,
                  (lambda s, m: s - m, [f"row{r}.logits[{j}]", f"row{r}.max"]) if ok else None)
            b.put(f"row{r}.exp[{j}]", e[j], (math.exp, [f"row{r}.shifted[{j}]"]) if ok else None)
            b.put(f"row{r}.softmax[{j}]", A[r, j],
                  (lambda x, s: x / s, [f"row{r}.exp[{j}]", f"row{r}.sum"]) if ok else None)
    for c in range(4):
        b.put(f"Y[0][{c}]", fw.output[0, c])
        for r, n in ((1, 2), (2, 3), (3, 4)):
            for t in range(n):
                if r < 3:
                    b.put(f"Y[{r}].terms[{t}][{c}]", A[r, t] * X[t, c], (lambda w, x=X[t, c]: w * x, [f"A[{r}][{t}]"]))
            ins = [f"Y[{r}].terms[{t}][{c}]" for t in range(n)] if r < 3 else [f"A[3][{t}]" for t in range(4)]
            f = (lambda *t: sum(t)) if r < 3 else (lambda *w, c=c: float(np.dot(w, X[:, c])))
            b.put(f"Y[{r}][{c}]", fw.output[r, c], (f, ins))
    b.put("A.visible_entries.min", A[vis].min(), kind="lower_bound",
          note="'every row of A has entries in [0.24, 0.51]', judged over all visible entries")
    b.put("A.visible_entries.max", A[vis].max(), kind="upper_bound",
          note=f"row 0 is 1.000; rows 1-3 reach {A[1:][vis[1:]].max():.4f}")
    for j in range(2):
        b.put(f"A[1] as 50/50 [{j}]", A[1, j], note="'fila 1 = 50/50' read as 0.5 at one decimal")
    b.put("A[3] uniform over", vis[3].sum(), note="visible keys of row 3")
    L, E = 4, 4
    full, causal = cost.visible_pairs(L, L), cost.visible_pairs(L, L, causal=True)
    per_row = 3 * L  # exp, sum and divide over the row's L entries
    b.put("cost.QKT_muls", full * E)
    b.put("cost.scale_ops", full)
    for what in ("exp", "sum", "div"):
        b.put(f"cost.softmax.{what}_per_row", L)
    b.put("cost.softmax.ops_per_row", per_row,
          (lambda a, s, d: a + s + d, [f"cost.softmax.{w}_per_row" for w in ("exp", "sum", "div")]),
          note="4 exp + 4 sum + 4 div is 12, not 32")
    b.put("cost.softmax.ops", per_row * L, (lambda r: 4 * r, ["cost.softmax.ops_per_row"]),
          note="4 rows x 12; the printed 128 is 4 x the erroneous 32")
    b.put("cost.mask_sets", full - causal)
    b.put("cost.AV_muls", full * E)
    b.put("cost.total_muls", 2 * full * E + full,
          note="QK^T 64 + scale 16 + AV 64 = 144 multiplications (128 without the scale); even adding "
               "every listed item (64+16+128+6+64) gives 278")
    b.put("cost.total_small_ops", full + per_row * L + (full - causal),
          note="scale 16 + softmax 48 + mask 6 = 70; 150 follows from the erroneous 128")
    b.put("cost.exponentials_per_row", L)
    b.put("cost[T=32].T2", 32**2)
    b.put("cost[T=32].muls", 32**2 * 4, note="T^2 d_k with d_k = 4, per matrix product")
    b.put("cost[T=2048].muls", cost.forward_flops(1, 1, 2048, 2048, 64) / 4, note="2048^2 * 64 = 268,435,456")
    return b


def _book004() -> _Book:
    b = _Book("004")
    b.put("dispersion_ratio[d=256 vs d=1]", math.sqrt(invariants.dot_product_variance(256, n=2).predicted
                                                      / invariants.dot_product_variance(1, n=2).predicted))
    for case, s in SCORES004.items():
        sat = invariants.softmax_saturation(np.array(s))
        w = run(SEED_PROBLEMS[f"004_{case}"]).output[0]  # (4,) V = I
        for src in ("json", "text"):
            ins = [f"{src}.{case}.scores[{j}]" for j in range(4)]
            for j in range(4):
                b.put(f"{src}.{case}.scores[{j}]", s[j], kind="rounded_input",
                      note="the lab's scores as printed (4 decimals): the weights carry their rounding")
                sm = (lambda *x, j=j: float(invariants.softmax_saturation(np.array(x)).weights[j]), ins)
                b.put(f"{src}.{case}.weights[{j}]", w[j], sm)
            if src == "json":
                b.put(f"json.{case}.entropy_bits", sat.entropy_bits,
                      (lambda *x: float(invariants.softmax_saturation(np.array(x)).entropy_bits), ins))
                b.put(f"json.{case}.max_weight", sat.max_weight,
                      (lambda *x: float(invariants.softmax_saturation(np.array(x)).max_weight), ins))
    b.exact["text.saturated_weight"] = b.exact["json.d=256_unscaled.weights[0]"]
    b.derive["text.saturated_weight"] = b.derive["json.d=256_unscaled.weights[0]"]
    b.kind["text.saturated_weight"] = "value"
    return b


def _propagated(book: _Book, printed: dict, q: str) -> tuple:
    """(bound, from_printed) for q's derivation; (0, None) when it has none."""
    if q not in book.derive:
        return 0.0, None
    f, ins = book.derive[q]
    x = [book.exact[i] for i in ins]
    bound = 0.0
    for n, name in enumerate(ins):
        ex = printed[name]
        rounded = book.kind.get(name) == "rounded_input" or (book.kind.get(name) != "input" and ex.value != x[n])
        h = ex.half_unit if rounded else 0.0
        if h:
            up, down = list(x), list(x)
            up[n] += h
            down[n] -= h
            bound += abs(f(*up) - f(*down)) / 2
    return bound, float(f(*[printed[i].value for i in ins]))


def check() -> list:
    """Every printed number against its recomputation: a list of `Row`."""
    books = {"000": _book000(), "002": _book002(), "003": _book003(), "004": _book004()}
    rows = []
    for key, book in books.items():
        printed = {e.quantity: e for e in EXAMPLES if e.source == SOURCES[key]}
        for q, ex in printed.items():
            computed, kind = book.exact[q], book.kind[q]
            bound, from_printed = _propagated(book, printed, q)
            tol = (ex.half_unit + bound) * (1 + 1e-9) + 1e-12
            if kind == "lower_bound":
                agrees = computed >= ex.value - tol
            elif kind == "upper_bound":
                agrees = computed <= ex.value + tol
            elif math.isinf(ex.value) or math.isinf(computed):
                agrees = ex.value == computed
            else:
                agrees = abs(ex.value - computed) <= tol
            notes = [book.notes.get(q, "")]
            if not agrees:
                notes.append(f"ERRATUM: printed {ex.printed} but recomputed {computed:.6g} (allowed +-{tol:.2g})")
                if from_printed is not None and abs(from_printed - ex.value) <= ex.half_unit * (1 + 1e-9):
                    notes.append(f"the seed's arithmetic on its own printed inputs gives {from_printed:.6g}: "
                                 "the error comes from those inputs")
                elif from_printed is not None and abs(from_printed - computed) <= tol:
                    notes.append(f"the seed's own printed inputs give {from_printed:.4g} too: "
                                 "a slip in the seed's arithmetic")
            rows.append(Row(SOURCES[key], q, ex.printed, ex.value, ex.decimals, computed, from_printed,
                            tol, bool(agrees), "; ".join(n for n in notes if n),
                            "input" if kind in ("input", "rounded_input") else "recomputed"))
    return rows


def errata() -> list:
    return [r for r in check() if not r.agrees]
