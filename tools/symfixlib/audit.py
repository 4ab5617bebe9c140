"""`symfix.py audit`: where a user's step breaks or specializes its unbacked sizes, and which
symfix fix fixes it.

The capture and its findings are torch/_symfix/audit.py's (the file the patched wheel ships as
``torch._symfix.audit``), run with the audited Python.  This driver adds the remedies.  While
the capture fails, the fixes whose patched files hold a frame of the failure are candidates,
those with a hunk over the failing line first; each is tried by capturing again on an overlay:
the audited torch with that fix (and the fixes found so far) applied to a copy of the files the
patches change, the rest of the package linked.  A candidate that moves the capture past the
failure is the fix for it; the proof tests of every fix found then run on the audited torch
(where they must fail) and on the overlay (where they must pass).  A failure no fix moves past
is checked against the series' oracle (torch 2.15.0, the environment `test --upstream`
makes); else it has no known fix and gets a repro file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from . import git, matrix
from .errors import BadTarget, Refused
from .series import base_for, Fix, git_blob_id, load, Patch, ROOT, Series

ENGINE = ROOT / "torch" / "_symfix" / "audit.py"
ORACLE = ROOT / ".symfix" / "upstream" / "bin" / "python"  # the series' oracle: `test --upstream`


def engine():
    """torch/_symfix/audit.py as a module (it imports torch only to capture)."""
    spec = importlib.util.spec_from_file_location("symfix_audit_engine", ENGINE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def probe(python: Path) -> dict:
    """The audited torch: its package directory and version, without importing torch."""
    code = ("import importlib.util as u, json, os; s = u.find_spec('torch'); "
            "d = s.submodule_search_locations[0] if s else None; "
            "v = open(os.path.join(d, 'version.py')).read() if d else ''; "
            "print(json.dumps({'dir': d, 'version': v}))")
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if proc.returncode:
        raise BadTarget(f"{python}: cannot run it")
    info = json.loads(proc.stdout)
    if not info["dir"]:
        raise BadTarget(f"{python}: has no torch")
    version = next((ln.split("=", 1)[1].strip().strip("'\"") for ln in info["version"].splitlines()
                    if ln.startswith("__version__")), "?")
    return {"dir": Path(info["dir"]), "version": version}


def run_engine(python: Path, target: str, overlay: Path | None = None,
               timeout: int = 900, extra: tuple[str, ...] | list[str] = (),
               progress=None) -> dict:
    """The engine's JSON result for ``target`` (``extra``: its options, --replay say); the
    engine's progress lines (``replay  ...`` on its stderr) go to ``progress`` as they come."""
    env = dict(os.environ)
    if overlay is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(overlay), *filter(None, [env.get("PYTHONPATH")])])
    # A torch with torch._symfix.audit runs its own; any other runs this repository's file.
    cmd = ([str(python), "-m", "torch._symfix", "audit"] if in_wheel(python)
           else [str(python), str(ENGINE)])
    proc = subprocess.Popen([*cmd, "--json", *extra, target], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()))
    timer = threading.Timer(timeout, proc.kill)
    reader.start()
    timer.start()
    try:
        err = []
        for line in proc.stderr:
            if progress is not None and line.startswith("replay  "):
                progress(line.rstrip("\n"))
            else:
                err.append(line)
        proc.wait()
        reader.join()
    finally:
        timer.cancel()
        if proc.poll() is None:  # Ctrl-C: the engine goes too
            proc.kill()
            proc.wait()
    stdout, stderr = "".join(out), "".join(err)
    if proc.returncode == 2:
        raise BadTarget((stderr.strip().splitlines() or ["bad input"])[-1]
                        .removeprefix("symfix audit: "))
    start = stdout.find("{\n")
    if start < 0:
        tail = "\n".join((stdout + stderr).strip().splitlines()[-5:])
        raise BadTarget(f"the capture died with {python} (exit {proc.returncode}): {tail}")
    return json.loads(stdout[start:])


