"""The repository as a torch source: the PEP 517 backend that `pip install .`, `pip wheel .`,
`python -m build`, `uv build`, `uv pip install .` and a git URL call (pyproject.toml's
[build-system]), and that setup.py calls too.

Building gives the patched torch for the interpreter that builds: the base wheel found as
`symfix.py wheel` finds it (cache, find-links, the variant's index) and the same build, so the
same bytes. Choices: config settings (`-C base=2.15.0`, `-C variant=cpu|pypi|cu130`,
`-C wheel=PATH`), else the environment (SYMFIX_BUILD_BASE, SYMFIX_BUILD_VARIANT,
SYMFIX_BUILD_WHEEL) for tools without config settings. Bad input fails the build with one line.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

from packaging.utils import parse_wheel_filename

from . import build, patched
from .errors import Refused, SymfixError
from .series import ROOT

OPTIONS = ("base", "variant", "wheel")
# the files an sdist leaves out where there is no git to list the tracked ones
UNTRACKED = {".git", ".symfix", ".venv", "dist", "__pycache__", ".pytest_cache", ".hypothesis",
             ".ruff_cache", "symfix-audit"}


def options(config_settings: dict | None) -> dict[str, str | None]:
    """-C settings first, then SYMFIX_BUILD_<NAME>; an sdist's recorded base where neither."""
    got = {k: (config_settings or {}).get(k) or os.environ.get(f"SYMFIX_BUILD_{k.upper()}")
           for k in OPTIONS}
    unknown = sorted(set(config_settings or {}) - set(OPTIONS) - {"--build-option"})
    if unknown:
        raise Refused(f"config setting {unknown[0]!r}: symfix knows {', '.join(OPTIONS)}")
    recorded = ROOT / "symfix-base"  # written into an sdist: the base and build it was made for
    if recorded.is_file() and not got["wheel"]:
        tag, variant = recorded.read_text().split()
        got["base"], got["variant"] = got["base"] or tag, got["variant"] or variant
    return got


def _args(opts: dict) -> SimpleNamespace:
    # the arguments `symfix.py wheel` would have; setup.py passes its own interpreter
    return SimpleNamespace(**opts, python=os.environ.get("SYMFIX_BUILD_PYTHON"))


def _one_line(hook):
    # progress lines to stderr (a front end's stdout, setup.py --version's answer, stays clean);
    # a user's mistake is one line and a failed build, as in the CLI
    def run(*args, **kwargs):
        try:
            with contextlib.redirect_stdout(sys.stderr):
                return hook(*args, **kwargs)
        except SymfixError as e:
            print(f"symfix: {e.what}{e}", file=sys.stderr)
            sys.exit(e.code)
    run.__name__, run.__doc__ = hook.__name__, hook.__doc__
    return run


@_one_line
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    """The patched wheel into ``wheel_directory``; returns its file name."""
    args = _args(options(config_settings))
    s = patched.load_series(args)
    base = patched.base_wheel(s, args)
    out, _ = build.build(s, base, Path(wheel_directory), say=lambda patch: None)
    print(f"symfix: {out.name} from {base.path.name} and {len(s.wheel_patches)} patches",
          file=sys.stderr)
    return out.name


@_one_line
def version(config_settings=None) -> str:
    """The version build_wheel makes here (setup.py --version)."""
    args = _args(options(config_settings))
    s = patched.load_series(args)
    return build.stamped_version(patched.base_wheel(s, args).version, s.label)


def _sdist_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout:
        return sorted(p for p in listed.stdout.split("\0") if p and (ROOT / p).is_file())
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
                  and not UNTRACKED & set(p.relative_to(ROOT).parts))


@_one_line
def build_sdist(sdist_directory, config_settings=None) -> str:
    """The series, our torch/ files and the tool, as torch-<version>.tar.gz: building it makes
    the patched wheel on the installing machine, for its Python and platform, from the same
    build of the base release (the variant, as -C variant=, that gave this machine's base wheel;
    its label is in the version)."""
    args = _args(options(config_settings))
    s = patched.load_series(args)
    base = patched.base_wheel(s, args)
    version = build.stamped_version(base.version, s.label)
    # the build it is made for: its version must be the wheel's (uv checks); the variant is the
    # index whose file names carry the base wheel's label ("" for PyPI's, "cpu", ...)
    label = parse_wheel_filename(base.path.name)[1].local or ""
    variant = args.variant or next(
        (name for name, row in s.base["variants"].items() if row["label"] == label), "pypi")
    name = f"torch-{version}"
    pkg_info = (f"Metadata-Version: 2.2\nName: torch\nVersion: {version}\n"
                f"Summary: PyTorch {s.base['version']} with the symfix series "
                f"({s.base['tag']})\n").encode()
    extra = {"PKG-INFO": pkg_info, "symfix-base": f"{s.base['tag']} {variant}\n".encode()}
    out = Path(sdist_directory) / f"{name}.tar.gz"
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel in _sdist_files():
            info = tar.gettarinfo(str(ROOT / rel), f"{name}/{rel}")
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(ROOT / rel, "rb") as f:
                tar.addfile(info, f)
        for rel, data in extra.items():
            info = tarfile.TarInfo(f"{name}/{rel}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.name
