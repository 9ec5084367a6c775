"""A backend that answers its first calls and declines every later one (a kernel whose shape limits the
suite cannot know): a property that checked problems before the declines is never "every drawn problem
was declined"."""
from __future__ import annotations

from attnspec.backends.base import Unsupported
from attnspec.backends.numpy_backends import NumpyNaive

ANSWERED = 3  # calls answered before every later one is declined


class AnswersThenDeclines(NumpyNaive):
    name = "answers-then-declines"

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        if self.calls > ANSWERED:
            raise Unsupported("this kernel takes no more problems")
        return super().forward(*args, **kwargs)
