"""The git helpers every room shares: run git in a tree, apply one patch, name the hunk that failed,
write files into a scratch tree (the wheel build, the checkout, the source build, export, audit)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from .series import Patch

# git am needs a committer; keep the user's identity when they have one.
GIT_ENV = {"GIT_COMMITTER_NAME": "symfix", "GIT_COMMITTER_EMAIL": "symfix@users.noreply.github.com"}
# the author of what symfix itself commits (the worktree's base and series)
AUTHOR = ("-c", "user.name=symfix", "-c", "user.email=symfix@users.noreply.github.com")


def run(src: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**GIT_ENV, **os.environ}
    proc = subprocess.run(["git", *args], cwd=src, capture_output=True, text=True, env=env)
    if check and proc.returncode:
        raise RuntimeError(f"git {' '.join(args)} failed in {src}: {proc.stderr.strip()}")
    return proc


def apply(patch: Patch, tree: Path, *options: str) -> str | None:
    """``git apply`` one patch in a scratch ``tree`` (exact context, no fuzz).

    Returns None if it applied, else the failing hunk.
    """
    # Keep git from finding a repository above the scratch directory.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}
    proc = subprocess.run(["git", "apply", "--whitespace=nowarn", *options, str(patch.path)],
                          cwd=tree, env=env, capture_output=True, text=True)
    return failing_hunk(patch, proc.stderr) if proc.returncode else None


def failing_hunk(patch: Patch, stderr: str) -> str:
    m = re.search(r"patch failed: (\S+):(\d+)", stderr)
    if m:
        for change in patch.changes:
            if change.path == m.group(1):
                for hunk in change.hunks:
                    if hunk.startswith(f"@@ -{m.group(2)},"):
                        return f"{change.path}: hunk {hunk}"
        return f"{m.group(1)}:{m.group(2)}"
    lines = stderr.strip().splitlines()
    return lines[-1] if lines else "git apply failed"


def write_tree(tree: Path, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        dest = tree / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
