"""The suite's command-line options, and what a run of it explores.

  --backend NAME, --attnspec-backend NAME
                          built-in, entry point or package.module:attr; repeatable or comma-
                          separated.  Default: $ATTNSPEC_BACKENDS, else every built-in.
                          (--backend only where no other plugin or conftest of the run defines it.)
  --attnspec-json PATH    write the results as JSON (also $ATTNSPEC_JSON).
  --attnspec-rows PATH    write each test's rows as they finish, JSON lines (`attnspec run` follows it):
                          first {"collected": [test ids]}, then per test {"nodeid", "row", "semantics"}.
  --attnspec-tb block|long  one block per failure (default) or pytest's traceback (-v: long).
  --attnspec-repro DIR    where reproducers go (default: beside the JSON, else ./.attnspec/repro).
  --attnspec-rule NAME    the error budget's rule: attnspec (default) or flash (flash-attention's).
  --attnspec-examples N   drawn problems a property (default: the profile's; gradient properties half).
  --attnspec-no-shrink    report failures unshrunk (measurements: whether a bug is caught does not
                          depend on shrinking, only how small the counterexample is).

Seeds: every run is seeded, and its seed printed (header, summary, JSON's "run"): each test's seed
derives from the run's and the test's id.  ``--hypothesis-seed=N`` (Hypothesis' own option, read
here, never rewritten) gives N, else $ATTNSPEC_SEED in any profile; the ci profile takes the checkout's
commit; every other run the fixed DEFAULT_SEED, so two runs of one command draw the same problems and give the
same verdicts (a seeded test keeps no example database: nothing of an earlier run replays).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from attnspec.properties import profiles
from attnspec.properties.explore import Exploration

PACKAGE = "attnspec.properties"
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
REPRO_DIR = os.path.join(".attnspec", "repro")
DEFAULT_SEED = 0  # a run given no seed: derandomized per test id (the same command, the same draws)


def addoption(parser) -> None:
    g = parser.getgroup("attnspec", "attnspec conformance suite")
    g.addoption("--attnspec-backend", action="append", dest="attnspec_backend", default=None, metavar="NAME",
                help="backend to check: built-in name, entry point or package.module:attr (repeatable, or "
                     "comma-separated); default $ATTNSPEC_BACKENDS, else every built-in")
    g.addoption("--attnspec-json", dest="attnspec_json", default=None, metavar="PATH",
                help="write per backend x property x dtype results as JSON (also $ATTNSPEC_JSON)")
    g.addoption("--attnspec-rows", dest="attnspec_rows", default=None, metavar="PATH",
                help="write each test's conformance and semantics rows as it finishes, as JSON lines")
    g.addoption("--attnspec-tb", dest="attnspec_tb", default=None, choices=("block", "long"),
                help="a failure as one block with its reproducer's path (default), or pytest's traceback "
                     "(long; also with -v)")
    g.addoption("--attnspec-repro", dest="attnspec_repro", default=None, metavar="DIR",
                help="folder for reproducer files (default: <json>-repro/ beside the JSON, else ./.attnspec/repro)")
    g.addoption("--attnspec-rule", dest="attnspec_rule", default="attnspec", choices=("attnspec", "flash"),
                help="the error budget's rule: attnspec's per-row budget (default) or flash-attention's "
                     "(2 x the plain error over the tensor)")
    g.addoption("--attnspec-examples", dest="attnspec_examples", default=None, type=int, metavar="N",
                help="drawn problems a property (gradient properties half); default: the profile's "
                     "(6 over every built-in, 100 for a few named backends)")
    g.addoption("--attnspec-no-shrink", dest="attnspec_no_shrink", action="store_true",
                help="report failures as found, unshrunk (and without attributing them to features)")


def add_backend_alias(parser) -> None:
    """--backend, unless a plugin or conftest of this run already defines it (--attnspec-backend always works)."""
    _, unknown = parser.parse_known_and_unknown_args(["--backend", "probe"])
    if "--backend" in unknown:
        parser.getgroup("attnspec").addoption("--backend", action="append", dest="attnspec_backend", default=None,
                                              metavar="NAME", help="same as --attnspec-backend")


def named(config) -> list[str]:
    """The backends the run names (--backend, then ATTNSPEC_BACKENDS); [] when it names none."""
    from attnspec.backends import registry

    raw = config.getoption("attnspec_backend", None) or []
    given = [n.strip() for value in raw for n in value.split(",")]
    if raw and not any(given):  # `--backend "$UNSET"`: never the default backends in its place
        raise ValueError(f"--backend: empty backend name {raw[0]!r}; give a built-in name, an entry point "
                         "or package.module:attr")
    return [n for n in given if n] or registry.names_from_env() or []


def backend_names(config) -> list[str]:
    from attnspec.backends import registry

    return named(config) or registry.suite_names()


def reaches_suite(config, arg, inside: bool = False) -> bool:
    """Whether a path or --pyargs name reaches the suite's folder (inside: lies within it)."""
    arg = str(arg).split("::")[0]
    if config.option.pyargs and (arg == PACKAGE or arg.startswith(PACKAGE + ".")):
        return True
    path = os.path.abspath(os.path.join(str(config.invocation_params.dir), arg))
    within = path == PACKAGE_DIR or path.startswith(PACKAGE_DIR + os.sep)
    return within or (not inside and PACKAGE_DIR.startswith(path + os.sep))


