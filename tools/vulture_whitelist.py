"""Names vulture (`vulture`, configured in pyproject.toml) reports as unused that a protocol requires.

Each is a parameter someone else passes by position or by name; the body need not read it.  Listing
the name here marks it used everywhere, so keep this to protocol names.
"""
# ruff: noqa: B018, F821 - a vulture whitelist is bare, undefined names by design

frame  # signal handlers' (signum, frame): attnspec/commands/run_cmd.py
cycle  # IPython/Hypothesis pretty printers' _repr_pretty_(p, cycle): properties/case.py, target.py
early_config  # pytest's pytest_load_initial_conftests(early_config, parser, args) hook
installed_plugin  # a pytest fixture, requested by naming it as a test's argument
openblas_coretype  # asv passes every parameter of `params` to setup and each benchmark method
dropout_p  # torch's scaled_dot_product_attention signature, mirrored by the plain-call adapters
