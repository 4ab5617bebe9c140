"""How the verbs report: one aligned progress line per step, paths relative to the checkout."""

from __future__ import annotations

import time
from pathlib import Path

from .series import ROOT


class Step:
    """Prints one aligned progress line per step, with its duration."""

    def __init__(self, name: str):
        self.name, self.t0 = name, time.monotonic()

    def done(self, text: str, status: str = "ok") -> None:
        secs = time.monotonic() - self.t0
        print(f"{self.name:<7} {text:<78} {status:>4} {secs:6.1f}s", flush=True)


def rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
