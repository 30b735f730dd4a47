"""Hub sources: a source checkpoint or a model's config fetched from the Hugging Face Hub (safetensors only).

Everything goes through ``huggingface_hub``: its cache (``HF_HUB_CACHE``), offline mode
(``HF_HUB_OFFLINE=1`` serves a warm cache without network access) and token sources (``HF_TOKEN``,
then a login saved by ``hf auth login``). The endpoint is ``endpoint=`` when given, else
``HF_ENDPOINT`` as set *when the function is called* (huggingface_hub reads it once, at import), so
a process can point at a mirror after importing fp4convert.

Downloads are limited to :data:`SOURCE_ALLOW_PATTERNS`: a pickle file (``*.bin``, ``*.pt``) is
never fetched, let alone opened. Client errors become one :class:`~fp4convert.errors.HubError`
each (:mod:`fp4convert.hub.errors`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fp4convert.errors import HubError
from fp4convert.hub.errors import download_errors
from fp4convert.version import __version__

__all__ = [
    "ENDPOINT_ENV",
    "SOURCE_ALLOW_PATTERNS",
    "hub_endpoint",
    "is_repo_id",
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


def _no_local_revision(source: str, revision: str) -> HubError:
    return HubError(
        f"revision {revision} (--revision) applies to Hub repo ids, but {source} is a local path",
        hint="give no revision, or give the repo id instead of the folder",
        found=source,
    )


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

    Example (not run: it downloads a checkpoint from the Hub):
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
    with download_errors(text, "source checkpoint", revision=revision, endpoint=endpoint):
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
        What :func:`fp4convert.model_source.load_model_inventory` should read.

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
    with download_errors(model, "config.json", revision=revision, endpoint=endpoint):
        return hf_hub_download(
            repo_id=model,
            filename="config.json",
            revision=revision,
            endpoint=endpoint,
            library_name="fp4convert",
            library_version=__version__,
        )
