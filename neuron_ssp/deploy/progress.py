"""How deploy code tells what it is doing without printing: the CLI draws it, a library user may ignore it.

Launches and endpoint creations take minutes, so the code reports each wait (with its latest detail),
each finished step, and notes and warnings along the way. `Silent` reports nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol


class Progress(Protocol):
    def waiting(self, what: str) -> AbstractContextManager[Callable[[str], None]]:
        """A wait in progress; the callable it gives takes the latest detail (a state, a count)."""

    def done(self, what: str) -> None:
        """A step or a wait finished."""

    def note(self, text: str) -> None:
        """Something worth telling along the way."""

    def warn(self, text: str) -> None:
        """Something the user should act on, though the work goes on."""


class Silent:
    """Reports nothing."""

    @contextmanager
    def waiting(self, what: str) -> Iterator[Callable[[str], None]]:
        yield lambda detail: None

    def done(self, what: str) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def warn(self, text: str) -> None:
        pass
