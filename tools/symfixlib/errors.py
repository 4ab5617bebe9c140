"""The user-facing error types: each becomes one line on stderr and an exit code (see cli.main)."""


class Refused(Exception):
    """Bad input: a one-line reason, exit code 2, nothing written."""
