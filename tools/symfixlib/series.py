"""A series per base release: patches/<tag>/series (apply order), patches/<tag>/manifest.toml
(every fix), the patch mails. A base is data: adding one needs a directory, not code."""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from email.parser import BytesHeaderParser
from pathlib import Path

import unidiff
from packaging.version import Version

from .errors import SeriesError

ROOT = Path(__file__).resolve().parents[2]
STATUSES = ("patch", "original", "in-base", "pending")  # the first two carry a patch


@dataclass(frozen=True)
class FileChange:
    path: str  # relative to the PyTorch root, e.g. torch/fx/graph.py
    pre_blob: str  # git blob id of the file before the patch ("0"*40 for a new file)
    post_blob: str
    hunks: tuple[str, ...]  # "@@ -720,8 +720,12 @@ def rebind_unbacked(" per hunk


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    sha256: str
    subject: str
    trailers: dict[str, str]
    changes: tuple[FileChange, ...]

    @property
    def wheel(self) -> bool:
        """The wheel build carries it: every file it changes is a Python file under torch/, as
        the wheel ships it. A patch to anything else (ATen, c10 sources) is for source builds."""
        return all(is_wheel_path(c.path) for c in self.changes)

    @property
    def origin_pr(self) -> int | None:
        m = re.search(r"/pull/(\d+)", self.trailers.get("Origin", ""))
        return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Fix:
    id: str
    title: str
    upstream: tuple[int, ...]
    fixes: tuple[int | str, ...]
    component: str
    status: str
    files: tuple[str, ...] = ()
    patch: str | None = None
    proof: tuple[str, ...] = ()
    guard: tuple[str, ...] = ()
    triton: tuple[str, ...] = ()  # of proof and guard: run again on Inductor's Triton path
    triton_guard: tuple[str, ...] = ()  # guards on the Triton path, whatever they are on the
    # C++ path (a proof there, say)
    triton_proof: tuple[str, ...] = ()  # proofs on the Triton path only (a fix of Triton's own
    # code): on the C++ path they are guards
    control: str | None = None
    released: str | None = None  # the first torch release that has the fix
    needs: tuple[str, ...] = ()  # acceptance: the fixes the workload depends on
    beyond_upstream: bool = False  # acceptance: needs fixes of our own, so upstream fails it
    note: str = ""

    @property
    def tests(self) -> tuple[str, ...]:
        return self.proof + self.guard + self.triton_proof

    @property
    def triton_tests(self) -> tuple[str, ...]:
        return self.triton + self.triton_guard + self.triton_proof


@dataclass
class Series:
    root: Path
    base: dict
    upstream: dict
    fixes: list[Fix]
    patches: list[Patch] = field(default_factory=list)  # in apply order
    acceptance: list[Fix] = field(default_factory=list)  # the workload the series exists for

    @property
    def rows(self) -> list[Fix]:
        """The matrix rows: every fix, then the acceptance workload."""
        return self.fixes + self.acceptance

    def fix_for(self, patch: Patch) -> Fix:
        return next(f for f in self.fixes if f.patch == patch.name)

    @property
    def triton(self) -> tuple[str, ...]:
        """The triton the base release's CUDA wheels require, for the Triton column (the CPU
        wheels require none)."""
        return tuple(filter(None, [self.base.get("triton")]))

    @property
    def label(self) -> str:
        """Local version label of a build, e.g. ``symfix1``."""
        return f"{self.base['label']}{len(self.patches)}"

    @property
    def wheel_patches(self) -> list[Patch]:
        """The patches the wheel build applies (source builds apply every patch)."""
        return [p for p in self.patches if p.wheel]

    def touched_files(self, source: bool = False) -> dict[str, str]:
        """Each file the series touches -> its blob id in the base (its first patch's pre-image).

        The wheel build's files; with ``source``, those of every patch (a PyTorch checkout).
        """
        first: dict[str, str] = {}
        for p in self.patches if source else self.wheel_patches:
            for c in p.changes:
                first.setdefault(c.path, c.pre_blob)
        return first


def is_wheel_path(path: str) -> bool:
    """A source path the wheel ships as it is: a Python file under torch/."""
    return path.startswith("torch/") and path.endswith(".py")


def control_path(fix_id: str) -> str:
    """Where test/conftest.py finds the control that takes an in-base fix out again."""
    return f"test/controls/{fix_id.replace('-', '_')}.py"


def git_blob_id(data: bytes) -> str:
    """The id git gives ``data`` as a blob (what a patch's ``index`` line records)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def as_lf(data: bytes) -> bytes:
    """``data`` with LF line ends: the Windows wheels ship torch's Python files with CRLF, while
    PyTorch's git, and so every blob id and patch of the series, has LF."""
    return data.replace(b"\r\n", b"\n")


