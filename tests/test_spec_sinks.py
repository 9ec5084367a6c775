"""Attention sinks in the definition (issue 31): the field, the reference, dSink, and their budgets."""
import numpy as np
import pytest

from attnspec.specs import error_budget, reference, sink_budget
from attnspec.specs.plain import round_to
from attnspec.specs.problem import validate
from tests.broken import sink_bugs

# float64 identities: a few roundings of numbers of size ~1 each, far below float64's budget floor
F64 = error_budget.BUDGETS["float64"].sigma(64) * 64


def _problem(seed, B=2, Hq=4, Hkv=2, Lq=5, Lk=9, E=3, Ev=2, dtype="float64"):
    rng = np.random.default_rng(seed)
    q, k, v = (np.asarray(round_to(rng.standard_normal(s), dtype), np.float64)
               for s in ((B, Hq, Lq, E), (B, Hkv, Lk, E), (B, Hkv, Lk, Ev)))
    sinks = np.asarray(round_to(rng.uniform(-4, 4, Hq), dtype), np.float64)
    return q, k, v, sinks


def test_validation_names_sinks():
    q, k, v, s = _problem(0)
    for bad, why in ((s[:3], "shape"), (np.array([0.0, np.nan, 1.0, 2.0]), "finite"),
                     (np.array([0.0, np.inf, 1.0, 2.0]), "finite"), (np.arange(4), "float")):
        with pytest.raises(ValueError, match="sinks") as e:
            validate(q, k, v, sinks=bad, enable_gqa=True)
        assert why in str(e.value)
    with pytest.raises(ValueError, match="sinks needs inputs with a head axis"):
        validate(q[0, 0], k[0, 0], v[0, 0], sinks=np.zeros(1))
    assert "sinks" in validate(q, k, v, sinks=s, enable_gqa=True).features
    assert validate(q, k, v, sinks=np.full(4, -np.inf), enable_gqa=True).sinks.shape == (4,)


def test_closed_form_and_lse():
    """O(sinks) = O(no sinks) sigma(lse - s_h); lse(sinks) = logaddexp(lse, s_h); rows sum to 1 - p_sink."""
    q, k, v, s = _problem(1)
    kw = dict(enable_gqa=True, is_causal=True, softcap=2.0, scale=0.7)
    f, f0 = reference.forward(q, k, v, sinks=s, **kw), reference.forward(q, k, v, **kw)
    h = s[:, None]  # (Hq, 1) against (B, Hq, Lq)
    sig = 1.0 / (1.0 + np.exp(h - f0.lse))  # (B, Hq, Lq)
    assert np.abs(f.output - f0.output * sig[..., None]).max() <= F64
    assert np.abs(f.lse - np.logaddexp(f0.lse, h)).max() <= F64 * 10  # |lse| ~ 5: its roundings scale with it
    assert np.abs(f.weights.sum(-1) - (1 - f.sink_weight)).max() <= F64
    assert np.abs(f.sink_weight - np.exp(h - f.lse)).max() <= F64


def test_empty_row_and_minus_inf():
    """An empty row outputs 0 with lse s_h; -inf sinks are no sinks, bit for bit."""
    q, k, v, s = _problem(2)
    mask = np.ones((5, 9), bool)
    mask[2] = False  # row 2 sees nothing
    f = reference.forward(q, k, v, mask=mask, sinks=s, enable_gqa=True)
    assert np.all(f.output[:, :, 2] == 0) and np.array_equal(f.lse[:, :, 2], np.broadcast_to(s, (2, 4)))
    none, off = reference.forward(q, k, v, mask=mask, enable_gqa=True), \
        reference.forward(q, k, v, mask=mask, sinks=np.full(4, -np.inf), enable_gqa=True)
    assert np.array_equal(none.output, off.output) and np.array_equal(none.lse, off.lse)


