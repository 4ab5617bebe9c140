"""Find and verify the official torch wheel the series is applied to."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import zipfile
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packaging import tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version
from wheel.wheelfile import WheelError, WheelFile

from . import rawzip
from .errors import Refused
from .series import as_lf, git_blob_id, Series


@dataclass
class BaseWheel:
    path: Path
    sha256: str
    version: str  # the runtime version, torch/version.py's: "2.13.0+cpu", "2.13.0+cu130"
    dist_info: str  # as in the wheel: "torch-2.13.0+cpu.dist-info", "torch-2.13.0.dist-info"
    known: bool  # sha256 is one we have checked
    # verify(defer=True): the check of a known wheel's sha256, under way (see check)
    pending: Future | None = field(default=None, repr=False, compare=False)

    def check(self) -> None:
        """Wait for the sha256 check ``verify(defer=True)`` left running: Refused if the file is
        not the published wheel. Called before anything made from the wheel is kept."""
        if self.pending is not None:
            self.pending.result()

    @property
    def file_version(self) -> str:
        """The version in the file name and METADATA ("2.13.0" for PyPI's CUDA build)."""
        return parse_wheel_filename(self.path.name)[1].__str__()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# -- choosing and fetching the base wheel -------------------------------------------------------


def interpreter_tags(python: str | None) -> list[tags.Tag]:
    """The wheel tags ``python`` installs (this interpreter's when None), best first."""
    if python is None:
        return list(tags.sys_tags())
    probe = subprocess.run(
        [python, "-c", "import sys, sysconfig; print(sys.version_info[0], sys.version_info[1], "
         "int(bool(sysconfig.get_config_var('Py_GIL_DISABLED'))))"],
        capture_output=True, text=True)
    if probe.returncode:
        raise Refused(f"--python {python}: cannot run it")
    major, minor, ft = map(int, probe.stdout.split())
    abi = f"cp{major}{minor}{'t' if ft else ''}"
    return list(tags.cpython_tags((major, minor), abis=[abi]))


def gpu_present() -> bool:
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


def variants_to_try(series: Series, variant: str | None) -> list[str]:
    """The variant asked for, or the machine's choice (see the manifest's [base.variants])."""
    known = series.base["variants"]
    if variant:
        if variant not in known:
            raise Refused(f"--variant {variant}: not one of {', '.join(known)}")
        return [variant]
    return ["pypi"] if gpu_present() else ["cpu", "pypi"]


def _find_links() -> list[Path]:
    """Directories pip is configured to find wheels in (this machine ships one there)."""
    return [Path(p) for p in os.environ.get("PIP_FIND_LINKS", "").split() if Path(p).is_dir()]


def known_wheel_names(series: Series, variant: str, wanted: list[tags.Tag],
                      names=None) -> list[str]:
    """Wheels of the base release and ``variant`` installable with interpreter tags ``wanted``,
    best first: among ``names`` (default: the known wheels)."""
    label = series.base["variants"][variant]["label"]
    rank = {t: i for i, t in enumerate(wanted)}
    found = []
    for name in series.base.get("known-wheels", {}) if names is None else names:
        _, version, _, wtags = parse_wheel_filename(name)
        best = min((rank[t] for t in wtags if t in rank), default=None)
        if (best is not None and version.public == series.base["version"]
                and (version.local or "") == label):
            found.append((best, name))
    return [name for _, name in sorted(found)]


def fetch(series: Series, cache: Path, variant: str | None = None, python: str | None = None
          ) -> Path:
    """The base wheel for ``python`` (default: this interpreter) and ``variant``.

    A known wheel already in ``cache`` or in pip's find-links directories is used as it is; else
    pip downloads it from the variant's index (pip's own configuration, which may pin or shadow
    torch on a machine, is set aside for that one command).
    """
    wanted = interpreter_tags(python)
    cache.mkdir(parents=True, exist_ok=True)
    reasons = []
    for name in variants_to_try(series, variant):
        for known in known_wheel_names(series, name, wanted):
            for where in (cache, *_find_links()):
                if (where / known).is_file():
                    return where / known
        row = series.base["variants"][name]
        requirement = series.base["requirement"] + (f"+{row['label']}" if row["label"] else "")
        py = wanted[0]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "--retries", "1", "--timeout", "30",
               "--index-url", row["index"], "-d", str(cache),
               "--python-version", py.interpreter[2:3] + "." + py.interpreter[3:],
               "--abi", py.abi, requirement]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env={**env, "PIP_CONFIG_FILE": os.devnull})
        got = known_wheel_names(series, name, wanted, [w.name for w in cache.glob("torch-*.whl")])
        if proc.returncode == 0 and got:
            return cache / got[0]
        err = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
        reasons.append(f"{name} ({row['index']}): {err}")
    raise Refused(f"no torch {series.base['version']} wheel for {wanted[0]}: "
                  + "; ".join(reasons))


# -- verifying it ---------------------------------------------------------------------------------


def _py_assign(text: str, name: str) -> str | None:
    m = re.search(rf"^{name}\s*(?::[^=]*)?=\s*['\"]([^'\"]*)['\"]", text, re.M)
    return m.group(1) if m else None


STAT_CACHE = Path(".symfix") / "cache" / "stat.json"
_REMEMBERING = threading.Lock()
_HASHING = ThreadPoolExecutor(1, thread_name_prefix="symfix-hash")  # verify(defer=True)


