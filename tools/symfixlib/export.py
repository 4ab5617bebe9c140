"""Upstreaming: each patch as a commit on a PyTorch branch plus the PR text a reviewer expects."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from . import checkout, envs, git, matrix, patched, porttests
from .basewheel import sha256_file
from .errors import Refused
from .report import rel, Step
from .series import bases, DEFAULT_BASE, Fix, load, Patch, ROOT, Series

# Our provenance trailers: the series keeps them, upstream commits do not want them.
DROPPED_TRAILERS = ("Origin", "Bug", "Applied-Upstream", "Last-Update", "Forwarded")

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
    body = re.sub(r"\s*Written for symfix; not an upstream backport\.", "", body)
    return body.strip()


def release_branch(series: Series) -> str:
    """The upstream branch of a base release: v2.13.0 -> release/2.13."""
    return "release/" + ".".join(series.base["version"].split(".")[:2])


def _newest_first(root: Path) -> list[str]:
    return sorted(bases(root), key=lambda tag: Version(tag.lstrip("v")), reverse=True)


@dataclass
class Plan:
    """What ``export`` sends: patches of one base's series, and the upstream branch addressed."""

    series: Series
    patches: list[Patch]
    target: str  # "main" or "release/X.Y"
    note: str = ""  # for the PR text: e.g. that a newer release has the fix already

    @property
    def name(self) -> str:
        return self.series.fix_for(self.patches[0]).id if len(self.patches) == 1 else "stack"


def plan(root: Path, fix_id: str | None, tag: str | None = None) -> Plan:
    """The series and patches to export for ``fix_id`` (None: the whole series of ``tag``).

    A fix of our own goes to ``main`` from the newest base whose series carries it; a backport
    goes to its release branch from the series it was written for (the first base's).
    """
    tags = _newest_first(root)
    if tag is not None and tag not in tags:
        raise Refused(f"export: no series for base {tag} (carried: {', '.join(tags)})")
    loaded = {t: load(root, t) for t in ([tag] if tag else tags)}
    if fix_id is None:
        s = loaded[tag or DEFAULT_BASE] if (tag or DEFAULT_BASE) in loaded else loaded[tags[-1]]
        fixes = [s.fix_for(p) for p in s.patches]
        own = all(f.status == "original" for f in fixes)
        newest = s.base["tag"] == tags[0]
        return Plan(s, list(s.patches), "main" if own and newest else release_branch(s))
    carrying = [t for t, s in loaded.items()
                if any(f.id == fix_id and f.patch for f in s.fixes)]
    if not carrying:
        known = any(f.id == fix_id for s in loaded.values() for f in s.fixes)
        raise Refused(f"export: {fix_id} is " + ("not a fix the series carries (no patch)"
                                                 if known else "no fix id of the manifest"))
    status = {next(f for f in loaded[t].fixes if f.id == fix_id).status for t in carrying}
    own = status == {"original"}
    if own:
        chosen = carrying[0]  # newest first
    else:
        chosen = DEFAULT_BASE if DEFAULT_BASE in carrying else carrying[-1]
    s = loaded[chosen]
    fix = next(f for f in s.fixes if f.id == fix_id)
    patches = [p for p in s.patches if p.name == fix.patch]
    note = ""
    if own and chosen != tags[0]:
        newer = [t for t in tags[:tags.index(chosen)] if t in loaded and any(
            f.id == fix_id and f.status == "in-base" for f in loaded[t].fixes)]
        if newer:
            note = (f"{newer[-1]} has this fix already (our tests of it pass there), so it is not "
                    f"for `main`; this change is for `{release_branch(s)}` only.")
    return Plan(s, patches, "main" if own and chosen == tags[0] else release_branch(s), note)


def repro(series: Series, fix: Fix) -> tuple[str, str] | None:
    """The smallest proof test of ``fix``: its id and its source."""
    found = [(porttests.test_source(series.root, t), t) for t in fix.proof + fix.triton_proof]
    found = [(src, t) for src, t in found if src]
    if not found:
        return None
    src, test = min(found, key=lambda x: len(x[0]))
    return test, src


