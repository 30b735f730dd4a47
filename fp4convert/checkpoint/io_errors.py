"""Operating-system errors met while writing an output, as one :class:`CheckpointError` each.

A full disk, a read-only filesystem or a folder without write permission is an ordinary condition
of a long conversion, not a crash: :func:`writing` turns the ``OSError`` into a message that names
the file and the condition and a hint that says what to do, and keeps ``errno`` for programs.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fp4convert.errors import CheckpointError

__all__ = ["os_error", "os_error_text", "writing"]

_HINTS = {
    errno.ENOSPC: "free space on that filesystem (or write elsewhere), then run again",
    errno.EDQUOT: "the disk quota is exhausted: free space (or write elsewhere), then run again",
    errno.EROFS: "the filesystem is read-only: choose a writable destination",
    errno.EACCES: "no permission to write there: choose a destination you can write, or fix its permissions",
    errno.EPERM: "the operation is not permitted there: choose another destination",
    errno.ENOENT: "a folder on the way does not exist: check the path",
    errno.ENOTDIR: "a component of the path is a file, not a folder: check the path",
    errno.EISDIR: "the path is a folder: name a file",
}


def os_error_text(exc: OSError) -> tuple[str, str]:
    """(what went wrong, what to do) for an ``OSError``.

    Example:
        >>> os_error_text(OSError(errno.ENOSPC, "No space left on device"))
        ('no space left on device (ENOSPC)', 'free space on that filesystem (or write elsewhere), then run again')
    """
    reason = (exc.strerror or str(exc) or type(exc).__name__).rstrip(".")
    code = errno.errorcode.get(exc.errno or -1)
    what = f"{reason[:1].lower()}{reason[1:]}" + (f" ({code})" if code else "")
    return what, _HINTS.get(exc.errno or -1, "check the disk and the path, then run again")


def os_error(exc: OSError, path: str | os.PathLike[str], doing: str = "cannot write") -> CheckpointError:
    """The :class:`CheckpointError` for ``exc`` met while ``doing`` ``path``."""
    what, hint = os_error_text(exc)
    return CheckpointError(f"{doing} {Path(path)}: {what}", hint=hint, file=str(path), errno=exc.errno)


@contextmanager
def writing(path: str | os.PathLike[str], doing: str = "cannot write") -> Iterator[None]:
    """Turn an ``OSError`` raised inside into :func:`os_error` of ``path``.

    Example:
        >>> with writing("/proc/no/such/file"):
        ...     open("/proc/no/such/file", "w")
        Traceback (most recent call last):
        ...
        fp4convert.errors.CheckpointError: cannot write /proc/no/such/file: no such file or directory (ENOENT); ...
    """
    try:
        yield
    except CheckpointError:
        raise
    except OSError as exc:
        raise os_error(exc, path, doing) from exc