def runs_suite(config) -> bool:
    """Whether this run is the suite's: backends named, or a path or --pyargs name reaching properties/."""
    if named(config):
        return True
    return any(reaches_suite(config, arg) for arg in config.args)


@dataclass(frozen=True)
class SuiteRun:
    """What a run of the suite explores and where it writes."""

    profile: str
    options: Exploration
    seed_from: str       # where the base seed came from (the default, --hypothesis-seed, the commit)
    repro_dir: str
    json_path: str | None
    tb: str              # block | long


def configure(config, installed: int = 0) -> SuiteRun:
    """The run's settings from its options and environment; ValueError for a bad value."""
    json_path = config.getoption("attnspec_json", None) or os.environ.get("ATTNSPEC_JSON") or None
    here = str(config.invocation_params.dir)
    repro = config.getoption("attnspec_repro", None)
    repro = os.path.abspath(os.path.join(here, repro)) if repro else (
        os.path.splitext(os.path.abspath(os.path.join(here, json_path)))[0] + "-repro" if json_path
        else os.path.join(here, REPRO_DIR))
    profile = profiles.choose(len(named(config)) or installed)
    seed, seed_from = DEFAULT_SEED, "the default seed: --hypothesis-seed=N draws others"
    given = config.getoption("hypothesis_seed", None)
    if given is not None:  # Hypothesis' own option: every test's seed derives from it
        seed, seed_from = int(given), "--hypothesis-seed"
    elif (own := profiles.env_seed()) is not None:  # in every profile: a seed the user set is never dropped
        seed, seed_from = own
    elif profile == "ci":
        seed, seed_from = profiles.ci_seed(str(config.rootpath))
    shrink = not config.getoption("attnspec_no_shrink", False)
    examples = config.getoption("attnspec_examples", None) or profiles.EXAMPLES[profile]
    if examples < 1:
        raise ValueError(f"--attnspec-examples must be at least 1; got {examples}")
    options = Exploration(examples=examples, seed=seed, shrink=shrink, attribute=shrink,
                      rule=config.getoption("attnspec_rule", "attnspec") or "attnspec")
    tb = config.getoption("attnspec_tb", None) or ("long" if config.getoption("verbose") > 0 else "block")
    return SuiteRun(profile, options, seed_from, repro, json_path, tb)


def for_installed(config, run: SuiteRun, backends: int) -> SuiteRun:
    """The run of tests `install` put into a user's module: the profile their number of backends gets
    (deep for a few), unless a profile or --attnspec-examples is asked for."""
    import dataclasses

    profile = profiles.choose(backends)
    examples = config.getoption("attnspec_examples", None) or profiles.EXAMPLES[profile]
    return dataclasses.replace(run, profile=profile, options=dataclasses.replace(run.options, examples=examples))
