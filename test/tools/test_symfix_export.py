# Owner(s): ["module: ci"]
"""Tests of `tools/symfix.py export` and `status --rebase-onto` on a miniature PyTorch checkout."""

import ast
import json
import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from torch.testing._internal.common_utils import run_tests, TestCase

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from symfixlib import export, porttests, series  # noqa: E402
from symfixlib.errors import Refused  # noqa: E402
from test_symfix_source import git, make_checkout, symfix  # noqa: E402

SERIES = series.load()
FIRST = SERIES.fix_for(SERIES.patches[0])
CONTEXT = "            if not isinstance(raw_u1, sympy.Symbol):\n"  # in the first patch's hunk
BY_ID = {f.id: f for f in SERIES.fixes}

# Our test file, in miniature: what porttests.carry takes tests from.
OURS = textwrap.dedent('''\
    # Owner(s): ["module: ours"]
    import operator
    import sys

    import torch
    from torch.fx.experimental.symbolic_shapes import free_symbols, ShapeEnv
    from torch.testing._internal.common_utils import run_tests, TestCase

    LIMIT = 3


    # a comment that goes with it
    def _helper(x):
        return _inner(x) + LIMIT


    def _inner(x):
        return operator.neg(x)


    def _unused():
        return sys.argv


    class TestMine(TestCase):
        def _shape_env(self):
            return ShapeEnv()

        def test_proof(self):
            self.assertEqual(_helper(1), 2)

        def test_other_fix(self):
            self.assertTrue(free_symbols(torch.ones(1)) == set())

        def test_guard(self):
            self.assertIsNotNone(self._shape_env())


    class TestUnrelated(TestCase):
        def test_x(self):
            pass


    if __name__ == "__main__":
        run_tests()
    ''')

# The checkout's file: its own tests, some of our imports already.
THEIRS = textwrap.dedent('''\
    # Owner(s): ["module: theirs"]
    import torch
    from torch.testing._internal.common_utils import run_tests, TestCase


    class TestTheirs(TestCase):
        def test_a(self):
            self.assertTrue(torch.ones(1).all())
    ''')
MAIN = 'if __name__ == "__main__":\n    run_tests()\n'


def carry(target, methods=("test_proof", "test_guard")):
    text = porttests.carry(OURS, target, "test/test_mine.py", {"TestMine": set(methods)})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "test_mine.py"
        path.write_text(text)
        py_compile.compile(str(path), cfile=str(Path(tmp) / "c.pyc"), doraise=True)
    return text


def top_level(text):
    return [getattr(n, "name", None) or ast.unparse(n).split("\n")[0]
            for n in ast.parse(text).body]


