"""Apply the series to the base wheel: patched files, version stamp, provenance, packed wheel."""

from __future__ import annotations

import ast
import hashlib
import json
import mmap
import os
import pprint
import re
import tempfile
import zipfile
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from . import git, rawzip
from .basewheel import BaseWheel, remember, remembered
from .errors import PatchFailed
from .series import as_lf, Patch, Series

# Bump when the layout of what `build` writes changes, so that cached wheels are rebuilt.
BUILD_FORMAT = 2
# torch._symfix is a package of the wheel: the generated provenance is its __init__.py, and the
# files of ours under the repository's torch/ (torch/_symfix/audit.py, __main__.py) go in beside.
PROVENANCE = "torch/_symfix/__init__.py"
LEGACY_PROVENANCE = "torch/_symfix.py"  # wheels made before torch._symfix was a package


def own_files(root: Path) -> dict[str, bytes]:
    """The files of ours that go into the wheel at their path: every file under ``root/torch``."""
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted((root / "torch").rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def stamped_version(base_version: str, label: str) -> str:
    """PEP 440 local version keeping the base's label: 2.13.0+cpu -> 2.13.0+cpu.symfix1."""
    return f"{base_version}.{label}" if "+" in base_version else f"{base_version}+{label}"


def build_key_of(inputs: dict) -> str:
    inputs = {"format": BUILD_FORMAT, **inputs}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def build_key(series: Series, base: BaseWheel) -> str:
    return build_key_of({"base": base.sha256,
                         "patches": [[p.name, p.sha256] for p in series.patches],
                         "own": [[k, hashlib.sha256(v).hexdigest()]
                                 for k, v in own_files(series.root).items()]})


def output_name(base: BaseWheel, version: str) -> str:
    return base.path.name.replace(f"torch-{base.file_version}-", f"torch-{version}-", 1)


def output_path(series: Series, base: BaseWheel, dist: Path) -> Path:
    return dist / output_name(base, stamped_version(base.version, series.label))


def read_provenance(wheel: Path) -> dict | None:
    """The provenance record of a wheel made by symfix, or None if it is not one."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            path = next((p for p in (PROVENANCE, LEGACY_PROVENANCE) if p in names), None)
            if path is None:
                return None
            text = zf.read(path).decode()
    except (OSError, zipfile.BadZipFile):
        return None
    return {node.targets[0].id: ast.literal_eval(node.value)
            for node in ast.parse(text).body if isinstance(node, ast.Assign)}


def provenance_module(series: Series, base: dict, version: str, key: str,
                      applied: list[Patch] | None = None) -> bytes:
    """torch/_symfix/__init__.py: what this build was made from (``base``) and the patches applied
    (``applied``; by default those of the wheel build)."""
    patches = []
    for p in series.wheel_patches if applied is None else applied:
        fix = series.fix_for(p)
        patches.append({
            "id": fix.id, "patch": p.name, "sha256": p.sha256, "subject": p.subject,
            "upstream": p.origin_pr, "fixes": list(fix.fixes), "status": fix.status,
            "files": [c.path for c in p.changes],
        })
    fields = {
        "VERSION": version,
        "BASE": {"git_version": series.base["commit"], "tag": series.base["tag"], **base},
        "PATCHES": patches,
        "BUILD_KEY": key,
    }
    body = "\n".join(f"{k} = {pprint.pformat(v, sort_dicts=False, width=96)}"
                     for k, v in fields.items())
    return (
        '"""Provenance of this torch build, written by symfix (do not edit).\n\n'
        "The official wheel it was made from (BASE) and the symfix patches applied to it, in\n"
        'order (PATCHES): see https://github.com/pytorch/pytorch/pull/<upstream>.\n"""\n\n'
        f"{body}\n"
    ).encode()


def apply_series(series: Series, files: dict[str, bytes], say=print) -> dict[str, bytes | None]:
    """Apply every patch of the wheel build to ``files`` (path -> bytes); ``say`` hears of
    each patch, applied or (not ``patch.wheel``: source builds only) skipped.

    Returns the files after the series; None for a file the series deletes.
    """
    with tempfile.TemporaryDirectory(prefix="symfix-apply-") as tmp:
        git.write_tree(Path(tmp), files)
        for patch in series.patches:
            if patch.wheel and (failed := git.apply(patch, Path(tmp))):
                raise PatchFailed(f"patch {patch.name} does not apply: {failed}")
            say(patch)
        return {path: Path(tmp, path).read_bytes() if Path(tmp, path).exists() else None
                for path in {c.path for p in series.wheel_patches for c in p.changes}}


@dataclass
class Plan:
    """The patched wheel before it is written: the base's members in order, each under its name
    in the new wheel, copied as stored (data None) or replaced by ``data``, and its RECORD last."""
    base: BaseWheel
    dist_info: str
    members: list[tuple[str, zipfile.ZipInfo, bytes | None]]
    record: list[tuple[str, str, str]]
    deleted: list[str]  # the base's files that a patch deletes

    def files(self) -> dict[str, bytes]:
        """The new wheel's files that the base does not have as they are (its RECORD too)."""
        return {name: data for name, _, data in self.members if data is not None}


