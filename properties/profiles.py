"""The suite's Hypothesis profiles and how many problems a property draws.

Profiles (registered as ``attnspec-<name>``, so a profile of the user's own, such as a "ci", is
never replaced): dev and ci draw 6 problems a property (gradient properties 3) - the run over
every built-in; deep draws 100 - a run of a few named backends, a plug-in above all, gets it
unless a profile is asked for; thorough 250.  ci has no example database, prints reproduction
blobs and seeds its draws by the checkout's commit (reproducible on one commit, new draws on
the next).  Which one: ``ATTNSPEC_PROFILE``, else ``HYPOTHESIS_PROFILE`` when it names one of
them, else deep for at most DEEP_BACKENDS named backends and dev otherwise.  Nothing is loaded
by importing this module: the plugin loads a profile for runs of the suite only.
"""
from __future__ import annotations

import contextlib
import os
import subprocess

EXAMPLES = {"dev": 6, "ci": 6, "deep": 100, "thorough": 250}
DEEP_BACKENDS = 3  # a run naming at most this many backends is a deep one (unless a profile is chosen)
ENV, HYPOTHESIS_ENV, SEED_ENV = "ATTNSPEC_PROFILE", "HYPOTHESIS_PROFILE", "ATTNSPEC_SEED"
PREFIX = "attnspec-"


def chosen(environ=None) -> str | None:
    """The profile the environment asks for (ATTNSPEC_PROFILE, or HYPOTHESIS_PROFILE naming one of
    ours), None when it asks for none; ValueError for an ATTNSPEC_PROFILE not among them."""
    env = os.environ if environ is None else environ
    own = env.get(ENV, "").strip()
    if own:
        if own not in EXAMPLES:
            raise ValueError(f"{ENV} must be one of {', '.join(EXAMPLES)}; got {own!r}")
        return own
    named = env.get(HYPOTHESIS_ENV, "").strip()
    return named if named in EXAMPLES else None


def choose(named_backends: int = 0, environ=None) -> str:
    """The profile of a run: the one asked for, else deep for a few named backends, else dev."""
    asked = chosen(environ)
    if asked:
        return asked
    return "deep" if 0 < named_backends <= DEEP_BACKENDS else "dev"


def register() -> None:
    """The profiles, under attnspec-<name> (registering again is harmless)."""
    from hypothesis import HealthCheck, settings

    common = dict(deadline=None,  # JAX compiles on first sight of a shape; a per-call limit guards hangs instead
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
                  report_multiple_bugs=False)  # shrink the first bug a test finds (each costs a full shrink)
    for name, n in EXAMPLES.items():
        extra = dict(print_blob=True, database=None) if name == "ci" else {}
        settings.register_profile(PREFIX + name, max_examples=n, **common, **extra)


def load(name: str) -> None:
    from hypothesis import settings

    register()
    settings.load_profile(PREFIX + name)


@contextlib.contextmanager
def active(name: str):
    """The suite's profile while the block runs, then the previous one (a user's own tests keep theirs)."""
    from hypothesis import settings

    previous = settings.get_current_profile_name()
    load(name)
    try:
        yield
    finally:
        settings.load_profile(previous)


def env_seed(environ=None) -> tuple[int, str] | None:
    """ATTNSPEC_SEED's seed in any profile (None when unset or blank); ValueError when it is no integer."""
    own = (os.environ if environ is None else environ).get(SEED_ENV, "").strip()
    if not own:
        return None
    try:
        return int(own), SEED_ENV
    except ValueError:
        raise ValueError(f"{SEED_ENV} must be an integer; got {own!r}") from None


def ci_seed(root: str, environ=None) -> tuple[int, str]:
    """The ci profile's seed and where it came from: ATTNSPEC_SEED, else the checkout's commit (its
    first 8 hex digits), else 0 outside a git checkout."""
    own = env_seed(environ)
    if own is not None:
        return own
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = ""
    if len(head) >= 8 and all(c in "0123456789abcdef" for c in head[:8]):
        return int(head[:8], 16), f"commit {head[:8]}"
    return 0, "no git commit here"
