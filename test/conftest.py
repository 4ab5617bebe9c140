"""symfix's test-session hook: controls for fixes that 2.13.0 already has.

A control takes one in-base fix out again, so that its tests can be shown to catch the bug. With
SYMFIX_CONTROL=<fix id>, the module test/controls/<fix_id>.py (dashes as underscores) is imported
before any test runs and its ``apply()`` undoes the fix in this process only (a monkeypatch of the
one function the fix changed). Controls live with the tests and never reach a wheel.
"""

import importlib.util
import os
from pathlib import Path


def pytest_configure(config):
    fix_id = os.environ.get("SYMFIX_CONTROL")
    if not fix_id:
        return
    path = Path(__file__).parent / "controls" / f"{fix_id.replace('-', '_')}.py"
    spec = importlib.util.spec_from_file_location(f"symfix_control_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.apply()
