"""Child processes that stop with symfix.

Each child starts in a process group of its own, without terminal input (a read from a group of
its own would stop it). When symfix is interrupted (Ctrl-C, or SIGTERM, which reaches symfix
alone), the child's whole group gets the child's stop signal: from the thread that waits on it,
or, for children waited on by a pool's threads, from ``interrupt_all``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

RUNNING: dict[subprocess.Popen, int] = {}  # the children running, and the signal that stops each


@contextlib.contextmanager
def started(cmd: list[str], stop: int = signal.SIGINT, **popen):
    """``cmd`` running (``popen``: Popen's other arguments); an exception in the block (an
    interrupt of the waiting thread) stops its group and waits for it."""
    with subprocess.Popen(cmd, stdin=subprocess.DEVNULL, process_group=0, **popen) as proc:
        RUNNING[proc] = stop
        try:
            yield proc
        except BaseException:
            _stop(proc, stop)
            proc.wait()
            raise
        finally:
            del RUNNING[proc]


def interrupt_all() -> None:
    """Stop every running child; the threads that wait on them see them end."""
    for proc, stop in list(RUNNING.items()):
        _stop(proc, stop)


def _stop(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # ended meanwhile
        os.killpg(proc.pid, sig)
