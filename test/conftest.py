"""symfix's test-session hooks: the Triton path, and controls for fixes that 2.13.0 already has.

With SYMFIX_INDUCTOR=triton, Inductor compiles through its Triton (GPU) code path, the kernels run
by Triton's interpreter on CPU tensors (test/inductor/_triton_cpu.py): the interpreter must be
switched on before torch is imported, hence here, at the top. With SYMFIX_DEVICE=cuda (the GPU
check, tools/gpu_check.sh), tensors are made on the GPU: the same tests on Triton's real backend.

A control takes one in-base fix out again, so that its tests can be shown to catch the bug. With
SYMFIX_CONTROL=<fix id>, the module test/controls/<fix_id>.py (dashes as underscores) is imported
before any test runs and its ``apply()`` undoes the fix in this process only (a monkeypatch of the
one function the fix changed). Controls live with the tests and never reach a wheel.
"""

import importlib.util
import os
from pathlib import Path

import pytest

TRITON_PATH = os.environ.get("SYMFIX_INDUCTOR") == "triton"
if TRITON_PATH:
    os.environ["TRITON_INTERPRET"] = "1"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pytest_configure(config):
    if device := os.environ.get("SYMFIX_DEVICE"):
        import torch

        torch.set_default_device(device)
    if TRITON_PATH:
        helper = _load(Path(__file__).parent / "inductor" / "_triton_cpu.py", "symfix_triton_cpu")
        try:
            helper.activate()
        except helper.TritonPathUnavailable as e:
            raise pytest.UsageError(
                f"SYMFIX_INDUCTOR=triton: cannot run the Triton path: {e}") from None
    fix_id = os.environ.get("SYMFIX_CONTROL")
    if not fix_id:
        return
    path = Path(__file__).parent / "controls" / f"{fix_id.replace('-', '_')}.py"
    _load(path, f"symfix_control_{path.stem}").apply()