def read_patch(path: Path) -> Patch:
    raw = path.read_bytes()
    headers = BytesHeaderParser().parsebytes(raw)
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", " ".join(str(headers["Subject"] or "").split()))
    if not subject:
        raise SeriesError(f"{path.name}: not a git format-patch mail (no Subject)")
    body = raw.decode().split("\n\n", 1)[1].split("\n---\n", 1)[0]  # commit message body
    trailers = dict(re.findall(r"^([A-Z][A-Za-z-]+): (.+)$", body, re.M))
    changes = []
    for pf in unidiff.PatchSet(raw.decode()):
        m = re.search(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)", str(pf.patch_info), re.M)
        if not m or len(m.group(1)) != 40:
            raise SeriesError(f"{path.name}: {pf.path} has no full blob ids (use --full-index)")
        hunks = tuple(
            f"@@ -{h.source_start},{h.source_length} +{h.target_start},{h.target_length} @@"
            f" {h.section_header}".rstrip()
            for h in pf
        )
        changes.append(FileChange(pf.path, m.group(1), m.group(2), hunks))
    if not changes:
        raise SeriesError(f"{path.name}: holds no diff")
    if len({is_wheel_path(c.path) for c in changes}) > 1:
        raise SeriesError(f"{path.name}: mixes Python files under torch/ with other sources; "
                          "split it (the wheel build carries only the first kind)")
    return Patch(path.name, path, hashlib.sha256(raw).hexdigest(), subject, trailers,
                 tuple(changes))


DEFAULT_BASE = "v2.13.0"


def bases(root: Path = ROOT) -> list[str]:
    """The base releases the project carries a series for, e.g. ["v2.13.0", "v2.15.0"]."""
    return sorted(d.name for d in (root / "patches").iterdir() if (d / "manifest.toml").is_file())


def base_for(version: str, root: Path = ROOT) -> tuple[str, bool]:
    """The series for a torch ``version`` ("2.14.1+cu130"): its own base's, else the newest
    base's; and whether it is its own."""
    tag, carried = f"v{Version(version).public}", bases(root)
    if tag in carried:
        return tag, True
    return max(carried, key=lambda b: Version(b[1:])), False


def _read_manifest(pdir: Path) -> dict:
    try:
        return tomllib.loads((pdir / "manifest.toml").read_text())
    except tomllib.TOMLDecodeError as e:
        raise SeriesError(f"patches/{pdir.name}/manifest.toml: {e}") from None


