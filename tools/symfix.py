#!/usr/bin/env python3
"""symfix: PT2 symbolic-tracing fixes for PyTorch 2.13.0.

    python3 tools/symfix.py wheel     patched torch wheel in dist/, installed into .venv/
    python3 tools/symfix.py test      regression matrix (stock / patched [/ upstream]) + test suite
    python3 tools/symfix.py status    which fixes a torch install has, judged by their tests
    python3 tools/symfix.py table     the README's series table, from patches/<base>/manifest.toml

The first run installs the tool's own dependencies (pyproject.toml) into .symfix/envs/tools.
"""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS_ENV = ROOT / ".symfix" / "envs" / "tools"


def _bootstrap() -> None:
    """Re-run under .symfix/envs/tools when this Python lacks the tool's dependencies."""
    try:
        import packaging  # noqa: F401
        import unidiff  # noqa: F401
        import uv  # noqa: F401
        import wheel  # noqa: F401

        return
    except ImportError:
        pass
    python = TOOLS_ENV / "bin" / "python"
    if os.environ.get("SYMFIX_BOOTSTRAPPED"):
        sys.exit(f"symfix: {python} still lacks the tool's dependencies")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    marker = TOOLS_ENV / "symfix-env.json"
    if not marker.is_file() or json.loads(marker.read_text()) != deps:
        print(f"setup   {TOOLS_ENV.relative_to(ROOT)}: {' '.join(deps)}", flush=True)
        subprocess.run(["rm", "-rf", str(TOOLS_ENV)], check=True)
        # A venv without pip of its own (ensurepip takes seconds), filled by this Python's pip.
        for cmd in ([sys.executable, "-m", "venv", "--without-pip", str(TOOLS_ENV)],
                    [sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                     "--disable-pip-version-check", *deps]):
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"symfix: setting up {TOOLS_ENV} failed:\n{proc.stdout}{proc.stderr}")
        marker.write_text(json.dumps(deps))
    os.execve(python, [str(python), __file__, *sys.argv[1:]],
              {**os.environ, "SYMFIX_BOOTSTRAPPED": "1"})


if __name__ == "__main__":
    _bootstrap()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from symfixlib.cli import main

    sys.exit(main())
