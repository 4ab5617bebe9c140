# Owner(s): ["module: ci"]
"""The project's own code passes ruff with the configuration in pyproject.toml."""

import subprocess
import sys
from pathlib import Path

from torch.testing._internal.common_utils import run_tests, TestCase

ROOT = Path(__file__).resolve().parents[2]


class TestLint(TestCase):
    def test_ruff(self):
        proc = subprocess.run([sys.executable, "-m", "ruff", "check", "tools", "test", "torch", "setup.py"],
                              cwd=ROOT, capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)


if __name__ == "__main__":
    run_tests()
