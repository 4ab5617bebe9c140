"""A PyTorch source checkout: verify it is the series base, apply the series as commits."""

from __future__ import annotations

import zipfile
from pathlib import Path

from . import git, patched
from .errors import PatchFailed, Refused
from .report import Step
from .series import Patch, Series


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
    head = git.run(src, "rev-parse", "--verify", "-q", f"{at}^{{commit}}",
                   check=False).stdout.strip()
    if not head:
        raise Refused(f"{what}: no commit {at}")
    if at == "HEAD":
        if dirty := git.run(src, "status", "--porcelain").stdout.splitlines():
            raise Refused(f"{what}: the tree is not clean ({len(dirty)} changed: {dirty[0][3:]}…)")
        missing = [ln.split()[1] for ln in git.run(src, "submodule", "status").stdout.splitlines()
                   if ln.startswith("-")]
        if missing:
            raise Refused(f"{what}: submodule {missing[0]} is not checked out "
                          f"(git submodule update --init --recursive)")
    if head == series.base["commit"]:
        return f"at {series.base['tag']} ({head[:8]})"
    for path, blob in series.touched_files(source=True).items():
        have = git.run(src, "rev-parse", "-q", "--verify", f"{head}:{path}",
                       check=False).stdout.strip()
        if have != blob and not (set(blob) == {"0"} and not have):
            raise Refused(f"{what}: {at} {head[:8]} is not {series.base['tag']} "
                          f"({series.base['commit'][:8]}) and {path} is not its file")
    return f"{head[:8]}, every file the series touches as in {series.base['tag']}"


def current_ref(src: Path) -> str:
    return (git.run(src, "symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip()
            or git.run(src, "rev-parse", "HEAD").stdout.strip())


def am(src: Path, patches: list[Patch], branch: str, start: str = "HEAD",
       say=lambda patch, commit: None) -> list[str]:
    """Apply ``patches`` with ``git am`` on a new ``branch`` from ``start``, one commit each.

    A patch that does not apply, or a ``say`` that raises, leaves the checkout as it was: am
    aborted, the previous branch checked out again, the new branch deleted.
    """
    exists = git.run(src, "rev-parse", "-q", "--verify", f"refs/heads/{branch}", check=False)
    if exists.returncode == 0:
        raise Refused(f"checkout {src}: branch {branch} exists already; delete it first")
    previous = current_ref(src)
    git.run(src, "checkout", "-q", "-b", branch, start)

    def undo():
        git.run(src, "am", "--abort", check=False)
        git.run(src, "reset", "-q", "--hard", check=False)
        git.run(src, "checkout", "-q", previous)
        git.run(src, "branch", "-q", "-D", branch)

    commits = []
    for patch in patches:
        proc = git.run(src, "am", "-q", "--keep-cr", "--keep-non-patch", str(patch.path),
                       check=False)
        if proc.returncode:
            undo()
            raise PatchFailed(f"patch {patch.name} does not apply to {src}: "
                              f"{git.failing_hunk(patch, proc.stdout + proc.stderr)}")
        commits.append(git.run(src, "rev-parse", "HEAD").stdout.strip())
        try:
            say(patch, commits[-1])
        except BaseException:
            undo()
            raise
    return commits


def worktree(args) -> int:
    """A git repo of the base wheel's Python files with the series applied, one commit a patch."""
    dest = Path(args.dir)
    if dest.exists() and not dest.is_dir():
        raise Refused(f"worktree {dest}: exists and is not a directory")
    if dest.exists() and any(dest.iterdir()):
        raise Refused(f"worktree {dest}: exists and is not empty")
    s = patched.load_series(args)
    base = patched.base_wheel(s, args)
    step = Step("tree")
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(base.path) as zf:
        for info in zf.infolist():
            if info.filename.startswith("torch/") and info.filename.endswith(".py"):
                zf.extract(info, dest)

    def run(*cmd):
        git.run(dest, *git.AUTHOR, *cmd)

    run("init", "-q")
    run("add", "-A")
    run("commit", "-q", "-m", f"PyTorch {s.base['tag']} Python files (from {base.path.name})",
        "-m", f"git_version {s.base['commit']}")
    run("tag", s.base["tag"])
    run("am", "-q", "--keep-cr", "--keep-non-patch", *[str(p.path) for p in s.wheel_patches])
    step.done(f"{dest}: {s.base['tag']} + {len(s.wheel_patches)} commits")
    return 0
