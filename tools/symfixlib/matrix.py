"""Run each fix's tests in each environment and judge them against what the fix's status expects."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .series import Fix, ROOT, Series

PASS, FAIL = "passed", "failed"


def run_tests(python: Path, test_ids: list[str], log: Path, control: str | None = None,
              overlay: Path | None = None) -> dict[str, str]:
    """Outcome of each test id under ``python``: passed, failed, skipped or missing.

    ``control``: the id of an in-base fix to take out for this run (see test/conftest.py).
    ``overlay``: a directory put first on PYTHONPATH (`symfix.py audit`'s patched torch).
    """
    files = sorted({t.split("::")[0] for t in test_ids if (ROOT / t.split("::")[0]).is_file()})
    outcomes: dict[str, str] = {}
    if files:
        with tempfile.TemporaryDirectory(prefix="symfix-matrix-") as tmp:
            wanted, result = Path(tmp, "wanted.json"), Path(tmp, "outcomes.json")
            wanted.write_text(json.dumps(test_ids))
            env = {**os.environ, "SYMFIX_WANTED": str(wanted), "SYMFIX_OUTCOMES": str(result),
                   "PYTHONPATH": os.pathsep.join([*([str(overlay)] if overlay else []),
                                                  str(ROOT / "tools")])}
            if control:
                env["SYMFIX_CONTROL"] = control
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "w") as out:
                subprocess.run([str(python), "-m", "pytest", "-p", "symfixlib.outcomes_plugin",
                                "-q", "-rfE", *files], cwd=ROOT, env=env, stdout=out,
                               stderr=subprocess.STDOUT)
            if result.exists():
                outcomes = json.loads(result.read_text())
    return {t: outcomes.get(t, "missing") for t in test_ids}


def expected(fix: Fix, kind: str, role: str) -> str:
    """What a test of ``kind`` (proof, guard) of ``fix`` must do in environment ``role``."""
    if kind == "guard":
        return PASS
    if role == "control":  # stock with the in-base fix taken out again
        return FAIL
    if fix.status == "in-base":
        return PASS
    if role == "patched":
        return PASS
    if role == "upstream":
        return FAIL if fix.status == "original" or fix.beyond_upstream else PASS
    return FAIL  # stock lacks every fix the series carries


@dataclass
class Cell:
    text: str  # e.g. "FAIL ✓"
    problems: list[str]


def judge(fix: Fix, role: str, outcomes: dict[str, str]) -> Cell:
    if not fix.tests and fix.status in ("in-base", "pending"):
        return Cell("–", [])  # nothing carried, no tests yet
    if role == "control" and fix.status != "in-base":
        return Cell("–", [])  # stock is the control of a carried fix
    problems = []
    for kind, ids in (("proof", fix.proof), ("guard", fix.guard)):
        for tid in ids:
            got, want = outcomes[tid], expected(fix, kind, role)
            if got == want:
                continue
            if kind == "proof" and want == FAIL and got == PASS:
                why = "passes without the fix: a useless proof, it does not catch the bug"
            else:
                why = f"{got}, expected {want.replace('ed', '')}"
            problems.append(f"{fix.id}: {role}: {kind} {tid}: {why}")
    if fix.status != "in-base" and not fix.proof:
        problems.append(f"{fix.id}: has no proof test")
    proofs = {outcomes[t] for t in fix.proof} or {outcomes[t] for t in fix.guard}
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
                    if fix.status == "in-base" and fix.proof:
                        problems.append(f"{fix.id}: in-base fix without a control")
                    continue
            cell = judge(fix, role, got)
            row.append(cell.text)
            problems += cell.problems
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)
    return text, problems


def all_test_ids(series: Series) -> list[str]:
    return [t for fix in series.rows for t in fix.tests]
