"""The libraries people run (registry.ZOO): no false alarm, and what each declares is its documentation's.

The slice below runs on eager flex too (registry.PYTEST_WHEN_NAMED): a plain `pytest properties`
leaves it out as it leaves out the zoo, so README's test command checks it here.

Each zoo adapter only converts arrays and conventions and declares what its library documents;
what the suite finds beyond that is a declared deviation pointing at docs/findings.md.  Here each
runs a slice of the suite (the reference, masks, the alignment, grouped heads, empty sizes, in
float16 and float32; the dev profile, fixed seeds): nothing may fail - a failure is either a new finding to register or a
fault of the adapter.  A missing library is a skip with its reason.
"""
from __future__ import annotations

import pytest

from attnspec.backends import registry
from attnspec.properties.runner import run_suite
from tests.plugins.cases import available

# the properties where the zoo's findings show, in a 16-bit and a 32-bit dtype (the rest: README's
# per-backend figures, `pytest properties --backend NAME`)
SLICE = ("(matches_reference or masked_keys_get_zero_weight or causal_alignment or grouped_heads_match_repeated_kv "
         "or additive_bias_matches_reference or empty_sizes or output_dtype or sinks_match_reference "
         "or dsink_matches_reference) and (float16 or float32)")


_SLICED = (*registry.ZOO, *registry.PYTEST_WHEN_NAMED)
_ZOO = {name: registry.resolve(name) for name in _SLICED}  # resolving loads no library


@pytest.mark.slow
@pytest.mark.parametrize("name", _SLICED)
def test_a_slice_of_the_suite_finds_nothing_undeclared(name, tmp_path):
    available(_ZOO, name)  # a missing library: a skip with its reason
    result = run_suite([name], json_path=str(tmp_path / "r.json"), profile="dev",
                       extra_args=["-k", SLICE, "--hypothesis-seed=7"])
    rows = result.conformance
    assert any(r["status"] == "passed" for r in rows), result.output[-2000:]
    bad = [f"{r['property']}[{r['dtype']}]: {r['message']}" for r in rows if r["status"] in ("failed", "error")]
    assert not bad, "\n".join(bad)


def test_what_the_libraries_document_is_declared():
    """The documented choices, as declared (a changed adapter must say why)."""
    keras = registry.resolve("keras-torch")
    assert keras.capabilities.equal_head_dims  # "value: the same shape of key"
    assert dict(keras.semantics.output_dtypes) == {"float64": "float32"}  # BIT64_TO_BIT32_DTYPE
    mlx = registry.resolve("mlx-sdpa")
    assert mlx.semantics.causal_alignment == "bottom_right"  # "lower-right alignment"
    assert mlx.semantics.effective_precision == "float32"  # "softmax ... in float32 regardless"
    assert not mlx.capabilities.mask_with_causal  # an array mask or "causal", not both
    assert "sinks" in mlx.capabilities.features  # 0.32's signature: sinks: array | None
    sdpa = registry.resolve("transformers-sdpa")
    assert not sdpa.capabilities.mask_with_causal  # with a mask, is_causal is ignored: the mask carries it
    assert "gqa" in sdpa.capabilities.features and "softcap" not in sdpa.capabilities.features  # sdpa refuses softcap
    assert "softcap" in registry.resolve("transformers-eager").capabilities.features
    assert "sinks" in registry.resolve("transformers-gpt-oss").capabilities.features  # module.sinks, always read
    for name in ("flax-linen", "flax-nnx"):
        assert "gqa" not in registry.resolve(name).capabilities.features  # "same heads for q and k"
    for name in registry.ZOO:  # every declared deviation names its entry in the register
        for d in registry.resolve(name).semantics.deviations:
            assert "docs/findings.md" in d.why, (name, d)
