"""What a user sees when a command fails: one error, never a traceback (unless asked), never a token.

:func:`show_failure` is the CLI's last word on an exception that escaped a command:

* an fp4convert error (:class:`~fp4convert.errors.Fp4ConvertError`) is its ``error[code]: message``
  and hint, exit status 1;
* an ``OSError`` the library did not name (a full disk, a read-only folder met somewhere
  unexpected) is ``error[os]`` with the file and what to do, exit status 1;
* ``MemoryError`` is ``error[memory]``, exit status 1;
* anything else is a bug: ``error[internal]`` with the exception's type and message and how to
  report it, exit status 70 (``EX_SOFTWARE``).

With ``FP4CONVERT_DEBUG=1`` the full traceback is printed instead, and every token it could carry
is scrubbed first (:func:`scrub`): the Hub token in use (``HF_TOKEN``, the token file), anything
shaped like a Hub token, and the value of an ``Authorization`` header a server echoed.
"""

from __future__ import annotations

import os
import re
import traceback

import click

from fp4convert.checkpoint.io_errors import os_error_text
from fp4convert.cli.render import error_text, problem_text
from fp4convert.errors import Fp4ConvertError

__all__ = ["EX_SOFTWARE", "scrub", "show_failure"]

#: exit status of an internal error (sysexits.h)
EX_SOFTWARE = 70
_TOKEN_ENVS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_TOKEN")
_TOKEN_SHAPE = re.compile(r"\bhf_[A-Za-z0-9]{20,}")
_AUTH_HEADER = re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)(bearer\s+)?[^\s'\",}]+")


def _known_tokens() -> list[str]:
    tokens = [os.environ.get(name, "") for name in _TOKEN_ENVS]
    try:
        from huggingface_hub import get_token

        tokens.append(get_token() or "")
    except Exception:  # no hub client, or an unreadable token file: nothing more to hide
        pass
    return sorted({t for t in tokens if len(t) >= 4}, key=len, reverse=True)


def scrub(text: str) -> str:
    """``text`` without tokens: the ones in use, Hub-token-shaped strings, Authorization values.

    Example:
        >>> scrub("401 for Authorization: Bearer hf_abcdefghijklmnopqrstu (token hf_abcdefghijklmnopqrstu)")
        '401 for Authorization: Bearer *** (token ***)'
    """
    for token in _known_tokens():
        text = text.replace(token, "***")
    text = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}***", text)
    return _TOKEN_SHAPE.sub("***", text)


def show_failure(exc: BaseException, *, debug: bool) -> int:
    """Print ``exc`` on stderr as the user should see it; return the exit status."""
    code = EX_SOFTWARE if not isinstance(exc, Fp4ConvertError | OSError | MemoryError) else 1
    if debug:
        click.echo(scrub("".join(traceback.format_exception(exc))), err=True, nl=False)
        return code
    if isinstance(exc, Fp4ConvertError):
        text = error_text(exc)
    elif isinstance(exc, OSError):
        what, hint = os_error_text(exc)
        where = f"{exc.filename}: " if exc.filename else ""
        text = problem_text("error", "os", f"{where}{what}", hint)
    elif isinstance(exc, MemoryError):
        text = problem_text(
            "error", "memory", "out of memory", "free memory, or convert with fewer workers (--workers)"
        )
    else:
        text = problem_text(
            "error",
            "internal",
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no message'}",
            "this is a bug in fp4convert: run again with FP4CONVERT_DEBUG=1 and report the traceback",
        )
    click.echo(scrub(text), err=True)
    return code
