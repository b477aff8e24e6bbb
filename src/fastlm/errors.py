"""User-facing errors: each one is a single line naming the file or parameter and the fix."""

from __future__ import annotations

from collections.abc import Iterator


class FastlmError(Exception):
    """A problem the user can fix (bad input, bad parameter, stale data).

    The project CLI prints ``str(error)`` as one line and exits with status 2; no traceback.
    """

    exit_code = 2

    def __init__(self, what: str, fix: str | None = None):
        message = what if fix is None else f"{what} Fix: {fix}"
        super().__init__(" ".join(message.split()))


class ConfigError(FastlmError):
    """A parameter is missing, misspelled, of the wrong type or out of range."""


class InputDataError(FastlmError):
    """An input file or folder is missing, unreadable or has the wrong shape."""


class StaleDataError(FastlmError):
    """Derived data no longer matches the configuration that should have produced it."""


class OutOfMemory(FastlmError):
    """The device ran out of memory (a training step or an evaluation) and the back-off
    (``train.batching.oom_backoff``) was off or could not shrink the micro-batch further."""


def find_user_error(exc: BaseException | None) -> FastlmError | None:
    """Return the first FastlmError in ``exc``'s chain of explicit causes (Kedro's catalog raises its own
    error ``from`` a dataset's). An implicit ``__context__`` is not followed: an exception raised while a
    user error was being handled is a bug of its own, shown with its traceback, not the user error's line."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, FastlmError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__
    return None


def exception_chain(error: BaseException | None) -> Iterator[BaseException]:
    """``error``, then the exception it was raised from or while handling (``__cause__``, else
    ``__context__``), and so on: each once (a chain can loop back on itself)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__
