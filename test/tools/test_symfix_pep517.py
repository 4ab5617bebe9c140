# Owner(s): ["module: ci"]
"""The repository builds as torch: `pip wheel .`, `uv build`, `python -m build`, setup.py, an sdist,
a git URL and `pip install .` over a stock torch, each in a fresh clone of this tree (its tracked
files as they are in the working tree, committed), against the wheel `symfix.py wheel` makes.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from torch.testing._internal.common_utils import run_tests, TestCase

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from symfixlib import envs  # noqa: E402
from test_symfix_wheel import real_base_wheel, SERIES  # noqa: E402


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(cmd, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def fresh_clone(dest: Path) -> Path:
    """The tracked files of this tree as they are now, committed in a new repository."""
    listed = run(["git", "ls-files", "-z"], cwd=ROOT).stdout.split("\0")
    for rel in filter(None, listed):
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    ident = ["-c", "user.name=t", "-c", "user.email=t@t"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "clone"], ["tag", "v"]):
        run(["git", *ident, *cmd], cwd=dest).check_returncode()
    return dest


class TestBuildsAsTorch(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = Path(tempfile.mkdtemp(prefix="symfix-pep517-"))
        cls.clone = fresh_clone(cls.tmp / "clone")
        cls.base = real_base_wheel()
        cls.uv = envs.uv()
        cli = run([sys.executable, cls.clone / "tools" / "symfix.py", "wheel", "--no-venv",
                   "--wheel", cls.base, "--dist", cls.tmp / "cli"])
        assert cli.returncode == 0, cli.stdout + cli.stderr
        (cls.cli_wheel,) = (cls.tmp / "cli").glob("torch-*.whl")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)
        super().tearDownClass()

    def out(self, name: str) -> Path:
        """A folder of this test's, removed when it ends: a wheel is 200 MB, an env 1 GB."""
        path = self.tmp / name
        path.mkdir()
        self.addCleanup(shutil.rmtree, path)
        return path

    def assertSameWheel(self, proc, out: Path):
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        (wheel,) = out.glob("torch-*.whl")
        self.assertEqual(wheel.name, self.cli_wheel.name)
        self.assertEqual(sha256(wheel), sha256(self.cli_wheel))

    def venv(self, name: str) -> Path:
        venv = self.out(name) / "venv"
        run([self.uv, "venv", "-q", "--seed", "-p", sys.executable, venv])
        return venv / "bin" / "python"

    def installed_version(self, python: Path) -> str:
        return run([python, "-c", "import importlib.metadata as m; print(m.version('torch'))"]
                   ).stdout.strip()

    def test_pip_wheel(self):
        out = self.out("pip")
        self.assertSameWheel(run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", out,
                                  "-C", f"wheel={self.base}", self.clone]), out)

    def test_uv_build(self):
        out = self.out("uv")
        self.assertSameWheel(run([self.uv, "build", "--wheel", "-p", sys.executable, "-o", out,
                                  "-C", f"wheel={self.base}", self.clone]), out)

    def test_python_m_build(self):
        out = self.out("build")
        self.assertSameWheel(run([sys.executable, "-m", "build", "--wheel", "-o", out,
                                  "-C", f"wheel={self.base}", self.clone]), out)

    def test_environment_for_tools_without_config_settings(self):
        out = self.out("env")
        self.assertSameWheel(run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", out,
                                  self.clone], env={"SYMFIX_BUILD_WHEEL": str(self.base)}), out)

    def test_setup_py(self):
        out = self.out("setup")
        version = run([sys.executable, self.clone / "setup.py", "--version", "--wheel", self.base])
        self.assertEqual(version.stdout.strip(), self.cli_wheel.name.split("-")[1])
        self.assertSameWheel(run([sys.executable, self.clone / "setup.py", "bdist_wheel", "-d", out,
                                  "--wheel", self.base]), out)

    def test_sdist_builds_the_wheel_where_it_is_installed(self):
        out, wheels = self.out("sdist"), self.out("from-sdist")
        proc = run([self.uv, "build", "--sdist", "-p", sys.executable, "-o", out,
                    "-C", f"wheel={self.base}", self.clone])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        (sdist,) = out.glob("torch-*.tar.gz")
        version = self.cli_wheel.name.split("-")[1]
        self.assertEqual(sdist.name, f"torch-{version}.tar.gz")
        with tarfile.open(sdist) as tar:
            names = {n.split("/", 1)[1] for n in tar.getnames()}
        for path in ("PKG-INFO", "pyproject.toml", "setup.py", "tools/symfix.py",
                     "torch/_symfix/audit.py", *(str(p.path.relative_to(ROOT))
                                                 for p in SERIES.patches)):
            self.assertIn(path, names)
        self.assertSameWheel(run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", wheels,
                                  sdist], env={"SYMFIX_BUILD_WHEEL": str(self.base)}), wheels)

    def test_git_url(self):
        python = self.venv("git")
        proc = run([python, "-m", "pip", "install", "-q", "--no-deps", "-C",
                    f"wheel={self.base}", f"git+file://{self.clone}@v"])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(self.installed_version(python), self.cli_wheel.name.split("-")[1])

    def test_install_over_stock_torch(self):
        python = self.venv("over")
        stock = run([self.uv, "pip", "install", "-q", "-p", python, self.base])
        self.assertEqual(stock.returncode, 0, stock.stderr)
        proc = run([self.uv, "pip", "install", "-q", "-p", python, "-C", f"wheel={self.base}",
                    self.clone])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(self.installed_version(python), self.cli_wheel.name.split("-")[1])
        check = run([python, "-m", "pip", "check"])
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)

    def test_bad_input_is_one_line_and_a_failed_build(self):
        broken = fresh_clone(self.tmp / "broken")
        patch = broken / SERIES.patches[0].path.relative_to(ROOT)
        text = patch.read_text()  # one context line of its first hunk changed
        line = text.index("\n ", text.index("\n@@ ")) + 2
        patch.write_text(text[:line] + "#" + text[line:])
        for settings, clone, line in [
            (["-C", "base=2.16.0"], self.clone,
             "symfix: refusing torch 2.16.0 is not a base symfix carries a series for"),
            (["-C", "wheel=/nonexistent/torch-2.13.0-cp311-cp311-linux_x86_64.whl"], self.clone,
             "symfix: refusing base wheel /nonexistent/torch-2.13.0-cp311-cp311-linux_x86_64.whl: "
             "no such file"),
            (["-C", "varient=cpu"], self.clone, "symfix: refusing config setting 'varient'"),
            (["-C", f"wheel={self.base}"], broken, f"symfix: patch {patch.name} does not apply"),
        ]:
            with self.subTest(settings=settings, clone=clone.name):
                out = self.tmp / "bad"
                shutil.rmtree(out, ignore_errors=True)
                proc = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", out,
                            *settings, clone])
                self.assertNotEqual(proc.returncode, 0)
                self.assertIn(line, proc.stdout + proc.stderr)
                self.assertNotIn("Traceback", proc.stdout + proc.stderr)
                self.assertFalse(list(out.glob("*.whl")) if out.exists() else [])


if __name__ == "__main__":
    run_tests()