def remembered(root: Path, path: Path, what: str):
    """What was recorded of ``path`` by :func:`remember`, while the file is unchanged.

    Hashing or even opening a 530 MB CUDA wheel costs more than everything else a rebuild with
    nothing changed does, so facts about a file are kept beside its size, mtime and inode; any
    rewrite of the file changes them.
    """
    try:
        entry = json.loads((root / STAT_CACHE).read_text()).get(f"{what}:{path.resolve()}")
    except (OSError, ValueError):
        return None
    return entry["value"] if entry and entry["stat"] == _stat(path) else None


def remember(root: Path, path: Path, **facts) -> None:
    """Record ``facts`` (what=value) of ``path`` for :func:`remembered`."""
    cache = root / STAT_CACHE
    with _REMEMBERING:  # the threads of one run: a deferred check and the build
        try:
            entries = json.loads(cache.read_text())
        except (OSError, ValueError):
            entries = {}
        for what, value in facts.items():
            entries[f"{what}:{path.resolve()}"] = {"stat": _stat(path), "value": value}
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
        tmp.write_text(json.dumps(entries, indent=1))
        os.replace(tmp, cache)


def _stat(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def verify(path: Path, series: Series, defer: bool = False) -> BaseWheel:
    """Check that ``path`` is an unmodified torch <base> wheel; raise Refused otherwise.

    A wheel verified before for the same series is trusted while the file is unchanged.
    ``defer``: a wheel known by name is returned with its published sha256 while its file is
    hashed in a thread (0.4 s for the CUDA build, beside the build instead of before it); the
    caller must `BaseWheel.check` it before keeping anything made from it.
    """
    base = series.base
    what = f"base wheel {path.name}"
    if not path.is_file():
        raise Refused(f"{what}: no such file")
    checked_for = hashlib.sha256(json.dumps([base, series.touched_files()], sort_keys=True)
                                 .encode()).hexdigest()
    if (seen := remembered(series.root, path, "verified")) and seen["for"] == checked_for:
        return BaseWheel(path, seen["sha256"], seen["version"], seen["dist_info"], seen["known"])
    try:
        name, version, _, _ = parse_wheel_filename(path.name)
    except InvalidWheelFilename as e:
        raise Refused(f"{what}: not a wheel file name ({e})") from None
    if name != "torch" or version.public != base["version"]:
        raise Refused(f"{what}: {name} {version} is not the series base torch {base['version']}")
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise Refused(f"{what}: not a readable zip, truncated or corrupt ({e})") from None
    with zf:
        dist_info = f"torch-{version}.dist-info"
        try:
            version_py = zf.read("torch/version.py").decode()
            record_text = zf.read(f"{dist_info}/RECORD").decode()
        except KeyError as e:
            raise Refused(f"{what}: {e.args[0]}") from None
        except (zipfile.BadZipFile, zlib.error) as e:
            raise Refused(f"{what}: corrupt member ({e})") from None
        # PyPI's builds name no local label in the file name and METADATA (2.13.0) while
        # torch/version.py says what the build is (2.13.0+cu130); a labelled file name
        # (2.13.0+cpu) must agree with version.py exactly.
        runtime = _py_assign(version_py, "__version__") or "?"
        try:
            runtime_ok = Version(runtime).public == version.public and (
                version.local is None or Version(runtime) == version)
        except ValueError:
            runtime_ok = False
        if not runtime_ok:
            raise Refused(f"{what}: torch/version.py says {runtime}, the file name {version}")
        git_version = _py_assign(version_py, "git_version")
        if git_version != base["commit"]:
            raise Refused(f"{what}: built from {git_version}, not {base['tag']} ({base['commit']})")
        record = set(rawzip.read_record(record_text))
        known = base.get("known-wheels", {}).get(path.name)
        defer = defer and bool(known)
        sha = known if defer else sha256_file(path)

        def published(sha: str) -> None:
            if known and known != sha:
                raise Refused(f"{what}: sha256 {sha[:12]}… is not the published {known[:12]}…")

        published(sha)
        if not known:
            # Not a wheel we know by hash (another build or Python tag): check every member
            # against its RECORD; the wheel library verifies each hash as the member is read.
            # Directory entries (the CUDA builds have some) carry no data and no RECORD row.
            try:
                with WheelFile(path) as wf:
                    for info in wf.infolist():
                        if not info.filename.endswith(("/RECORD", "/")):
                            with wf.open(info) as f:
                                while f.read(1 << 20):
                                    pass
            except (WheelError, zipfile.BadZipFile, zlib.error) as e:
                raise Refused(f"{what}: {e}") from None
        for member, blob in series.touched_files().items():
            if set(blob) == {"0"}:
                if member in record:
                    raise Refused(f"{what}: has {member}, which the series adds")
                continue
            try:
                data = zf.read(member)
            except KeyError:
                raise Refused(f"{what}: lacks {member}, which the series patches") from None
            if git_blob_id(as_lf(data)) != blob:
                raise Refused(f"{what}: {member} is not the {base['tag']} file "
                              f"(blob {git_blob_id(as_lf(data))[:12]}, expected {blob[:12]})")
    fact = {"for": checked_for, "sha256": sha, "version": runtime, "dist_info": dist_info,
            "known": bool(known)}
    if not defer:
        remember(series.root, path, verified=fact)
        return BaseWheel(path, sha, runtime, dist_info, bool(known))

    def check_hash() -> None:
        published(sha256_file(path))
        remember(series.root, path, verified=fact)

    return BaseWheel(path, sha, runtime, dist_info, True, _HASHING.submit(check_hash))