def plan(series: Series, base: BaseWheel, say=print) -> Plan:
    """Apply the series to ``base``: what its patched wheel holds (``say`` hears of each patch)."""
    version = stamped_version(base.version, series.label)
    key = build_key(series, base)
    dist_info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(base.path) as zf:
        infos = zf.infolist()
        base_record = rawzip.read_record(zf.read(f"{base.dist_info}/RECORD").decode())
        by_name = {i.filename: i for i in infos}
        touched = {path: zf.read(path) for path in series.touched_files() if path in by_name}
        version_py = zf.read("torch/version.py").decode()
        metadata_name = f"{base.dist_info}/METADATA"
        metadata = zf.read(metadata_name).decode()
    crlf = {path for path, data in touched.items() if b"\r\n" in data}
    changed = apply_series(series, {path: as_lf(data) for path, data in touched.items()}, say)
    for path in crlf & {p for p, data in changed.items() if data is not None}:
        changed[path] = changed[path].replace(b"\n", b"\r\n")  # keep the wheel's line ends

    stamped, n = re.subn(r"^__version__ = '[^']*'", f"__version__ = '{version}'", version_py,
                         flags=re.M)
    if n != 1:
        raise PatchFailed("torch/version.py: cannot find the __version__ line to stamp")
    changed["torch/version.py"] = stamped.encode()
    changed.update(own_files(series.root))
    changed[PROVENANCE] = provenance_module(
        series, {"version": base.version, "wheel": base.path.name, "sha256": base.sha256},
        version, key)
    metadata, n = re.subn(r"^Version: [^\r\n]*", f"Version: {version}", metadata, count=1,
                          flags=re.M)
    if n != 1:
        raise PatchFailed(f"{metadata_name}: cannot find the Version line to stamp")
    changed[metadata_name] = metadata.encode()

    members, record = [], []

    def add(name: str, info: zipfile.ZipInfo, data: bytes | None) -> None:
        members.append((name, info, data))
        if name.endswith("/"):  # a directory entry: no data, no RECORD row
            return
        record.append((name, *base_record[info.filename][1:3]) if data is None else
                      (name, rawzip.record_hash(data), str(len(data))))

    added = sorted(p for p in changed if p not in by_name and changed[p] is not None)
    record_name = f"{base.dist_info}/RECORD"
    for info in infos:
        name = info.filename
        if name == record_name:
            continue
        if name.startswith(base.dist_info + "/"):
            # New files (the provenance module, files a patch adds) go before dist-info.
            for path in added:
                add(path, by_name["torch/version.py"], changed[path])
            added = []
            name = dist_info + name[len(base.dist_info):]
        if info.filename not in changed:
            add(name, info, None)
        elif changed[info.filename] is not None:  # None: deleted by a patch
            add(name, info, changed[info.filename])
    record.append((f"{dist_info}/RECORD", "", ""))
    members.append((f"{dist_info}/RECORD", by_name[record_name], rawzip.record_text(record)))
    deleted = sorted(p for p, data in changed.items() if data is None and p in by_name)
    return Plan(base, dist_info, members, record, deleted)


def write(plan: Plan, out: Path) -> str:
    """Write the wheel ``plan`` describes to ``out``; returns its sha256."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(".torch-*.partial"):  # left by a build that was killed
        stale.unlink()
    # Written aside and renamed into place: a killed build leaves no wheel under its name. No
    # fsync, as pip and uv install without one: flushing the 530 MB CUDA wheel took 1.7 s,
    # more than building it; a build is reproducible, and made again in a second.
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    try:
        with open(plan.base.path, "rb") as base, os.fdopen(fd, "wb") as f:
            # The stored members are written from a map of the base: no copy of 530 MB through
            # a read buffer. The map closes when the last view of it is gone.
            stored = memoryview(mmap.mmap(base.fileno(), 0, access=mmap.ACCESS_READ))
            hashed = Hashing(f)
            rawzip.write(hashed, (rawzip.new_member(name, data, info) if data is not None else
                                  rawzip.raw_member(stored, info, name)
                                  for name, info, data in plan.members))
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a wheel is for everyone to read
        plan.base.check()
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    return hashed.sha256.hexdigest()


def build(series: Series, base: BaseWheel, dist: Path, say=print,
          planned: Future | None = None) -> tuple[Path, bool]:
    """Build the patched wheel into ``dist``; returns (path, reused an up-to-date build).

    ``planned``, if given, gets the build's Plan as soon as it is made, before the wheel is
    written (None for a reused build; the exception if planning fails).
    """
    try:
        key = build_key(series, base)
        out = output_path(series, base, dist)
        reused = out.is_file() and key in (remembered(series.root, out, "built"),
                                          (read_provenance(out) or {}).get("BUILD_KEY"))
        made = None if reused else plan(series, base, say)
    except BaseException as e:
        if planned:
            planned.set_exception(e)
        raise
    if planned:
        planned.set_result(made)
    if made is None:
        return out, True
    sha256 = write(made, out)
    remember(series.root, out, built=key, sha256=sha256)
    return out, False


class Hashing:
    """A file that hashes what is written to it: the wheel's sha256 without reading the wheel
    back (0.4 s for the 530 MB CUDA wheel)."""

    def __init__(self, f):
        self.f, self.sha256 = f, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        return self.f.write(data)
