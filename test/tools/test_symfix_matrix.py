# Owner(s): ["module: ci"]
"""Tests of `tools/symfix.py test`'s schedule: the matrix's patched column is read from whichever
of the suite's shards ran each test; an interrupt stops the jobs."""

import json
import math
import os
import shutil
import signal
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from unittest import mock

from torch.testing._internal.common_utils import run_tests, TestCase

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from symfixlib import children, envs, matrix, series  # noqa: E402

SERIES = series.load()
# the logs of the control jobs `test` runs: each in-base fix with a control and tests
CONTROL_JOBS = [f"control-{f.id}" for f in SERIES.fixes
                if f.status == "in-base" and f.control and f.tests]


class TestSuiteShards(TestCase):
    def test_shards_run_the_suite_once(self):
        def runs(args: list[str], f: str) -> bool:
            path, ignored = args[0], [a.removeprefix("--ignore=") for a in args[1:]]
            return (f == path or f.startswith(path + "/")) and not any(
                f == q or f.startswith(q + "/") for q in ignored)

        files = [p.relative_to(ROOT).as_posix() for p in (ROOT / "test").rglob("test_*.py")]
        self.assertGreater(len(files), 10)
        for f in files:
            self.assertEqual(sum(runs(a, f) for a in matrix.SUITE_SHARDS.values()), 1, f)

    def test_columns_read_from_the_shards(self):
        ids = matrix.all_test_ids(SERIES)
        triton_ids = [t for f in SERIES.rows for t in f.triton_tests]
        started, caches, lock = [], set(), threading.Lock()
        # (a test before this one in the process may have set Inductor's for its workers)
        self.enterContext(mock.patch.dict(os.environ, {
            k: v for k, v in os.environ.items() if k not in matrix.RUN_CACHES}, clear=True))

        def fake_run(python, test_ids, log, control=None, suite=None, extra_env=None):
            with lock:
                started.append(log.stem)
                caches.add(tuple(extra_env[var] for var in matrix.RUN_CACHES))
            if log.stem.endswith(matrix.TRITON):  # the Triton path's tests only, on its switch
                self.assertEqual(test_ids, triton_ids)
                self.assertEqual(extra_env.keys() - matrix.RUN_CACHES.keys(),
                                 matrix.TRITON_ENV.keys())
            if suite == matrix.SUITE_SHARDS["tools"]:  # one shard ran every fix's test
                return matrix.Run({t: "passed" for t in test_ids}, 0, "all passed", log)
            outcome = "failed" if python == Path("stock") else "missing"
            return matrix.Run({t: outcome for t in test_ids}, 0, "ran", log)

        pythons = {"stock": Path("stock"), "patched": Path("patched"), "upstream": "no room"}
        with mock.patch.object(matrix, "run_tests", fake_run):
            results, suite = matrix.run_columns(SERIES, pythons, {})
        # every job shares the run's caches, a folder of their own removed when the run ends
        ((inductor, triton),) = caches
        self.assertEqual(Path(inductor).parent, Path(triton).parent)
        self.assertFalse(Path(inductor).parent.exists())
        self.assertEqual(list(suite), list(matrix.SUITE_SHARDS))
        self.assertEqual(set(started), {*(f"suite-{n}" for n in matrix.SUITE_SHARDS),
                                        "matrix-stock", "matrix-stock+ops", "matrix-stock+dist",
                                        "matrix-stock+flex",
                                        "matrix-stock+triton",
                                        "matrix-patched+triton",
                                        *(f"control-{f.id}" for f in SERIES.fixes
                                          if f.status == "in-base" and f.control)})
        self.assertEqual(list(results), ["stock", "patched", "upstream", "stock+triton",
                                         "patched+triton", "upstream+triton", "control"])
        self.assertEqual(results["upstream+triton"], "no room")
        self.assertEqual(results["patched"], {t: "passed" for t in ids})
        self.assertEqual(results["stock"], {t: "failed" for t in ids})
        self.assertEqual(results["upstream"], "no room")
        # without the suite, the patched column is its two jobs' outcomes too
        with mock.patch.object(matrix, "run_tests", fake_run):
            results, suite = matrix.run_columns(SERIES, pythons, {}, suite=False)
        self.assertEqual(list(suite), ["patched", *(f"patched{job}" for job in matrix.JOBS)])
        self.assertEqual(results["stock"], {t: "failed" for t in ids})
        self.assertEqual(set(results["control"]),
                         {f.id for f in SERIES.fixes if f.status == "in-base" and f.control})

    def test_patched_only_runs_no_stock_job(self):
        # another build of a release (--patched-only): the stock columns and the controls, which
        # run on stock, are skipped with the reason, and so judged nowhere
        started = []

        def fake_run(python, test_ids, log, control=None, suite=None, extra_env=None):
            started.append(log.stem)
            return matrix.Run(dict.fromkeys(test_ids, "passed"), 0, "ran", log)

        why = "not run (--patched-only)"
        with mock.patch.object(matrix, "run_tests", fake_run):
            results, _ = matrix.run_columns(
                SERIES, {"stock": why, "patched": Path("patched")}, {}, suite=False)
        self.assertEqual(sorted(started), ["matrix-patched", "matrix-patched+dist",
                                           "matrix-patched+flex", "matrix-patched+ops",
                                           "matrix-patched+triton"])
        self.assertEqual((results["stock"], results["stock+triton"], results["control"]),
                         (why, why, why))
        text, problems = matrix.table(SERIES, results)
        self.assertEqual(problems, [])
        self.assertIn("skipped", text)

    def test_triton_column_judges_the_triton_tests_only(self):
        # a fix's Triton cells judge its `triton` tests with the role's expectations; a fix
        # without any shows none
        fix = next(f for f in SERIES.fixes if f.status == "original" and f.triton
                   and set(f.triton) != set(f.tests))
        only = {t: "failed" for t in fix.tests}
        for t in fix.triton:
            only[t] = "passed"
        self.assertEqual(matrix.judge(fix, "patched" + matrix.TRITON, only).text, "PASS ✓")
        self.assertNotEqual(matrix.judge(fix, "patched", only).problems, [])
        stock = {t: "passed" for t in fix.tests}
        cell = matrix.judge(fix, "stock" + matrix.TRITON, stock)
        self.assertEqual(len(cell.problems),
                         len([t for t in fix.proof if t in fix.triton]), cell.problems)
        plain = next(f for f in SERIES.fixes if f.tests and not f.triton_tests)
        self.assertEqual(matrix.judge(plain, "patched" + matrix.TRITON, {}).text, "–")

    def test_triton_proof_is_a_proof_on_the_triton_path_and_a_guard_elsewhere(self):
        # a fix of Triton's own code: its test fails on stock only where Triton's code runs
        fix = next(f for f in SERIES.fixes if f.triton_proof)
        self.assertEqual(fix.proof, ())
        stock = dict.fromkeys(fix.tests, "passed")
        self.assertEqual(matrix.judge(fix, "stock", stock).problems, [])
        self.assertNotEqual(matrix.judge(fix, "stock" + matrix.TRITON, stock).problems, [])
        failing = dict.fromkeys(fix.tests, "failed")
        self.assertEqual(matrix.judge(fix, "stock" + matrix.TRITON, failing).text, "FAIL ✓")
        self.assertNotEqual(matrix.judge(fix, "patched", failing).problems, [])

    def test_interrupted_starts_no_more_jobs(self):
        # Ctrl-C while the jobs run: the KeyboardInterrupt reaches the waiting main thread;
        # the jobs not started yet never start (the running ones stop: the test below)
        started = []

        def fake_run(python, test_ids, log, control=None, suite=None, extra_env=None):
            started.append(log.stem)
            time.sleep(0.1)
            if log.stem == started[0]:  # Ctrl-C, once every job is submitted and a few ran
                time.sleep(0.2)
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            return matrix.Run(dict.fromkeys(test_ids, "passed"), 0, "ran", log)

        with mock.patch.object(matrix, "run_tests", fake_run), \
                self.assertRaises(KeyboardInterrupt):
            matrix.run_columns(SERIES, {"stock": Path("stock"), "patched": Path("p")}, {})
        self.assertLess(len(started), len(matrix.SUITE_SHARDS) + 1 + len(CONTROL_JOBS), started)

    def test_longest_first_by_last_run(self):
        # jobs start in the order of the last run's times (pytest's last line in each job's log),
        # longest first; a job without a time yet starts before all, in the usual order
        class Inline:  # a pool that runs each job when it is submitted
            def __init__(self, workers):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def submit(self, fn):
                future = Future()
                future.set_result(fn())
                return future

        started = []

        def fake_run(python, test_ids, log, control=None, suite=None, extra_env=None):
            started.append(log.stem)
            return matrix.Run(dict.fromkeys(test_ids, "passed"), 0, "ran", log)

        with tempfile.TemporaryDirectory() as tmp:
            logs = Path(tmp)
            (logs / "suite-audit.log").write_text("...\n8 passed, 3 subtests passed in 96.31s "
                                                  "(0:01:36)\n")
            (logs / "matrix-stock.log").write_text("100 failed, 79 passed in 78.39s (0:01:18)")
            (logs / "suite-rest.log").write_text("== 60 passed in 5.2s ==\n")
            (logs / "suite-tools.log").write_text("Traceback (most recent call last):\n")
            self.assertEqual(matrix.last_seconds(logs / "suite-audit.log"), 96.31)
            self.assertEqual(matrix.last_seconds(logs / "suite-tools.log"), float("inf"))
            self.assertEqual(matrix.last_seconds(logs / "nothing.log"), float("inf"))
            with (mock.patch.object(matrix, "run_tests", fake_run),
                  mock.patch.object(matrix, "ThreadPoolExecutor", Inline),
                  mock.patch.object(matrix, "LOGS", logs)):
                matrix.run_columns(SERIES, {"stock": Path("stock"), "patched": Path("p")}, {})
        self.assertEqual(started, ["matrix-stock+ops", "matrix-stock+dist", "matrix-stock+flex",
                                   "suite-tools",
                                   "suite-distributed", "suite-inductor", "suite-ops",
                                   "matrix-stock+triton", "matrix-patched+triton", *CONTROL_JOBS,
                                   "suite-audit", "matrix-stock", "suite-rest"])


