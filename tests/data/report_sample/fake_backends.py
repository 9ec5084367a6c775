"""Backends that misbehave at the process level, for `attnspec run`'s crash and hang tests.

Imported as a plug-in (`fake_backends:Crashing`) with this folder as the working directory.
"""
import os
import time

from attnspec.backends.base import Backend, Capabilities


class Crashing(Backend):
    """Takes the interpreter down on its first call, as a segfaulting native kernel would."""

    name = "fake-crashing"
    capabilities = Capabilities(dtypes=("float64",))

    def native_forward(self, q, k, v, mask, is_causal, scale):
        os._exit(3)


class Hanging(Backend):
    """Never returns from its first call (longer than any limit the tests set)."""

    name = "fake-hanging"
    capabilities = Capabilities(dtypes=("float64",))

    def native_forward(self, q, k, v, mask, is_causal, scale):
        time.sleep(600)


class Int8Only(Backend):
    """Declares only a dtype the suite has no error budget for: available, yet nothing is tested."""

    name = "fake-int8-only"
    capabilities = Capabilities(dtypes=("int8",))

    def native_forward(self, q, k, v, mask, is_causal, scale):
        raise AssertionError("never called: the suite selects no test for int8")
