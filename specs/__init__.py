"""attnspec's backend-neutral definition of scaled dot-product attention (NumPy only).

problem (inputs, masks), reference (float64 forward/backward), invariants (verdicts),
error_budget (how close a dtype must come), cost (FLOPs, bytes), worked_examples (seeds).

Only `problem` loads with the package: backends validate their inputs with it, and optimized
code must never load the reference.  The other modules load on first use (PEP 562).
"""
import importlib

from attnspec.specs.problem import FLOAT_DTYPE_NAMES, Problem, causal_mask, default_scale, validate

_LAZY = ("cost", "error_budget", "invariants", "reference", "worked_examples")

__all__ = ["cost", "error_budget", "invariants", "problem", "reference", "worked_examples",
           "Verdict", "FLOAT_DTYPE_NAMES", "Problem", "causal_mask", "default_scale", "validate"]


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f".{name}", __name__)
    if name == "Verdict":
        return importlib.import_module(".invariants", __name__).Verdict
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