def in_wheel(python: Path) -> bool:
    try:
        return (probe(python)["dir"] / "_symfix" / "audit.py").is_file()
    except BadTarget:
        return False


class Overlay:
    """The audited torch with some patches applied: a directory that shadows the package on
    PYTHONPATH, holding patched copies of the changed files and links to everything else."""

    def __init__(self, series: Series, torch_dir: Path, tmp: Path):
        self.series, self.torch_dir, self.tmp = series, torch_dir, tmp
        self.base = {path: (torch_dir.parent / path).read_bytes()
                     for path in series.touched_files() if (torch_dir.parent / path).is_file()}
        self.pristine = all(git_blob_id(self.base.get(p, b"")) == blob
                            for p, blob in series.touched_files().items())
        self.n = 0

    def make(self, patches: list[Patch]) -> Path | None:
        """The overlay for ``patches`` (in series order), or None if one does not apply."""
        self.n += 1
        root = self.tmp / f"overlay-{self.n}"
        scratch = self.tmp / f"apply-{self.n}"
        git.write_tree(scratch, self.base)
        for p in sorted(patches, key=self.series.wheel_patches.index):
            if git.apply(p, scratch):
                return None
        changed = {c.path for p in patches for c in p.changes}
        for path in changed:
            self._link_parents(root, path)
            dest = root / path
            if dest.is_symlink():
                dest.unlink()
            for pyc in (dest.parent / "__pycache__").glob(f"{dest.stem}.*.pyc"):
                pyc.unlink()
            if (scratch / path).exists():
                dest.write_bytes((scratch / path).read_bytes())
        shutil.rmtree(scratch)
        return root

    def _link_parents(self, root: Path, path: str) -> None:
        """Make the directories of ``path`` real in ``root``, every sibling a link."""
        parts = Path(path).parts[:-1]
        src, dst = self.torch_dir.parent, root
        for part in parts:
            src, dst = src / part, dst / part
            if dst.is_dir() and not dst.is_symlink():
                continue
            if dst.is_symlink():
                dst.unlink()
            dst.mkdir(parents=True)
            for entry in src.iterdir():
                if entry.name != "__pycache__":
                    (dst / entry.name).symlink_to(entry)
            # compiled modules of the siblings stay shared; Python writes the patched ones here
            if (src / "__pycache__").is_dir():
                (dst / "__pycache__").mkdir()
                for pyc in (src / "__pycache__").iterdir():
                    (dst / "__pycache__" / pyc.name).symlink_to(pyc)


def candidates(series: Series, failure: dict, have: set[str]) -> list[tuple[Patch, str]]:
    """Patches whose changed files hold a frame of the failure: hunk over the line first, then
    by file, innermost frame first."""
    frames = [f for f in reversed(failure.get("torch_frames") or [])]
    in_hunk, in_file = [], []
    for fr in frames:
        for p in series.wheel_patches:
            fix = series.fix_for(p)
            if fix.id in have:
                continue
            for c in p.changes:
                if c.path != fr["file"]:
                    continue
                hit = any(_hunk_covers(h, fr["line"]) for h in c.hunks)
                (in_hunk if hit else in_file).append(p)
    out: dict[str, tuple[Patch, str]] = {}
    for p in in_hunk:
        out.setdefault(p.name, (p, "a frame of the failure is in a hunk it patches"))
    for p in in_file:
        out.setdefault(p.name, (p, "a frame of the failure is in a file it patches"))
    return list(out.values())


def nearest_first(patches: list[Patch], failure: dict) -> list[Patch]:
    """``patches`` ordered by how close their files are to the failure's frames (the longest
    common directory), then in series order: a Dynamo-raised failure tries Dynamo's first."""
    dirs = [Path(f["file"]).parent.parts for f in failure.get("torch_frames") or []]

    def closeness(p: Patch) -> int:
        best = 0
        for c in p.changes:
            parts = Path(c.path).parent.parts
            for d in dirs:
                n = next((i for i, (a, b) in enumerate(zip(parts, d, strict=False)) if a != b),
                         min(len(parts), len(d)))
                best = max(best, n)
        return best

    return sorted(patches, key=lambda p: -closeness(p))


