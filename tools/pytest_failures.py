"""A pytest plugin that writes each failure's report to a file as soon as it
arrives (with pytest-xdist, as the controller receives it), so that a run cut
short by a time limit still leaves its tracebacks; pytest itself prints them
only at the end.

    pytest -p pytest_failures --failures-file FILE ...   (tools/ on PYTHONPATH)
"""

import pytest

_PATH = {}  # the file to write to, set by pytest_configure in the controller


def pytest_addoption(parser):
    parser.addoption("--failures-file", default=None,
                     help="append every failed or erroring test's report to this file")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    path = _PATH.get("file")
    if path is None or not report.failed:  # a failing setup or teardown is "failed" too
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


def pytest_configure(config):
    # With pytest-xdist the hook runs in each worker and again in the controller,
    # which receives the workers' reports: the controller alone writes.
    if not hasattr(config, "workerinput"):
        _PATH["file"] = config.getoption("--failures-file")
