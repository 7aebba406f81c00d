"""Run by tests/test_deps.py in a child pytest (not collected by the suite: no test_ prefix)."""

from tests import deps


def test_needs_something_absent() -> None:
    deps.missing("frobnicator is not installed (apt-get install frobnicator)")


def test_plain() -> None:
    assert True
