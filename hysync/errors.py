"""The base of every error HySync raises on purpose.

Every message says what is wrong and, where there is one, how to fix it: the CLI
prints `str(error)` as its one line of output and exits 1 on any HySyncError.
"""


class HySyncError(Exception):
    """Base class of the errors of every HySync package (hysync, controlplane, ...)."""


class BadFileError(HySyncError, ValueError):
    """A file the user named cannot be used as it is: unreadable, not text, or invalid. The
    message names the file and the field; the CLI exits 2 and has written nothing."""