def sigterm_once_started(started: Path) -> None:
    """From a thread, SIGTERM to the main thread once the file ``started`` exists: to the main
    thread, as the kernel delivers a kill from outside (another thread taking it would leave the
    main thread's wait unbroken). Given up after a minute: a child that never starts fails its
    test alone, and no SIGTERM lands in a later test."""
    def interrupt():
        deadline = time.monotonic() + 60
        while not started.exists():
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)

    threading.Thread(target=interrupt, daemon=True).start()


class TestInterrupt(TestCase):
    """SIGTERM reaches symfix alone (cli.main makes it a KeyboardInterrupt): a running job's
    pytest is interrupted and waited for, instead of running to its end; also where the job
    inherited SIGINT ignored, as a job of a shell's background job does."""

    def setUp(self):
        for sig, handler in ((signal.SIGINT, signal.SIG_IGN),
                             (signal.SIGTERM, signal.default_int_handler)):
            self.addCleanup(signal.signal, sig, signal.signal(sig, handler))
        self.tmp = Path(tempfile.mkdtemp(prefix="symfix-matrix-test-"))
        self.addCleanup(shutil.rmtree, self.tmp)
        (self.tmp / "test_sleep.py").write_text(textwrap.dedent(f"""
            import pathlib, time
            def test_sleep():
                pathlib.Path({str(self.tmp / "started")!r}).touch()
                time.sleep(30)
                pathlib.Path({str(self.tmp / "finished")!r}).touch()
            """))
        sigterm_once_started(self.tmp / "started")

    def sleeping_job(self, run_tests=matrix.run_tests) -> matrix.Run:
        return run_tests(Path(sys.executable), [], self.tmp / "job.log",
                         suite=[str(self.tmp / "test_sleep.py")])

    def assertStopped(self):
        self.assertFalse((self.tmp / "finished").exists())
        log = (self.tmp / "job.log").read_text()
        self.assertIn("KeyboardInterrupt", log)
        self.assertLess(matrix.last_seconds(self.tmp / "job.log"), math.inf, log)  # it ended
        self.assertEqual(children.RUNNING, {})

    def test_test_stops_its_running_jobs(self):
        # jobs in the pool's threads: the main thread passes the interrupt on
        runs = []

        def one_real_job(python, test_ids, log, control=None, suite=None, extra_env=None):
            if runs:  # the other jobs: quick fakes
                return matrix.Run({}, 0, "ran", log)
            runs.append(log)
            return self.sleeping_job()

        with mock.patch.object(matrix, "run_tests", one_real_job), \
                self.assertRaises(KeyboardInterrupt):
            matrix.run_columns(SERIES, {"stock": Path("stock"), "patched": Path("p")}, {})
        self.assertStopped()

    def test_status_stops_its_job(self):
        # a job waited on in the main thread (`status`, `audit`)
        with self.assertRaises(KeyboardInterrupt):
            self.sleeping_job()
        self.assertStopped()