def _hunk_covers(hunk: str, line: int, slack: int = 3) -> bool:
    # "@@ -720,8 +720,12 @@ ..." in the pre-image's numbering (the audited torch is the base)
    start, _, length = hunk.split()[1][1:].partition(",")
    start, length = int(start), int(length or 1)
    return start - slack <= line <= start + length + slack


def same(a: dict | None, b: dict | None) -> bool:
    return a is not None and b is not None and a["kind"] == b["kind"] and (
        (a["torch_func"] or a["torch"]) == (b["torch_func"] or b["torch"])) and a["user"] == b[
        "user"] and a["expr"].split(":")[0] == b["expr"].split(":")[0]


def fatal(result: dict) -> dict | None:
    """The finding that stops the capture, where a fix of torch may remove it (not one whose
    remedy is the step's own)."""
    return next((f for f in result["findings"] if f["fatal"] and not f.get("remedy")), None)


class Search:
    """Tries fixes against one failure: captures again with each added to ``applied``."""

    def __init__(self, series, overlay, python, target, applied, fail, say, extra=()):
        self.series, self.overlay, self.python, self.target = series, overlay, python, target
        self.applied, self.fail, self.say, self.extra = applied, fail, say, list(extra)
        self.tried: list[Patch] = []

    def attempt(self, cand: Patch, how: str) -> dict | None:
        """The capture with ``cand`` added, if it gets past the failure; else None."""
        self.tried.append(cand)
        deps = []
        root = self.overlay.make(self.applied + [cand])
        if root is None:  # needs an earlier patch's context: try with those patches
            deps = context_of(self.series, cand, self.applied)
            root = self.overlay.make(self.applied + deps + [cand])
        if root is None:
            return None
        self.say(f"        {self.fail['kind']} in {self.fail['torch_func']}: trying "
                 f"{self.series.fix_for(cand).id} ({cand.name[:4]}, {how})")
        trial = run_engine(self.python, self.target, root, extra=self.extra)
        if same(fatal(trial), self.fail):
            return None
        trial["_with"], trial["_how"] = deps + [cand], how
        return trial


def context_of(series: Series, cand: Patch, applied: list[Patch]) -> list[Patch]:
    """The earlier patches ``cand`` may need for its context: those before it (not in
    ``applied``) that change one of its files, or a file of one of them, and so on (0079 over
    0048's lines, 0048 over 0046's in another file)."""
    before = [p for p in series.wheel_patches[:series.wheel_patches.index(cand)]
              if p not in applied]
    files, deps = {c.path for c in cand.changes}, []
    while grown := [p for p in before if p not in deps and files & {c.path for c in p.changes}]:
        deps += grown
        files |= {c.path for p in grown for c in p.changes}
    return sorted(deps, key=series.wheel_patches.index)


def next_fix(series, overlay, python, target, applied, have, fail, say,
             extra=()) -> dict | None:
    """The capture with the next fix that gets past ``fail`` added to ``applied`` (the fix in
    its "_with"), or None: candidates by the failure's frames, else the rest of the series.
    ``extra``: the engine's options (a replay's)."""
    done = have | {series.fix_for(p).id for p in applied}
    search = Search(series, overlay, python, target, applied, fail, say, extra)
    for cand, how in candidates(series, fail, done):
        if trial := search.attempt(cand, how):
            return trial
    # No frame in a patch's hunks or files (Dynamo re-raised it, say): does the rest of the
    # series get past it at all? Then find the one patch that does.
    rest = [p for p in series.wheel_patches
            if p not in applied and series.fix_for(p).id not in done]
    root = overlay.make(applied + rest) if rest else None
    if root is not None and not same(fatal(run_engine(python, target, root, extra=extra)),
                                     fail):
        for cand in nearest_first([p for p in rest if p not in search.tried], fail):
            if trial := search.attempt(cand, "no frame in its files; found by trying the "
                                             "series"):
                return trial
    return None


