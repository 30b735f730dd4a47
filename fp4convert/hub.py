"""Hugging Face Hub access: fetch a source checkpoint or a model's config (safetensors only).

Everything goes through ``huggingface_hub``: its cache (``HF_HUB_CACHE``), offline mode
(``HF_HUB_OFFLINE=1`` serves a warm cache without network access) and token sources (``HF_TOKEN``,
then a login saved by ``hf auth login``). The endpoint is ``endpoint=`` when given, else
``HF_ENDPOINT`` as set *when the function is called* (huggingface_hub reads it once, at import), so
a process can point at a mirror after importing fp4convert.

Downloads are limited to :data:`SOURCE_ALLOW_PATTERNS`: a pickle file (``*.bin``, ``*.pt``) is
never fetched, let alone opened. :func:`hub_error` turns the client's exceptions into one
:class:`~fp4convert.errors.HubError` with a hint, and never lets a token through.

Publishing converted checkpoints lives in :mod:`fp4convert.publish`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fp4convert import __version__
from fp4convert.errors import HubError

__all__ = [
    "ENDPOINT_ENV",
    "SOURCE_ALLOW_PATTERNS",
    "hub_endpoint",
    "hub_error",
    "is_repo_id",
    "redact",
    "resolve_model_config",
    "resolve_source",
]

#: What conversion needs from a source repo: config, weights, index, tokenizer. Never pickles.
SOURCE_ALLOW_PATTERNS = [
    "*.json",
    "*.safetensors",
    "tokenizer*",
    "*.model",
    "*.tiktoken",
    "*.txt",
    "*.jinja",
]
#: The environment variable naming the Hub endpoint (huggingface_hub's own).
ENDPOINT_ENV = "HF_ENDPOINT"
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_AUTH_HINT = "set HF_TOKEN to a valid token (or run `hf auth login`)"


def is_repo_id(text: str) -> bool:
    """Whether ``text`` is spelled like a Hub repo id (``owner/name``).

    Example:
        >>> is_repo_id("Qwen/Qwen3-30B-A3B"), is_repo_id("./out"), is_repo_id("DeepSeek-V3")
        (True, False, False)
    """
    return bool(_REPO_ID.match(text))


def hub_endpoint(endpoint: str | None = None) -> str | None:
    """The endpoint to talk to: ``endpoint``, else ``HF_ENDPOINT`` now, else None (huggingface.co).

    Example:
        >>> hub_endpoint("http://127.0.0.1:8080/")
        'http://127.0.0.1:8080'
    """
    chosen = endpoint or os.environ.get(ENDPOINT_ENV) or None
    return chosen.rstrip("/") if chosen else None


def redact(text: str, token: str | None) -> str:
    """``text`` with every occurrence of ``token`` replaced by ``***``.

    Example:
        >>> redact("401: bad token hf_abc", "hf_abc")
        '401: bad token ***'
    """
    return text.replace(token, "***") if token else text


def _http_cause(exc: BaseException) -> BaseException | None:
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
    cause = _http_cause(exc)
    advice: str | None
    status = getattr(getattr(cause, "response", None), "status_code", None)
    server = getattr(cause, "server_message", None) or ""
    detail = server.strip() or str(cause or exc).strip().splitlines()[0]
    if isinstance(cause, RevisionNotFoundError):
        message, advice = (
            f"{repo_id} has no revision {revision!r} on {where}",
            "pass an existing branch, tag or commit with --revision",
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


def _no_local_revision(source: str, revision: str) -> HubError:
    return HubError(
        f"--revision {revision} applies to Hub repo ids, but {source} is a local path",
        hint="drop --revision, or pass the repo id instead of the folder",
        found=source,
    )


def _offline_error(exc: BaseException, repo_id: str, endpoint: str | None, what: str) -> HubError:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return HubError(
            f"{repo_id} ({what}) is not in the local Hub cache and HF_HUB_OFFLINE is set",
            hint="download it once with network access, or unset HF_HUB_OFFLINE",
            repo_id=repo_id,
        )
    cause = _http_cause(exc)
    reason = f" ({type(cause).__name__})" if cause is not None else ""
    return HubError(
        f"could not reach {endpoint or 'huggingface.co'}{reason} and {repo_id} ({what}) is not in the local cache",
        hint="check the network (or HF_ENDPOINT), then run again",
        repo_id=repo_id,
    )


@contextmanager
def _download_errors(repo_id: str, what: str, *, revision: str | None, endpoint: str | None) -> Iterator[None]:
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


def resolve_source(source: str | Path, *, revision: str | None = None, endpoint: str | None = None) -> Path:
    """A local checkpoint directory for ``source``: the directory itself, or a Hub snapshot.

    Hub repos are fetched with ``snapshot_download`` limited to :data:`SOURCE_ALLOW_PATTERNS` (so a
    repo with both safetensors and pickle weights only ever yields the safetensors); with
    ``HF_HUB_OFFLINE=1`` a warm cache is used without network access.

    Args:
        source: a local checkpoint folder, or a repo id such as ``Qwen/Qwen3-30B-A3B``.
        revision: branch, tag or commit of a repo id (refused for a local folder).
        endpoint: the Hub endpoint; default ``HF_ENDPOINT``, else huggingface.co.

    Returns:
        The folder (for a repo: the snapshot in the Hub cache).

    Raises:
        HubError: ``source`` is neither an existing directory nor a reachable repo id, the revision
            does not exist, the repo has no safetensors weights, or it is not cached while offline.

    Example:
        >>> resolve_source("Qwen/Qwen3-30B-A3B", revision="main")  # doctest: +SKIP
        PosixPath('~/.cache/huggingface/hub/models--Qwen--Qwen3-30B-A3B/snapshots/ad44e777...')
    """
    path = Path(source)
    if path.is_dir():
        if revision is not None:
            raise _no_local_revision(str(source), revision)
        return path
    text = str(source)
    if not is_repo_id(text):
        raise HubError(
            f"source {text!r} is not a directory and not a Hub repo id (owner/name)",
            hint="pass a local checkpoint folder or a repo id such as Qwen/Qwen3-30B-A3B",
            found=text,
        )
    from huggingface_hub import snapshot_download

    endpoint = hub_endpoint(endpoint)
    with _download_errors(text, "source checkpoint", revision=revision, endpoint=endpoint):
        snapshot = Path(
            snapshot_download(
                repo_id=text,
                revision=revision,
                allow_patterns=SOURCE_ALLOW_PATTERNS,
                endpoint=endpoint,
                library_name="fp4convert",
                library_version=__version__,
            )
        )
    if not any(snapshot.glob("*.safetensors")):
        raise HubError(
            f"{text} (revision {revision or 'main'}) has no *.safetensors weights",
            hint="fp4convert converts safetensors checkpoints only; it never downloads pickles (*.bin, *.pt)",
            repo_id=text,
        )
    return snapshot


def resolve_model_config(model: str, *, revision: str | None = None, endpoint: str | None = None) -> str:
    """``--model`` as a local path: a repo id becomes its downloaded ``config.json``, the rest stays.

    Only ``config.json`` is fetched: the inventory of a model is derived from its config alone
    (:func:`fp4convert.families.inventory_from_config`), as for a shipped config, so no weights or
    headers are downloaded. An existing local path or a shipped config name (``DeepSeek-V3``) is
    returned unchanged.

    Args:
        model: a local path, a shipped config name, or a repo id.
        revision: branch, tag or commit of a repo id (refused for anything else).
        endpoint: the Hub endpoint; default ``HF_ENDPOINT``, else huggingface.co.

    Returns:
        What ``load_model_inventory`` should read.

    Raises:
        HubError: the repo, its revision or its config.json cannot be fetched.

    Example:
        >>> resolve_model_config("DeepSeek-V3")
        'DeepSeek-V3'
    """
    if Path(model).exists() or not is_repo_id(model):
        if revision is not None:
            raise _no_local_revision(model, revision)
        return model
    from huggingface_hub import hf_hub_download

    endpoint = hub_endpoint(endpoint)
    with _download_errors(model, "config.json", revision=revision, endpoint=endpoint):
        return hf_hub_download(
            repo_id=model,
            filename="config.json",
            revision=revision,
            endpoint=endpoint,
            library_name="fp4convert",
            library_version=__version__,
        )
