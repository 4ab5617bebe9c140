# Owner(s): ["module: ci"]
"""Tests of `tools/symfix.py wheel`: base verification, patching, version stamp, provenance,
packing.

They work on miniature torch wheels made from the real 2.13.0 wheel's files at test time (the files
the series touches, torch/version.py, the dist-info), so each build takes milliseconds; one test
builds from the real wheel.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st
from packaging import tags
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from torch.testing._internal.common_utils import run_tests, TestCase
from wheel.wheelfile import WheelFile

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from symfixlib import basewheel, build, cli, envs, errors, patched, series  # noqa: E402
from symfixlib.series import git_blob_id  # noqa: E402

SERIES = series.load()
MINI = "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"  # not a known file name: checked by RECORD


def real_base_wheel() -> Path:
    """The official 2.13.0 wheel: where `symfix.py test` says, else from pip like the tool."""
    if (path := os.environ.get("SYMFIX_BASE_WHEEL")) and (
            os.environ.get("SYMFIX_BASE", SERIES.base["tag"]) == SERIES.base["tag"]):
        return Path(path)  # the base `test` runs with, when it is this series' (any 2.13.0 build)
    return basewheel.fetch(SERIES, ROOT / ".symfix" / "cache" / "base")


def base_members(names) -> dict[str, bytes]:
    with zipfile.ZipFile(real_base_wheel()) as zf:
        return {n: zf.read(n) for n in names}


def make_wheel(path: Path, files: dict[str, bytes]) -> Path:
    """A wheel of ``files`` with a correct RECORD (the wheel library writes it)."""
    with WheelFile(path, "w") as wf:
        for name, data in sorted(files.items()):
            wf.writestr(zipfile.ZipInfo(name, (2026, 7, 3, 22, 22, 46)), data)
    return path


def mini_files(dist_info="torch-2.13.0+cpu.dist-info", version="2.13.0+cpu") -> dict[str, bytes]:
    """The real wheel's touched files, version.py (saying ``version``) and dist-info, renamed."""
    with zipfile.ZipFile(real_base_wheel()) as zf:
        real = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA")).split("/")[0]
    names = [*SERIES.touched_files(), "torch/version.py", "torch/__init__.py",
             f"{real}/METADATA", f"{real}/WHEEL"]
    files = {n.replace(real, dist_info): d for n, d in base_members(names).items()}
    files["torch/version.py"] = re.sub(rb"(?m)^__version__ = '[^']*'",
                                       f"__version__ = '{version}'".encode(),
                                       files["torch/version.py"])
    return files


def without_requirements(files: dict[str, bytes]) -> dict[str, bytes]:
    """``files`` with no Requires-Dist in METADATA: environments of it install torch alone."""
    meta = next(n for n in files if n.endswith(".dist-info/METADATA"))
    lines = files[meta].decode().splitlines(keepends=True)
    return {**files, meta: "".join(ln for ln in lines if not ln.startswith("Requires-Dist:"))
            .encode()}


PYPI_MINI = "torch-2.13.0-cp311-cp311-linux_x86_64.whl"


def add_directory_entries(wheel: Path, names: list[str]) -> None:
    with zipfile.ZipFile(wheel, "a") as zf:
        for name in names:
            zf.writestr(zipfile.ZipInfo(name, (2026, 7, 3, 22, 22, 46)), b"")


def series_with_broken_patch(tmp: Path, index: int) -> series.Series:
    """The series, copied under ``tmp``, with one context line of a patch's first hunk changed
    (its pre-image blob ids kept, so only applying it can tell)."""
    shutil.copytree(ROOT / "patches", tmp / "patches")
    shutil.copytree(ROOT / "test" / "controls", tmp / "test" / "controls")
    patch = tmp / "patches" / SERIES.base["tag"] / SERIES.patches[index].name
    text = patch.read_text()
    line = text.index("\n ", text.index("\n@@ ")) + 2
    patch.write_text(text[:line] + "#" + text[line:])
    return series.load(tmp)