def run_proofs(python: Path, fixes: list[Fix], overlay: Path | None, log: Path) -> dict:
    """The outcome of each proof test of ``fixes`` (test id -> passed, failed, ...)."""
    return matrix.run_tests(python, [t for f in fixes for t in f.proof], log,
                            overlay=overlay).outcomes


def audit(series: Series, target: str, python: Path, repro_dir: Path, tests: bool = True,
          say=print) -> int:
    eng = engine()
    info = probe(python)
    say(f"audit   {target} with {os.path.relpath(python)} (torch {info['version']})")
    first = run_engine(python, target)
    runs = [([], first)]  # (patches applied on top of the audited torch, result)
    have = set(first["symfix"] or [])
    tmp = Path(tempfile.mkdtemp(prefix="symfix-audit-"))
    how_found: dict[str, str] = {}  # patch name -> how it was matched to its failure
    found: list[tuple[dict, list[Patch], Patch | None]] = []  # finding, applied, fixing patch
    try:
        overlay = Overlay(series, info["dir"], tmp)
        usable = overlay.pristine and info["version"].startswith(series.base["version"])
        applied: list[Patch] = []
        result = first
        while True:
            fail = fatal(result)
            for f in result["findings"]:
                if not any(same(f, g) for g, _, _ in found):
                    found.append((f, list(applied), None))
            if fail is None or not usable:
                break
            trial = next_fix(series, overlay, python, target, applied, have, fail, say)
            if trial is None:
                break
            how_found[trial["_with"][-1].name] = trial.pop("_how")
            cand = trial["_with"][-1]
            applied = applied + trial.pop("_with")
            # every finding of this run that the trial lost is this fix's
            found = [(f, a, cand if (p is None and any(f is g for g in result["findings"])
                                     and not any(same(f, g) for g in trial["findings"]))
                      else p) for f, a, p in found]
            runs.append((list(applied), trial))
            result = trial
        final_root = overlay.make(applied) if applied else None

        # Findings no fix of the series removed: 2.15.0, or no known fix.
        left = [f for f, _, p in found if p is None and not f.get("remedy")]
        upstream = None
        fixed_in = series.upstream.get("requirement", "").partition("==")[2]
        oracle = probe(ORACLE) if left and fixed_in and ORACLE.exists() else None
        if oracle and oracle["dir"] != info["dir"] and oracle["version"].startswith(fixed_in):
            say(f"        {len(left)} left without a symfix fix: capturing with torch {fixed_in}")
            try:
                upstream = run_engine(ORACLE, target)
            except BadTarget as e:
                say(f"        torch {fixed_in}: {e}")

        # Proofs: each fix found fails its proof tests on the audited torch, passes on the overlay.
        fixes = [series.fix_for(p) for p in applied if any(q is p for _, _, q in found)]
        proofs = {}
        if fixes and tests:
            say(f"        proof tests of {', '.join(f.id for f in fixes)}: on the audited torch, "
                f"then with the fixes")
            logs = ROOT / ".symfix" / "logs"
            before = run_proofs(python, fixes, None, logs / "audit-proofs-before.log")
            after = run_proofs(python, fixes, final_root, logs / "audit-proofs-after.log")
            for fix in fixes:
                fails = sum(before.get(t) == matrix.FAIL for t in fix.proof)
                passes = sum(after.get(t) == matrix.PASS for t in fix.proof)
                proofs[fix.id] = (fails, passes, len(fix.proof))

        print()
        n_total = 0
        for n, (f, applied_then, patch) in enumerate(found, 1):
            n_total += 1
            if f.get("remedy"):  # the step's own, no fix of torch's
                text = f["remedy"]
            elif patch is not None:
                fix = series.fix_for(patch)
                text = f"symfix fix {fix.id} ({patch.name}; {how_found[patch.name]})"
                if fix.id in proofs:
                    fails, passes, total = proofs[fix.id]
                    text += (f"; its proof tests: {fails}/{total} fail on your torch, "
                             f"{passes}/{total} pass with the fix")
            elif upstream is not None and upstream["traced"] and not any(
                    same(f, g) or (f["kind"] == g["kind"] and f["user"] == g["user"])
                    for g in upstream["findings"]):
                text = f"fixed in torch {fixed_in} (no symfix fix; {fixed_in} traces the step)"
            else:
                repro = eng.write_repro(str(repro_dir), n, f, target, info["version"],
                                        bool(result.get("state_inputs")))
                why = "" if usable else " (the series cannot be tried on this torch)"
                text = f"no known fix{why}; repro: {os.path.relpath(repro)}"
            if applied_then:
                text += f"  [seen with {', '.join(p.name[:4] for p in applied_then)} applied]"
            print(eng.format_finding(n, f, text))
        if not found:
            print("clean: the step traces with its unbacked sizes symbolic.")
            if (n := runs[-1][1].get("runtime_asserts")) is not None:
                print(eng.RUNTIME_ASSERTS.format(n=n))
        else:
            ids = [series.fix_for(p).id for p in applied if any(q is p for _, _, q in found)]
            print(f"{n_total} problem(s) found; symfix fixes this step needs: "
                  f"{', '.join(ids) or 'none'}"
                  + ("; with them it traces clean" if ids and not runs[-1][1]["findings"]
                     else ""))
        return 1 if found else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def replay(series: Series, target: str, python: Path, repro_dir: Path, modes: list[str],
           say=print, inductor: bool = False) -> int:
    """`audit --replay`: the engine runs the captured graph at other sizes and in other modes
    against eager.  On a torch where the step does not trace, the fixes that make it trace
    (found as `audit` finds them) are applied first.  Each difference's remedy: the fix of the
    series that removes it (bisecting the rest of the series on overlays, at the difference's
    size and mode), else torch 2.15.0 if it has none, else a repro."""
    eng = engine()
    info = probe(python)
    say(f"audit   --replay {target} with {os.path.relpath(python)} (torch {info['version']})")
    options = ["--replay", "--modes", ",".join(modes), *(["--inductor"] if inductor else [])]
    result = run_engine(python, target, extra=options, progress=_progress)
    have = set(result["symfix"] or [])
    tmp = Path(tempfile.mkdtemp(prefix="symfix-audit-"))
    try:
        overlay = Overlay(series, info["dir"], tmp)
        usable = overlay.pristine and info["version"].startswith(series.base["version"])
        applied: list[Patch] = []
        needed: list[Patch] = []  # the fixes found (applied adds the patches they apply on)
        while usable and (fail := fatal(result)) is not None:
            trial = next_fix(series, overlay, python, target, applied, have, fail, say,
                             options)
            if trial is None:
                break
            applied += trial["_with"]
            needed.append(trial["_with"][-1])
            result = trial
        context = (f" (and the {len(applied) - len(needed)} earlier patches "
                   f"{'it applies' if len(needed) == 1 else 'they apply'} on)"
                   if len(applied) > len(needed) else "")
        if applied:
            say(f"        the capture needs {', '.join(_ids(series, needed))}{context}: "
                f"replaying with {'it' if len(applied) == 1 else 'them'} applied")
            result = run_engine(python, target, overlay.make(applied), extra=options,
                                progress=_progress)
        print()
        if not result["traced"]:
            for n, f in enumerate(result["findings"], 1):
                print(eng.format_finding(n, f, f.get("remedy") or "the graph cannot be replayed: "
                                         "`symfix.py audit` finds what the capture needs"))
            print(f"{len(result['findings'])} problem(s) found; the step does not trace, so "
                  "nothing was replayed.")
            return 1
        rest = [p for p in series.wheel_patches
                if p not in applied and series.fix_for(p).id not in have] if usable else []
        remedies = []
        for n, f in enumerate(result["findings"], 1):
            remedies.append(_replay_remedy(eng, series, overlay, python, target, applied, rest,
                                           f, n, repro_dir, info["version"], say))
        if applied:
            print(f"with {', '.join(_ids(series, needed))}{context} applied (the capture "
                  f"needs {'it' if len(applied) == 1 else 'them'}):")
        print(eng.report(result, remedies, ""))
        # a step that needs fixes to trace does not trace on this torch: not clean
        return 1 if result["findings"] or applied else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _ids(series: Series, patches: list[Patch]) -> list[str]:
    return [series.fix_for(p).id for p in patches]


