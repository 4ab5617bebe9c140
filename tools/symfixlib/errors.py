"""The user-facing error types: each becomes one line on stderr and its exit code (cli.main)."""


class SymfixError(Exception):
    """One line on stderr, ``symfix: <what><message>``, and exit code ``code``."""

    code, what = 1, ""


class Refused(SymfixError):
    """Bad input: a one-line reason, exit code 2, nothing written."""

    code, what = 2, "refusing "


class PatchFailed(SymfixError):
    """A patch of the series does not apply to the base (a wheel's files or a checkout): bad
    input for the series, exit code 2, nothing written or left changed."""

    code = 2


class BadTarget(SymfixError):
    """`audit`: the target cannot be audited: the engine's one line, exit code 2."""

    code, what = 2, "audit: "


class BuildFailed(SymfixError):
    """`source`: PyTorch's own build failed; its log says why (exit code 1)."""


class SeriesError(SymfixError):
    """The series or the manifest is inconsistent (exit code 1)."""


class EnvError(SymfixError):
    """An environment could not be made (exit code 1)."""


class NoRoom(EnvError):
    """The disk cannot hold the environment: nothing was installed."""
