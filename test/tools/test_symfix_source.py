# Owner(s): ["module: ci"]
"""Tests of `tools/symfix.py source` on a miniature PyTorch checkout.

The fixture is a git repo whose tree holds the v2.13.0 files the series touches (taken from the
official wheel at test time) and a tiny PEP 517 backend standing in for PyTorch's setup.py: it
packs torch/ into a wheel named after PYTORCH_BUILD_VERSION, as PyTorch's build does.
"""

import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from torch.testing._internal.common_utils import run_tests, TestCase

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from symfixlib import build, checkout, series, source  # noqa: E402
from symfixlib import git as gitops  # noqa: E402
from symfixlib.errors import PatchFailed, Refused  # noqa: E402
from test_symfix_matrix import sigterm_once_started  # noqa: E402
from test_symfix_wheel import real_base_wheel, series_with_broken_patch  # noqa: E402

SERIES = series.load()

BACKEND = '''
import os, pathlib
from wheel.wheelfile import WheelFile

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = os.environ["PYTORCH_BUILD_VERSION"]
    name = f"torch-{version}-py3-none-any.whl"
    with WheelFile(os.path.join(wheel_directory, name), "w") as wf:
        for path in sorted(pathlib.Path("torch").rglob("*.py")):
            wf.write(str(path), str(path))
        info = f"torch-{version}.dist-info"
        metadata = f"Metadata-Version: 2.1\\nName: torch\\nVersion: {version}\\n"
        wf.writestr(f"{info}/METADATA", metadata)
        wf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\\nTag: py3-none-any\\n")
    return name
'''

PYPROJECT = '''
[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]
'''


def git(src, *args):
    return gitops.run(Path(src), *args).stdout.strip()


PACKAGING_GUARD = "#if !defined(TORCH_STABLE_ONLY) && !defined(TORCH_TARGET_VERSION)\n"
PACKAGING_ELSE = (
    '\n#else\n#error "This file should not be included when either TORCH_STABLE_ONLY or '
    'TORCH_TARGET_VERSION is defined."\n#endif  // !defined(TORCH_STABLE_ONLY) && '
    "!defined(TORCH_TARGET_VERSION)\n"
)


def source_file(zf: zipfile.ZipFile, path: str) -> bytes:
    """v2.13.0's file at source ``path``, from the wheel: a Python file as it is, an ATen header
    from torch/include/ without the TORCH_STABLE_ONLY guard the packaging wraps it in."""
    if path.startswith("torch/"):
        return zf.read(path)
    return unwrap_header(zf.read("torch/include/" + path.removeprefix("aten/src/")).decode(),
                         path).encode()


def unwrap_header(text: str, path: str) -> str:
    """An installed ATen header without the TORCH_STABLE_ONLY guard the packaging wraps it in."""
    assert text.startswith(PACKAGING_GUARD) and text.endswith(PACKAGING_ELSE), path
    return text[len(PACKAGING_GUARD) : -len(PACKAGING_ELSE)]


def make_checkout(dest: Path, change=None) -> Path:
    """A git repo at a commit holding v2.13.0's copies of the files the series touches."""
    dest.mkdir(parents=True)
    with zipfile.ZipFile(real_base_wheel()) as zf:
        for path in [*SERIES.touched_files(source=True), "torch/version.py"]:
            (dest / path).parent.mkdir(parents=True, exist_ok=True)
            (dest / path).write_bytes(source_file(zf, path))
    if change:
        change(dest)
    (dest / "backend.py").write_text(BACKEND)
    (dest / "pyproject.toml").write_text(PYPROJECT)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "fixture")
    return dest


def symfix(*args):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "symfix.py"), *args],
                          capture_output=True, text=True, cwd=ROOT)


