"""Fixture plug-ins for the backend contract tests (tests/test_backends_*.py)."""
