"""Every number the seeds print, as printed (text copied verbatim; seed 000 and seed 004's
prose use decimal commas).  Grouped by source; `specs.worked_examples` parses and checks.

Left out on purpose: labels (lesson, section, phase and equation numbers, years, XP), the
shapes that define a problem (d_k = 2, "tres tokens") and a number repeated verbatim inside
a formula right after it was printed as a result (e.g. the weights in "0,412·(10,0)").
"""

import numpy as np

SOURCES = {
    "000": "000_c8226dcc232e29af.txt",
    "002": "002_9c0b080536bcfeae.txt",
    "003": "003_94bd3c4ea4e011bf.txt",
    "004": "004_559f55107ef9f86c.txt",
}


I3, I4 = np.eye(3), np.eye(4)
X003 = np.array([[0.50, 0.30, -0.20, 0.10], [-0.10, 0.40, 0.20, -0.30],
                  [0.20, -0.10, 0.50, 0.10], [0.00, 0.00, 0.00, 0.20]])  # (4, 4)
K000 = np.array([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1]])  # (3, 2)
V000 = np.array([[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]])  # (3, 2)
CAUSAL000 = np.array([[0.71, 0.0, 0.0], [0.32, 0.67, 0.0], [0.16, 0.15, 0.69]])  # (3, 3) masked: 0
SCORES004 = {"d=8_unscaled": [0.4204, -1.9767, 1.3619, 1.2219], "d=8_scaled": [0.3541, -0.3729, 2.3033, 0.8469],
              "d=256_unscaled": [-9.7106, -2.6027, 1.9724, -15.9423],
              "d=256_scaled": [-0.7502, 1.9863, 0.3221, 0.5716]}


def _p(q, k, v, is_causal=False, scale=None, mask=None):
    return dict(q=np.asarray(q, float), k=np.asarray(k, float), v=np.asarray(v, float),
                mask=mask, is_causal=is_causal, scale=scale)


SEED_PROBLEMS = {
    "000_example": _p([[1.0, 0.0]], K000, V000),
    "000_exercise": _p([[0.0, 1.0]], K000, V000),
    "000_exercise_causal": _p([[0.0, 1.0]], K000, V000, is_causal=True),
    # the causal 3x3 example prints scores only: q = scores, K = I, V = I gives q.k = score
    # exactly, scale 1, and the output equals the weights (masked entries hold 0, unused)
    "000_causal_printed_scores": _p(CAUSAL000, I3, I3, is_causal=True, scale=1.0),
    "003_causal": _p(0.5 * X003, 0.5 * X003, X003, is_causal=True),  # scale 1/sqrt(4) = 1/2
    # seed 004's score vectors (already scaled where the seed says so): one query, same trick
    **{f"004_{c}": _p([s], I4, I4, scale=1.0) for c, s in SCORES004.items()},
}


def _matrix(prefix, text):
    """Rows of whitespace-separated tokens -> [(prefix[i][j], token)]."""
    rows = [r.split() for r in text.strip().splitlines()]
    return [(f"{prefix}[{i}][{j}]", t) for i, r in enumerate(rows) for j, t in enumerate(r)]


def _vector(prefix, tokens):
    return [(f"{prefix}[{j}]", t) for j, t in enumerate(tokens)]


