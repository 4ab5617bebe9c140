# Owner(s): ["module: dynamic shapes"]
"""`symfix.py audit` and `python -m torch._symfix audit`: where a step breaks or specializes its
unbacked sizes, and which symfix fix fixes it.

The targets are in audit_targets/: steps.py (captures), replay_steps.py and dtensor_steps.py
(replays).  On stock 2.13.0 the flex training step must name the five fixes it needs (found by
capturing again with each fix applied; its first is the one the nested make_fx step needs); on
the patched build each target must trace clean.
"""

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from torch.testing._internal.common_utils import run_tests, TestCase

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from symfixlib import basewheel, envs, series  # noqa: E402

STEPS = "test/tools/audit_targets/steps.py"
REPLAY = "test/tools/audit_targets/replay_steps.py"
DTENSOR = "test/tools/audit_targets/dtensor_steps.py"
PATCHED = ROOT / ".venv" / "bin" / "python"


def stock_python() -> Path:
    """Stock torch 2.13.0 (`symfix.py test` makes it; made here the same way if missing)."""
    link = ROOT / ".symfix" / "stock"
    if not envs.python_of(link).exists():
        from test_symfix_wheel import real_base_wheel

        wheel = real_base_wheel()
        envs.ensure("stock", str(wheel), basewheel.sha256_file(wheel), bytecode=True)
    return envs.python_of(link)


def stock_python_of(tag: str) -> Path:
    """Stock torch of another base (its PyPI build, as `wheel --base` fetches it)."""
    s = series.load(tag=tag)
    wheel = basewheel.fetch(s, ROOT / ".symfix" / "cache" / "base")
    return envs.python_of(envs.ensure(f"audit-{tag}", str(wheel), s.base["known-wheels"].get(
        wheel.name) or basewheel.sha256_file(wheel), link=ROOT / ".symfix" / f"audit-{tag}",
        bytecode=True))


def symfix(*args, timeout=1500):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "symfix.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def fixes_needed(out: str) -> list[str]:
    m = re.search(r"symfix fixes this step needs: (.*?)(;|$)", out, re.M)
    return [] if m is None or m.group(1) == "none" else m.group(1).split(", ")


class TestAuditOnStock(TestCase):
    """Stock 2.13.0: the findings and the fixes that remove them."""

    def audit(self, name):
        proc = symfix("audit", "--no-tests", "--python", str(stock_python()),
                      "--repro-dir", str(ROOT / ".symfix" / "audit-test"), f"{STEPS}:{name}")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        return proc.stdout

    def test_flex_training_step(self):
        # flex attention, an in-graph causal block mask, a loss over unbacked batch and
        # sequence: five failures, one after the other, each matched to its fix (a frame in a
        # hunk it patches, else by trying the rest of the series)
        out = self.audit("flex_step_target")
        self.assertEqual(fixes_needed(out), [
            "proxy-provenance", "fake-constant-pad-nd-symbolic", "flex-dense-block-mask-scatter",
            "foreign-unbacked-transfer", "flex-unbacked-lengths"], out)
        self.assertIn("SymIntArrayRef expected to contain only concrete integers", out)
        self.assertIn("data-dependent error: u0 > 1", out)
        self.assertIn("no frame in its files; found by trying the series", out)
        self.assertIn("with them it traces clean", out)
        # every finding names the layer, both locations and a remedy
        for block in out.split("\n[")[1:]:
            self.assertRegex(block, r"layer   \S")
            self.assertRegex(block, r"remedy  (symfix fix|fixed in torch|no known fix)")

    def test_proof_tests_of_the_fixes_found(self):
        # without --no-tests: the fix the capture needs is checked by its proof tests on the
        # audited torch and with the fix; a DTensor the step returns is the step's own finding
        proc = symfix("audit", "--python", str(stock_python()), "--repro-dir",
                      str(ROOT / ".symfix" / "audit-test"), f"{DTENSOR}:dtensor_output_target")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertEqual(fixes_needed(proc.stdout), ["proxy-provenance"], proc.stdout)
        self.assertIn("its proof tests: 6/6 fail on your torch, 6/6 pass with the fix",
                      proc.stdout)
        self.assertIn("[2] fake constant in graph", proc.stdout)
        self.assertIn("remedy  pass its local tensor (marked)", proc.stdout)

    def test_fix_written_over_earlier_patches_is_tried_with_them(self):
        # 0079 changes lines 0048 wrote, and 0048 a file of other patches: tried with its
        # context (capped pooling in ceil_mode needs it: the audit then names 0079)
        from symfixlib import audit

        s = series.load(tag="v2.13.0")
        by_id = {s.fix_for(p).id: p for p in s.wheel_patches}
        fix = by_id["pooling-ceil-mode-last-window-unbacked"]
        context = audit.context_of(s, fix, [])
        self.assertIn(by_id["meta-pooling-ceil-mode-unbacked"], context)
        with tempfile.TemporaryDirectory() as tmp:
            overlay = audit.Overlay(s, audit.probe(stock_python())["dir"], Path(tmp))
            self.assertIsNone(overlay.make([fix]))
            self.assertIsNotNone(overlay.make([*context, fix]))


