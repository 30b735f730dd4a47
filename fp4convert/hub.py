"""Hugging Face Hub access: fetch a source checkpoint (safetensors only)."""

from __future__ import annotations

import re
from pathlib import Path

from fp4convert.errors import HubError

__all__ = ["SOURCE_ALLOW_PATTERNS", "is_repo_id", "resolve_source"]

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
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def is_repo_id(text: str) -> bool:
    return bool(_REPO_ID.match(text))


def resolve_source(source: str | Path, *, revision: str | None = None) -> Path:
    """A local checkpoint directory for ``source``: the directory itself, or a Hub snapshot.

    Hub repos are fetched with ``snapshot_download`` limited to :data:`SOURCE_ALLOW_PATTERNS`;
    with ``HF_HUB_OFFLINE=1`` a warm cache is used without network access.

    Raises:
        HubError: ``source`` is neither an existing directory nor a reachable repo id.
    """
    path = Path(source)
    if path.is_dir():
        return path
    text = str(source)
    if not is_repo_id(text):
        raise HubError(
            f"source {text!r} is not a directory and not a Hub repo id (owner/name)",
            hint="pass a local checkpoint folder or a repo id such as Qwen/Qwen3-30B-A3B",
            found=text,
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id=text, revision=revision, allow_patterns=SOURCE_ALLOW_PATTERNS))
    except LocalEntryNotFoundError as exc:
        raise HubError(
            f"{text} is not in the local Hub cache and the Hub cannot be reached",
            hint="download it once with network access, or unset HF_HUB_OFFLINE",
            repo_id=text,
        ) from exc
    except HfHubHTTPError as exc:
        raise HubError(f"could not download {text}: {exc}", repo_id=text) from exc