def symfix(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "symfix.py"), *args],
                          capture_output=True, text=True, cwd=ROOT)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class TestBaseVerification(TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="symfix-test-"))
        self.addCleanup(shutil.rmtree, self.tmp)
        self.dist = self.tmp / "dist"

    def assertRefused(self, wheel: Path, reason: str):
        proc = symfix("wheel", "--wheel", str(wheel), "--dist", str(self.dist), "--no-venv")
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        lines = proc.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, proc.stderr)
        prefix = f"symfix: refusing base wheel {re.escape(wheel.name)}: "
        self.assertRegex(lines[0], f"^{prefix}.*{reason}")
        self.assertFalse(self.dist.exists() and any(self.dist.iterdir()), "dist/ not empty")

    def test_accepts_untouched_wheel(self):
        wheel = make_wheel(self.tmp / MINI, mini_files())
        base = basewheel.verify(wheel, SERIES)
        self.assertFalse(base.known)
        self.assertEqual(base.version, "2.13.0+cpu")

    def test_refuses_other_release(self):
        files = mini_files("torch-2.16.0.dist-info")
        files["torch/version.py"] = files["torch/version.py"].replace(b"2.13.0+cpu", b"2.16.0")
        wheel = make_wheel(self.tmp / "torch-2.16.0-cp311-cp311-linux_x86_64.whl", files)
        self.assertRefused(wheel, "torch 2.16.0 is not a base symfix carries a series for")

    def test_refuses_truncated_wheel(self):
        (self.tmp / "good").mkdir()
        data = make_wheel(self.tmp / "good" / MINI, mini_files()).read_bytes()
        (self.tmp / MINI).write_bytes(data[: len(data) // 2])
        self.assertRefused(self.tmp / MINI, "not a readable zip")

    def test_refuses_corrupt_member(self):
        wheel = make_wheel(self.tmp / MINI, mini_files())
        data = bytearray(wheel.read_bytes())
        with zipfile.ZipFile(wheel) as zf:
            info = zf.getinfo("torch/__init__.py")
        data[info.header_offset + 100] ^= 0xFF  # inside the compressed stream
        wheel.write_bytes(bytes(data))
        self.assertRefused(wheel, "Bad CRC-32 for file 'torch/__init__.py'")

    def test_refuses_touched_file_behind_record(self):
        # A member changed after the wheel was built: its RECORD hash no longer matches.
        wheel = make_wheel(self.tmp / MINI, mini_files())
        with zipfile.ZipFile(wheel) as zf:
            members = {i.filename: zf.read(i) for i in zf.infolist()}
        members["torch/__init__.py"] += b"\n# touched\n"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in members.items():
                zf.writestr(name, data)
        self.assertRefused(wheel, "[Hh]ash mismatch")

    def test_refuses_touched_file_with_consistent_record(self):
        # A rebuilt wheel whose RECORD is consistent but whose patched file is not v2.13.0's.
        files = mini_files()
        (path,) = [p for p in SERIES.touched_files() if p.endswith("symbolic_shapes.py")]
        files[path] += b"\n# local change\n"
        wheel = make_wheel(self.tmp / MINI, files)
        self.assertRefused(wheel, f"{path} is not the v2.13.0 file")

    def test_refuses_wrong_commit(self):
        files = mini_files()
        files["torch/version.py"] = files["torch/version.py"].replace(
            SERIES.base["commit"].encode(), b"0" * 40)
        self.assertRefused(make_wheel(self.tmp / MINI, files), "built from 0000")

    def test_refuses_known_name_with_other_bytes(self):
        name = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
        self.assertIn(name, SERIES.base["known-wheels"])
        self.assertRefused(make_wheel(self.tmp / name, mini_files()), "is not the published")

    def test_known_name_with_other_bytes_keeps_nothing(self):
        # `wheel` checks a known wheel's sha256 beside the build and uv's install: refused all
        # the same, and neither the build nor the environment is kept
        name = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
        wheel = make_wheel(self.tmp / name, without_requirements(mini_files()))
        with mock.patch.object(patched, "VENV", self.tmp / "venv"), \
                mock.patch.object(envs, "ENVS", self.tmp / "envs"), \
                mock.patch.object(envs, "LOGS", self.tmp / "logs"), \
                mock.patch.object(envs, "test_requirements", return_value=[]), \
                mock.patch("sys.stdout"), mock.patch("sys.stderr") as err:
            rc = cli.main(["wheel", "--wheel", str(wheel), "--dist", str(self.dist)])
        printed = "".join(c.args[0] for c in err.write.call_args_list)
        self.assertEqual(rc, 2)
        self.assertRegex(printed, rf"^symfix: refusing base wheel {re.escape(name)}: sha256 .* "
                                  "is not the published")
        self.assertEqual(len(printed.strip().splitlines()), 1, printed)
        self.assertFalse((self.tmp / "venv").exists() or (self.tmp / "venv").is_symlink())
        self.assertEqual(list((self.tmp / "envs").iterdir()), [])
        self.assertEqual(list(self.dist.iterdir()), [])
        self.assertIsNone(basewheel.remembered(ROOT, wheel, "verified"))

    def test_accepts_pypi_cuda_layout(self):
        # PyPI's CUDA build: no label in file name and METADATA, version.py says +cu130, and
        # directory entries that RECORD does not list.
        wheel = make_wheel(self.tmp / PYPI_MINI, mini_files("torch-2.13.0.dist-info", "2.13.0+cu130"))
        add_directory_entries(wheel, ["functorch/", "torch/"])
        base = basewheel.verify(wheel, SERIES)
        self.assertEqual((base.version, base.file_version), ("2.13.0+cu130", "2.13.0"))

    def test_refuses_version_py_other_build(self):
        files = mini_files(version="2.13.0+cu130")  # file name says +cpu
        self.assertRefused(make_wheel(self.tmp / MINI, files),
                           "torch/version.py says 2.13.0\\+cu130, the file name 2.13.0\\+cpu")

    def test_known_wheel_for_each_python_and_variant(self):
        def names(variant, py):
            wanted = list(tags.cpython_tags(py, abis=[f"cp{py[0]}{py[1]}"],
                                            platforms=["manylinux_2_28_x86_64", "linux_x86_64"]))
            return basewheel.known_wheel_names(SERIES, variant, wanted)

        self.assertEqual(names("pypi", (3, 12)), ["torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl"])
        self.assertEqual(names("cpu", (3, 11)),
                         ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"])
        self.assertEqual(names("cpu", (3, 12)), [])  # not known: fetched from the CPU index
        for py in [(3, 10), (3, 11), (3, 12), (3, 13), (3, 14)]:
            self.assertEqual(len(names("pypi", py)), 1, py)

    def test_unknown_variant_is_refused(self):
        proc = symfix("wheel", "--variant", "cu999", "--no-venv", "--dist", str(self.dist))
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertRegex(proc.stderr.strip(), r"^symfix: refusing --variant cu999: not one of pypi")


class TestSharedSeries(TestCase):
    """A base that names another release's series (`series-of`): 2.14.0 takes 2.14.1's."""

    def test_v2_14_0_takes_v2_14_1_series_with_its_own_base(self):
        shared, own = series.load(tag="v2.14.0"), series.load(tag="v2.14.1")
        self.assertEqual([p.path for p in shared.patches], [p.path for p in own.patches])
        self.assertEqual(shared.fixes, own.fixes)
        self.assertEqual(shared.acceptance, own.acceptance)
        self.assertEqual((shared.base["version"], own.base["version"]), ("2.14.0", "2.14.1"))
        self.assertNotEqual(shared.base["commit"], own.base["commit"])
        self.assertTrue(set(shared.base["known-wheels"]).isdisjoint(own.base["known-wheels"]))

    def make_bases(self, tmp: Path, shared_manifest: str) -> None:
        """patches/v9.0.1 with one mail changing torch/a.py, and patches/v9.0.0 naming it."""
        repo = tmp / "repo"
        (repo / "torch").mkdir(parents=True)
        (repo / "torch" / "a.py").write_text("x = 1\n")
        git_ = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git_, "init", "-q"], check=True)
        subprocess.run([*git_, "add", "-A"], check=True)
        subprocess.run([*git_, "commit", "-qm", "base"], check=True)
        (repo / "torch" / "a.py").write_text("x = 2\n")
        subprocess.run([*git_, "commit", "-qam", "[t] the fix"], check=True)
        mail = subprocess.run([*git_, "format-patch", "-1", "--stdout", "--full-index"],
                              capture_output=True, text=True, check=True).stdout
        for tag, commit in (("v9.0.1", "c1"), ("v9.0.0", "c0")):
            (tmp / "patches" / tag).mkdir(parents=True)
            base = (f'[base]\nversion = "{tag[1:]}"\ntag = "{tag}"\ncommit = "{commit}"\n'
                    'label = "symfix"\n')
            rows = ('[[fix]]\nid = "the-fix"\ntitle = "t"\nupstream = []\nfixes = []\n'
                    'component = "c"\nstatus = "original"\npatch = "0001-fix.patch"\n')
            (tmp / "patches" / tag / "manifest.toml").write_text(
                base + (shared_manifest if tag == "v9.0.0" else rows))
        (tmp / "patches" / "v9.0.1" / "0001-fix.patch").write_text(mail)
        (tmp / "patches" / "v9.0.1" / "series").write_text("0001-fix.patch\n")

    def mini_wheel(self, tmp: Path, a_py: bytes) -> Path:
        return make_wheel(tmp / "torch-9.0.0-py3-none-any.whl", {
            "torch/version.py": b"__version__ = '9.0.0'\ngit_version = 'c0'\n",
            "torch/a.py": a_py,
            "torch-9.0.0.dist-info/METADATA": b"Name: torch\nVersion: 9.0.0\n",
            "torch-9.0.0.dist-info/WHEEL": b"Wheel-Version: 1.0\n"})

    def test_files_are_checked_not_assumed(self):
        tmp = Path(tempfile.mkdtemp(prefix="symfix-test-"))
        self.addCleanup(shutil.rmtree, tmp)
        self.make_bases(tmp, 'series-of = "v9.0.1"\n')
        s = series.load(tmp, "v9.0.0")
        self.assertEqual([p.name for p in s.patches], ["0001-fix.patch"])
        self.assertEqual(basewheel.verify(self.mini_wheel(tmp, b"x = 1\n"), s).version, "9.0.0")
        with self.assertRaisesRegex(errors.Refused, "torch/a.py is not the v9.0.0 file"):
            basewheel.verify(self.mini_wheel(tmp, b"x = 1  # 9.0.0's own\n"), s)

    def test_series_of_a_base_without_its_own_is_refused(self):
        tmp = Path(tempfile.mkdtemp(prefix="symfix-test-"))
        self.addCleanup(shutil.rmtree, tmp)
        self.make_bases(tmp, 'series-of = "v9.0.0"\n')
        with self.assertRaisesRegex(errors.SeriesError, "series-of 'v9.0.0' is not a base"):
            series.load(tmp, "v9.0.0")


class TestBuild(TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="symfix-test-"))
        self.addCleanup(shutil.rmtree, self.tmp)
        self.base = basewheel.verify(make_wheel(self.tmp / MINI, mini_files()), SERIES)

    def build(self, dist="dist", s=SERIES):
        return build.build(s, self.base, self.tmp / dist, say=lambda patch: None)

    def test_patched_wheel_is_valid_and_labelled(self):
        out, reused = self.build()
        self.assertFalse(reused)
        version = f"2.13.0+cpu.{SERIES.label}"
        self.assertEqual(out.name, f"torch-{version}-cp311-cp311-linux_x86_64.whl")
        with WheelFile(out) as wf:  # reading every member checks it against RECORD
            names = wf.namelist()
            contents = {n: wf.read(n) for n in names}
        self.assertIn(f"__version__ = '{version}'", contents["torch/version.py"].decode())
        self.assertIn(f"\nVersion: {version}\n",
                      contents[f"torch-{version}.dist-info/METADATA"].decode())
        self.assertFalse([n for n in names if n.startswith("torch-2.13.0+cpu.dist-info")])
        self.assertEqual(out.stat().st_mode & 0o777, 0o644)
        for patch in SERIES.wheel_patches:
            for change in patch.changes:
                post = [c.post_blob for p in SERIES.wheel_patches for c in p.changes
                        if c.path == change.path][-1]
                self.assertEqual(git_blob_id(contents[change.path]), post)

    def test_provenance(self):
        out, _ = self.build()
        prov = build.read_provenance(out)
        self.assertEqual(prov["BASE"]["sha256"], self.base.sha256)
        self.assertEqual(prov["BASE"]["git_version"], SERIES.base["commit"])
        # the patches the wheel carries: not the source-only ones
        self.assertEqual([p["patch"] for p in prov["PATCHES"]],
                         [p.name for p in SERIES.wheel_patches])
        self.assertIn(183837, [p["upstream"] for p in prov["PATCHES"]])
        for entry, patch in zip(prov["PATCHES"], SERIES.wheel_patches, strict=True):
            self.assertEqual(entry["sha256"], hashlib.sha256(patch.path.read_bytes()).hexdigest())

    def test_killed_build_leaves_nothing_visible(self):
        # A build killed mid-write leaves only a hidden .partial file, removed by the next build.
        dist = self.tmp / "dist"
        dist.mkdir()
        (dist / ".torch-2.13.0+cpu.symfix1-cp311-cp311-linux_x86_64.whl.x.partial").write_text("")
        self.build()
        self.assertEqual([p.name for p in dist.iterdir()],
                         [f"torch-2.13.0+cpu.{SERIES.label}-cp311-cp311-linux_x86_64.whl"])

    def test_reproducible_and_reused(self):
        first, _ = self.build("a")
        second, _ = self.build("b")
        self.assertEqual(sha256(first), sha256(second))
        # the sha256 `wheel` prints, hashed as the file was written
        self.assertEqual(basewheel.remembered(SERIES.root, first, "sha256"), sha256(first))
        again, reused = self.build("a")
        self.assertTrue(reused)
        self.assertEqual(again, first)

    def test_patch_that_does_not_apply(self):
        broken = series_with_broken_patch(self.tmp / "series", 0)
        with self.assertRaisesRegex(errors.PatchFailed, rf"patch {SERIES.patches[0].name} "
                                    "does not apply: .*hunk @@ -"):
            self.build("dist", broken)
        self.assertFalse((self.tmp / "dist").exists() and any((self.tmp / "dist").iterdir()))

    def test_pypi_cuda_build_is_labelled_and_satisfies_requirements(self):
        wheel = make_wheel(self.tmp / PYPI_MINI, mini_files("torch-2.13.0.dist-info", "2.13.0+cu130"))
        add_directory_entries(wheel, ["functorch/"])
        self.base = basewheel.verify(wheel, SERIES)
        out, _ = self.build()
        version = f"2.13.0+cu130.{SERIES.label}"
        self.assertEqual(out.name, f"torch-{version}-cp311-cp311-linux_x86_64.whl")
        with WheelFile(out) as wf:
            names = wf.namelist()
            for name in names:
                if not name.endswith("/"):
                    wf.read(name)  # checked against RECORD
            metadata = wf.read(f"torch-{version}.dist-info/METADATA").decode()
            version_py = wf.read("torch/version.py").decode()
        self.assertIn("functorch/", names)
        self.assertIn(f"\nVersion: {version}\n", metadata)
        self.assertIn(f"__version__ = '{version}'", version_py)
        # What pip, `pip check` and other packages' requirements see (PEP 440 local versions).
        for spec in ["==2.13.0", ">=2.13,<2.14", "~=2.13.0", "==2.13.*"]:
            self.assertIn(Version(version), SpecifierSet(spec), spec)
        self.assertNotIn(Version(version), SpecifierSet("==2.13.0+cu130"))

    def test_windows_crlf_files_are_patched_and_keep_crlf(self):
        # The Windows wheels ship torch's Python files with CRLF line ends.
        files = mini_files("torch-2.13.0.dist-info", "2.13.0+cpu")
        for path in SERIES.touched_files():
            if path in files:
                files[path] = files[path].replace(b"\n", b"\r\n")
        self.base = basewheel.verify(make_wheel(self.tmp / "torch-2.13.0-cp311-cp311-win_arm64.whl",
                                                files), SERIES)
        out, _ = self.build()
        self.assertEqual(out.name, f"torch-2.13.0+cpu.{SERIES.label}-cp311-cp311-win_arm64.whl")
        with WheelFile(out) as wf:
            for patch in SERIES.wheel_patches:
                for change in patch.changes:
                    data = wf.read(change.path)
                    self.assertNotIn(b"\n", data.replace(b"\r\n", b""), change.path)
                    post = [c.post_blob for p in SERIES.wheel_patches for c in p.changes
                            if c.path == change.path][-1]
                    self.assertEqual(git_blob_id(series.as_lf(data)), post)

    @given(local=st.sampled_from(["", "cpu", "cu126", "rocm6.4"]), n=st.integers(1, 99))
    def test_stamped_version_keeps_base(self, local, n):
        base = "2.13.0" + (f"+{local}" if local else "")
        stamped = Version(build.stamped_version(base, f"symfix{n}"))
        self.assertEqual(stamped.public, "2.13.0")
        self.assertEqual(stamped.local, ".".join(filter(None, [local, f"symfix{n}"])))


