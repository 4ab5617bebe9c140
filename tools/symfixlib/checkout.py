"""A PyTorch source checkout: verify it is the series base, apply the series as commits."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .build import failing_hunk
from .errors import PatchFailed, Refused
from .series import Patch, Series

# git am needs a committer; keep the user's identity when they have one.
GIT_ENV = {"GIT_COMMITTER_NAME": "symfix", "GIT_COMMITTER_EMAIL": "symfix@users.noreply.github.com"}


def git(src: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**GIT_ENV, **os.environ}
    proc = subprocess.run(["git", *args], cwd=src, capture_output=True, text=True, env=env)
    if check and proc.returncode:
        raise RuntimeError(f"git {' '.join(args)} failed in {src}: {proc.stderr.strip()}")
    return proc


def verify(src: Path, series: Series, at: str = "HEAD") -> str:
    """Refuse unless ``src`` is a clean checkout whose ``at`` is the series base.

    The base is its commit; for a vendor branch or a test fixture, a commit where every file the
    series touches has the pre-image blob its patch records. Returns how it was recognised.
    """
    what = f"checkout {src}"
    if not src.is_dir():
        raise Refused(f"{what}: no such directory")
    if not (src / ".git").exists():
        raise Refused(f"{what}: not a git checkout")
    head = git(src, "rev-parse", "--verify", "-q", f"{at}^{{commit}}", check=False).stdout.strip()
    if not head:
        raise Refused(f"{what}: no commit {at}")
    if at == "HEAD":
        if dirty := git(src, "status", "--porcelain").stdout.splitlines():
            raise Refused(f"{what}: the tree is not clean ({len(dirty)} changed: {dirty[0][3:]}…)")
        missing = [ln.split()[1] for ln in git(src, "submodule", "status").stdout.splitlines()
                   if ln.startswith("-")]
        if missing:
            raise Refused(f"{what}: submodule {missing[0]} is not checked out "
                          f"(git submodule update --init --recursive)")
    if head == series.base["commit"]:
        return f"at {series.base['tag']} ({head[:8]})"
    for path, blob in series.touched_files(source=True).items():
        have = git(src, "rev-parse", "-q", "--verify", f"{head}:{path}", check=False).stdout.strip()
        if have != blob and not (set(blob) == {"0"} and not have):
            raise Refused(f"{what}: {at} {head[:8]} is not {series.base['tag']} "
                          f"({series.base['commit'][:8]}) and {path} is not its file")
    return f"{head[:8]}, every file the series touches as in {series.base['tag']}"


def current_ref(src: Path) -> str:
    return (git(src, "symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip()
            or git(src, "rev-parse", "HEAD").stdout.strip())


def am(src: Path, patches: list[Patch], branch: str, start: str = "HEAD",
       say=lambda patch, commit: None) -> list[str]:
    """Apply ``patches`` with ``git am`` on a new ``branch`` from ``start``, one commit each.

    A patch that does not apply, or a ``say`` that raises, leaves the checkout as it was: am
    aborted, the previous branch checked out again, the new branch deleted.
    """
    if git(src, "rev-parse", "-q", "--verify", f"refs/heads/{branch}", check=False).returncode == 0:
        raise Refused(f"checkout {src}: branch {branch} exists already; delete it first")
    previous = current_ref(src)
    git(src, "checkout", "-q", "-b", branch, start)

    def undo():
        git(src, "am", "--abort", check=False)
        git(src, "reset", "-q", "--hard", check=False)
        git(src, "checkout", "-q", previous)
        git(src, "branch", "-q", "-D", branch)

    commits = []
    for patch in patches:
        proc = git(src, "am", "-q", "--keep-cr", "--keep-non-patch", str(patch.path), check=False)
        if proc.returncode:
            undo()
            raise PatchFailed(f"patch {patch.name} does not apply to {src}: "
                              f"{failing_hunk(patch, proc.stdout + proc.stderr)}")
        commits.append(git(src, "rev-parse", "HEAD").stdout.strip())
        try:
            say(patch, commits[-1])
        except BaseException:
            undo()
            raise
    return commits
