"""
Every test here is a trial-style class (``twisted.trial.unittest``), so the
suite runs the same under ``pytest`` and ``trial``.

pytest-twisted installs the reactor.  It also runs plain test *functions*
inside a reactor greenlet, which then fights trial's own spinning of the
reactor (seen: child processes of later tests never reaped).  So plain test
functions are refused at collection, with a message that says why.
"""

import hypothesis
import pytest


def pytest_collection_modifyitems(session, config, items):
    functions = [
        item.nodeid
        for item in items
        if isinstance(item, pytest.Function) and getattr(item, "cls", None) is None
    ]
    if functions:
        raise pytest.UsageError(
            "plain test functions break trial-style tests under pytest-twisted; "
            "make these methods of a twisted.trial.unittest class: " + ", ".join(functions[:5])
        )


@pytest.fixture(scope="session", autouse=True)
def _scratch_directory(tmp_path_factory):
    """
    trial's ``mktemp`` makes paths relative to the working directory (trial
    itself runs in _trial_temp); under pytest, work in a scratch directory so
    tests never write into the source tree.
    """
    import os

    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("trial"))
    yield
    os.chdir(before)


# Examples are judged by their outcome, not their speed: a loaded CI machine
# must not fail a property on hypothesis's 200 ms deadline.
hypothesis.settings.register_profile("trapsandbox", deadline=None)
hypothesis.settings.load_profile("trapsandbox")
