"""The one exception type the command line turns into a one-line message."""


class PactlError(Exception):
    """A failure the user can fix: the message says what was wrong and what to do."""


class UsageError(PactlError):
    """Bad options or arguments (exit code 2)."""


class Busy(PactlError):
    """Another pactl process is writing the same folder (its writer lock is held): run again
    when it has finished. The service answers it with 409 Conflict."""


class ReadOnly(PactlError):
    """The folder to change is read-only (a read-only mount, or no write permission): nothing
    was changed. The service can answer it with 403 Forbidden."""


class NoSpace(PactlError):
    """A write found its device full (or the user's quota spent). The service answers it with
    507 Insufficient Storage."""