class TestCarryTests(TestCase):
    """porttests.carry: a fix's test classes into the upstream file at the same path."""

    def test_into_file_with_main_block(self):
        text = carry(THEIRS + "\n\n" + MAIN)
        self.assertEqual(top_level(text), [
            "import torch",
            "from torch.testing._internal.common_utils import run_tests, TestCase",
            "import operator",
            "from torch.fx.experimental.symbolic_shapes import ShapeEnv",
            "TestTheirs", "LIMIT = 3", "_helper", "_inner", "TestMine",
            "if __name__ == '__main__':"])
        self.assertIn("\n\n\n# a comment that goes with it\ndef _helper(x):\n", text)
        self.assertNotIn("test_other_fix", text)
        self.assertNotIn("_unused", text)
        self.assertTrue(text.endswith("\n\n\n" + MAIN))
        self.assertTrue(text.startswith(THEIRS.split("\n\n\n")[0] + "\n"))

    def test_into_file_without_main_block(self):
        text = carry(THEIRS)
        self.assertEqual(top_level(text)[-3:], ["_inner", "TestMine",
                                                "if __name__ == '__main__':"])
        self.assertTrue(text.endswith("\n\n\n" + MAIN))
        self.assertEqual(text.count("run_tests()"), 1)

    def test_imports_already_present_are_not_added(self):
        theirs = THEIRS.replace("import torch\n", "import operator\nimport torch\n"
                                "from torch.fx.experimental.symbolic_shapes import ShapeEnv\n")
        text = carry(theirs + "\n\n" + MAIN)
        self.assertEqual(text.count("import operator"), 1)
        self.assertEqual(text.count("import ShapeEnv"), 1)
        self.assertEqual(text.count("import torch\n"), 1)
        self.assertEqual(text.count("import run_tests, TestCase"), 1)
        # only the name the carried tests use
        self.assertNotIn("free_symbols", text)

    def test_a_name_joins_the_files_import_from_its_module(self):
        theirs = THEIRS.replace("import torch\n", "import torch\nfrom torch.fx.experimental."
                                "symbolic_shapes import (\n    DimDynamic,\n    StatelessSymbolic"
                                "Context,\n)\n")
        text = carry(theirs + "\n\n" + MAIN)
        self.assertIn("from torch.fx.experimental.symbolic_shapes import (\n    DimDynamic,\n"
                      "    ShapeEnv,\n    StatelessSymbolicContext,\n)\n", text)
        self.assertEqual(text.count("symbolic_shapes import"), 1)

    def test_new_file_in_pytorch_style(self):
        text = carry(None)
        self.assertTrue(text.startswith('# Owner(s): ["module: ours"]\nimport operator\n'))
        self.assertTrue(text.endswith("\n\n\n" + MAIN))
        self.assertIn("from torch.testing._internal.common_utils import run_tests, TestCase\n",
                      text)
        self.assertNotIn("TestUnrelated", text)

    def test_second_fix_adds_methods_to_the_class_the_first_added(self):
        first = carry(THEIRS + "\n\n" + MAIN, ["test_proof"])
        second = carry(first, ["test_other_fix"])
        self.assertEqual(second.count("class TestMine"), 1)
        self.assertEqual(second.count("def _helper"), 1)
        self.assertIn("free_symbols, ShapeEnv", OURS)
        self.assertEqual(second.count("free_symbols"), 2)  # imported once, used once
        cls = next(n for n in ast.parse(second).body if getattr(n, "name", "") == "TestMine")
        self.assertEqual([m.name for m in cls.body],
                         ["_shape_env", "test_proof", "test_other_fix"])
        self.assertEqual(carry(second, ["test_other_fix"]), second)  # nothing left to add

    def test_a_different_helper_of_the_same_name_is_refused(self):
        theirs = THEIRS + "\n\ndef _helper(x):\n    return x\n"
        with self.assertRaisesRegex(Refused, "defines _helper differently"):
            carry(theirs)

    def test_a_test_the_manifest_names_but_the_file_lacks(self):
        with self.assertRaisesRegex(Refused, "class TestMine has no test test_gone"):
            carry(THEIRS, ["test_gone"])

    def test_own_main_block_replaces_a_plain_one(self):
        ours = OURS.replace(MAIN, 'if __name__ == "__main__":\n    if sys.argv[1:] == ["--x"]:\n'
                            '        print(LIMIT)\n    else:\n        run_tests()\n')
        text = porttests.carry(ours, THEIRS + "\n\n" + MAIN, "test/test_mine.py",
                               {"TestMine": {"test_guard"}})
        self.assertTrue(text.endswith(ours[ours.index("if __name__"):]))
        self.assertIn("import sys\n", text)
        self.assertIn("LIMIT = 3\n", text)

    def test_every_fix_of_the_series(self):
        for patch in SERIES.patches:
            fix = SERIES.fix_for(patch)
            for path, classes in porttests.wanted(fix).items():
                ours = (ROOT / path).read_text()
                for target in (None, THEIRS + "\n\n" + MAIN):
                    text = porttests.carry(ours, target, path, classes)
                    porttests.compiles(text, path)
                    names = top_level(text)
                    self.assertEqual(names[-1], "if __name__ == '__main__':")
                    self.assertTrue(set(classes) <= set(names), (fix.id, path))