S000 = (
    _matrix("example.Q", "1,0 0,0")
    + _matrix("example.K", "1,0 0,0\n0,0 1,0\n0,9 0,1")
    + _matrix("example.V", "10,0 0,0\n0,0 10,0\n5,0 5,0")
    + _vector("example.dot", ["1,00", "0,00", "0,90"])
    + [("sqrt_dk", "1,414")]
    + _vector("example.scores", ["0,707", "0,000", "0,636"])
    + [("typical_dot[d=2]", "~1,4"), ("typical_dot[d=64]", "~8"), ("typical_dot[d=512]", "~23"),
       ("saturated[d=512].max_weight", "~1,0"), ("saturated[d=512].other_weights", "~0")]
    + _vector("example.exp", ["2,028", "1,000", "1,889"])
    + [("example.sum_exp", "4,917")]
    + _vector("example.weights", ["0,412", "0,203", "0,384"])
    + [("example.weights_sum", "1,000")]
    + _vector("counterexample.scores", ["2", "−1", "0,5"])
    + _vector("counterexample.normalised", ["1,33", "−0,67", "0,33"])
    + _vector("example.output_terms[0]", ["4,12", "0,00", "1,92"])
    + _vector("example.output_terms[1]", ["0,00", "2,03", "1,92"])
    + _vector("example.output", ["6,04", "3,95"])
    + _matrix("causal.scores", "0,71 −∞ −∞\n0,32 0,67 −∞\n0,16 0,15 0,69")
    + [("causal.exp_of_minus_inf", "0")]
    + _matrix("causal.weights", "1,000 0,000 0,000\n0,327 0,673 0,000\n0,164 0,145 0,691")
    + [("multihead.d_k", "64")]
    + _matrix("exercise.Q", "0,0 1,0")
    + _vector("exercise.dot", ["0,00", "1,00", "0,10"])
    + _vector("exercise.causal_first_row", ["1", "0", "0"])
)

S002 = [
    ("typical_score[d_k=64]", "±8"),
    ("mean_dot", "0"),                 # E[q.k] = 0
    ("var_term", "1"),                 # Var(q_i k_i) = 1 . 1 = 1
    ("var_scaled[d_k=64]", "1"),       # Var(q.k / sqrt(d_k)) = d_k / d_k = 1
]

_X = """
 0.50  0.30 -0.20  0.10
-0.10  0.40  0.20 -0.30
 0.20 -0.10  0.50  0.10
 0.00  0.00  0.00  0.20
"""

S003 = (
    _matrix("X", _X)
    + _matrix("XXT", """
 0.39 -0.04 -0.01  0.02
-0.04  0.30  0.04 -0.06
-0.01  0.04  0.31  0.02
 0.02 -0.06  0.02  0.04""")
    + _vector("X[0].X[0].terms", ["0.25", "0.09", "0.04", "0.01"])
    + [("X[0].X[0]", "0.39")]
    + _matrix("QKT", """
 0.098 -0.010 -0.003  0.005
-0.010  0.075  0.010 -0.015
-0.003  0.010  0.078  0.005
 0.005 -0.015  0.005  0.010""")
    + [("sqrt_dk", "2")]
    + _matrix("S", """
 0.049 -0.005 -0.002  0.003
-0.005  0.038  0.005 -0.008
-0.002  0.005  0.039  0.003
 0.003 -0.008  0.003  0.005""")
    + _matrix("S_masked", """
 0.049 -inf -inf -inf
-0.005 0.038 -inf -inf
-0.002 0.005 0.039 -inf
 0.003 -0.008 0.003 0.005""")
    + _vector("row0.softmax", ["1", "0", "0", "0"])
    + _vector("row1.logits", ["-0.005", "0.038", "-inf", "-inf"])
    + [("row1.max", "0.038")]
    + _vector("row1.shifted", ["-0.043", "0", "-inf", "-inf"])
    + _vector("row1.exp", ["0.958", "1.0", "0", "0"])
    + [("row1.sum", "1.958")]
    + _vector("row1.softmax", ["0.489", "0.511", "0", "0"])
    + _vector("row2.logits", ["-0.002", "0.005", "0.039", "-inf"])
    + [("row2.max", "0.039")]
    + _vector("row2.shifted", ["-0.041", "-0.034", "0", "-inf"])
    + _vector("row2.exp", ["0.960", "0.967", "1.0", "0"])
    + [("row2.sum", "2.927")]
    + _vector("row2.softmax", ["0.328", "0.330", "0.342", "0"])
    + _vector("row3.logits", ["0.003", "-0.008", "0.003", "0.005"])
    + [("row3.max", "0.005")]
    + _vector("row3.shifted", ["-0.002", "-0.013", "-0.002", "0"])
    + _vector("row3.exp", ["0.998", "0.987", "0.998", "1.0"])
    + [("row3.sum", "3.983")]
    + _vector("row3.softmax", ["0.250", "0.248", "0.250", "0.251"])
    + _matrix("A", """
1.000 0 0 0
0.489 0.511 0 0
0.328 0.330 0.342 0
0.250 0.248 0.250 0.251""")
    + _vector("Y[0]", ["0.50", "0.30", "-0.20", "0.10"])
    + _vector("Y[1].terms[0]", ["0.2445", "0.1467", "-0.0978", "0.0489"])   # 0.489 . X[0]
    + _vector("Y[1].terms[1]", ["- 0.0511", "0.2044", "0.1022", "- 0.1533"])  # 0.511 . X[1]
    + _vector("Y[1]", ["0.194", "0.351", "0.004", "-0.104"])
    + _vector("Y[2].terms[0]", ["0.164", "0.099", "-0.066", "0.033"])
    + _vector("Y[2].terms[1]", ["-0.033", "0.132", "0.066", "-0.099"])
    + _vector("Y[2].terms[2]", ["0.068", "-0.034", "0.171", "0.034"])
    + _vector("Y[2]", ["0.199", "0.197", "0.171", "-0.032"])
    + _vector("Y[3]", ["0.150", "0.155", "0.123", "0.020"])
    + [("A.visible_entries.min", "0.24"), ("A.visible_entries.max", "0.51"),
       ("A[1] as 50/50 [0]", "50/50"), ("A[1] as 50/50 [1]", "50/50"),
       ("A[3] uniform over", "4")]
    + [("cost.QKT_muls", "64"), ("cost.scale_ops", "16"), ("cost.softmax.exp_per_row", "4"),
       ("cost.softmax.sum_per_row", "4"), ("cost.softmax.div_per_row", "4"),
       ("cost.softmax.ops_per_row", "~32"), ("cost.softmax.ops", "128"), ("cost.mask_sets", "6"),
       ("cost.AV_muls", "64"), ("cost.total_muls", "~270"), ("cost.total_small_ops", "~150"),
       ("cost.exponentials_per_row", "4"),
       ("cost[T=32].T2", "1024"), ("cost[T=32].muls", "4096"), ("cost[T=2048].muls", "268M")]
)