class TestEnvironmentRoom(TestCase):
    """An environment asks the disk only for what uv must fetch or unpack: its cache holds the rest
    and uv hardlinks it (a CI machine with 7.6 GB free was refused a cached CUDA environment)."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="symfix-test-"))
        self.addCleanup(shutil.rmtree, self.tmp)
        subprocess.run([envs.uv(), "venv", "-q", str(self.tmp / "venv")], check=True)
        self.python = envs.python_of(self.tmp / "venv")

    def test_cached_environment_needs_only_the_margin(self):
        # the stock environment of this run holds the base wheel and the test requirements
        need = envs.room_needed(self.python, [str(real_base_wheel()), *envs.test_requirements()],
                                cold_gb=7.0)
        self.assertEqual(need, envs.MARGIN_GB)

    def test_new_local_wheel_needs_its_unpacked_size(self):
        wheel = make_wheel(self.tmp / MINI, mini_files())
        with zipfile.ZipFile(wheel) as zf:
            unpacked = sum(i.file_size for i in zf.infolist()) / 1e9
        need = envs.room_needed(self.python, [str(wheel)], cold_gb=7.0)
        self.assertAlmostEqual(need, unpacked + envs.MARGIN_GB)

    def test_what_must_be_downloaded_needs_the_cold_estimate(self):
        self.assertEqual(envs.room_needed(self.python, ["sympy==1.0"], cold_gb=7.0), 7.0)

    def test_copies_from_the_cache_need_the_cold_estimate(self):
        with mock.patch.dict(os.environ, {"UV_LINK_MODE": "copy"}):
            need = envs.room_needed(self.python, [str(real_base_wheel())], cold_gb=7.0)
        self.assertEqual(need, 7.0)

    def test_no_room_installs_nothing(self):
        link = self.tmp / "patched"
        with mock.patch.object(envs, "ENVS", self.tmp / "envs"), \
                mock.patch.object(envs, "LOGS", self.tmp / "logs"), \
                mock.patch.object(envs, "free_gb", return_value=0.1):
            with self.assertRaisesRegex(errors.NoRoom, r"^patched: 0.1 GB free, its environment "
                                                     r"needs 0.5 GB$"):
                envs.ensure("patched", str(real_base_wheel()), "key", link)
        self.assertFalse(link.exists() or link.is_symlink())
        self.assertEqual(list((self.tmp / "envs").iterdir()), [])

    def test_test_skips_loudly_only_when_asked(self):
        no_room = errors.NoRoom("stock: 0.1 GB free, its environment needs 7.0 GB")
        with mock.patch.object(envs, "ensure", side_effect=no_room), \
                mock.patch("sys.stdout") as out, mock.patch("sys.stderr") as err:
            asked = cli.main(["test", "--matrix-only", "--skip-if-no-room"])
            not_asked = cli.main(["test", "--matrix-only"])
        printed = "".join(c.args[0] for c in out.write.call_args_list)
        self.assertEqual(asked, 0)
        self.assertIn(f"!!! SKIPPED these tests: {no_room} !!!", printed)
        self.assertEqual(not_asked, 1)
        self.assertIn(f"symfix: {no_room}\n", "".join(c.args[0] for c in err.write.call_args_list))


class TestEnvironmentBytecode(TestCase):
    """`test` asks for environments with bytecode: where PYTHONDONTWRITEBYTECODE is set, each of
    its processes would compile torch again. `wheel` does not ask, and keeps one that has it."""

    def test_bytecode_when_asked_and_kept(self):
        tmp = Path(tempfile.mkdtemp(prefix="symfix-test-"))
        self.addCleanup(shutil.rmtree, tmp)
        wheel = make_wheel(tmp / MINI, without_requirements(mini_files()))
        link = tmp / "patched"

        def pyc(env: Path) -> list[Path]:  # torch/__init__.py: never imported by ensure
            return list(env.glob("lib/python*/site-packages/torch/__pycache__/__init__.*.pyc"))

        with mock.patch.object(envs, "ENVS", tmp / "envs"), \
                mock.patch.object(envs, "LOGS", tmp / "logs"), \
                mock.patch.object(envs, "test_requirements", return_value=[]):
            plain = envs.ensure("patched", str(wheel), "key", link).resolve()
            self.assertEqual(pyc(plain), [])
            compiled = envs.ensure("patched", str(wheel), "key", link, bytecode=True).resolve()
            self.assertNotEqual(compiled, plain)
            self.assertEqual(len(pyc(compiled)), 1)
            self.assertEqual(envs.ensure("patched", str(wheel), "key", link).resolve(), compiled)


class TestInstallOver(TestCase):
    """`wheel` has uv install the base (in its cache: hardlinks) and writes the patched build's
    own files over it from the build's plan (envs.install_over), instead of having uv unpack the
    new build."""

    def test_same_as_installing_the_patched_wheel(self):
        tmp = Path(tempfile.mkdtemp(prefix="symfix-test-"))
        self.addCleanup(shutil.rmtree, tmp)
        base = basewheel.verify(make_wheel(tmp / MINI, without_requirements(mini_files())),
                                SERIES)
        out, _ = build.build(SERIES, base, tmp / "dist", say=lambda patch: None)

        def env(name: str, wheel: Path) -> Path:
            subprocess.run([envs.uv(), "venv", "-q", str(tmp / name)], check=True)
            subprocess.run([envs.uv(), "pip", "install", "-q", "--python",
                            str(envs.python_of(tmp / name)), str(wheel)], check=True)
            return envs.site_packages(tmp / name)

        def tree(site: Path) -> dict[str, str]:
            """path -> sha256 of torch's files (RECORD's rows sorted; uv's note on the archive
            it cached left out)"""
            files = {}
            for p in site.glob("torch*/**/*"):
                if p.is_file() and "__pycache__" not in p.parts and p.name != "uv_cache.json":
                    data = p.read_bytes()
                    if p.name == "RECORD":
                        data = "\n".join(sorted(r for r in data.decode().splitlines()
                                                if "uv_cache.json" not in r)).encode()
                    files[p.relative_to(site).as_posix()] = hashlib.sha256(data).hexdigest()
            return files

        direct = env("direct", out)
        over = env("over", base.path)
        written = envs.install_over(over, build.plan(SERIES, base, say=lambda patch: None), out)
        self.assertEqual(tree(over), tree(direct))
        self.assertIn(over / "torch" / "version.py", written)
        # the base's files in uv's cache, hardlinked into the environment, are untouched
        again = env("again", base.path)
        with zipfile.ZipFile(base.path) as zf:
            self.assertEqual((again / "torch" / "version.py").read_bytes(),
                             zf.read("torch/version.py"))

    def test_patch_that_does_not_apply_switches_nothing(self):
        # the build fails while uv installs the base beside it: one line, and no environment
        tmp = Path(tempfile.mkdtemp(prefix="symfix-test-"))
        self.addCleanup(shutil.rmtree, tmp)
        base = make_wheel(tmp / MINI, without_requirements(mini_files()))
        broken = series_with_broken_patch(tmp, 0)
        with mock.patch.object(series, "load", return_value=broken), \
                mock.patch.object(patched, "VENV", tmp / "venv"), \
                mock.patch.object(envs, "ENVS", tmp / "envs"), \
                mock.patch.object(envs, "LOGS", tmp / "logs"), \
                mock.patch.object(envs, "test_requirements", return_value=[]), \
                mock.patch("sys.stdout"), mock.patch("sys.stderr") as err:
            rc = cli.main(["wheel", "--wheel", str(base), "--dist", str(tmp / "dist")])
        printed = "".join(c.args[0] for c in err.write.call_args_list)
        self.assertEqual(rc, 2)  # bad input
        self.assertRegex(printed, rf"^symfix: patch {SERIES.patches[0].name} does not apply")
        self.assertEqual(len(printed.strip().splitlines()), 1, printed)
        self.assertFalse((tmp / "venv").exists() or (tmp / "venv").is_symlink())
        self.assertEqual(list((tmp / "envs").iterdir()), [])


class TestRealWheel(TestCase):
    def test_build_from_official_wheel(self):
        tmp = Path(tempfile.mkdtemp(prefix="symfix-test-"))
        self.addCleanup(shutil.rmtree, tmp)
        base = basewheel.verify(real_base_wheel(), SERIES)
        self.assertTrue(base.known)
        out, _ = build.build(SERIES, base, tmp, say=lambda patch: None)
        with zipfile.ZipFile(out) as zf, zipfile.ZipFile(base.path) as zb:
            # + the torch._symfix package: the provenance record and our own files
            ours = [*build.own_files(SERIES.root), build.PROVENANCE]
            self.assertEqual(len(zf.namelist()), len(zb.namelist()) + len(ours))
            self.assertLessEqual(set(ours), set(zf.namelist()))
            self.assertIsNone(zf.testzip())

    def test_readme_series_table_is_current(self):
        proc = symfix("table", "--check")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)


if __name__ == "__main__":
    run_tests()