class TestExport(TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="symfix-export-"))
        self.addCleanup(shutil.rmtree, self.tmp)
        self.src = make_checkout(self.tmp / "pytorch")
        git(self.src, "tag", "v2.13.0")
        self.out = self.tmp / "pr"

    def export(self, *args):
        return symfix("export", *args, "--onto", str(self.src), "--out", str(self.out))

    def test_one_patch(self):
        proc = self.export(FIRST.id)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(git(self.src, "symbolic-ref", "--short", "HEAD"),
                         f"symfix/export/{FIRST.id}")
        self.assertEqual(git(self.src, "rev-list", "--count", "v2.13.0..HEAD"), "1")
        message = git(self.src, "log", "-1", "--format=%B")
        self.assertEqual(git(self.src, "log", "-1", "--format=%s"), SERIES.patches[0].subject)
        self.assertEqual(git(self.src, "log", "-1", "--format=%an"), "symfix")
        for trailer in export.DROPPED_TRAILERS:
            self.assertNotIn(f"\n{trailer}: ", message)
        self.assertIn("Fixes #183677", message)
        # The series keeps its trailers.
        self.assertIn("Origin: backport,", SERIES.patches[0].path.read_text())
        # The fix and its tests in one commit; the test plan's command runs in the checkout.
        self.assertEqual(git(self.src, "show", "--name-status", "--format=", "HEAD").splitlines(),
                         ["A\ttest/test_dynamic_shapes.py",
                          "M\ttorch/fx/experimental/symbolic_shapes.py"])
        text = (self.out / "0001-rebind-unbacked-derived-expression.md").read_text()
        command = "python test/test_dynamic_shapes.py -k TestUnbackedRebind"
        self.assertIn(f"\n{command}\n", text)
        # As a reviewer runs it: under CI=..., run_tests writes XML reports and needs xmlrunner.
        env = {k: v for k, v in os.environ.items() if k != "CI"}
        run = subprocess.run([sys.executable, *command.split()[1:]], cwd=self.src,
                             capture_output=True, text=True, env=env)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertRegex(run.stderr, r"Ran 4 tests in .*\n\nOK")

    def test_into_the_upstream_file(self):
        # The checkout has the upstream test file: ours go in before its __main__ block.
        (self.src / "test").mkdir()
        (self.src / "test" / "test_dynamic_shapes.py").write_text(THEIRS + "\n\n" + MAIN)
        git(self.src, "add", "-A")
        git(self.src, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tests")
        git(self.src, "tag", "-f", "v2.13.0")
        proc = self.export(FIRST.id)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        diff = git(self.src, "show", "--format=", "HEAD", "--", "test/test_dynamic_shapes.py")
        self.assertNotRegex(diff, r"\n-[^-]")  # only additions
        text = (self.src / "test" / "test_dynamic_shapes.py").read_text()
        self.assertEqual(top_level(text)[:3], ["import torch",
                         "from torch.testing._internal.common_utils import run_tests, TestCase",
                         "import operator"])
        self.assertEqual(top_level(text)[-5:], ["TestTheirs", "_retrace", "_only_node",
                                                "TestUnbackedRebind",
                                                "if __name__ == '__main__':"])

    def test_tests_that_cannot_be_carried_leave_the_checkout_as_it_was(self):
        (self.src / "test").mkdir()
        (self.src / "test" / "test_dynamic_shapes.py").write_text(
            THEIRS + "\n\ndef _retrace(gm):\n    return gm\n\n\n" + MAIN)
        git(self.src, "add", "-A")
        git(self.src, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tests")
        head = git(self.src, "rev-parse", "HEAD")
        proc = self.export(FIRST.id, "--base", "HEAD")
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertIn("defines _retrace differently from ours", proc.stderr)
        self.assertEqual(git(self.src, "rev-parse", "HEAD"), head)
        self.assertEqual(git(self.src, "status", "--porcelain"), "")
        self.assertEqual(git(self.src, "branch", "--list", "symfix/export/*"), "")
        self.assertFalse(self.out.exists())

    def test_pr_text(self):
        self.assertExpectedInline(export.pr_text(SERIES, SERIES.patches[0], FIRST), """\
# [release/2.13] [dynamic shapes] rebind_unbacked: accept a derived expression as the new binding

## Summary

When a graph that already went through fake tensor propagation is
retraced (FakeTensorProp after a graph pass, a HOP body retraced by
FlexAttention, ...), rebind_unbacked maps each old unbacked symbol of a
node to the value the node produces now. It handled a new symbol (rename)
and a constant (discard), and asserted "should have been constant" for
anything else.

A pass that chunks the token grid legitimately turns a binding into an
expression over other unbacked symbols: slicing a fresh nonzero() with
step 2 yields (u1 + 1) // 2. The old symbol is still fully determined by
that expression, so record it through ShapeEnv._eliminate_unbacked, the
existing path for replacing an unbacked symbol by a non-symbol
expression. _set_replacement keeps its usual range checks, so a
replacement that would lose a range (e.g. for a size-like symbol) is
still skipped rather than recorded unsoundly.

Fixes #183677

Cherry-pick of #183837 (in 2.14.0) onto `release/2.13` (v2.13.0), rewritten for the 2.13 code.

## Release tracker

Criterion: Critical fix: a hard failure (data-dependent error or assertion) when tracing with unbacked dynamic shapes, with no workaround short of not tracing symbolically. The change is small, confined to the failing path, and covered by the tests below.

## Test plan

```
python test/test_dynamic_shapes.py -k TestUnbackedRebind
python -m pytest test/test_dynamic_shapes.py::TestUnbackedRebind::test_rebind_size_to_derived_expr_after_pass test/test_dynamic_shapes.py::TestUnbackedRebind::test_rebind_item_to_derived_expr_records_replacement test/test_dynamic_shapes.py::TestUnbackedRebind::test_rebind_to_fresh_symbol_renames test/test_dynamic_shapes.py::TestUnbackedRebind::test_rebind_to_constant_is_discarded
```

Regression tests (fail without this change, pass with it):

- `test/test_dynamic_shapes.py::TestUnbackedRebind::test_rebind_size_to_derived_expr_after_pass`
- `test/test_dynamic_shapes.py::TestUnbackedRebind::test_rebind_item_to_derived_expr_records_replacement`

Behaviour kept (pass before and after):

- `test/test_dynamic_shapes.py::TestUnbackedRebind::test_rebind_to_fresh_symbol_renames`
- `test/test_dynamic_shapes.py::TestUnbackedRebind::test_rebind_to_constant_is_discarded`
""")

    def test_all_is_one_linear_stack(self):
        proc = self.export("--all")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        subjects = git(self.src, "log", "--reverse", "--format=%s", "v2.13.0..HEAD").splitlines()
        self.assertEqual(subjects, [p.subject for p in SERIES.patches])
        self.assertEqual(git(self.src, "rev-list", "--merges", "v2.13.0..HEAD"), "")
        texts = sorted(p.name for p in self.out.iterdir())
        self.assertEqual(texts, [p.name.replace(".patch", ".md") for p in SERIES.patches])
        commits = git(self.src, "rev-list", "--reverse", "v2.13.0..HEAD").splitlines()
        for commit, patch in zip(commits, SERIES.patches, strict=True):
            # Every commit: the patch's files and its fix's test files, nothing else.
            fix = SERIES.fix_for(patch)
            files = git(self.src, "show", "--name-only", "--format=", commit).splitlines()
            # (a test an earlier commit of the stack already added is not added twice)
            self.assertLessEqual({c.path for c in patch.changes}, set(files), fix.id)
            self.assertLessEqual(set(files), {c.path for c in patch.changes}
                                 | set(porttests.wanted(fix)), fix.id)
            self.assertTrue(set(files) & set(porttests.wanted(fix)), f"{fix.id}: no test change")
            for path, classes in porttests.wanted(fix).items():
                text = git(self.src, "show", f"{commit}:{path}")
                porttests.compiles(text, path)
                tree = {n.name: n for n in ast.parse(text).body if isinstance(n, ast.ClassDef)}
                for name, methods in classes.items():
                    have = {m.name for m in tree[name].body if isinstance(m, ast.FunctionDef)}
                    self.assertLessEqual(methods, have, (fix.id, name))
        # Two fixes, one test class (0011 and 0012: TestPickleCapturedGraph): the second
        # commit adds its tests to the class the first one added.
        second = commits[[p.name[:4] for p in SERIES.patches].index("0012")]
        status = git(self.src, "show", "--name-status", "--format=", second, "--",
                     "test/test_proxy_tensor.py")
        self.assertEqual(status, "M\ttest/test_proxy_tensor.py")
        diff = git(self.src, "show", "--format=", second, "--", "test/test_proxy_tensor.py")
        self.assertNotRegex(diff, r"\n-[^-]")
        self.assertNotIn("+class ", diff)
        self.assertIn("+    def test_unpickle_make_fx_graph_in_fresh_process(self):", diff)

    def test_patch_that_does_not_apply_on_target(self):
        # release/2.13 moved on: the context of the first patch changed there.
        path = SERIES.patches[0].changes[0].path
        git(self.src, "checkout", "-q", "-b", "release/2.13")
        text = (self.src / path).read_text()
        (self.src / path).write_text(text.replace(CONTEXT, "# moved on\n" + CONTEXT))
        git(self.src, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "moved on")
        head = git(self.src, "rev-parse", "HEAD")
        proc = self.export(FIRST.id)
        self.assertEqual(proc.returncode, 2, proc.stderr)  # bad input: the target moved on
        self.assertRegex(proc.stderr, f"^symfix: patch {SERIES.patches[0].name} does not apply")
        self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
        self.assertEqual(git(self.src, "rev-parse", "HEAD"), head)
        self.assertEqual(git(self.src, "symbolic-ref", "--short", "HEAD"), "release/2.13")
        self.assertEqual(git(self.src, "status", "--porcelain"), "")
        self.assertEqual(git(self.src, "branch", "--list", "symfix/export/*"), "")
        self.assertFalse(self.out.exists())

    def test_dry_run(self):
        head = git(self.src, "rev-parse", "HEAD")
        proc = self.export("--all", "--dry-run")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("git checkout -b symfix/export/stack v2.13.0", proc.stdout)
        self.assertEqual(git(self.src, "rev-parse", "HEAD"), head)
        self.assertFalse(self.out.exists())


def fake_newer_base(root: Path, fix: series.Fix) -> Path:
    """A copy of the repo at ``root`` with a second base, v2.15.0, whose series carries ``fix``
    (its 2.13 mail, the subject marked so that the export shows which one it took)."""
    for name in ("tools", "test", "patches"):  # the real v2.14.x and v2.15.0 series are left out
        shutil.copytree(ROOT / name, root / name,
                        ignore=shutil.ignore_patterns("__pycache__", ".*", "v2.14.*", "v2.15.0"))
    shutil.copy(ROOT / "pyproject.toml", root)
    patch = next(p for p in SERIES.patches if p.name == fix.patch)
    tag = root / "patches" / "v2.15.0"
    tag.mkdir()
    (tag / patch.name).write_text(
        patch.path.read_text().replace("Subject: [PATCH] ", "Subject: [PATCH] [v2.15] ", 1))
    (tag / "series").write_text(patch.name + "\n")
    row = {"id": fix.id, "title": fix.title, "upstream": [], "fixes": [],
           "component": fix.component, "status": "original", "files": list(fix.files),
           "patch": fix.patch, "proof": list(fix.proof), "guard": list(fix.guard)}
    (tag / "manifest.toml").write_text(
        '[base]\nversion = "2.15.0"\ntag = "v2.15.0"\ncommit = "%s"\n'
        'requirement = "torch==2.15.0"\nlabel = "symfix"\n\n'
        '[upstream]\nrequirement = "torch==2.15.0"\n\n[[fix]]\n' % ("0" * 40)
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in row.items()))
    return root


class TestOwnFixToMain(TestCase):
    """A fix of ours goes to main from the newest base's series; backports stay on 2.13."""

    OWN = BY_ID["proxy-nary-sym-expr"]

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="symfix-export-main-"))
        self.addCleanup(shutil.rmtree, self.tmp)
        self.root = fake_newer_base(self.tmp / "symfix", self.OWN)

    def test_plan(self):
        self.assertEqual(series.bases(self.root), ["v2.13.0", "v2.15.0"])
        own = export.plan(self.root, self.OWN.id)
        self.assertEqual((own.series.base["tag"], own.target), ("v2.15.0", "main"))
        self.assertTrue(own.patches[0].subject.startswith("[v2.15] "))
        backport = export.plan(self.root, FIRST.id)
        self.assertEqual((backport.series.base["tag"], backport.target),
                         ("v2.13.0", "release/2.13"))
        stack = export.plan(self.root, None)
        self.assertEqual((stack.series.base["tag"], stack.target, len(stack.patches)),
                         ("v2.13.0", "release/2.13", len(SERIES.patches)))
        pinned = export.plan(self.root, self.OWN.id, "v2.13.0")
        self.assertEqual((pinned.series.base["tag"], pinned.target), ("v2.13.0", "release/2.13"))
        # An own fix the newer base has already: to the release branch, saying so.
        manifest = self.root / "patches" / "v2.15.0" / "manifest.toml"
        other = BY_ID["sdpa-cpu-unbacked-zero-seq"]
        manifest.write_text(manifest.read_text() + textwrap.dedent(f"""
            [[fix]]
            id = "{other.id}"
            title = "t"
            upstream = []
            fixes = []
            component = "SDPA"
            status = "in-base"
            """))
        fixed = export.plan(self.root, other.id)
        self.assertEqual((fixed.series.base["tag"], fixed.target), ("v2.13.0", "release/2.13"))
        self.assertEqual(fixed.note, "v2.15.0 has this fix already (our tests of it pass there), "
                         "so it is not for `main`; this change is for `release/2.13` only.")
        patch = fixed.patches[0]
        text = export.pr_text(fixed.series, patch, fixed.series.fix_for(patch), fixed.target,
                              fixed.note)
        self.assertTrue(text.startswith(f"# [release/2.13] {patch.subject}\n\n{fixed.note}\n"
                                        "\n## Problem\n"))
        with self.assertRaisesRegex(Refused, "no series for base v9.0.0"):
            export.plan(self.root, self.OWN.id, "v9.0.0")

    def test_export_to_main(self):
        src = make_checkout(self.tmp / "pytorch")
        git(src, "tag", "v2.13.0")
        git(src, "branch", "main")
        git(src, "checkout", "-q", "-b", "elsewhere")
        out = self.tmp / "pr"
        proc = subprocess.run([sys.executable, str(self.root / "tools" / "symfix.py"), "export",
                               self.OWN.id, "--onto", str(src), "--out", str(out)],
                              capture_output=True, text=True, cwd=self.root)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("series  v2.15.0: 1 of 1 patches, PR text addressed to main", proc.stdout)
        self.assertEqual(git(src, "rev-parse", "HEAD~1"), git(src, "rev-parse", "main"))
        subject = git(src, "log", "-1", "--format=%s")
        self.assertTrue(subject.startswith("[v2.15] [ProxyTensor]"), subject)
        self.assertEqual(git(src, "show", "--name-only", "--format=", "HEAD").splitlines(),
                         ["test/test_proxy_tensor.py", "torch/fx/experimental/proxy_tensor.py"])
        (text,) = [p.read_text() for p in out.iterdir()]
        self.assertTrue(text.startswith(f"# {subject}\n\n## Problem\n\nWhen make_fx meets"))
        sections = [ln for ln in text.splitlines() if ln.startswith("## ")]
        self.assertEqual(sections, ["## Problem", "## Repro", "## Why this change is right",
                                    "## Test plan"])
        self.assertIn("```python\ndef test_", text)
        self.assertIn("\npython test/test_proxy_tensor.py -k TestSymExprProxyNary "
                      "-k TestSymExprProxyNaryModes\n", text)
        self.assertNotIn("release/2.13", text)
        self.assertNotIn("Written for symfix", text)


