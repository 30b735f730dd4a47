"""Decide offline what a publication uploads: verify the output, list its files, render the card.

:func:`prepare_publication` refuses an output that does not verify, lists the files to upload with
their size and SHA-256 (subfolders and pickle files are refused, dotfiles skipped), and renders the
model card (:mod:`fp4convert.publish.card`), which replaces any ``README.md`` in the folder. Nothing
here touches the network unless the BF16 source to re-derive the bytes from is a Hub repo id.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp4convert.checkpoint.hashing import file_sha256
from fp4convert.checkpoint.manifest import MANIFEST, read_manifest
from fp4convert.checkpoint.source import PICKLE_SUFFIXES
from fp4convert.errors import HubError
from fp4convert.hub import is_repo_id
from fp4convert.publish.card import render_card
from fp4convert.verify.checkpoint import verify_checkpoint

__all__ = ["CARD_NAME", "LocalFile", "Publication", "prepare_publication"]

#: The model card's name in the repo.
CARD_NAME = "README.md"


@dataclass(frozen=True)
class LocalFile:
    """One file to upload: its path in the repo, size and SHA-256, and where its bytes are."""

    path: str
    size: int
    sha256: str
    local: Path | None = None  # the file on disk; None for generated content
    content: bytes | None = None  # generated content (the model card)

    def data(self) -> bytes:
        return self.content if self.content is not None else self.local.read_bytes()  # type: ignore[union-attr]

    def git_oid(self) -> str:
        """Git's blob SHA-1, what the Hub lists for files it stores outside LFS."""
        from huggingface_hub.utils.sha import git_hash

        return git_hash(self.data())


@dataclass(frozen=True)
class Publication:
    """What :func:`publish` uploads, decided offline by :func:`prepare_publication`.

    Attributes:
        directory: the converted checkpoint.
        repo_id: the target repo.
        revision: the target branch.
        private: create the repo private (and refuse an existing public one).
        files: every file of the commit, ``README.md`` (the generated card) included, by path.
        card: the model card text.
        verification: the verify summary the card quotes.
    """

    directory: Path
    repo_id: str
    revision: str
    private: bool
    files: tuple[LocalFile, ...]
    card: str
    verification: str

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "repo_id": self.repo_id,
            "revision": self.revision,
            "private": self.private,
            "verification": self.verification,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
            "total_bytes": self.total_bytes,
            "card": self.card,
        }


def _local_files(directory: Path) -> list[LocalFile]:
    """The folder's top-level files, README.md left out (the card replaces it), dotfiles skipped."""
    files = []
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or path.name == CARD_NAME:
            continue
        if path.is_dir():
            raise HubError(
                f"{directory} holds a folder {path.name}/, which fp4convert does not write",
                hint="move it out of the converted checkpoint before publishing",
                file=str(path),
            )
        if path.name.endswith(PICKLE_SUFFIXES):
            raise HubError(
                f"{directory} holds {path.name}, a pickle file fp4convert never writes",
                hint="remove it: a published checkpoint must not carry pickles",
                file=str(path),
            )
        files.append(LocalFile(path.name, path.stat().st_size, file_sha256(path), local=path))
    return files


def prepare_publication(
    directory: str | Path,
    repo_id: str,
    *,
    revision: str = "main",
    private: bool = False,
    source: str | Path | None = None,
    base_model: str | None = None,
    device: str = "cpu",
) -> Publication:
    """Verify a converted checkpoint and decide what to upload; no network access.

    Args:
        directory: the output of ``fp4convert convert``.
        repo_id: the target repo (``owner/name``).
        revision: the target branch.
        private: create the repo private.
        source: the BF16 source (folder or repo id): also re-derive every byte from it (this one
            does download, when it is a repo id), and say so in the card.
        base_model: the source repo id for the card, when the source was a local folder.
        device: where re-quantization runs when ``source`` is given.

    Returns:
        The publication: files (with the generated ``README.md``), card, verify summary.

    Raises:
        HubError: the repo id is malformed, the output does not verify, or the folder holds
            subfolders or pickle files.
        CheckpointError: the folder is not a finished fp4convert output.

    Example (not run: it needs a converted checkpoint in ``out``):
        >>> pub = prepare_publication("out", "me/Qwen3-30B-A3B-NVFP4")  # doctest: +SKIP
        >>> [f.path for f in pub.files][-1], pub.verification  # doctest: +SKIP
        ('model.safetensors.index.json', 'OK: 191 checks passed (structure and hashes)')
    """
    directory = Path(directory)
    for name, value in (("repo id", repo_id), ("base model", base_model)):
        if value is not None and not is_repo_id(value):
            raise HubError(
                f"{name} {value!r} is not a Hub repo id (owner/name)",
                hint="write it as owner/name, e.g. me/Qwen3-30B-A3B-NVFP4",
                found=value,
            )
    local = _local_files(directory)  # first: a pickle or a folder is named as such, before verify flags it
    report = verify_checkpoint(directory, source=source, device=device)
    if not report.ok:
        raise HubError(
            f"{directory} does not verify, so it is not published: {report.summary()}",
            hint=f"`fp4convert verify {directory}` lists every failure (verify_checkpoint in Python); convert "
            "again, replacing the output (--overwrite, overwrite=True), then publish that",
            failures=[c.__dict__ for c in report.failures],
        )
    manifest = read_manifest(directory)
    card = render_card(
        manifest,
        repo_id=repo_id,
        verification=report.summary(),
        compared_with_source=report.compared_with_source,
        base_model=base_model,
    )
    data = card.encode()
    readme = LocalFile(CARD_NAME, len(data), hashlib.sha256(data).hexdigest(), content=data)
    files = sorted([*local, readme], key=lambda f: f.path)
    if not any(f.path == MANIFEST for f in files):  # verify read it, so only a race could get here
        raise HubError(f"{directory}/{MANIFEST} disappeared while preparing", hint="publish again")
    return Publication(directory, repo_id, revision, private, tuple(files), card, report.summary())
