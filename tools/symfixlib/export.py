"""Upstreaming: each patch as a commit on a PyTorch branch plus the PR text a reviewer expects."""

from __future__ import annotations

import re
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from . import checkout
from .basewheel import Refused
from .build import git_apply, write_tree
from .series import Fix, Patch, Series

# Our provenance trailers: the series keeps them, upstream commits do not want them.
DROPPED_TRAILERS = ("Origin", "Bug", "Applied-Upstream", "Last-Update", "Forwarded")
RELEASE_BRANCH = "release/2.13"

# PyTorch's release tracker accepts cherry-picks in these categories; ours are all of the first.
CRITERION = ("Critical fix: a hard failure (data-dependent error or assertion) when tracing with "
             "unbacked dynamic shapes, with no workaround short of not tracing symbolically. "
             "The change is small, confined to the failing path, and covered by the tests below.")


def upstream_message(message: str) -> str:
    """The commit message without our provenance trailers."""
    keep = [ln for ln in message.rstrip().splitlines()
            if not re.match(rf"({'|'.join(DROPPED_TRAILERS)}): ", ln)]
    return "\n".join(keep).rstrip() + "\n"


def summary(patch: Patch) -> str:
    """The commit body in a reviewer's words: without trailers and our backport note."""
    body = patch.path.read_text().split("\n\n", 1)[1].split("\n---\n", 1)[0]
    body = upstream_message(body)
    body = re.sub(r"\n*Backport of pytorch/pytorch#\d+ to v2\.13\.0, written for symfix\.\n*",
                  "\n", body)
    body = re.sub(r"\n*Fixes #\d+\n*", "\n", body)
    return body.strip()


def test_command(fix: Fix) -> str:
    return "python -m pytest " + " ".join(fix.tests)


def pr_text(series: Series, patch: Patch, fix: Fix) -> str:
    original = fix.status == "original"
    title = patch.subject if original else f"[{RELEASE_BRANCH}] {patch.subject}"
    bugs = " ".join(f"Fixes #{b}" if isinstance(b, int) else f"Fixes {b}" for b in fix.fixes)
    lines = [f"# {title}", "", "## Summary", "", summary(patch), "", bugs, ""]
    if not original:
        landed = patch.trailers.get("Applied-Upstream", "main")
        lines += [f"Cherry-pick of #{patch.origin_pr} (in {landed}) onto `{RELEASE_BRANCH}` "
                  f"({series.base['tag']}), rewritten for the 2.13 code.", "",
                  "## Release tracker", "", f"Criterion: {CRITERION}", ""]
    lines += ["## Test plan", "", "```", test_command(fix), "```", ""]
    if fix.proof:
        lines += ["Regression tests (fail without this change, pass with it):", ""]
        lines += [f"- `{t}`" for t in fix.proof]
        lines += [""]
    if fix.guard:
        lines += ["Behaviour kept (pass before and after):", ""]
        lines += [f"- `{t}`" for t in fix.guard]
        lines += [""]
    return "\n".join(lines)


def base_ref(src: Path, fix: Fix, given: str | None, series: Series) -> str:
    if given:
        return given
    if fix.status == "original":
        raise Refused(f"checkout {src}: {fix.id} is our own fix; name the ref to base it on "
                      "(--base main)")
    for ref in (RELEASE_BRANCH, f"origin/{RELEASE_BRANCH}", series.base["tag"]):
        if checkout.git(src, "rev-parse", "-q", "--verify", f"{ref}^{{commit}}",
                        check=False).returncode == 0:
            return ref
    raise Refused(f"checkout {src}: has neither {RELEASE_BRANCH} nor {series.base['tag']}; "
                  "pass --base REF")


@dataclass
class Exported:
    branch: str
    commits: list[str]
    texts: list[Path]


def export(series: Series, patches: list[Patch], src: Path, base: str | None, out: Path,
           say=print) -> Exported:
    """``patches`` as one linear branch (one commit each) and a PR text per patch in ``out``."""
    fixes = [series.fix_for(p) for p in patches]
    start = base_ref(src, fixes[0], base, series)
    name = fixes[0].id if len(patches) == 1 else "stack"
    branch = f"symfix/export/{name}"
    commits = []

    def strip_trailers(patch, commit):
        message = checkout.git(src, "log", "-1", "--format=%B", commit).stdout
        checkout.git(src, "commit", "-q", "--amend", "--no-verify", "-m",
                     upstream_message(message))
        commits.append(checkout.git(src, "rev-parse", "HEAD").stdout.strip())
        say(patch, commits[-1])

    clean = checkout.git(src, "status", "--porcelain").stdout.strip()
    if clean:
        raise Refused(f"checkout {src}: the tree is not clean")
    checkout.am(src, patches, branch, start, say=strip_trailers)
    out.mkdir(parents=True, exist_ok=True)
    texts = []
    for patch, fix in zip(patches, fixes, strict=True):
        path = out / f"{patch.name.removesuffix('.patch')}.md"
        path.write_text(pr_text(series, patch, fix))
        texts.append(path)
    return Exported(branch, commits, texts)


def rebase_check(series: Series, target: Path) -> dict[str, str]:
    """Textual verdict per patch against another torch's files (a wheel, or a dir holding torch/).

    ``applies`` or ``conflicts: <hunk>``; each patch is checked on its own against the target's
    files, as a cherry-pick onto that base would be.
    """
    paths = {c.path for p in series.wheel_patches for c in p.changes}
    if target.is_file():
        with zipfile.ZipFile(target) as zf:
            files = {path: zf.read(path) for path in paths & set(zf.namelist())}
    else:
        root = target if (target / "torch").is_dir() else target.parent
        files = {path: (root / path).read_bytes() for path in paths if (root / path).is_file()}
    with tempfile.TemporaryDirectory(prefix="symfix-rebase-") as tmp:
        write_tree(Path(tmp), files)
        verdicts = {}
        for patch in series.patches:
            failed = patch.wheel and git_apply(patch, Path(tmp), "--check")
            verdicts[patch.name] = ("source only (not in these Python files)" if not patch.wheel
                                    else f"conflicts: {failed}" if failed else "applies")
        return verdicts