def _test_plan(fix: Fix) -> list[str]:
    lines = ["## Test plan", "", "```", *porttests.test_commands(fix),
             "python -m pytest " + " ".join(fix.tests), "```", ""]
    if fix.proof:
        lines += ["Regression tests (fail without this change, pass with it):", ""]
        lines += [f"- `{t}`" for t in fix.proof]
        lines += [""]
    if fix.triton_proof:
        lines += ["Regression tests on Inductor's Triton (GPU) code path (fail there without this "
                  "change, pass with it; pass before and after on the C++ path):", ""]
        lines += [f"- `{t}`" for t in fix.triton_proof]
        lines += [""]
    if fix.guard:
        lines += ["Behaviour kept (pass before and after):", ""]
        lines += [f"- `{t}`" for t in fix.guard]
        lines += [""]
    return lines


def pr_text(series: Series, patch: Patch, fix: Fix, target: str | None = None,
            note: str = "") -> str:
    """The PR description: a cherry-pick for a release branch, or a fix of ours for main."""
    target = target or ("main" if fix.status == "original" else release_branch(series))
    title = patch.subject if target == "main" else f"[{target}] {patch.subject}"
    bugs = " ".join(f"Fixes #{b}" if isinstance(b, int) else f"Fixes {b}" for b in fix.fixes)
    if fix.status != "original":
        lines = [f"# {title}", "", "## Summary", "", summary(patch), "", bugs, ""]
        landed = patch.trailers.get("Applied-Upstream", "main")
        lines += [f"Cherry-pick of #{patch.origin_pr} (in {landed}) onto `{target}` "
                  f"({series.base['tag']}), rewritten for the {target.split('/')[-1]} code.",
                  "", "## Release tracker", "", f"Criterion: {CRITERION}", ""]
        return "\n".join(lines + _test_plan(fix))
    paragraphs = summary(patch).split("\n\n")
    lines = [f"# {title}", "", *([note, ""] if note else []), "## Problem", "", paragraphs[0], ""]
    if found := repro(series, fix):
        test, src = found
        lines += ["## Repro", "", f"The smallest regression test (`{test}`); it fails without "
                  "this change:", "", "```python", src.rstrip(), "```", ""]
    lines += ["## Why this change is right", "",
              "\n\n".join(paragraphs[1:]) or paragraphs[0], ""]
    if bugs:
        lines += [bugs, ""]
    return "\n".join(lines + _test_plan(fix))


def base_ref(src: Path, target: str, given: str | None, series: Series) -> str:
    def exists(ref):
        return git.run(src, "rev-parse", "-q", "--verify", f"{ref}^{{commit}}",
                            check=False).returncode == 0

    if given:
        if not exists(given):
            raise Refused(f"checkout {src}: no commit {given} (--base)")
        return given
    for ref in (target, f"origin/{target}", series.base["tag"]):
        if exists(ref):
            return ref
    raise Refused(f"checkout {src}: has neither {target} nor {series.base['tag']}; "
                  "pass --base REF")


def check_checkout(src: Path) -> None:
    """One line and exit code 2 for a checkout export cannot work in."""
    if not src.exists():
        raise Refused(f"checkout {src}: no such directory")
    if not src.is_dir():
        raise Refused(f"checkout {src}: not a directory")
    if not (src / ".git").exists():
        raise Refused(f"checkout {src}: not a git checkout")
    if git.run(src, "rev-parse", "--verify", "-q", "HEAD", check=False).returncode:
        raise Refused(f"checkout {src}: has no commit")
    if git.run(src, "status", "--porcelain").stdout.strip():
        raise Refused(f"checkout {src}: the tree is not clean")


def check_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise Refused(f"--out {out}: exists and is not a directory")


@dataclass
class Exported:
    branch: str
    commits: list[str]
    texts: list[Path]


