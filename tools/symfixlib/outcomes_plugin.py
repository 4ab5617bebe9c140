"""pytest plugin used by the matrix: run only the wanted test ids, record each one's outcome.

Loaded with ``-p symfixlib.outcomes_plugin``; SYMFIX_WANTED names a JSON list of node ids (unset:
every test runs) and SYMFIX_OUTCOMES the JSON file the outcomes (node id -> passed | failed |
skipped) go to.
"""

import json
import os
import signal

_outcomes: dict[str, str] = {}

# A job started from a shell's background job inherits SIGINT ignored, and Python then leaves it
# so; symfix interrupts its jobs with SIGINT (children.started).
signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    if "SYMFIX_WANTED" not in os.environ:
        return
    with open(os.environ["SYMFIX_WANTED"]) as f:
        wanted = set(json.load(f))
    keep = [item for item in items if item.nodeid in wanted]
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
    items[:] = keep


def pytest_runtest_logreport(report):
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif report.skipped and report.when == "setup":
        _outcomes[report.nodeid] = "skipped"
    elif report.when == "call":
        _outcomes.setdefault(report.nodeid, "passed")


def pytest_sessionfinish(session):
    with open(os.environ["SYMFIX_OUTCOMES"], "w") as f:
        json.dump(_outcomes, f, indent=1, sort_keys=True)
