"""attnspec's backend-neutral definition of scaled dot-product attention (NumPy only).

problem (inputs, masks), reference (float64 forward/backward), invariants (verdicts),
error_budget (how close a dtype must come), cost (FLOPs, bytes), worked_examples (seeds).
"""
from . import cost, error_budget, invariants, problem, reference, worked_examples
from .invariants import Verdict
from .problem import FLOAT_DTYPE_NAMES, Problem, causal_mask, default_scale, validate

__all__ = ["cost", "error_budget", "invariants", "problem", "reference", "worked_examples",
           "Verdict", "FLOAT_DTYPE_NAMES", "Problem", "causal_mask", "default_scale", "validate"]