def export(p: Plan, src: Path, base: str | None, out: Path, say=print) -> Exported:
    """``p``'s patches as one linear branch, one commit each holding the fix and its tests,
    and a PR text per patch in ``out``."""
    series = p.series
    fixes = [series.fix_for(patch) for patch in p.patches]
    for fix in fixes:
        if not fix.tests:
            raise Refused(f"export: {fix.id} has no tests to go with it upstream")
    check_checkout(src)
    check_out_dir(out)
    start = base_ref(src, p.target, base, series)
    branch = f"symfix/export/{p.name}"
    commits = []

    def with_tests(patch, commit):
        fix = series.fix_for(patch)
        changed = porttests.carry_fix(fix, series.root, src)
        git.run(src, "add", "--", *changed)
        message = git.run(src, "log", "-1", "--format=%B", commit).stdout
        git.run(src, "commit", "-q", "--amend", "--no-verify", "-m",
                     upstream_message(message))
        commits.append(git.run(src, "rev-parse", "HEAD").stdout.strip())
        say(patch, commits[-1], changed)

    checkout.am(src, p.patches, branch, start, say=with_tests)
    out.mkdir(parents=True, exist_ok=True)
    texts = []
    for patch, fix in zip(p.patches, fixes, strict=True):
        path = out / f"{patch.name.removesuffix('.patch')}.md"
        path.write_text(pr_text(series, patch, fix, p.target, p.note))
        texts.append(path)
    return Exported(branch, commits, texts)


def check_python(python: Path) -> Path:
    """An interpreter given on the command line: it must be there and runnable."""
    if os.sep not in str(python) and shutil.which(str(python)):
        python = Path(shutil.which(str(python)))
    if not python.exists():
        raise Refused(f"python {python}: no such file")
    if python.is_dir() or not os.access(python, os.X_OK):
        raise Refused(f"python {python}: not an executable file")
    return python


def rebase_target(target: Path) -> Path:
    """Refuse anything ``status --rebase-onto`` cannot read torch's files from."""
    what = f"--rebase-onto {target}"
    if not target.exists():
        raise Refused(f"{what}: no such file or directory")
    if target.is_dir():
        if not ((target / "torch").is_dir() or (target / "__init__.py").is_file()
                and target.name == "torch"):
            raise Refused(f"{what}: holds no torch/ package (give a wheel, site-packages, "
                          "a source checkout or the torch/ directory)")
        return target
    try:
        name, _, _, _ = parse_wheel_filename(target.name)
    except InvalidWheelFilename:
        raise Refused(f"{what}: not a wheel (name it torch-VERSION-...whl) "
                      "nor a directory") from None
    if name != "torch":
        raise Refused(f"{what}: a {name} wheel, not a torch wheel")
    try:
        with zipfile.ZipFile(target) as zf:
            has_torch = "torch/__init__.py" in zf.namelist()
    except (zipfile.BadZipFile, OSError) as e:
        raise Refused(f"{what}: not a readable wheel ({e})") from None
    if not has_torch:
        raise Refused(f"{what}: holds no torch/__init__.py, not a torch wheel")
    return target


def _torch_root(target: Path) -> Path:
    return target if (target / "torch").is_dir() else target.parent


def rebase_python(target: Path, given: str | None, say=print) -> tuple[Path | None, str]:
    """A Python whose torch is ``target``'s, to run the fixes' tests with, or why there is none.

    A directory: the interpreter of the environment it sits in. A wheel: an environment of ours
    that has it (same sha256 or version), else a new one made from it.
    """
    if given:
        return check_python(Path(given)), ""
    if target.is_dir():
        for up in [target, *target.parents][:5]:
            is_env = (up / "pyvenv.cfg").is_file() or (up / "conda-meta").is_dir()
            if is_env and (up / "bin" / "python").is_file():
                return up / "bin" / "python", ""
        return None, f"no Python environment around {target} (pass --python)"
    sha = sha256_file(target)
    version = str(parse_wheel_filename(target.name)[1])
    for marker in sorted(envs.ENVS.glob(f"*/{envs.MARKER}")):
        try:
            have = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue
        python = envs.python_of(marker.parent)
        if (have.get("key") == sha or have.get("torch_version") == version) and python.is_file():
            return python, ""
    say(f"venv    no environment with {target.name} yet: making one (minutes)", flush=True)
    try:
        env = envs.ensure("rebase", str(target), sha, need_gb=envs.COLD_GB["cuda"])
        return envs.python_of(env), ""
    except (envs.EnvError, OSError) as e:
        return None, f"could not make an environment for it ({str(e).splitlines()[0]})"


