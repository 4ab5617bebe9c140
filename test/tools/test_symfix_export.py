# Owner(s): ["module: ci"]
"""Tests of `tools/symfix.py export` and `status --rebase-onto` on a miniature PyTorch checkout."""

import os
import shutil
import sys
import tempfile
from pathlib import Path

from torch.testing._internal.common_utils import run_tests, TestCase

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from symfixlib import basewheel, export, series  # noqa: E402
from test_symfix_source import git, make_checkout, symfix  # noqa: E402

SERIES = series.load()
FIRST = SERIES.fix_for(SERIES.patches[0])
CONTEXT = "            if not isinstance(raw_u1, sympy.Symbol):\n"  # in the first patch's hunk


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

    def test_patch_that_does_not_apply_on_target(self):
        # release/2.13 moved on: the context of the first patch changed there.
        path = SERIES.patches[0].changes[0].path
        git(self.src, "checkout", "-q", "-b", "release/2.13")
        text = (self.src / path).read_text()
        (self.src / path).write_text(text.replace(CONTEXT, "# moved on\n" + CONTEXT))
        git(self.src, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "moved on")
        head = git(self.src, "rev-parse", "HEAD")
        proc = self.export(FIRST.id)
        self.assertEqual(proc.returncode, 1)
        self.assertRegex(proc.stderr, f"patch {SERIES.patches[0].name} does not apply")
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


class TestRebaseOnto(TestCase):
    def test_verdicts_on_own_base_and_changed_files(self):
        base = basewheel.fetch(SERIES.base["requirement"], ROOT / ".symfix" / "cache" / "base")
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

    def test_upstream_has_every_backport(self):
        python = os.environ.get("SYMFIX_UPSTREAM_PYTHON")
        if not python:
            self.skipTest("needs torch 2.14.1: run `python3 tools/symfix.py test --upstream`")
        wheel = basewheel.fetch(SERIES.upstream["requirement"], ROOT / ".symfix" / "cache" / "up")
        proc = symfix("status", "--rebase-onto", str(wheel), "--python", python)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        for patch in SERIES.patches:
            if SERIES.fix_for(patch).status == "patch":
                self.assertRegex(proc.stdout, f"{patch.name} +already upstream")


if __name__ == "__main__":
    run_tests()