def load(root: Path = ROOT, tag: str = DEFAULT_BASE) -> Series:
    pdir = root / "patches" / tag
    if not (pdir / "manifest.toml").is_file():
        raise SeriesError(f"no series for base {tag} (patches/{tag}/manifest.toml); "
                          f"carried: {', '.join(bases(root))}")
    manifest = _read_manifest(pdir)
    if shared := manifest["base"].get("series-of"):
        # Another release's fixes and mails serve this one (2.14.0 takes 2.14.1's): the base
        # wheel's files are checked against the mails' pre-images as for any base, so a file
        # that differs refuses the wheel rather than being patched.
        pdir = root / "patches" / shared
        owner = _read_manifest(pdir) if (pdir / "manifest.toml").is_file() else None
        if owner is None or owner["base"].get("series-of"):
            raise SeriesError(f"patches/{tag}/manifest.toml: series-of {shared!r} is not a base "
                              "with a series of its own")
        manifest = {**owner, "base": manifest["base"], "upstream": manifest.get("upstream", {})}
    fixes = []
    for row in manifest["fix"]:
        row = {k: tuple(v) if isinstance(v, list) else v for k, v in row.items()}
        fixes.append(Fix(**row))
    series = Series(root, manifest["base"], manifest.get("upstream", {}), fixes)
    for row in manifest.get("acceptance", []):
        row = {k: tuple(v) if isinstance(v, list) else v for k, v in row.items()}
        series.acceptance.append(Fix(upstream=(), fixes=(), status="acceptance", **row))
        if unknown := set(row.get("needs", ())) - {f.id for f in fixes}:
            raise SeriesError(f"manifest: {row['id']} needs unknown fixes {sorted(unknown)}")

    names = [ln.strip() for ln in (pdir / "series").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    ids = [f.id for f in fixes]
    if len(set(ids)) != len(ids):
        raise SeriesError("manifest: duplicate fix ids")
    for f in fixes:
        if f.status not in STATUSES:
            raise SeriesError(f"manifest: {f.id}: unknown status {f.status!r}")
        if (f.status in STATUSES[:2]) != (f.patch is not None):
            raise SeriesError(f"manifest: {f.id}: status {f.status} "
                              + ("carries a patch" if f.patch else "names no patch"))
        if f.control and f.control != control_path(f.id):
            raise SeriesError(f"manifest: {f.id}: control must be {control_path(f.id)}")
        if f.control and not (root / f.control).is_file():
            raise SeriesError(f"manifest: {f.id}: {f.control} does not exist")
        for kind in ("proof", "guard", "triton", "triton_guard", "triton_proof"):
            if len(set(tests := getattr(f, kind))) != len(tests):
                raise SeriesError(f"manifest: {f.id}: {kind} names a test twice")
        if both := set(f.triton_guard) & set(f.triton):
            raise SeriesError(f"manifest: {f.id}: tests in both triton and triton_guard: "
                              f"{sorted(both)}")
        if both := set(f.triton_proof) & {*f.proof, *f.guard, *f.triton_guard}:
            raise SeriesError(f"manifest: {f.id}: triton_proof tests are its only ones: "
                              f"{sorted(both)}")
        if stray := set(f.triton) - {*f.proof, *f.guard}:
            raise SeriesError(f"manifest: {f.id}: triton lists tests that are not its proofs "
                              f"or guards: {sorted(stray)}")
        if f.patch and f.patch not in names:
            raise SeriesError(f"manifest: {f.id}: {f.patch} is not in patches/{pdir.name}/series")
    carried = {f.patch for f in fixes if f.patch}
    for name in names:
        if name not in carried:
            raise SeriesError(f"patches/{pdir.name}/series: {name} belongs to no fix of the "
                              "manifest")
        if not (pdir / name).is_file():
            raise SeriesError(f"patches/{pdir.name}/series: {name} does not exist")
        series.patches.append(read_patch(pdir / name))
    return series


TABLE_BEGIN, TABLE_END = "<!-- series-table: begin -->", "<!-- series-table: end -->"


def table(all_series: list[Series]) -> str:
    """One row per fix of any base; per base, what its series does about it (status, patch)."""
    tags = [s.base["tag"] for s in all_series]
    rows = ["| fix | upstream | fixes | component | first release | "
            + " | ".join(f"{tag} series" for tag in tags) + " | carried by |",
            "|---" * (6 + len(tags)) + "|"]
    by_base = [{f.id: f for f in s.fixes} for s in all_series]
    wheel = {p.name: p.wheel for s in all_series for p in s.patches}
    ids = list(dict.fromkeys(f.id for s in all_series for f in s.fixes))
    for fid in ids:
        f = next(b[fid] for b in by_base if fid in b)
        prs = ", ".join(f"[#{n}](https://github.com/pytorch/pytorch/pull/{n})" for n in f.upstream)
        bugs = ", ".join(f"#{b}" if isinstance(b, int) else str(b) for b in f.fixes)
        cells = []
        for b in by_base:
            row = b.get(fid)
            cells.append("–" if row is None else f"{row.status} {row.patch[:4]}" if row.patch
                         else row.status)
        patch = next((b[fid].patch for b in by_base if fid in b and b[fid].patch), None)
        carried = "–" if not patch else "wheel, source" if wheel[patch] else "source"
        rows.append(f"| {f.title} | {prs or '–'} | {bugs or '–'} | {f.component} | "
                    f"{f.released or '–'} | {' | '.join(cells)} | {carried} |")
    return "\n".join(rows)


BASES_BEGIN, BASES_END = "<!-- bases-table: begin -->", "<!-- bases-table: end -->"


def bases_table(all_series: list[Series]) -> str:
    """One row per base release: its series, how many mails, and what they carry."""
    rows = ["| base | series | mails (wheel) | in base | upstream fixes carried | "
            "our fixes carried | ops failing, stock → patched | DTensor ops failing, stock → "
            "patched |", "|---|---|---|---|---|---|---|---|"]

    def numbers(s: Series, status: str) -> str:
        return " ".join(sorted(f.patch[:4] for f in s.fixes if f.status == status)) or "–"

    def scoreboard(s: Series, name: str) -> str:
        """A scoreboard's ops that fail with every size unbacked (test_ops_unbacked.py,
        test_dtensor_ops.py): [xfail] fail patched, [fixed] as well on the stock release."""
        path = s.patches[0].path.parent / name if s.patches else None
        if path is None or not path.exists():
            return "–"
        data = tomllib.loads(path.read_text())
        return f"{len(data['xfail']) + len(data['fixed'])} → {len(data['xfail'])}"

    for s in all_series:
        shared = s.patches[0].path.parent.name if s.patches else s.base["tag"]
        where = f"`patches/{shared}/`" + ("" if shared == s.base["tag"] else " (same mails)")
        rows.append(f"| {s.base['version']} | {where} | {len(s.patches)} ({len(s.wheel_patches)})"
                    f" | {sum(f.status == 'in-base' for f in s.fixes)} | {numbers(s, 'patch')} | "
                    f"{numbers(s, 'original')} | {scoreboard(s, 'ops_unbacked.toml')} | "
                    f"{scoreboard(s, 'dtensor_unbacked.toml')} |")
    return "\n".join(rows)


def _replace(text: str, begin: str, end: str, new: str) -> str:
    head, rest = text.split(begin, 1)
    return f"{head}{begin}\n{new}\n{end}{rest.split(end, 1)[1]}"


def write_table(check: bool) -> int:
    """`symfix.py table`: write the bases table and the series table of every base into
    README.md (``check``: only say whether they are current)."""
    all_series = [load(tag=tag) for tag in bases()]
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = _replace(_replace(text, BASES_BEGIN, BASES_END, bases_table(all_series)),
                   TABLE_BEGIN, TABLE_END, table([s for s in all_series
                                                  if not s.base.get("series-of")]))
    if check:
        if new != text:
            print("README.md's tables are stale: run `python3 tools/symfix.py table`")
            return 1
        return 0
    readme.write_text(new)
    print(bases_table(all_series))
    return 0