def _replay_remedy(eng, series, overlay, python, target, applied, rest, f, n, repro_dir,
                   version, say) -> str:
    """Which fix removes replay difference ``f``: the shortest prefix of the rest of the
    series that removes it at its size and mode ends with it (bisection)."""
    if f.get("remedy"):  # the step's own, no fix of torch's
        return f["remedy"]
    point = ["--replay", "--modes", f["mode"], "--only", f["only"],
             *(["--inductor"] if f.get("inductor") else [])]

    def gone(patches: list[Patch], python=python) -> bool:
        root = overlay.make(applied + patches) if patches else None
        if patches and root is None:
            return False
        trial = run_engine(python, target, root, extra=point)
        return trial["traced"] and not trial["findings"]

    say(f"        {f['kind']} at {f['at'][0]}: bisecting the series for the fix")
    if rest and gone(rest):
        lo, hi = 0, len(rest)  # without rest[:lo] it shows, with rest[:hi] it is gone
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if gone(rest[:mid]) else (mid, hi)
        fix = series.fix_for(rest[hi - 1])
        f["layer"] = fix.component
        return (f"symfix fix {fix.id} ({rest[hi - 1].name}; the difference is gone with it, "
                f"found by bisecting the series on overlays)")
    fixed_in = series.upstream.get("requirement", "").partition("==")[2]
    oracle = probe(ORACLE) if fixed_in and ORACLE.exists() else None
    if oracle and oracle["dir"] != overlay.torch_dir and oracle["version"].startswith(fixed_in):
        say(f"        {f['kind']} at {f['at'][0]}: replaying with torch {fixed_in}")
        try:
            if gone([], ORACLE):
                return f"fixed in torch {fixed_in} (no symfix fix; {fixed_in} gives eager's result)"
        except BadTarget as e:
            say(f"        torch {fixed_in}: {e}")
    repro = eng.write_replay_repro(str(repro_dir), n, f, target, version)
    return f"no known fix; repro: {os.path.relpath(repro)}"


def default_python() -> Path:
    return ROOT / ".venv" / "bin" / "python"


def run(args) -> int:
    """`symfix.py audit`: check the arguments, then audit the target with the series."""
    eng = engine()
    try:
        modes = eng.parse_modes(args.modes) if args.replay else None
    except eng.BadInput as e:
        raise BadTarget(str(e)) from None
    for flag in ("modes", "inductor"):
        if getattr(args, flag) and not args.replay:
            raise BadTarget(f"--{flag}: only with --replay")
    python = Path(args.python) if args.python else default_python()
    if not python.exists():
        raise Refused(f"--python {python}: no such interpreter"
                      + ("" if args.python else " (run `python3 tools/symfix.py wheel` first)"))
    path = args.target.partition(":")[0] if not Path(args.target).is_file() else args.target
    if not Path(path).is_file():
        raise BadTarget(f"{path}: no such file")
    # the series of the audited torch's release (its overlays patch that release's files)
    tag, _ = base_for(probe(python)["version"])
    if args.replay:
        return replay(load(tag=tag), args.target, python, Path(args.repro_dir), modes,
                      inductor=args.inductor)
    return audit(load(tag=tag), args.target, python, Path(args.repro_dir),
                 tests=not args.no_tests)
