"""Which exception the CLI shows as a user error (one line) and which as a bug (a traceback)."""

from __future__ import annotations

import pytest

from fastlm.errors import ConfigError, InputDataError, find_user_error


def _raise_chained(outer: type[Exception], explicit: bool) -> BaseException:
    try:
        try:
            raise ConfigError("train.lr must be a number.", fix="set it to 1e-4.")
        except ConfigError as inner:
            if explicit:
                raise outer("the catalog could not load the dataset") from inner
            raise outer("a bug while handling the user error")  # noqa: B904 - the implicit chain tested
    except Exception as exc:  # noqa: BLE001 - returned to the test
        return exc
    raise AssertionError("nothing was raised")


def test_a_user_error_wrapped_on_purpose_is_found_through_its_cause():
    """Kedro's catalog raises its ``DatasetError`` ``from`` the dataset's own error: the user's line is
    the wrapped one."""
    error = _raise_chained(RuntimeError, explicit=True)
    assert isinstance(find_user_error(error), ConfigError)
    assert "train.lr" in str(find_user_error(error))


@pytest.mark.parametrize("bug", [TypeError, KeyError, AttributeError])
def test_a_bug_raised_while_a_user_error_was_handled_is_no_user_error(bug):
    """A bug inside an ``except FastlmError`` block chains the user error as its implicit context only:
    shown as the user's one line, the bug would be hidden and the user sent to fix a parameter that may be
    fine."""
    error = _raise_chained(bug, explicit=False)
    assert error.__context__ is not None and isinstance(error.__context__, ConfigError)
    assert find_user_error(error) is None


def test_a_user_error_raised_while_another_exception_was_handled_is_itself():
    try:
        try:
            {}["missing"]
        except KeyError:
            raise InputDataError("x.csv has no text column.", fix="name it.")  # noqa: B904 - tested
    except InputDataError as exc:
        assert find_user_error(exc) is exc


def test_an_exception_chain_is_walked_once_each_even_where_it_loops():
    """``exception_chain``: the error, what it was raised from (``__cause__``) or while handling
    (``__context__``), each once: a chain that loops back (an error re-raised while handling itself) ends."""
    from fastlm.errors import exception_chain

    first, second, third = ValueError("first"), KeyError("second"), OSError("third")
    third.__cause__ = second
    second.__context__ = first
    first.__context__ = third  # back to the start
    assert [str(e) for e in exception_chain(third)] == ["third", "'second'", "first"]
    assert list(exception_chain(None)) == []