class TestAuditOnOtherBase(TestCase):
    """Stock 2.14.1: the audit takes the series of the audited release. 2.14.1 has the
    upstream fixes the step needs on 2.13.0; two fixes of ours remain, found on overlays of
    2.14.1's own files."""

    def test_flex_training_step_on_2_14_1(self):
        proc = symfix("audit", "--no-tests", "--python", str(stock_python_of("v2.14.1")),
                      "--repro-dir", str(ROOT / ".symfix" / "audit-test"),
                      f"{STEPS}:flex_step_target")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("(torch 2.14.1", proc.stdout)
        self.assertEqual(fixes_needed(proc.stdout),
                         ["fake-constant-pad-nd-symbolic", "flex-dense-block-mask-scatter"],
                         proc.stdout)
        self.assertIn("with them it traces clean", proc.stdout)


class TestAuditOnPatched(TestCase):
    """The patched build: every target traces clean, with the in-wheel audit too."""

    def test_targets_clean_in_wheel(self):
        # flex_step_target too, with the in-wheel capture, in test_tools_audit_clean_exit_0
        for name in ("nested_make_fx_target", "clean_target"):
            with self.subTest(name=name):
                proc = subprocess.run([str(PATCHED), "-m", "torch._symfix", "audit",
                                       f"{STEPS}:{name}"], cwd=ROOT, capture_output=True,
                                      text=True, timeout=600)
                self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
                self.assertIn("clean: the step traces", proc.stdout)
                # the marks' min=1 (and the ops' own checks) become the graph's assertions
                self.assertRegex(proc.stdout, r"runtime asserts: [1-9]\d* facts")

    def test_tools_audit_clean_exit_0(self):
        proc = symfix("audit", f"{STEPS}:flex_step_target")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("clean: the step traces", proc.stdout)
        self.assertRegex(proc.stdout, r"runtime asserts: [1-9]\d* facts")


class TestAuditBadInput(TestCase):
    def check(self, target, expect):
        for cmd in ([sys.executable, str(ROOT / "tools" / "symfix.py"), "audit", target],
                    [str(PATCHED), "-m", "torch._symfix", "audit", target]):
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
            self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
            self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
            self.assertIn(expect, proc.stderr)
            self.assertNotIn("Traceback", proc.stderr)

    def test_no_such_file(self):
        self.check("test/tools/audit_targets/nope.py", "no such file")

    def test_no_such_function(self):
        self.check(f"{STEPS}:missing", "has no function missing")

    def test_wrong_return_shape(self):
        self.check(f"{STEPS}:not_a_pair", "must return (fn, args)")


def line_of(path: str, text: str) -> int:
    return next(n for n, line in enumerate((ROOT / path).read_text().splitlines(), 1)
                if text in line)


