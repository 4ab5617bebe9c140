"""The user-facing error types: each becomes one line on stderr and an exit code (see cli.main)."""


class Refused(Exception):
    """Bad input: a one-line reason, exit code 2, nothing written."""


class BadTarget(Exception):
    """`audit`: the target cannot be audited: the engine's one line, exit code 2."""


class PatchFailed(Exception):
    """A patch of the series does not apply to the base wheel's files (exit code 1)."""


class SeriesError(Exception):
    """The series or the manifest is inconsistent (exit code 1)."""


class EnvError(Exception):
    """An environment could not be made (exit code 1)."""


class NoRoom(EnvError):
    """The disk cannot hold the environment: nothing was installed."""
