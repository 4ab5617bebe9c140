#!/usr/bin/env python3
"""symfix: PT2 symbolic-tracing fixes for PyTorch 2.13.0.

    python3 tools/symfix.py wheel     patched torch wheel in dist/, installed into .venv/
    python3 tools/symfix.py test      regression matrix (stock / patched [/ upstream]) + test suite
    python3 tools/symfix.py status    which fixes a torch install has, judged by their tests
    python3 tools/symfix.py table     the README's series table, from patches/<base>/manifest.toml

The first run on a machine installs the tool's own dependencies (pyproject.toml) into
~/.cache/symfix/tools-<hash>.
"""

import hashlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEPS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["symfix"]["dependencies"]
# One tools environment per set of dependencies, shared by every clone on the machine (as uv and
# pre-commit share theirs): a fresh clone starts in seconds.
TOOLS_ENV = (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "symfix"
             / f"tools-{hashlib.sha256(json.dumps(DEPS).encode()).hexdigest()[:12]}")


def _bootstrap(script: str = __file__) -> None:
    """Re-run ``script`` (this file, or setup.py) under the tools environment when this Python
    lacks the tool's dependencies."""
    try:
        import packaging  # noqa: F401
        import unidiff  # noqa: F401
        import uv  # noqa: F401
        import wheel  # noqa: F401

        os.environ.pop("SYMFIX_BOOTSTRAPPED", None)  # a symfix.py this one runs starts afresh
        return
    except ImportError:
        pass
    python = TOOLS_ENV / "bin" / "python"
    if os.environ.get("SYMFIX_BOOTSTRAPPED"):
        sys.exit(f"symfix: {python} still lacks the tool's dependencies")
    if not python.is_file():
        print(f"setup   {TOOLS_ENV}: {' '.join(DEPS)}", flush=True)
        tmp = TOOLS_ENV.with_name(f".{TOOLS_ENV.name}.{os.getpid()}")
        # A venv without pip of its own (ensurepip takes seconds), filled by this Python's pip,
        # then renamed into place: a killed setup leaves nothing that looks complete.
        for cmd in ([sys.executable, "-m", "venv", "--without-pip", str(tmp)],
                    [sys.executable, "-m", "pip", "--python", str(tmp / "bin" / "python"),
                     "install", "-q", "--disable-pip-version-check", *DEPS]):
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                subprocess.run(["rm", "-rf", str(tmp)])
                sys.exit(f"symfix: setting up {TOOLS_ENV} failed:\n{proc.stdout}{proc.stderr}")
        try:
            os.replace(tmp, TOOLS_ENV)
        except OSError:  # another clone made it first
            subprocess.run(["rm", "-rf", str(tmp)])
    os.execve(python, [str(python), script, *sys.argv[1:]],
              {**os.environ, "SYMFIX_BOOTSTRAPPED": "1"})


if __name__ == "__main__":
    _bootstrap()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from symfixlib.cli import main

    sys.exit(main())
