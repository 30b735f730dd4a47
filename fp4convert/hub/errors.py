"""huggingface_hub's exceptions as one :class:`~fp4convert.errors.HubError` each, never carrying a token.

:func:`hub_error` reads what the client raised (an HTTP error, a network error, or a wrapper of
one: :func:`http_cause` finds the HTTP layer in the cause chain) and says what happened and what to
do next; :func:`download_errors` does it for a download, where a missing cache entry while offline
and a missing file are their own cases. Every message goes through :func:`redact` with the token in
use, in case a server or a proxy echoed it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fp4convert.errors import HubError

__all__ = ["download_errors", "http_cause", "hub_error", "redact"]

_AUTH_HINT = "set HF_TOKEN to a valid token (or run `hf auth login`)"


def redact(text: str, token: str | None) -> str:
    """``text`` with every occurrence of ``token`` replaced by ``***``.

    Example:
        >>> redact("401: bad token hf_abc", "hf_abc")
        '401: bad token ***'
    """
    return text.replace(token, "***") if token else text


def http_cause(exc: BaseException) -> BaseException | None:
    """The HTTP-layer exception behind ``exc`` (itself, or in its cause chain)."""
    from huggingface_hub.errors import HTTPError

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, HTTPError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def hub_error(
    exc: BaseException,
    *,
    doing: str,
    repo_id: str,
    endpoint: str | None,
    revision: str | None = None,
    token: str | None = None,
    hint: str | None = None,
) -> HubError:
    """One readable :class:`HubError` for an exception raised by huggingface_hub.

    Args:
        exc: what the client raised (an HTTP error, a network error, or a wrapper of one).
        doing: what was being done, e.g. ``"uploading model-00001-of-00008.safetensors"``.
        repo_id: the repo concerned.
        endpoint: the endpoint used (None: huggingface.co), named in network errors.
        revision: the revision concerned, for "no such revision".
        token: the token in use; scrubbed from the message in case a server or proxy echoed it.
        hint: what to do next when the error is a network failure or an unexpected HTTP status.

    Returns:
        The error to raise (``raise hub_error(...) from exc``).
    """
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = endpoint or "huggingface.co"
    cause = http_cause(exc)
    advice: str | None
    status = getattr(getattr(cause, "response", None), "status_code", None)
    server = getattr(cause, "server_message", None) or ""
    detail = server.strip() or str(cause or exc).strip().splitlines()[0]
    if isinstance(cause, RevisionNotFoundError):
        message, advice = (
            f"{repo_id} has no revision {revision!r} on {where}",
            "give an existing branch, tag or commit as the revision (--revision)",
        )
    elif isinstance(cause, GatedRepoError):
        message, advice = (
            f"{repo_id} is gated and the token has not been granted access",
            "accept the model's terms on its Hub page with the account of the token",
        )
    elif isinstance(cause, RepositoryNotFoundError):
        message, advice = (
            f"no repo {repo_id} on {where}, or it is private and the token cannot read it",
            f"check the repo id (or, for a local folder, the path); for a private repo {_AUTH_HINT}",
        )
    elif status == 401:
        message, advice = f"{where} rejected the token (HTTP 401) while {doing}", _AUTH_HINT
    elif status == 403:
        message, advice = (
            f"the token may not write to {repo_id} (HTTP 403: {detail})",
            f"use a token with write access to the namespace {repo_id.split('/')[0]}",
        )
    elif status == 412:
        message, advice = (
            f"{repo_id} changed on {where} while {doing} (another commit landed first)",
            "nothing of this run was committed; run the command again",
        )
    elif isinstance(cause, HfHubHTTPError):
        message, advice = f"{where} answered HTTP {status} while {doing}: {detail}", hint
    elif cause is not None:
        message, advice = f"network error while {doing} on {where}: {type(cause).__name__}: {detail}", hint
    else:
        message, advice = f"{doing} failed: {type(exc).__name__}: {detail}", hint
    return HubError(
        redact(message, token), hint=redact(advice, token) if advice else None, repo_id=repo_id, status=status
    )


def _offline_error(exc: BaseException, repo_id: str, endpoint: str | None, what: str) -> HubError:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return HubError(
            f"{repo_id} ({what}) is not in the local Hub cache and HF_HUB_OFFLINE is set",
            hint="download it once with network access, or unset HF_HUB_OFFLINE",
            repo_id=repo_id,
        )
    cause = http_cause(exc)
    reason = f" ({type(cause).__name__})" if cause is not None else ""
    return HubError(
        f"could not reach {endpoint or 'huggingface.co'}{reason} and {repo_id} ({what}) is not in the local cache",
        hint="check the network (or HF_ENDPOINT), then run again",
        repo_id=repo_id,
    )


@contextmanager
def download_errors(repo_id: str, what: str, *, revision: str | None, endpoint: str | None) -> Iterator[None]:
    """huggingface_hub's download errors as one :class:`HubError` each (``what``: what was fetched)."""
    from huggingface_hub.errors import EntryNotFoundError, HTTPError, LocalEntryNotFoundError

    try:
        yield
    except LocalEntryNotFoundError as exc:  # offline, or unreachable, and not (fully) cached
        raise _offline_error(exc, repo_id, endpoint, what) from exc
    except EntryNotFoundError as exc:  # the remote one (the local one is caught above)
        raise HubError(
            f"{repo_id} (revision {revision or 'main'}) has no {what}",
            hint="pass the repo of a transformers checkpoint",
            repo_id=repo_id,
        ) from exc
    except HTTPError as exc:
        raise hub_error(
            exc,
            doing=f"downloading the {what} of {repo_id}",
            repo_id=repo_id,
            endpoint=endpoint,
            revision=revision,
            hint="check the network (or HF_ENDPOINT), then run again",
        ) from exc
