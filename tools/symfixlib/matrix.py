"""Run each fix's tests in each environment and judge them against what the fix's status expects."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from packaging.version import Version

from . import children, envs
from .series import bases, Fix, ROOT, Series

PASS, FAIL = "passed", "failed"
LOGS = ROOT / ".symfix" / "logs"


@dataclass
class Run:
    outcomes: dict[str, str]  # test id -> passed, failed, skipped or missing
    returncode: int
    summary: str  # pytest's last line
    log: Path


def shard_args(paths: dict[str, str]) -> dict[str, list[str]]:
    """pytest's arguments of each shard: its path, less the outermost of the earlier shards'
    paths that lie inside it."""
    out: dict[str, list[str]] = {}
    for name, path in paths.items():
        inside = [p for args in out.values() for p in args[:1] if p.startswith(path + "/")]
        out[name] = [path, *(f"--ignore={p}" for p in inside
                             if not any(p.startswith(q + "/") for q in inside))]
    return out


# The whole test/ suite runs in shards, so that both cores stay busy to the end beside the other
# columns: a shard runs its path but the paths of the shards before it, so that together they
# run test/ once. The audit's captures on stock and the gloo runs are the long ones.
SUITE_SHARDS = shard_args({"audit": "test/tools/test_symfix_audit.py", "tools": "test/tools",
                           "distributed": "test/distributed", "inductor": "test/inductor",
                           "ops": "test/test_ops_unbacked.py", "rest": "test"})


def last_seconds(log: Path) -> float:
    """How long the job that writes ``log`` took last time (pytest's last line says); a job
    that has not run yet counts as the longest."""
    try:
        last = log.read_text().strip().rsplit("\n", 1)[-1]
    except OSError:
        return math.inf
    m = re.search(r" in ([\d.]+)s\b", last)
    return float(m.group(1)) if m else math.inf


# Python's own tracebacks: pytest's parse the source of every frame of a failure, and a failure
# deep in Dynamo has a hundred; on stock, where half the tests fail, that was 40 s of 110.
PYTEST_ARGS = ["-p", "symfixlib.outcomes_plugin", "-q", "-rfE", "--tb=native", "--durations=10"]
# Each job has a core of its own (two at a time): Inductor's pool of compile workers, a process
# that imports torch again in every job that compiles, would only take the other job's core.
# Set by the user, theirs wins.
JOB_ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
# Inductor's and Triton's caches are a matrix run's own, removed when it ends: each environment
# gets a precompiled header of 150 MB there that no later run's environments use. Set by the
# user, theirs win.
RUN_CACHES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


# The Triton column: each fix's ``triton`` tests again on each torch, Inductor compiling through its
# GPU code path and Triton's interpreter running the kernels on CPU (test/inductor/_triton_cpu.py,
# switched on by test/conftest.py). Its columns are the roles' names with this suffix.
TRITON = "+triton"
TRITON_ENV = {"SYMFIX_INDUCTOR": "triton"}


# A column's tests run as several jobs, so that both cores stay busy to the end of a matrix: the
# scoreboards' per-op tests (hundreds of short ones), the distributed tests (gloo ranks, the
# compiled workload: a quarter of the patched column's time), FlexAttention's (another quarter)
# and the rest. A test id goes to the first job whose prefixes it has, else to the rest (suffix "").
SCOREBOARD_TESTS = ("test/test_ops_unbacked.py::", "test/distributed/tensor/test_dtensor_ops.py::")
JOBS = {"+ops": SCOREBOARD_TESTS, "+dist": ("test/distributed/",),
        "+flex": ("test/inductor/test_flex_attention.py::",)}


def parts(ids: list[str]) -> dict[str, list[str]]:
    """A column's test ids by job (see JOBS); the rest's job is there even when empty."""
    out: dict[str, list[str]] = {"": [], **{job: [] for job in JOBS}}
    for t in ids:
        out[next((job for job, prefixes in JOBS.items() if t.startswith(prefixes)), "")].append(t)
    return {job: part for job, part in out.items() if part or not job}


# A test's outcome on an official wheel does not change while the tests do not. In one CI run the
# 2.14.1 matrix's oracle and the 2.15.0 matrix's stock column are the torch 2.15.0 on which the
# 2.13.0 matrix's oracle has already run most of the same tests: each such outcome is kept, keyed
# by the torch (its version.py), the interpreter and requirements, the run's environment
# variables and a digest of everything of this repository the tests read (test/, tools/,
# patches/, torch/). Patched builds are never cached: their label does not say which mails they
# carry. A cached failure's traceback is in the log of the run that kept it.
OUTCOMES = ROOT / ".symfix" / "cache" / "outcomes"
# Variables that do not key an outcome: where the run's caches are, and which base's run it is
# (the base wheel for test/tools' tests of the tooling to find without a download).
UNKEYED = {*RUN_CACHES, "SYMFIX_BASE", "SYMFIX_BASE_WHEEL", "SYMFIX_UPSTREAM_PYTHON"}
CACHED = ("passed", "failed", "skipped")


@functools.cache
def tree_digest() -> str:
    h = hashlib.sha256()
    files = (f for d in ("test", "tools", "patches", "torch") for f in (ROOT / d).rglob("*"))
    for f in sorted(f for f in files if f.is_file() and "__pycache__" not in f.parts):
        h.update(f"{f.relative_to(ROOT)}\0".encode() + f.read_bytes() + b"\0")
    return h.hexdigest()


def outcome_cache(python: Path, env: dict[str, str]) -> Path | None:
    """Where the outcomes of tests run by ``python`` with ``env`` are kept; None: not kept."""
    info = envs.installed(python.parent.parent)
    version = next(python.parent.parent.glob("lib/python*/site-packages/torch/version.py"), None)
    if info is None or version is None or "symfix" in info.get("torch_version", "symfix"):
        return None
    # Triton matters only to the Triton column, and there the one installed, whether asked for
    # (the base's, an extra requirement) or brought by torch (the oracle's): the oracle of one
    # base's run and the stock column of another's are one torch.
    reqs = [r for r in info["requirements"] if not r.startswith("triton")]
    if TRITON_ENV.keys() <= env.keys():
        reqs += [d.name for d in version.parent.parent.glob("triton-*.dist-info")]
    key = json.dumps([version.read_text(), info["python"], reqs,
                      sorted((k, v) for k, v in env.items() if k not in UNKEYED),
                      tree_digest()])
    return OUTCOMES / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def run_tests(python: Path, test_ids: list[str], log: Path, control: str | None = None,
              suite: list[str] | None = None, extra_env: dict[str, str] | None = None,
              overlay: Path | None = None) -> Run:
    """Outcome of each test id under ``python``.

    ``control``: the id of an in-base fix to take out for this run (see test/conftest.py).
    ``suite``: pytest's paths of a part of the suite to run whole (recording the outcomes of
    ``test_ids`` in it). ``overlay``: a directory put first on PYTHONPATH (`symfix.py audit`'s
    patched torch).
    """
    cache = None if suite or overlay else outcome_cache(
        python, {**(extra_env or {}), **({"SYMFIX_CONTROL": control} if control else {})})
    try:
        known = json.loads(cache.read_text()) if cache else {}
    except (OSError, ValueError):  # none yet
        known = {}
    all_ids, test_ids = test_ids, [t for t in test_ids if t not in known]
    files = suite or sorted(
        {t.split("::")[0] for t in test_ids if (ROOT / t.split("::")[0]).is_file()})
    outcomes: dict[str, str] = {}
    rc, summary = 5, "no test file"
    if known and not test_ids:
        rc, summary = 0, f"{len(all_ids)} outcomes from {cache.relative_to(ROOT)} in 0.0s"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(summary + "\n")
    if files:
        with tempfile.TemporaryDirectory(prefix="symfix-matrix-") as tmp:
            wanted, result = Path(tmp, "wanted.json"), Path(tmp, "outcomes.json")
            wanted.write_text(json.dumps(test_ids))
            env = {**JOB_ENV, **os.environ, **(extra_env or {}), "SYMFIX_OUTCOMES": str(result),
                   "PYTHONPATH": os.pathsep.join([*([str(overlay)] if overlay else []),
                                                  str(ROOT / "tools")])}
            if not suite:
                env["SYMFIX_WANTED"] = str(wanted)
            if control:
                env["SYMFIX_CONTROL"] = control
            log.parent.mkdir(parents=True, exist_ok=True)
            # SIGINT stops a job as Ctrl-C would: pytest tears down and logs its summary
            with open(log, "w") as out, children.started(
                    [str(python), "-m", "pytest", *PYTEST_ARGS, *files], cwd=ROOT, env=env,
                    stdout=out, stderr=subprocess.STDOUT) as proc:
                rc = proc.wait()
            if result.exists():
                outcomes = json.loads(result.read_text())
            summary = (log.read_text().strip().splitlines() or ["no output"])[-1].strip("= ")
    if cache:
        try:  # what a job beside this one kept meanwhile
            known = json.loads(cache.read_text()) | known
        except (OSError, ValueError):
            pass
        known |= {t: o for t in test_ids if (o := outcomes.get(t)) in CACHED}
        cache.parent.mkdir(parents=True, exist_ok=True)
        part = cache.with_suffix(".part")
        part.write_text(json.dumps(known, indent=1, sort_keys=True))
        part.replace(cache)  # whole or not at all
    outcomes = known | outcomes
    return Run({t: outcomes.get(t, "missing") for t in all_ids}, rc, summary, log)


def run_columns(series: Series, pythons: dict[str, Path | str], env: dict[str, str],
                suite: bool = True) -> tuple[dict[str, dict[str, str] | str], dict[str, Run]]:
    """Every column of the matrix, and (``suite``) the whole test suite on the patched build.

    Two jobs at a time, one a core, the longest first (``last_seconds``): the fixes' tests on
    stock and upstream, the suite's shards on the patched build (its column is read from them;
    without ``suite`` only the fixes' tests), each in-base fix's tests on stock with its control.
    ``pythons``: role -> interpreter, or why it was skipped. Returns the columns and the suite's
    runs by shard.
    """
    caches = tempfile.TemporaryDirectory(prefix="symfix-caches-")
    env = {**env, **{var: f"{caches.name}/{name}" for var, name in RUN_CACHES.items()
                     if var not in os.environ}}
    ids = all_test_ids(series)
    jobs: dict[str, Callable[[], Run]] = {
        role + job: partial(run_tests, python, part, log=LOGS / f"matrix-{role}{job}.log",
                            extra_env=env)
        for role, python in pythons.items() if role != "patched" and not isinstance(python, str)
        for job, part in parts(ids).items()}
    shards = ({name: (paths, f"suite-{name}", ids) for name, paths in SUITE_SHARDS.items()}
              if suite else {f"patched{job}": (None, f"matrix-patched{job}", part)
                             for job, part in parts(ids).items()})
    for name, (paths, log, shard_ids) in shards.items():
        jobs[name] = partial(run_tests, pythons["patched"], shard_ids, log=LOGS / f"{log}.log",
                             suite=paths, extra_env=env)
    if triton_ids := [t for fix in series.rows for t in fix.triton_tests]:
        for role, python in pythons.items():
            if not isinstance(python, str):
                jobs[role + TRITON] = partial(
                    run_tests, python, triton_ids, log=LOGS / f"matrix-{role}{TRITON}.log",
                    extra_env={**env, **TRITON_ENV})
    for fix in series.fixes if isinstance(pythons["stock"], Path) else ():
        if fix.status == "in-base" and fix.control and fix.tests:
            jobs[f"control-{fix.id}"] = partial(
                run_tests, pythons["stock"], list(fix.tests), log=LOGS / f"control-{fix.id}.log",
                control=fix.id, extra_env=env)
    # longest first by the last run's times, so that the two cores finish together
    order = sorted(jobs, key=lambda name: -last_seconds(jobs[name].keywords["log"]))
    with caches, ThreadPoolExecutor(2) as pool:  # in submission order
        futures = {name: pool.submit(jobs[name]) for name in order}
        try:
            runs = {name: futures[name].result() for name in jobs}
        except BaseException:  # Ctrl-C or SIGTERM: start no more jobs, stop the running ones
            pool.shutdown(wait=False, cancel_futures=True)
            children.interrupt_all()  # the pool's threads wait for them to end
            raise

    suite_runs = {name: runs.pop(name) for name in shards}
    merged = {t: next((r.outcomes[t] for r in suite_runs.values()
                       if r.outcomes.get(t, "missing") != "missing"), "missing") for t in ids}

    def column(role: str) -> dict[str, str]:
        return {t: o for job in parts(ids) for t, o in runs.pop(role + job).outcomes.items()}

    results: dict[str, dict[str, str] | str] = {  # the columns in the order of ``pythons``
        role: merged if role == "patched" else python if isinstance(python, str)
        else column(role) for role, python in pythons.items()}
    if triton_ids:
        results |= {role + TRITON: python if isinstance(python, str)
                    else runs.pop(role + TRITON).outcomes for role, python in pythons.items()}
    results["control"] = pythons["stock"] if isinstance(pythons["stock"], str) else {
        name.removeprefix("control-"): run.outcomes for name, run in runs.items()}
    return results, suite_runs


def expected(fix: Fix, kind: str, role: str, upstream: str | None = None) -> str:
    """What a test of ``kind`` (proof, guard) of ``fix`` must do in environment ``role``.

    ``upstream``: the oracle's version; it has a fix from the release the manifest records
    (``released``) on.
    """
    role = role.removesuffix(TRITON)  # the same expectations on the Triton path
    if kind == "guard":
        return PASS
    if role == "control":  # stock with the in-base fix taken out again
        return FAIL
    if fix.status == "in-base":
        return PASS
    if role == "patched":
        return PASS
    if role == "upstream":
        if fix.status == "acceptance":
            return FAIL if fix.beyond_upstream else PASS
        has = fix.released and upstream and Version(fix.released) <= Version(upstream)
        return PASS if has else FAIL
    return FAIL  # stock lacks every fix the series carries


@dataclass
class Cell:
    text: str  # e.g. "FAIL ✓"
    problems: list[str]


def judge(fix: Fix, role: str, outcomes: dict[str, str], upstream: str | None = None) -> Cell:
    if not fix.tests and fix.status in ("in-base", "pending"):
        return Cell("–", [])  # nothing carried, no tests yet
    if role == "control" and fix.status != "in-base":
        return Cell("–", [])  # stock is the control of a carried fix
    proof, guard = fix.proof, fix.guard + fix.triton_proof
    if role.endswith(TRITON):  # only the tests that go through Inductor or FlexAttention
        if not fix.triton_tests:
            return Cell("–", [])
        proof, guard = [[t for t in ids if t in fix.triton] for ids in (fix.proof, fix.guard)]
        proof += fix.triton_proof
        guard += fix.triton_guard
    problems = []
    for kind, ids in (("proof", proof), ("guard", guard)):
        for tid in ids:
            got, want = outcomes[tid], expected(fix, kind, role, upstream)
            if got == want:
                continue
            if kind == "proof" and want == FAIL and got == PASS:
                why = "passes without the fix: a useless proof, it does not catch the bug"
            else:
                why = f"{got}, expected {want.replace('ed', '')}"
            problems.append(f"{fix.id}: {role}: {kind} {tid}: {why}")
    # a workload may be guards only, on a base that already runs it
    if fix.status not in ("in-base", "acceptance") and not (fix.proof or fix.triton_proof):
        problems.append(f"{fix.id}: has no proof test")
    proofs = {outcomes[t] for t in proof} or {outcomes[t] for t in guard}
    word = {frozenset({PASS}): "PASS", frozenset({FAIL}): "FAIL"}.get(frozenset(proofs), "MIXED")
    if "missing" in proofs:
        word = "MISSING"
    return Cell(f"{word} {'✗' if problems else '✓'}", problems)


def table(series: Series, results: dict[str, dict[str, str] | str]) -> tuple[str, list[str]]:
    """The matrix text and its problems.

    ``results``: role -> outcomes, or a reason it was skipped; "control" -> fix id -> outcomes.
    """
    roles = list(results)
    rows = [["fix", "status", *roles]]
    problems: list[str] = []
    upstream = series.upstream.get("requirement", "").partition("==")[2] or None
    # An in-base fix needs a control where no older base's stock shows its proofs failing.
    oldest = min(Version(b[1:]) for b in bases(series.root))
    for fix in series.rows:
        row = [fix.id, fix.status]
        for role in roles:
            got = results[role]
            if isinstance(got, str):
                row.append("skipped")
                continue
            if role == "control":
                got = got.get(fix.id)
                if got is None:
                    row.append("–")
                    if fix.status == "in-base" and fix.proof and (
                            not fix.released or Version(fix.released) <= oldest):
                        problems.append(f"{fix.id}: in-base fix without a control")
                    continue
            cell = judge(fix, role, got, upstream)
            row.append(cell.text)
            problems += cell.problems
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)
    return text, problems


def all_test_ids(series: Series) -> list[str]:
    return [t for fix in series.rows for t in fix.tests]
