# Owner(s): ["module: ci"]
"""Every bad input to `status`, `export`, `source` and `worktree`, and a build interrupted: one line
on stderr, exit code 2, no traceback; and `status --rebase-onto` without an environment for that
torch."""

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from unittest import mock

from torch.testing._internal.common_utils import run_tests, TestCase

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from symfixlib import envs, errors, export, series  # noqa: E402
from test_symfix_source import git, make_checkout, symfix  # noqa: E402
from test_symfix_wheel import real_base_wheel  # noqa: E402

SERIES = series.load()


class TestRefusals(TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="symfix-refusals-"))
        cls.src = make_checkout(cls.tmp / "pytorch")
        git(cls.src, "tag", "v2.13.0")
        cls.file = cls.tmp / "file.txt"
        cls.file.write_text("not a directory\n")
        cls.plain = cls.tmp / "plain"  # neither a git checkout nor a torch tree
        cls.plain.mkdir()
        (cls.plain / "x").write_text("x\n")
        cls.corrupt = cls.tmp / "torch-2.16.0-py3-none-any.whl"
        cls.corrupt.write_bytes(b"PK\x03\x04 truncated")
        cls.other = cls.tmp / "numpy-2.0.0-py3-none-any.whl"
        with zipfile.ZipFile(cls.other, "w") as zf:
            zf.writestr("numpy/__init__.py", "")
        cls.no_torch = cls.tmp / "sub" / "torch-2.16.0-py3-none-any.whl"
        cls.no_torch.parent.mkdir()
        with zipfile.ZipFile(cls.no_torch, "w") as zf:
            zf.writestr("other/__init__.py", "")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def assertRefused(self, reason, *args):
        proc = symfix(*args)
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)
        self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
        self.assertRegex(proc.stderr.strip(), f"^symfix: refusing .*{reason}")

    def test_status(self):
        self.assertRefused("python /nonexistent/python: no such file",
                           "status", "--python", "/nonexistent/python")
        self.assertRefused("not an executable file", "status", "--python", str(self.file))
        proc = symfix("status", "--python", "/bin/true")  # runs, but is no Python with torch
        self.assertEqual((proc.returncode, proc.stderr), (2, "symfix: /bin/true cannot import "
                                                              "torch\n"))
        for target, reason in [("/nonexistent", "no such file or directory"),
                               (self.file, "not a wheel"),
                               (self.corrupt, "not a readable wheel"),
                               (self.other, "a numpy wheel, not a torch wheel"),
                               (self.no_torch, "holds no torch/__init__.py"),
                               (self.plain, "holds no torch/ package")]:
            self.assertRefused(reason, "status", "--rebase-onto", str(target))
        self.assertRefused("python /nonexistent/python: no such file", "status", "--rebase-onto",
                           str(self.src), "--python", "/nonexistent/python")

    def test_export(self):
        onto = ("--onto", str(self.src), "--out", str(self.tmp / "pr"))
        self.assertRefused("checkout /nonexistent: no such directory",
                           "export", "--all", "--onto", "/nonexistent")
        self.assertRefused("not a directory", "export", "--all", "--onto", str(self.file))
        self.assertRefused("not a git checkout", "export", "--all", "--onto", str(self.plain))
        self.assertRefused("no-such-fix is no fix id", "export", "no-such-fix", *onto)
        self.assertRefused("folded-matmul-symbolic is not a fix the series carries",
                           "export", "folded-matmul-symbolic", *onto)
        self.assertRefused("name one fix id, or --all", "export", *onto)
        self.assertRefused("no series for base v9.9.9", "export", "--all", "--series", "v9.9.9",
                           *onto)
        self.assertRefused("no commit no-such-ref", "export", "--all", "--base", "no-such-ref",
                           *onto)
        self.assertRefused("exists and is not a directory", "export", "--all", "--onto",
                           str(self.src), "--out", str(self.file))
        git(self.src, "branch", "symfix/export/stack")
        try:
            self.assertRefused("branch symfix/export/stack exists already", "export", "--all",
                               *onto)
        finally:
            git(self.src, "branch", "-D", "symfix/export/stack")
        (self.src / "untracked.py").write_text("")
        try:
            self.assertRefused("the tree is not clean", "export", "--all", *onto)
        finally:
            (self.src / "untracked.py").unlink()
        self.assertEqual(git(self.src, "status", "--porcelain"), "")
        self.assertFalse((self.tmp / "pr").exists())

    def test_source(self):
        self.assertRefused("checkout /nonexistent: no such directory",
                           "source", "--src", "/nonexistent", "--dry-run")
        self.assertRefused("not a git checkout", "source", "--src", str(self.plain), "--dry-run")
        self.assertRefused("exists and is not an empty directory",
                           "source", "--clone", str(self.plain), "--dry-run")
        self.assertRefused("python /nonexistent/python: no such file", "source", "--src",
                           str(self.src), "--python", "/nonexistent/python", "--dry-run")
        self.assertRefused("--out .*: exists and is not a directory", "source", "--src",
                           str(self.src), "--out", str(self.file), "--dry-run")

    def test_worktree(self):
        self.assertRefused("exists and is not empty", "worktree", str(self.plain))
        self.assertRefused("exists and is not a directory", "worktree", str(self.file))
        self.assertRefused("nonexistent.whl: no such file", "worktree", str(self.tmp / "new"),
                           "--wheel", "/nonexistent.whl")
        self.assertRefused("torch 2.16.0 is not a base symfix carries a series for", "worktree",
                           str(self.tmp / "new"), "--wheel", str(self.corrupt))
        self.assertFalse((self.tmp / "new").exists())