class TestAuditReplay(TestCase):
    """`audit --replay`: the captured graph run at other sizes and in other modes against
    eager (audit_targets/replay_steps.py and dtensor_steps.py)."""

    def stock_replay(self, target, *options, steps=REPLAY):
        """`symfix.py audit --replay` of ``target`` of ``steps`` on stock 2.13.0, which finds
        something (exit 1): the finished process (its report on stdout, progress on stderr)."""
        proc = symfix("audit", "--replay", *options, "--python", str(stock_python()),
                      "--repro-dir", str(ROOT / ".symfix" / "audit-test"), f"{steps}:{target}")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        return proc

    def patched_replay(self, target, *options, found=False, steps=REPLAY):
        """The in-wheel engine's --replay of ``target`` of ``steps`` on the patched build,
        clean (exit 0) unless ``found`` (exit 1): its report."""
        with tempfile.TemporaryDirectory() as repros:
            proc = subprocess.run([str(PATCHED), "-m", "torch._symfix", "audit", "--replay",
                                   "--repro-dir", repros, *options, f"{steps}:{target}"],
                                  cwd=ROOT, capture_output=True, text=True, timeout=600)
        self.assertEqual(proc.returncode, int(found), proc.stdout + proc.stderr)
        return proc.stdout

    def assert_dropped_contiguous(self, out, user_text):
        """Stock 2.13.0's report of a step whose padded channels-last batch the capture took for
        contiguous (it needs 0003 and 0008 to trace): from the mul on, at ``user_text``'s line,
        removed by 0031 alone."""
        self.assertIn("the capture needs proxy-provenance, fake-constant-pad-nd-symbolic", out)
        self.assertIn("node    mul (aten.mul.Tensor): a trace at this size runs "
                      "aten.clone.default here", out)
        self.assertIn(f"yours   {REPLAY}:{line_of(REPLAY, user_text)}", out)
        self.assertIn("remedy  symfix fix prims-channels-last-unbacked-batch", out)
        self.assertNotIn("[2]", out)

    def test_stock_difference_and_its_fix(self):
        # stock 2.13.0: the capture needs 0003 and 0008 (applied on an overlay); the graph
        # then drops the step's .contiguous() (the padded fake looked contiguous): strides
        # differ at every batch but 0, from the mul on, found by bisecting the series: 0031
        proc = self.stock_replay("pad_channels_last_target", "--modes", "plain,no_grad")
        out = proc.stdout
        self.assertIn("(torch 2.13.0", out)
        self.assertIn("[1] differs from eager: output 0 strides: (84, 1, 21, 3) where eager has "
                      "(84, 28, 7, 1)", out)
        self.assertIn("at      u0=1 plain (and 11 more", out)
        self.assertIn("1 problem(s) found", out)
        self.assert_dropped_contiguous(out, "return y.contiguous() * 2")
        # one progress line per size and mode, on stderr
        self.assertEqual(len(re.findall(r"^replay  u0=\d+ +(plain|no_grad) ", proc.stderr,
                                        re.M)), 14, proc.stderr)

    def test_patched_clean(self):
        # the in-wheel engine on the patched build: the same step gives eager's results
        out = self.patched_replay("pad_channels_last_target")
        self.assertIn("clean: the graph gives eager's results at every size and mode checked: "
                      "7 size(s)", out)
        self.assertIn("28 replay(s)", out)

    def test_inductor_difference_and_its_fix(self):
        # stock 2.13.0, the capture (with 0003, which it needs) compiled by Inductor: where a
        # row is 5 wide or less eager raises IndexError and Inductor's code reads past it; the
        # captured graph raises as eager does, so no node of it is named; bisecting finds 0093
        out = self.stock_replay("select_inductor_target", "--inductor", "--modes", "plain").stdout
        self.assertIn("[1] accepted: the graph runs; eager raises IndexError: index 5 is out of "
                      "bounds for dimension 1 with size 1", out)
        self.assertIn("at      u0=1 plain (and 2 more: u0=2 plain, u0=3 plain)", out)
        self.assertIn("node    –", out)
        self.assertIn("remedy  symfix fix inductor-input-size-runtime-asserts", out)
        self.assertIn("6 replay(s) of the captured graph compiled by Inductor", out)
        self.assertNotIn("[2]", out)

    def test_inductor_diagonal_difference_and_its_fix(self):
        # stock 2.13.0: the superdiagonal of an unbacked square is empty in Inductor's code at
        # every size, where the captured graph is right; bisected to 0024. Patched: clean
        out = self.stock_replay("diagonal_inductor_target", "--inductor", "--modes",
                                "plain").stdout
        self.assertIn("[1] differs from eager: output 0 shape: (0,) where eager has (1,)\n"
                      "    layer   Inductor\n    at      u0=2 plain", out)
        self.assertIn("node    –", out)  # the captured graph is right
        self.assertIn("remedy  symfix fix inductor-diagonal-unbacked-length", out)
        self.assertNotIn("[2]", out)
        out = self.patched_replay("diagonal_inductor_target", "--inductor", "--modes", "plain")
        self.assertIn("7 replay(s) of the captured graph compiled by Inductor", out)

    def test_patched_clean_compiled(self):
        # the in-wheel engine on the patched build: Inductor's code checks the row's width
        out = self.patched_replay("select_inductor_target", "--inductor", "--modes", "plain,no_grad")
        self.assertIn("12 replay(s) of the captured graph compiled by Inductor", out)

    def test_training_step_difference_and_its_fix(self):
        # stock 2.13.0: the step takes its model and optimizer; their parameters and momentum
        # buffers are inputs of the graph, which updates them.  The capture needs 0003 and
        # 0008; the graph then raises at the flatten of the features it took for contiguous
        out = self.stock_replay("training_step_target", "--modes", "plain").stdout
        self.assertIn("[1] raised: the graph raises RuntimeError: view size is not compatible "
                      "with input tensor's size and stride", out)
        self.assertIn("at      u0=1 plain (and 5 more", out)
        self.assert_dropped_contiguous(out, "y = F.pad(x, (1, 1), value=0.5).contiguous() * 2")

    def test_training_step_patched_clean(self):
        # the parameters and momentum buffers after the step equal eager's at every size; a
        # backward under no_grad raises in eager too, so those modes are not replayed
        out = self.patched_replay("training_step_target")
        self.assertIn("7 size(s) of the unbacked inputs, in 2 mode(s) (plain, autocast): 14 "
                      "replay(s) of the captured graph; not in no_grad, inference_mode, where "
                      "eager raises too.", out)

    def test_state_after_the_step_is_compared(self):
        # what a graph cannot keep: the optimizer state the step creates, a parameter's .data
        out = self.patched_replay("cold_optimizer_target", "--modes", "plain", found=True)
        self.assertIn("[1] state not kept: 2 tensor(s) the step creates are not kept, as "
                      "argument (after the step) 1 (SGD) state[0].momentum_buffer", out)
        self.assertIn("at      u0=0 plain (and 6 more", out)
        self.assertIn("remedy  create that state before the capture", out)
        out = self.patched_replay("parameter_data_target", "--modes", "plain", found=True)
        self.assertIn("argument (after the step) 0 (Linear) weight values: differ", out)
        self.assertNotIn("[2]", out)
        out = self.patched_replay("scheduler_target", "--modes", "plain", found=True)
        self.assertIn("[1] differs from eager: argument (after the step) 1 (Adam) "
                      "param_groups[0].lr value: 0.005 where eager has 0.0025", out)
        self.assertNotIn("[2]", out)

    def test_kept_grads_and_foreach_update(self):
        # the grads the step accumulates into are inputs of the graph, updated in place, and
        # each side starts from its own copy of them; Adam's foreach ops update lists of them
        out = self.patched_replay("accumulation_target", "--modes", "plain")
        self.assertIn("7 replay(s)", out)

    def test_dtensor_step_difference_and_its_fix(self):
        # stock 2.13.0: a rank's batch made a DTensor (from_local, sharded on the batch); the
        # capture needs 0003, then the graph refuses an empty local batch where eager runs
        out = self.stock_replay("local_batch_target", "--modes", "plain", steps=DTENSOR).stdout
        self.assertIn("the capture needs proxy-provenance:", out)
        self.assertIn("[1] refused: the graph raises RuntimeError: Runtime assertion failed for "
                      "expression u0 >= 1", out)
        self.assertIn("at      u0=0 plain\n", out)
        self.assertIn("remedy  symfix fix dtensor-shardable-unbacked-policy", out)
        self.assertNotIn("[2]", out)

    def test_dtensor_step_patched_clean(self):
        out = self.patched_replay("local_batch_target", steps=DTENSOR)
        self.assertIn("7 size(s) of the unbacked inputs, in 4 mode(s) (plain, autocast, "
                      "no_grad, inference_mode): 28 replay(s)", out)

    def test_tensor_subclass_is_reported_not_replayed(self):
        # make_fx does not trace into a DTensor: one taken or returned by the step would be a
        # constant of the graph; each says what to pass instead
        for target, finding in (
                ("local_tensor_marked_target", "[1] tensor subclass input: input 0 is a DTensor "
                                               "whose inner tensor alone is marked unbacked"),
                ("dtensor_output_target", "[1] fake constant in graph: _tensor_constant0")):
            with self.subTest(target=target):
                out = self.patched_replay(target, "--modes", "plain", found=True, steps=DTENSOR)
                self.assertIn(finding, out)
                self.assertIn("remedy  pass its local tensor (marked) and make the DTensor in "
                              "the step (DTensor.from_local)", out)
                self.assertIn("nothing was replayed", out)

    def test_clean_step_every_mode(self):
        # embedding, linear, loss over unbacked batch and sequence: clean in all four modes
        proc = symfix("audit", "--replay", f"{REPLAY}:clean_target", timeout=600)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("12 size(s) of the unbacked inputs, in 4 mode(s) (plain, autocast, "
                      "no_grad, inference_mode): 48 replay(s)", proc.stdout)
        self.assertEqual(len(re.findall(r"^replay  u[01]=", proc.stderr, re.M)), 48)

    def test_bad_input(self):
        for args, expect in (
                (["test/tools/audit_targets/nope.py"], "no such file"),
                ([f"{REPLAY}:missing"], "has no function missing"),
                (["--modes", "autocast,fp8", f"{REPLAY}:clean_target"], "no mode 'fp8'"),
                ([f"{REPLAY}:trainer_object_target"], "argument 0 holds a Linear inside an "
                                                      "object the audit does not look into")):
            for cmd in ([sys.executable, str(ROOT / "tools" / "symfix.py"), "audit"],
                        [str(PATCHED), "-m", "torch._symfix", "audit"]):
                with self.subTest(args=args, cmd=cmd[1]):
                    proc = subprocess.run([*cmd, "--replay", *args], cwd=ROOT,
                                          capture_output=True, text=True, timeout=600)
                    self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
                    self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
                    self.assertIn(expect, proc.stderr)


class TestAuditEngine(TestCase):
    """The findings of the capture itself, on the torch running the suite."""

    def test_specialization_is_found(self):
        # torch._check(n == 8) pins the unbacked size: reported where it happened
        proc = subprocess.run([sys.executable, str(ROOT / "torch" / "_symfix" / "audit.py"),
                               f"{STEPS}:specialized_target"], cwd=ROOT, capture_output=True,
                              text=True, timeout=600)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("specialized: u0 = 8", proc.stdout)
        self.assertIn(f"{STEPS}:", proc.stdout)


if __name__ == "__main__":
    run_tests()
