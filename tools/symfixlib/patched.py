"""The patched torch of a base release: its series, the official base wheel, the patched wheel
built from both, and the environments that install them (`symfix.py wheel`; `test`, `bench`,
`worktree` and `source` start from the same steps)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from . import basewheel, build, envs, series
from .errors import Refused
from .report import rel, Step
from .series import ROOT

CACHE = ROOT / ".symfix" / "cache"
DIST = ROOT / "dist"
VENV = ROOT / ".venv"


def sha256_short(path: Path) -> str:
    """A wheel's sha256, as `wheel` recorded it when it wrote the file, else read."""
    return (basewheel.remembered(ROOT, path, "sha256") or basewheel.sha256_file(path))[:12]


def series_tag(args) -> str:
    """The base release: --base, else the base wheel's, else the default."""
    if getattr(args, "base", None):
        return "v" + args.base.removeprefix("v")
    if getattr(args, "wheel", None):
        if not Path(args.wheel).is_file():
            raise Refused(f"base wheel {args.wheel}: no such file")
        try:
            return f"v{parse_wheel_filename(Path(args.wheel).name)[1].public}"
        except InvalidWheelFilename as e:
            raise Refused(f"base wheel {args.wheel}: not a wheel file name ({e})") from None
    return series.DEFAULT_BASE


def load_series(args=None) -> series.Series:
    step = Step("series")
    tag = series_tag(args)
    if tag not in series.bases():
        what = f"base wheel {Path(args.wheel).name}: " if getattr(args, "wheel", None) else ""
        raise Refused(f"{what}torch {tag[1:]} is not a base symfix carries a series for "
                      f"({', '.join(b[1:] for b in series.bases())})")
    s = series.load(tag=tag)
    step.done(f"{len(s.patches)} patches, {len(s.fixes)} fixes, base {s.base['tag']} "
              f"({s.base['commit'][:8]})")
    return s


def base_wheel(s: series.Series, args, defer: bool = False) -> basewheel.BaseWheel:
    """The base wheel: ``args.wheel`` if given, else the one for ``args.python`` and
    ``args.variant``. ``defer``: as for basewheel.verify."""
    step = Step("base")
    wheel = (Path(args.wheel) if args.wheel else
             basewheel.fetch(s, CACHE / "base", args.variant, args.python))
    base = basewheel.verify(wheel, s, defer)
    how = ("sha256 known, checked beside the build" if base.pending else "sha256 known"
           if base.known else "every member checked against RECORD")
    step.done(f"{wheel.name}  {base.sha256[:12]}… ({how})")
    return base


def build_wheel(s: series.Series, base: basewheel.BaseWheel, dist: Path,
                planned: Future | None = None) -> Path:
    """Build (or keep) the patched wheel; ``planned`` as for build.build."""
    step = Step("apply")

    def applied(patch):
        fix = s.fix_for(patch)
        print(f"        {patch.name[:4]} {fix.id:<28} {', '.join(c.path for c in patch.changes)}"
              + ("" if patch.wheel else "  skipped: source builds only"), flush=True)

    out, reused = build.build(s, base, dist, say=applied, planned=planned)
    if reused:
        step.done(f"{rel(out)} up to date (same base and patches)", "kept")
    else:
        step.done(f"{rel(out)}  sha256 {sha256_short(out)}…", "pack")
    for old in dist.glob("torch-*.whl"):  # one wheel in dist/: `pip install dist/*.whl` works
        if old != out and build.read_provenance(old) is not None:
            old.unlink()
    return out


def install(role: str, spec: str, key: str, link: Path | None = None,
            python: str | None = None, need_gb: float | None = None,
            bytecode: bool = False, over: Path | None = None,
            patched: Callable[[], build.Plan] | None = None, extra: tuple[str, ...] = ()) -> Path:
    step = Step("venv")
    path = envs.ensure(role, spec, key, link, python, need_gb, bytecode, over, patched, extra)
    step.done(f"{rel(path)}  (torch {envs.installed(path)['torch_version']})")
    return path


def plan_of(s: series.Series, base: basewheel.BaseWheel, planned: Future) -> Callable:
    """The patched files to install over the base: the plan of the build ``planned`` waits
    for, or, where the build was kept (None), made again."""
    def plan() -> build.Plan:
        made = planned.result() or build.plan(s, base, say=lambda patch: None)
        base.check()  # before an environment made from the base is kept
        return made
    return plan


def env_need_gb(base: basewheel.BaseWheel) -> float:
    """Disk for an environment of this build: a CUDA torch pulls in 4 GB of CUDA libraries."""
    cpu = base.version.endswith("+cpu") or "macosx" in base.path.name
    return envs.COLD_GB["cpu" if cpu else "cuda"]


def wheel(args) -> int:
    """`symfix.py wheel`: the patched wheel in dist/, installed into .venv/."""
    s = load_series(args)
    base = base_wheel(s, args, defer=True)
    if args.no_venv:
        build_wheel(s, base, Path(args.dist))
        base.check()
        return 0
    # uv installs the base while the wheel is built; the patched files go over it once the
    # series is applied, while the wheel is still being written.
    planned = Future()
    with ThreadPoolExecutor(1) as pool:
        built = pool.submit(build_wheel, s, base, Path(args.dist), planned)
        install("patched", str(build.output_path(s, base, Path(args.dist))),
                build.build_key(s, base), VENV, args.python, env_need_gb(base), over=base.path,
                patched=plan_of(s, base, planned), extra=s.triton)
        built.result()
    base.check()  # where nothing was made: the wheel and .venv were up to date
    print("done. `. .venv/bin/activate` and `import torch` gives the patched build.")
    return 0
