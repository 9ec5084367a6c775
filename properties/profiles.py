"""The suite's Hypothesis profiles: dev (the default), ci and thorough.

Registered as ``attnspec-dev``, ``attnspec-ci`` and ``attnspec-thorough``, so they never replace
a profile of the user's own (many test suites register a "ci").  Which one: ``ATTNSPEC_PROFILE``,
else ``HYPOTHESIS_PROFILE`` when it names one of them (``HYPOTHESIS_PROFILE=ci pytest properties``
as before), else dev.  Nothing is loaded by importing this module: the plugin loads a profile for
runs of the suite itself, and `properties.install` only around importing the property modules
(Hypothesis binds a test's settings when its module is imported), so a user's own Hypothesis
tests keep their settings.
"""
from __future__ import annotations

import contextlib
import os

# Drawn examples per property test (gradient tests draw half, at least 3), besides the seeds'
# explicit examples.  Issue 12 measures kill rates of planted bugs (properties/detection_power.py
# --kill-rates): when it recommends other counts, change them here.
EXAMPLES = {"dev": 6, "ci": 6, "thorough": 250}
SHRINK_SECONDS = 20  # dev and ci: at most this long shrinking one failure (thorough: Hypothesis' 300 s)
ENV, HYPOTHESIS_ENV = "ATTNSPEC_PROFILE", "HYPOTHESIS_PROFILE"
PREFIX = "attnspec-"


def choose(environ=None) -> str:
    """dev, ci or thorough, from the environment; ValueError for an ATTNSPEC_PROFILE not among them."""
    env = os.environ if environ is None else environ
    own = env.get(ENV, "").strip()
    if own:
        if own not in EXAMPLES:
            raise ValueError(f"{ENV} must be one of {', '.join(EXAMPLES)}; got {own!r}")
        return own
    named = env.get(HYPOTHESIS_ENV, "").strip()
    return named if named in EXAMPLES else "dev"


def register() -> None:
    """The three profiles, under attnspec-<name> (registering again is harmless)."""
    from hypothesis import HealthCheck, settings

    common = dict(deadline=None,  # JAX compiles on first sight of a shape; a per-call limit guards hangs instead
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
    # report_multiple_bugs off in dev/ci: shrink the first bug only (each distinct bug costs a full shrink)
    settings.register_profile(PREFIX + "dev", max_examples=EXAMPLES["dev"], report_multiple_bugs=False, **common)
    # ci: no example database, and the draws seeded by the commit (ci_seed): reproducible, yet
    # not the same handful of draws on every commit forever
    settings.register_profile(PREFIX + "ci", max_examples=EXAMPLES["ci"], print_blob=True,
                              database=None, report_multiple_bugs=False, **common)
    settings.register_profile(PREFIX + "thorough", max_examples=EXAMPLES["thorough"], **common)


def ci_seed(root: str, environ=None) -> tuple[int, str]:
    """The ci profile's seed and where it came from: ATTNSPEC_SEED, else the checkout's commit
    (its first 8 hex digits), else 0 outside a git checkout."""
    env = os.environ if environ is None else environ
    own = env.get("ATTNSPEC_SEED", "").strip()
    if own:
        try:
            return int(own), "ATTNSPEC_SEED"
        except ValueError:
            raise ValueError(f"ATTNSPEC_SEED must be an integer; got {own!r}") from None
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = ""
    if len(head) >= 8 and all(c in "0123456789abcdef" for c in head[:8]):
        return int(head[:8], 16), f"commit {head[:8]}"
    return 0, "no git commit here"


def load(name: str) -> None:
    from hypothesis import settings

    register()
    settings.load_profile(PREFIX + name)


def current() -> str:
    """The Hypothesis profile loaded now (its registered name)."""
    from hypothesis import settings

    getter = getattr(settings, "get_current_profile_name", None)
    return getter() if getter else (getattr(settings, "_current_profile", None) or "default")


@contextlib.contextmanager
def active(name: str):
    """The suite's profile while the block runs (imports its test modules), then the previous one."""
    from hypothesis import settings

    previous = current()
    load(name)
    try:
        yield
    finally:
        settings.load_profile(previous)


@contextlib.contextmanager
def bounded_shrinking(seconds: int = SHRINK_SECONDS):
    """Cap the time Hypothesis spends shrinking one failure while the block runs (one test).

    Its default is 300 s a test and a failing backend shrinks in every test it fails; dev and
    ci runs should report within minutes.  Hypothesis has no setting for this, so its engine
    constant is lowered and restored afterwards (a user's own tests keep theirs); the shrunk
    example is then less minimal, never wrong.
    """
    try:
        from hypothesis.internal.conjecture import engine
        before = engine.MAX_SHRINKING_SECONDS
    except (ImportError, AttributeError):  # another Hypothesis: its own limit applies
        yield
        return
    engine.MAX_SHRINKING_SECONDS = min(before, seconds)
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = before