# seed 004: the prose block (decimal commas, "text.") and the lab's JSON output ("json.")
_CASES = {
    "d=8_unscaled": (["0.4204", "-1.9767", "1.3619", "1.2219"],
                     ["0.169955", "0.015462", "0.435753", "0.37883"], "1.580263", "0.435753"),
    "d=8_scaled": (["0.3541", "-0.3729", "2.3033", "0.8469"],
                   ["0.098585", "0.047653", "0.692379", "0.161382"], "1.330663", "0.692379"),
    "d=256_unscaled": (["-9.7106", "-2.6027", "1.9724", "-15.9423"],
                       ["8e-06", "0.010201", "0.989791", "0.0"], "0.082274", "0.989791"),
    "d=256_scaled": (["-0.7502", "1.9863", "0.3221", "0.5716"],
                     ["0.043279", "0.667945", "0.126469", "0.162308"], "1.387977", "0.667945"),
}
_TEXT = {
    "d=8_unscaled": (["0,4204", "−1,9767", "1,3619", "1,2219"], "0,169955"),
    "d=8_scaled": (["0,3541", "−0,3729", "2,3033", "0,8469"], "0,098585"),
    "d=256_unscaled": (["−9,7106", "−2,6027", "1,9724", "−15,9423"], "8e-06"),
    "d=256_scaled": (["−0,7502", "1,9863", "0,3221", "0,5716"], "0,043279"),
}

S004 = [("dispersion_ratio[d=256 vs d=1]", "16"), ("text.saturated_weight", "8e-06")]
for _case, (_scores, _first) in _TEXT.items():
    S004 += _vector(f"text.{_case}.scores", _scores) + [(f"text.{_case}.weights[0]", _first)]
for _case, (_scores, _weights, _entropy, _max) in _CASES.items():
    S004 += (_vector(f"json.{_case}.scores", _scores) + _vector(f"json.{_case}.weights", _weights)
             + [(f"json.{_case}.entropy_bits", _entropy), (f"json.{_case}.max_weight", _max)])

PRINTED = {"000": S000, "002": S002, "003": S003, "004": S004}
