"""The verbs of tools/symfix.py: the arguments of each, and the module whose function runs it."""

from __future__ import annotations

import argparse
import signal
import sys

from . import audit, bench, checkout, checks, export, patched, series, source
from .errors import SymfixError
from .series import ROOT


def _status(args) -> int:
    return (export.rebase_status if args.rebase_onto else checks.status)(args)


VERBS = {
    "wheel": patched.wheel,
    "test": checks.test,
    "status": _status,
    "worktree": checkout.worktree,
    "export": export.run,
    "source": source.run,
    "bench": bench.report,
    "audit": audit.run,
    "table": lambda args: series.write_table(args.check),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="symfix.py", description=__doc__)
    sub = p.add_subparsers(dest="verb", required=True)
    def base_options(parser):
        parser.add_argument("--base", metavar="VERSION", help="base release whose series to use "
                            f"(default: the base wheel's, else {series.DEFAULT_BASE[1:]}); "
                            f"carried: {', '.join(b[1:] for b in series.bases())}")
        parser.add_argument("--wheel", help="the official base wheel (default: fetched for "
                            "--python and --variant)")
        parser.add_argument("--variant", help="which build of the base release: pypi (what "
                            "`pip install torch` gives: CUDA on Linux), cpu, cu130, ... "
                            "(default: pypi on a GPU machine, else cpu where one exists)")
        parser.add_argument("--python", help="the Python the wheel is for and the environments "
                            "run (default: this one)")

    w = sub.add_parser("wheel", help="build the patched wheel into dist/ and install it in .venv/")
    base_options(w)
    w.add_argument("--dist", default=str(patched.DIST), help="output directory (default: dist/)")
    w.add_argument("--no-venv", action="store_true", help="only build, do not install")
    t = sub.add_parser("test", help="regression matrix and test suite")
    base_options(t)
    t.add_argument("--patched", metavar="WHEEL", help="test this built wheel as the patched "
                   "build (default: build dist/'s wheel)")
    t.add_argument("--upstream", action="store_true", help="also test upstream torch (oracle)")
    t.add_argument("--matrix-only", action="store_true", help="only the fixes' tests, not the "
                   "whole test/ suite on the patched build")
    t.add_argument("--patched-only", action="store_true", help="only the patched build's "
                   "columns: for another build of a release whose stock columns ran already")
    t.add_argument("--skip-if-no-room", action="store_true", help="when the disk cannot hold "
                   "the stock or patched environment, say so and exit 0 instead of failing")
    st = sub.add_parser("status", help="which fixes a torch install has")
    st.add_argument("--python", help="interpreter of that install (default: python3 on PATH)")
    st.add_argument("--rebase-onto", metavar="WHEEL_OR_DIR",
                    help="forward-port check: does each patch apply to / is it in that torch?")
    st.add_argument("--no-tests", action="store_true", help="with --rebase-onto: verdicts from "
                    "applying alone, no environment made for that torch")
    st.add_argument("--fix", action="append", metavar="ID", help="with --rebase-onto: only "
                    "this fix's patches and tests (repeatable; default: the whole series)")
    wt = sub.add_parser("worktree", help="git repo of the base Python files + the series, to "
                        "write a patch in")
    wt.add_argument("dir")
    base_options(wt)
    ex = sub.add_parser("export", help="a patch (or the stack) as a PyTorch branch + PR text")
    ex.add_argument("id", nargs="?", help="fix id (see patches/<base>/manifest.toml)")
    ex.add_argument("--all", action="store_true", help="the whole series, in order, one branch")
    ex.add_argument("--onto", required=True, help="a PyTorch checkout")
    ex.add_argument("--base", help="ref to start from (default: the branch addressed, main or "
                    "release/X.Y, else the base tag)")
    ex.add_argument("--series", metavar="TAG", help="export from this base's series (default: "
                    "our own fixes from the newest base carrying them, backports from v2.13.0)")
    ex.add_argument("--out", default=str(patched.DIST / "pr"), help="where PR texts go (dist/pr/)")
    ex.add_argument("--dry-run", action="store_true", help="print what it would do")
    so = sub.add_parser("source", help="rebuild PyTorch from a v2.13.0 checkout with the series")
    where = so.add_mutually_exclusive_group(required=True)
    where.add_argument("--src", help="an existing PyTorch checkout")
    where.add_argument("--clone", help="clone the v2.13.0 tag with submodules into this directory")
    so.add_argument("--python", default=source.python_default(),
                    help="Python with PyTorch's build requirements (default: python3 on PATH)")
    so.add_argument("--out", default=str(patched.DIST),
                    help="where the wheel goes (default: dist/)")
    so.add_argument("--branch", help="branch for the series (default: symfix/v2.13.0-symfixN)")
    so.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    so.add_argument("--no-test", action="store_true", help="skip the regression matrix")
    so.add_argument("--upstream", action="store_true", help="matrix also on upstream torch")
    be = sub.add_parser("bench", help="speed ratios: wheel build, unbacked trace and step")
    base_options(be)
    au = sub.add_parser("audit", help="where a step breaks or specializes its unbacked sizes, "
                        "and which symfix fix fixes it")
    au.add_argument("target", metavar="FILE.py[:NAME]",
                    help="NAME (default audit_target) returns (fn, args) with mark_unbacked marks")
    au.add_argument("--python", help="the torch to audit (default: the patched .venv)")
    au.add_argument("--repro-dir", default=str(ROOT / ".symfix" / "audit"),
                    help="where repros of problems without a fix go (default: .symfix/audit/)")
    au.add_argument("--no-tests", action="store_true",
                    help="do not run the proof tests of the fixes found")
    au.add_argument("--replay", action="store_true", help="run the captured graph at other "
                    "sizes and in other modes against eager; differences and their fixes")
    au.add_argument("--modes", help="with --replay: autocast,no_grad,inference_mode,plain or "
                    "all (the default)")
    au.add_argument("--inductor", action="store_true", help="with --replay: compile the "
                    "captured graph with Inductor, as a trainer does, and replay that")
    tb = sub.add_parser("table", help="write the series table into README.md")
    tb.add_argument("--check", action="store_true", help="only check that it is current")
    args = p.parse_args(argv)
    # A run stopped by SIGTERM (a CI timeout, say) cleans up as one stopped by Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return VERBS[args.verb](args)
    except SymfixError as e:
        print(f"symfix: {e.what}{e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (above); every step cleaned up after itself
        print("symfix: interrupted", file=sys.stderr)
        return 2