class TestRebaseOnto(TestCase):
    def test_verdicts_on_own_base_and_changed_files(self):
        from test_symfix_wheel import real_base_wheel

        base = real_base_wheel()
        verdicts = export.rebase_check(SERIES, base)
        self.assertEqual({verdicts[p.name] for p in SERIES.wheel_patches}, {"applies"})
        self.assertEqual({verdicts[p.name] for p in SERIES.patches if not p.wheel},
                         {"source only (not in these Python files)"})
        tmp = Path(tempfile.mkdtemp(prefix="symfix-rebase-"))
        self.addCleanup(shutil.rmtree, tmp)
        src = make_checkout(tmp / "pytorch")
        path = SERIES.patches[0].changes[0].path
        text = (src / path).read_text()
        (src / path).write_text(text.replace(CONTEXT, "# moved on\n" + CONTEXT))
        verdict = export.rebase_check(SERIES, src)[SERIES.patches[0].name]
        self.assertRegex(verdict, f"^conflicts: {path}")

    def test_backport_and_original_on_upstream(self):
        # One backport (its tests pass upstream) and one fix of ours that upstream lacks: the
        # matrix's upstream column judges every fix this way, this runs the command that tells
        # a release engineer which patches to drop when moving the series forward.
        python = os.environ.get("SYMFIX_UPSTREAM_PYTHON")
        if not python:
            self.skipTest("needs the upstream torch: run `python3 tools/symfix.py test --upstream`")
        site = subprocess.run([python, "-c", "import os, torch; print(os.path.dirname("
                               "os.path.dirname(torch.__file__)))"],
                              capture_output=True, text=True, check=True).stdout.strip()
        backport, ours = (next(f for f in SERIES.fixes if f.id == name) for name in (
            "meta-replication-pad2d-sym-or", "decomp-instance-norm-unbacked-batch"))
        self.assertEqual((backport.status, ours.status, ours.released), ("patch", "original", None))
        proc = symfix("status", "--rebase-onto", site, "--python", python,
                      "--fix", backport.id, "--fix", ours.id)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = [ln.split() for ln in proc.stdout.splitlines() if ln.startswith("  0")]
        self.assertEqual([(ln[0], " ".join(ln[1:3])) for ln in lines],
                         [(p.name, "already upstream") if SERIES.fix_for(p) is backport
                          else (p.name, "applies") for p in SERIES.patches
                          if SERIES.fix_for(p) in (backport, ours)])

    def test_unknown_fix_is_one_line(self):
        proc = symfix("status", "--rebase-onto", str(ROOT), "--no-tests", "--fix", "no-such-fix")
        self.assertEqual(proc.returncode, 2)
        self.assertEqual(proc.stderr.strip().count("\n"), 0, proc.stderr)
        self.assertIn("--fix no-such-fix: no such fix", proc.stderr)

if __name__ == "__main__":
    run_tests()