class TestSource(TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="symfix-source-"))
        self.addCleanup(shutil.rmtree, self.tmp)
        self.out = self.tmp / "dist"

    def source(self, src, *extra):
        return symfix("source", "--src", str(src), "--out", str(self.out), "--no-test",
                      "--python", sys.executable, *extra)

    def assertRefused(self, proc, reason):
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertRegex(proc.stderr.strip(), f"^symfix: refusing checkout .*{reason}")
        self.assertFalse(self.out.exists() and any(self.out.iterdir()))

    def test_happy_path(self):
        src = make_checkout(self.tmp / "pytorch")
        base = git(src, "rev-parse", "HEAD")
        proc = self.source(src)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        branch = git(src, "symbolic-ref", "--short", "HEAD")
        self.assertEqual(branch, f"symfix/v2.13.0-{SERIES.label}")
        subjects = git(src, "log", "--reverse", "--format=%s", f"{base}..HEAD").splitlines()
        self.assertEqual(subjects, [p.subject for p in SERIES.patches])
        authors = set(git(src, "log", "--format=%an <%ae>", f"{base}..HEAD").splitlines())
        self.assertEqual(authors, {"symfix <symfix@users.noreply.github.com>"})
        self.assertIn("Origin: backport, https://github.com/pytorch/pytorch/pull/183837",
                      git(src, "log", "--format=%B", f"{base}..HEAD"))
        self.assertEqual(git(src, "status", "--porcelain"), "")  # provenance file removed again
        (wheel,) = self.out.glob("*.whl")
        version = f"2.13.0+{SERIES.label}"
        self.assertEqual(wheel.name, f"torch-{version}-py3-none-any.whl")
        prov = build.read_provenance(wheel)
        self.assertEqual(prov["VERSION"], version)
        self.assertEqual(prov["BASE"]["source"], base)
        self.assertEqual([p["patch"] for p in prov["PATCHES"]], [p.name for p in SERIES.patches])
        with zipfile.ZipFile(wheel) as zf:  # the torch._symfix package: our files beside it
            for path, data in build.own_files(ROOT).items():
                self.assertEqual(zf.read(path), data)
        self.assertEqual([f for f in self.out.iterdir() if f != wheel], [])

    def test_wrong_commit(self):
        path = next(iter(SERIES.touched_files()))
        src = make_checkout(self.tmp / "pytorch",
                            lambda d: (d / path).write_text((d / path).read_text() + "# other\n"))
        self.assertRefused(self.source(src), f"is not v2.13.0 .* and {path} is not its file")

    def test_dirty_tree(self):
        src = make_checkout(self.tmp / "pytorch")
        (src / "torch" / "version.py").write_text("# edited\n")
        self.assertRefused(self.source(src), "the tree is not clean")
        self.assertEqual(git(src, "status", "--porcelain"), "M torch/version.py")

    def test_patch_that_does_not_apply_leaves_checkout_as_it_was(self):
        src = make_checkout(self.tmp / "pytorch")
        head = git(src, "rev-parse", "HEAD")
        broken = series_with_broken_patch(self.tmp / "series", -1)
        with self.assertRaisesRegex(PatchFailed,
                                    f"patch {SERIES.patches[-1].name} does not apply"):
            checkout.am(src, broken.patches, "symfix/test")
        self.assertEqual(git(src, "rev-parse", "HEAD"), head)
        self.assertEqual(git(src, "status", "--porcelain"), "")
        self.assertEqual(git(src, "branch", "--list", "symfix/test"), "")

    def test_branch_exists(self):
        src = make_checkout(self.tmp / "pytorch")
        git(src, "branch", f"symfix/v2.13.0-{SERIES.label}")
        self.assertRefused(self.source(src), "branch .* exists already")

    def test_dry_run(self):
        src = make_checkout(self.tmp / "pytorch")
        head = git(src, "rev-parse", "HEAD")
        proc = self.source(src, "--dry-run")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        for p in SERIES.patches:
            self.assertIn(f"git am --keep-cr --keep-non-patch {p.path}", proc.stdout)
        self.assertRegex(proc.stdout,
                         r"BUILD_TEST=0 USE_DISTRIBUTED=1 PYTORCH_BUILD_VERSION=2\.13\.0\+symfix")
        self.assertIn("-m pip wheel . --no-build-isolation", proc.stdout)
        self.assertEqual(git(src, "rev-parse", "HEAD"), head)
        self.assertFalse(self.out.exists())

    def test_not_a_checkout(self):
        with self.assertRaisesRegex(Refused, "not a git checkout"):
            checkout.verify(self.tmp, SERIES)


class TestBuildInterrupted(TestCase):
    def test_the_whole_build_stops(self):
        # SIGTERM (a CI timeout, say) during PyTorch's build: not only the command symfix ran
        # (pip) stops, but what it started (setup.py, ninja, the compilers); here a grandchild
        tmp = Path(tempfile.mkdtemp(prefix="symfix-source-test-"))
        self.addCleanup(shutil.rmtree, tmp)
        self.addCleanup(signal.signal, signal.SIGTERM,
                        signal.signal(signal.SIGTERM, signal.default_int_handler))  # as cli.main
        compiler = (f"import pathlib, time; pathlib.Path({str(tmp / 'started')!r}).touch(); "
                    f"time.sleep(3); pathlib.Path({str(tmp / 'finished')!r}).touch()")
        build_cmd = [sys.executable, "-c", "import subprocess, sys; "
                     f"subprocess.run([sys.executable, '-c', {compiler!r}])"]
        sigterm_once_started(tmp / "started")
        with self.assertRaises(KeyboardInterrupt):
            source.run_build(tmp, build_cmd, {}, tmp / "build.log", say=lambda line: None)
        time.sleep(4)  # the grandchild would have finished by now
        self.assertTrue((tmp / "started").exists())
        self.assertFalse((tmp / "finished").exists())


if __name__ == "__main__":
    run_tests()