def rebase_check(series: Series, target: Path) -> dict[str, str]:
    """Textual verdict per patch against another torch's files (a wheel, or a dir holding torch/).

    ``applies`` or ``conflicts: <hunk>``, in series order as quilt pushes them: a patch that
    applies stays applied for the ones after it (a follow-up patch needs the one it follows).
    """
    paths = {c.path for p in series.wheel_patches for c in p.changes}
    if target.is_file():
        with zipfile.ZipFile(target) as zf:
            files = {path: zf.read(path) for path in paths & set(zf.namelist())}
    else:
        root = _torch_root(target)
        files = {path: (root / path).read_bytes() for path in paths if (root / path).is_file()}
    with tempfile.TemporaryDirectory(prefix="symfix-rebase-") as tmp:
        git.write_tree(Path(tmp), files)
        verdicts = {}
        for patch in series.patches:
            failed = patch.wheel and git.apply(patch, Path(tmp))
            verdicts[patch.name] = ("source only (not in these Python files)" if not patch.wheel
                                    else f"conflicts: {failed}" if failed else "applies")
        return verdicts


def run(args) -> int:
    """`symfix.py export`: a patch (or the stack) as a PyTorch branch plus its PR text."""
    if args.all == bool(args.id):
        raise Refused("export: name one fix id, or --all")
    xp = plan(ROOT, args.id, args.series)
    s = xp.series
    print(f"series  {s.base['tag']}: {len(xp.patches)} of {len(s.patches)} patches, "
          f"PR text addressed to {xp.target}" + (f"\n        {xp.note}" if xp.note else ""))
    src = Path(args.onto).resolve()
    check_checkout(src)
    check_out_dir(Path(args.out))
    if args.dry_run:
        start = base_ref(src, xp.target, args.base, s)
        print(f"would run, in {src}:\n  git checkout -b symfix/export/{xp.name} {start}")
        for p in xp.patches:
            fix = s.fix_for(p)
            print(f"  git am --keep-cr --keep-non-patch {p.path}")
            print(f"  add the tests to {', '.join(porttests.wanted(fix))}; "
                  f"git commit --amend (without {', '.join(DROPPED_TRAILERS)})")
            print(f"  write {Path(args.out) / p.name.removesuffix('.patch')}.md")
        return 0
    step = Step("export")

    def exported(patch, commit, tests):
        print(f"        {commit[:10]} {patch.subject}\n                   + {', '.join(tests)}",
              flush=True)

    done = export(xp, src, args.base, Path(args.out), say=exported)
    step.done(f"{src}: branch {done.branch}, {len(done.commits)} commits")
    for text in done.texts:
        print(f"        PR text: {rel(text)}")
    return 0


def rebase_status(args) -> int:
    """`symfix.py status --rebase-onto`: does each patch apply to, or is it in, that torch?"""
    s = patched.load_series()
    target = rebase_target(Path(args.rebase_onto).resolve())
    if unknown := set(args.fix or ()) - {fix.id for fix in s.fixes}:
        raise Refused(f"--fix {', '.join(sorted(unknown))}: no such fix in {s.base['tag']}'s "
                      "manifest")
    chosen = [p for p in s.patches if not args.fix or s.fix_for(p).id in args.fix]
    step = Step("rebase")
    verdicts = rebase_check(s, target)  # the whole series: a patch may need the ones before it
    python, why_not = (None, "--no-tests") if args.no_tests else \
        rebase_python(target, args.python)
    outcomes = {}
    if python:
        log = ROOT / ".symfix" / "logs" / "rebase.log"
        outcomes = matrix.run_tests(python, [t for p in chosen for t in s.fix_for(p).tests],
                                    log).outcomes
        if all(v == "missing" for v in outcomes.values()):
            python, why_not = None, f"none ran with {python}, see {rel(log)}"
    step.done(f"{target.name}: {len(chosen)} patches checked"
              + (f", tests run with {python}" if python
                 else f"; tests not run ({why_not}): verdicts from applying alone"))
    for patch in chosen:
        fix = s.fix_for(patch)
        upstream = fix.proof and all(outcomes.get(t) == matrix.PASS for t in fix.tests)
        verdict = ("already upstream (its tests pass there): drop it" if upstream
                   else verdicts[patch.name])
        print(f"  {patch.name:<48} {verdict}")
    return 0