class TestInterrupted(TestCase):
    def test_sigterm_during_the_build_leaves_nothing(self):
        # SIGTERM (a CI timeout, say) once the last patch is applied, as the wheel is about
        # to be written: one line, exit code 2, no wheel and no partial file in --dist
        with tempfile.TemporaryDirectory(prefix="symfix-interrupted-") as tmp:
            dist = Path(tmp, "dist")
            proc = subprocess.Popen(
                [sys.executable, str(ROOT / "tools" / "symfix.py"), "wheel", "--wheel",
                 str(real_base_wheel()), "--no-venv", "--dist", str(dist)],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            lines = []
            for line in proc.stdout:
                lines.append(line)
                if line.lstrip().startswith(SERIES.patches[-1].name[:4]):
                    proc.send_signal(signal.SIGTERM)
                    break
            out, err = proc.communicate(timeout=60)
            self.assertEqual((proc.returncode, err), (2, "symfix: interrupted\n"),
                             "".join(lines) + out)
            self.assertEqual(list(dist.glob("*")), [])


class TestRebaseWithoutEnvironment(TestCase):
    """A fresh clone has no .symfix/upstream: verdicts from applying alone, saying so."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="symfix-rebase-env-"))
        self.addCleanup(shutil.rmtree, self.tmp)

    def test_directory_without_environment(self):
        src = make_checkout(self.tmp / "pytorch")
        proc = symfix("status", "--rebase-onto", str(src))
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("tests not run (no Python environment around", proc.stdout)
        self.assertIn("verdicts from applying alone", proc.stdout)
        for patch in SERIES.patches:
            self.assertRegex(proc.stdout, f"{patch.name} +" + (
                "applies" if patch.wheel else r"source only \(not in these Python files\)"))

    def test_wheel_with_no_tests(self):
        proc = symfix("status", "--rebase-onto", str(real_base_wheel()), "--no-tests")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("tests not run (--no-tests): verdicts from applying alone", proc.stdout)
        self.assertEqual(proc.stdout.count(" applies\n"), len(SERIES.wheel_patches))

    def test_wheel_finds_an_environment_that_has_it(self):
        wheel = self.tmp / "torch-2.16.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr("torch/__init__.py", "")
        env = self.tmp / "envs" / "upstream-123"
        (env / "bin").mkdir(parents=True)
        (env / "bin" / "python").write_text("")
        (env / envs.MARKER).write_text(json.dumps({"key": "torch==2.16.0",
                                                   "torch_version": "2.16.0"}))
        with mock.patch.object(envs, "ENVS", self.tmp / "envs"):
            self.assertEqual(export.rebase_python(wheel, None), (env / "bin" / "python", ""))
            # none that has it, and none can be made: say why, run no tests
            (env / envs.MARKER).write_text(json.dumps({"torch_version": "2.13.0"}))
            with mock.patch.object(envs, "ensure", side_effect=errors.EnvError("no room")):
                python, why = export.rebase_python(wheel, None, say=lambda *a, **k: None)
        self.assertIsNone(python)
        self.assertIn("could not make an environment for it (no room)", why)


if __name__ == "__main__":
    run_tests()
