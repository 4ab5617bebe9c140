"""Find and verify the official torch wheel the series is applied to."""

from __future__ import annotations

import csv
import hashlib
import io
import re
import subprocess
import sys
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from wheel.wheelfile import WheelError, WheelFile

from .series import git_blob_id, Series


class Refused(Exception):
    """Bad input: a one-line reason, exit code 2, nothing written."""


@dataclass
class BaseWheel:
    path: Path
    sha256: str
    version: str  # e.g. "2.13.0+cpu"
    dist_info: str  # e.g. "torch-2.13.0+cpu.dist-info"
    record: dict[str, tuple[str, str]]  # member -> (hash, size) from the base RECORD
    known: bool  # sha256 is one we have checked


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def fetch(requirement: str, cache: Path) -> Path:
    """Ask pip for the wheel of ``requirement`` (no dependencies); returns its path in ``cache``."""
    cache.mkdir(parents=True, exist_ok=True)
    name = requirement.split("==")[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(cache), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise Refused(f"pip could not fetch {requirement}: {proc.stderr.strip().splitlines()[-1]}")
    version = requirement.split("==")[1]
    found = sorted(cache.glob(f"{name}-{version}[-+]*.whl"))
    if len(found) != 1:
        raise Refused(f"expected one {requirement} wheel in {cache}, found {len(found)}")
    return found[0]


def _py_assign(text: str, name: str) -> str | None:
    m = re.search(rf"^{name}\s*(?::[^=]*)?=\s*['\"]([^'\"]*)['\"]", text, re.M)
    return m.group(1) if m else None


def verify(path: Path, series: Series) -> BaseWheel:
    """Check that ``path`` is an unmodified torch <base> wheel; raise Refused otherwise."""
    base = series.base
    what = f"base wheel {path.name}"
    if not path.is_file():
        raise Refused(f"{what}: no such file")
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
        if _py_assign(version_py, "__version__") != str(version):
            raise Refused(f"{what}: torch/version.py says {_py_assign(version_py, '__version__')}")
        git_version = _py_assign(version_py, "git_version")
        if git_version != base["commit"]:
            raise Refused(f"{what}: built from {git_version}, not {base['tag']} ({base['commit']})")
        record = {row[0]: (row[1], row[2]) for row in csv.reader(io.StringIO(record_text)) if row}

        sha = sha256_file(path)
        known = base.get("known-wheels", {}).get(path.name)
        if known and known != sha:
            raise Refused(f"{what}: sha256 {sha[:12]}… is not the published {known[:12]}…")
        if not known:
            # Not a wheel we know by hash (another Python tag, a CUDA build): check every member
            # against its RECORD; the wheel library verifies each hash as the member is read.
            try:
                with WheelFile(path) as wf:
                    for info in wf.infolist():
                        if not info.filename.endswith("/RECORD"):
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
            if git_blob_id(data) != blob:
                raise Refused(f"{what}: {member} is not the {base['tag']} file "
                              f"(blob {git_blob_id(data)[:12]}, expected {blob[:12]})")
    return BaseWheel(path, sha, str(version), dist_info, record, bool(known))