def _fd(fn, x, eps=1e-5):
    """Central differences of a scalar function: truncation eps^2 |f'''| ~ 1e-10, rounding 1e-16 / eps."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, dn = x.copy(), x.copy()
        up[i] += eps
        dn[i] -= eps
        g[i] = (fn(up) - fn(dn)) / (2 * eps)
    return g


FD_TOL = 1e-7  # 1000 x the central differences' error above: their own slack, not the reference's


def test_dsink_and_gradients_against_finite_differences():
    q, k, v, s = _problem(3)
    kw = dict(enable_gqa=True, is_causal=True, softcap=3.0)
    g = np.random.default_rng(9).standard_normal((2, 4, 5, 2))  # (B, Hq, Lq, Ev)

    def loss(**x):
        args = {"q": q, "k": k, "v": v, "s": s, **x}
        return float((reference.attention(args["q"], args["k"], args["v"], sinks=args["s"], **kw) * g).sum())
    ds = reference.dsink(q, k, v, g, sinks=s, **kw)
    assert np.abs(ds - _fd(lambda x: loss(s=x), s)).max() <= FD_TOL
    dq, dk, dv = reference.backward(q, k, v, g, sinks=s, **kw)
    for got, name, x in ((dq, "q", q), (dk, "k", k), (dv, "v", v)):
        assert np.abs(got - _fd(lambda y, n=name: loss(**{n: y}), x)).max() <= FD_TOL, name
    with pytest.raises(ValueError, match="sinks"):
        reference.dsink(q, k, v, g, enable_gqa=True)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("kernel", [sink_bugs.SinkKernel, sink_bugs.SinkInitMax])
def test_other_orders_within_budget(kernel, dtype):
    """Folding the sink after the loop and starting the running max at it are within every budget
    (output, LSE as declared, dq/dk/dv, dSink) over problems with softcap, causal, GQA, -inf sinks."""
    backend = kernel()
    backend.capabilities = sink_bugs._caps(dtype)
    for seed in range(6):
        q, k, v, s = _problem(10 + seed, Lk=3 + 4 * seed, dtype=dtype)
        if seed % 3 == 2:
            s[1] = -np.inf
        s = s * (1 + seed % 2)  # sinks up to 8: dominating some rows
        kw = dict(sinks=s, enable_gqa=True, is_causal=seed % 2 == 0, softcap=None if seed < 3 else 2.0)
        g = np.asarray(round_to(np.random.default_rng(seed).standard_normal((2, 4, 5, 2)), dtype), np.float64)
        out, lse = backend.forward(q, k, v, dtype=dtype, return_lse=True, **kw)
        grads, ds = backend.backward(q, k, v, g, dtype=dtype, return_dsink=True, **kw)
        rows = reference.forward(q, k, v, **kw).visible.any(-1)
        lse_kw = kw if backend.semantics.lse_with_sinks else {**kw, "sinks": None}
        verdicts = [error_budget.check_forward(out, q, k, v, dtype=dtype, rows=rows, **kw),
                    error_budget.check_lse(lse, q, k, v, dtype=dtype, **lse_kw),
                    sink_budget.check_dsink(ds, q, k, v, g, dtype=dtype, **kw),
                    *error_budget.check_backward(grads, q, k, v, g, dtype=dtype, **kw)]
        for verdict in verdicts:
            assert verdict, verdict.message


def test_the_budget_rejects_the_planted_sinks():
    """The same budgets reject the kernels with a planted sink slip (each on its own measure)."""
    q, k, v, s = _problem(4, dtype="float32")
    kw = dict(sinks=s, enable_gqa=True, softcap=2.0, scale=0.5)
    for cls in (sink_bugs.SinkIgnored, sink_bugs.SinkPerSplit, sink_bugs.SinkScaled, sink_bugs.SinkCapped,
                sink_bugs.SinkByKvHead, sink_bugs.SinkWithValue):
        b = cls()
        b.capabilities = sink_bugs._caps("float32")
        assert not error_budget.check_forward(b.forward(q, k, v, dtype="float32", **kw), q, k, v, dtype="float32", **kw), \
            cls.__name__
    b = sink_bugs.SinkLseExcluded()
    _, lse = b.forward(q, k, v, return_lse=True, **kw)
    assert not error_budget.check_lse(lse, q, k, v, dtype="float64", **kw)
    with pytest.raises(ValueError, match="sinks"):
        sink_budget.dsink_allowed(q, k, v, np.zeros((2, 4, 5, 2)), enable_gqa=True)


@pytest.mark.parametrize("name", ["sdpa_sinks", "fa4_sinks"])
def test_plain_functions_take_sinks_by_name(name):
    """A parameter named sinks (FlashInfer) or learnable_sink (FA4) declares the field; the value reaches it."""
    from attnspec.backends.registry import resolve
    if name == "fa4_sinks":
        pytest.importorskip("torch")
    backend = resolve(f"tests.plugins.sink_functions:{name}")
    assert "sinks" in backend.capabilities.features and backend.semantics.lse_with_sinks is True
    q, k, v, s = _problem(5, Hkv=4, dtype="float32")
    out = backend.forward(q, k, v, dtype="float32", sinks=s)
    assert error_budget.check_forward(out, q, k, v, dtype="float32", sinks=s)
    assert not error_budget.check_forward(out, q, k, v, dtype="float32")  # not inert: the sinks were used
