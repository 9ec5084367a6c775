"""The serving formats' LSE, sinks and cache views beyond the padded call: the suite rejects each slip of
tests/broken/format_bugs.py by the property written for it, and passes numpy-naive on the same
properties (the draws of the proof of teeth: ci profile, its seed)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.teeth_report import TEETH_SEED

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAUGHT_BY = {"PackedLseBase2": "packed_lse_matches_reference", "PackedLsePaddedLayout": "packed_lse_matches_reference",
             "PagedLseDropsSink": "sinks_in_paged_calls", "PagedLseFirstSplit": "paged_lse_matches_reference",
             "PackedBackwardIgnoresSinks": "sinks_in_packed_gradients", "AppendDropsSinks": "sinks_in_append_calls",
             "AppendRowsAtTheirStride": "paged_cache_views"}


def _failed(spec: str, properties: str, tmp_path) -> set:
    env = dict({k: v for k, v in os.environ.items() if not k.startswith(("ATTNSPEC_", "PYTEST_"))},
               PYTHONPATH=ROOT, ATTNSPEC_PROFILE="ci", ATTNSPEC_SEED=str(TEETH_SEED))
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "attnspec.properties", "-q", "-n", "0", "-p",
                           "no:cacheprovider", "--backend", spec, "-k", properties, "--attnspec-json", str(out),
                           "--attnspec-no-shrink"],  # caught or not does not depend on shrinking (as in the proof)
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-2000:]
    return {r["property"] for r in json.loads(out.read_text())["conformance"] if r["status"] == "failed"}


@pytest.mark.parametrize("bug", sorted(CAUGHT_BY))
def test_the_format_properties_reject_the_slip(bug, tmp_path):
    assert CAUGHT_BY[bug] in _failed(f"tests.broken.format_bugs:{bug}", CAUGHT_BY[bug], tmp_path)


def test_the_format_properties_pass_the_reference_kernel(tmp_path):
    assert _failed("numpy-naive", " or ".join(sorted(set(CAUGHT_BY.values()))), tmp_path) == set()