class TestOutcomeCache(TestCase):
    """An official wheel's outcomes are kept for the next run of the same tests by the same
    torch with the same environment variables; a patched build's never are."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="symfix-cache-test-", dir=ROOT / ".symfix"))
        self.addCleanup(shutil.rmtree, self.tmp)
        self.ran = self.tmp / "ran"
        (self.tmp / "test_counted.py").write_text(textwrap.dedent(f"""
            import pathlib
            def test_counted():
                with open({str(self.ran)!r}, "a") as f:
                    f.write("ran\\n")
                assert False
            """))
        self.test_id = f"{(self.tmp / 'test_counted.py').relative_to(ROOT)}::test_counted"
        patcher = mock.patch.object(matrix, "OUTCOMES", self.tmp / "outcomes")
        patcher.start()
        self.addCleanup(patcher.stop)

    def env(self, name: str, torch_version: str, requirements=(), triton=None) -> Path:
        env = self.tmp / name
        (env / "bin").mkdir(parents=True)
        (env / "bin" / "python").symlink_to(sys.executable)
        version = env / "lib" / "python3" / "site-packages" / "torch" / "version.py"
        version.parent.mkdir(parents=True)
        version.write_text(f"__version__ = {torch_version!r}\n")
        if triton:  # installed, asked for or not
            (version.parent.parent / f"triton-{triton}.dist-info").mkdir()
        (env / envs.MARKER).write_text(json.dumps(
            {"python": sys.executable, "requirements": list(requirements),
             "torch_version": torch_version}))
        return env / "bin" / "python"

    def runs(self, python: Path, times: int, **kw) -> list[str]:
        outcomes = [matrix.run_tests(python, [self.test_id], self.tmp / "job.log", **kw)
                    .outcomes[self.test_id] for _ in range(times)]
        return outcomes

    def test_official_wheel_outcome_kept(self):
        python = self.env("stock", "2.15.0+cu132")
        self.assertEqual(self.runs(python, 2), ["failed", "failed"])
        self.assertEqual(self.ran.read_text().count("ran"), 1)
        self.assertIn("outcomes from", (self.tmp / "job.log").read_text())
        # another switch of the tests (the Triton path) is another run
        self.assertEqual(self.runs(python, 1, extra_env=matrix.TRITON_ENV), ["failed"])
        self.assertEqual(self.ran.read_text().count("ran"), 2)

    def test_triton_keys_only_the_triton_column(self):
        # one base's oracle (triton brought by torch) and another's stock column (triton asked
        # for) are one torch: the second reuses the first's outcomes, on the Triton path too
        # (each run says which base it is for, and has caches of its own: not keys); another
        # triton is another Triton column, the same torch's other columns
        oracle = self.env("upstream", "2.15.0+cu132", ["pytest"], triton="3.9.0")
        stock = self.env("stock", "2.15.0+cu132", ["pytest", "triton==3.9.0"], triton="3.9.0")
        older = self.env("older", "2.15.0+cu132", ["pytest", "triton==3.7.1"], triton="3.7.1")
        run_of = {base: {"SYMFIX_BASE": base, "SYMFIX_BASE_WHEEL": f"/{base}.whl",
                         "TORCHINDUCTOR_CACHE_DIR": f"/tmp/{base}"} for base in ("13", "15")}
        for python in (oracle, stock, older):
            self.assertEqual(self.runs(python, 1, extra_env=run_of["13"]), ["failed"])
        self.assertEqual(self.ran.read_text().count("ran"), 1)
        for python in (oracle, stock):
            self.runs(python, 1, extra_env={**run_of["15"], **matrix.TRITON_ENV})
        self.assertEqual(self.ran.read_text().count("ran"), 2)
        self.runs(older, 1, extra_env=matrix.TRITON_ENV)
        self.assertEqual(self.ran.read_text().count("ran"), 3)

    def test_patched_build_never_kept(self):
        python = self.env("patched", "2.15.0+cu132.symfix29")
        self.assertEqual(self.runs(python, 2), ["failed", "failed"])
        self.assertEqual(self.ran.read_text().count("ran"), 2)


if __name__ == "__main__":
    run_tests()
