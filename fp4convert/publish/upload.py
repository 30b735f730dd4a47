"""Publish a converted checkpoint to the Hugging Face Hub: verify, inspect, confirm, one commit, check.

:func:`prepare_publication` works offline: it refuses an output that does not verify, lists the
files to upload with their size and SHA-256, and renders the model card (which replaces any
``README.md`` in the folder). :func:`publish` then

1. reads the remote state (repo, branch, files) without changing anything;
2. refuses a repo or branch that already holds *different* content, unless ``replace=True``, in
   which case the one commit also deletes the remote files the folder does not have (a branch
   that does not exist yet is compared with ``main``, where it will start); identical content is
   a no-op; an existing public repo is refused when ``private=True`` was asked;
3. asks ``confirm`` (the CLI prompts unless ``--yes``), then creates the repo / branch if needed;
4. uploads the large files (``preupload_lfs_files``, in batches, reporting progress) and makes
   **one commit** with every file, with ``parent_commit`` set to the head it inspected, so a
   concurrent change makes the commit fail instead of being overwritten;
5. lists the new commit's tree and checks every file's SHA-256 (LFS) or git SHA-1 (regular files)
   against the folder.

Why one commit and not ``upload_large_folder``: that helper resumes interrupted uploads from a
local journal but commits in several steps, so a reader can fetch a checkpoint whose index names
shards that are not there yet. A single commit is atomic: the repo shows all of the checkpoint or
none of it. Resuming still works, because uploads are content-addressed: LFS objects (and Xet
chunks on the real Hub) that reached the server before a failure are not sent again by the next
run. What it gives up is the journal: the next run hashes the local files again.

Tokens come from ``token=``, else huggingface_hub's sources (``HF_TOKEN``, then the login saved
by ``hf auth login``); they are sent to the endpoint only and scrubbed from every error message.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp4convert import __version__
from fp4convert.checkpoint.hashing import file_sha256
from fp4convert.checkpoint.manifest import MANIFEST, read_manifest
from fp4convert.checkpoint.source import PICKLE_SUFFIXES
from fp4convert.errors import Fp4ConvertError, HubError
from fp4convert.hub import _http_cause, hub_endpoint, hub_error, is_repo_id, redact
from fp4convert.plan import human_bytes
from fp4convert.publish.card import render_card

__all__ = [
    "CARD_NAME",
    "LocalFile",
    "Publication",
    "PublishPlan",
    "PublishResult",
    "RemoteFile",
    "prepare_publication",
    "publish",
]

#: The model card's name in the repo.
CARD_NAME = "README.md"
# The Hub writes it into every new repo; it is never ours to compare, replace or delete.
_HUB_FILES = frozenset({".gitattributes"})

Progress = Callable[[str, Mapping[str, Any]], None]


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


@dataclass(frozen=True)
class RemoteFile:
    """A file of the remote tree: its size, git SHA-1, and SHA-256 when it is stored through LFS."""

    path: str
    size: int
    oid: str
    sha256: str | None

    def matches(self, local: LocalFile) -> bool:
        if self.size != local.size:
            return False
        if self.sha256 is not None:
            return self.sha256 == local.sha256
        return self.oid == local.git_oid()


@dataclass(frozen=True)
class PublishPlan:
    """What :func:`publish` is about to do, shown to ``confirm`` before anything changes.

    Attributes:
        publication: what is published.
        endpoint: the Hub endpoint (None: huggingface.co).
        create_repo: the repo does not exist yet.
        create_branch: the branch does not exist yet (it starts from ``main``).
        upload: paths added or changed by the commit.
        unchanged: paths the remote already holds byte for byte.
        delete: remote paths the commit deletes (only with ``replace``).
        head: the commit the new one goes on top of (None: a repo created by this run).
    """

    publication: Publication
    endpoint: str | None
    create_repo: bool
    create_branch: bool
    upload: tuple[str, ...]
    unchanged: tuple[str, ...]
    delete: tuple[str, ...]
    head: str | None

    @property
    def noop(self) -> bool:
        return not (self.create_repo or self.create_branch or self.upload or self.delete)

    @property
    def upload_bytes(self) -> int:
        sizes = {f.path: f.size for f in self.publication.files}
        return sum(sizes[p] for p in self.upload)

    def describe(self) -> str:
        """The plan in a few lines (what the CLI shows before asking)."""
        pub = self.publication
        lines = [f"publish {pub.directory} to {pub.repo_id}@{pub.revision} on {self.endpoint or 'huggingface.co'}:"]
        if self.create_repo:
            lines.append(f"  create the repo ({'private' if pub.private else 'public'})")
        if self.create_branch:
            lines.append(f"  create the branch {pub.revision} from main")
        lines.append(
            f"  upload {len(self.upload)} files ({human_bytes(self.upload_bytes)}) in one commit"
            + (f", {len(self.unchanged)} unchanged" if self.unchanged else "")
        )
        if self.delete:
            shown = ", ".join(self.delete[:5]) + (f" and {len(self.delete) - 5} more" if len(self.delete) > 5 else "")
            lines.append(f"  delete {len(self.delete)} files that are not in {pub.directory}: {shown}")
        return "\n".join(lines)


@dataclass(frozen=True)
class PublishResult:
    """The outcome of :func:`publish`.

    Attributes:
        status: ``published``, or ``unchanged`` when the remote already held exactly these files.
        commit: the commit that holds them.
        url: the commit's URL (``unchanged``: the repo's).
        remote_verified: every remote file was checked against the local SHA-256 / git SHA-1.
    """

    repo_id: str
    revision: str
    status: str
    commit: str
    url: str
    created_repo: bool = False
    created_branch: bool = False
    uploaded: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    uploaded_bytes: int = 0
    remote_verified: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {key: (list(value) if isinstance(value, tuple) else value) for key, value in self.__dict__.items()}


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

    Example:
        >>> pub = prepare_publication("out", "me/Qwen3-30B-A3B-NVFP4")  # doctest: +SKIP
        >>> [f.path for f in pub.files][-1], pub.verification  # doctest: +SKIP
        ('model.safetensors.index.json', 'OK: 191 checks passed (structure and hashes)')
    """
    from fp4convert.verify.checkpoint import verify_checkpoint

    directory = Path(directory)
    for name, value in (("repo id", repo_id), ("base model", base_model)):
        if value is not None and not is_repo_id(value):
            raise HubError(
                f"{name} {value!r} is not a Hub repo id (owner/name)",
                hint="write it as owner/name, e.g. me/Qwen3-30B-A3B-NVFP4",
                found=value,
            )
    report = verify_checkpoint(directory, source=source, device=device)
    if not report.ok:
        raise HubError(
            f"{directory} does not verify, so it is not published: {report.summary()}",
            hint=f"`fp4convert verify {directory}` lists every failure; convert again (--overwrite), "
            "then publish that",
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
    files = sorted([*_local_files(directory), readme], key=lambda f: f.path)
    if not any(f.path == MANIFEST for f in files):  # verify read it, so only a race could get here
        raise HubError(f"{directory}/{MANIFEST} disappeared while preparing", hint="publish again")
    return Publication(directory, repo_id, revision, private, tuple(files), card, report.summary())


# -- the remote side -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Remote:
    exists: bool
    private: bool | None = None
    branch_exists: bool = False
    head: str | None = None
    files: dict[str, RemoteFile] = field(default_factory=dict)


def _remote_files(api: Any, repo_id: str, revision: str) -> dict[str, RemoteFile]:
    from huggingface_hub.hf_api import RepoFile

    return {
        f.path: RemoteFile(f.path, f.size, f.blob_id, f.lfs.sha256 if f.lfs is not None else None)
        for f in api.list_repo_tree(repo_id, revision=revision, recursive=True)
        if isinstance(f, RepoFile) and f.path not in _HUB_FILES
    }


def _inspect(api: Any, pub: Publication) -> _Remote:
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = api.repo_info(pub.repo_id, revision=pub.revision)
        branch_exists = True
    except RepositoryNotFoundError:
        return _Remote(exists=False)
    except RevisionNotFoundError:
        info = api.repo_info(pub.repo_id)  # the new branch will start from main
        branch_exists = False
    return _Remote(True, info.private, branch_exists, info.sha, _remote_files(api, pub.repo_id, info.sha))


def _plan(pub: Publication, remote: _Remote, endpoint: str | None, replace: bool) -> PublishPlan:
    where = (
        f"{pub.repo_id}@{pub.revision}"
        if remote.branch_exists
        else f"{pub.repo_id} (main, where {pub.revision} would start)"
    )
    if remote.exists and pub.private and not remote.private:
        raise HubError(
            f"{pub.repo_id} exists and is public, but a private publication was asked for",
            hint="make the repo private on the Hub first, or publish to a new repo",
            repo_id=pub.repo_id,
        )
    changed = tuple(f.path for f in pub.files if f.path not in remote.files or not remote.files[f.path].matches(f))
    unchanged = tuple(f.path for f in pub.files if f.path not in changed)
    stale = tuple(p for p in sorted(remote.files) if p not in {f.path for f in pub.files})
    if remote.files and (changed or stale) and not replace:
        examples = ", ".join([*stale[:3], *(p for p in changed if p in remote.files)][:3])
        raise HubError(
            f"{where} already holds different content: {len(changed)} of the {len(pub.files)} files "
            f"to publish are missing or differ there, {len(stale)} of its files are not in {pub.directory}"
            + (f" (e.g. {examples})" if examples else ""),
            hint="publish to a new repo or branch (--revision), or pass --replace to make the branch "
            "equal to the folder in one commit (deleting the files that are not in it)",
            repo_id=pub.repo_id,
            differs=list(changed),
            extra=list(stale),
        )
    # A branch other than main that does not exist yet is created (from main), in a new repo too.
    create_branch = not remote.branch_exists and pub.revision != "main"
    return PublishPlan(
        pub,
        endpoint,
        not remote.exists,
        create_branch,
        changed,
        unchanged,
        stale if replace else (),
        remote.head,
    )


def _check_remote(api: Any, pub: Publication, commit: str) -> None:
    remote = _remote_files(api, pub.repo_id, commit)
    wrong = [f.path for f in pub.files if f.path not in remote or not remote[f.path].matches(f)]
    extra = sorted(set(remote) - {f.path for f in pub.files})
    if wrong or extra:
        raise HubError(
            f"after commit {commit[:12]}, {pub.repo_id} does not hold the published folder: "
            f"{len(wrong)} files missing or different ({', '.join(wrong[:3])}), {len(extra)} extra",
            hint="the commit is on the Hub; inspect it there, then publish again with --replace",
            repo_id=pub.repo_id,
        )


def _upload(api: Any, plan: PublishPlan, operations: list[Any], hook: Progress, batch: int) -> None:
    """Send the file contents before the commit, ``batch`` files per call, reporting progress."""
    total = sum(op.upload_info.size for op in operations)
    done_files = done_bytes = 0
    hook("upload", {"files": 0, "of": len(operations), "bytes": 0, "total": total})
    for start in range(0, len(operations), batch):
        chunk = operations[start : start + batch]
        api.preupload_lfs_files(plan.publication.repo_id, additions=chunk, revision=plan.publication.revision)
        done_files += len(chunk)
        done_bytes += sum(op.upload_info.size for op in chunk)
        hook(
            "upload",
            {
                "files": done_files,
                "of": len(operations),
                "bytes": done_bytes,
                "total": total,
                "last": chunk[-1].path_in_repo,
            },
        )


def _commit_message(pub: Publication) -> tuple[str, str]:
    manifest = json.loads((pub.directory / MANIFEST).read_text())
    formats = ", ".join(f"{n} {fmt}" for fmt, n in sorted(manifest["formats"].items()))
    title = f"fp4convert {__version__}: {manifest['contract']['name']} ({manifest['dialect']})"
    body = f"{formats}; contract sha256 {manifest['contract_sha256']}; verify: {pub.verification}"
    return title, body


def publish(
    publication: Publication,
    *,
    replace: bool = False,
    endpoint: str | None = None,
    token: str | None = None,
    confirm: Callable[[PublishPlan], bool] | None = None,
    progress: Progress | None = None,
    batch: int = 5,
) -> PublishResult:
    """Publish a prepared checkpoint in one commit (see the module docstring for every step).

    Args:
        publication: from :func:`prepare_publication`.
        replace: make a repo/branch that holds other content equal to the folder (deleting the
            files the folder does not have), instead of refusing.
        endpoint: the Hub endpoint; default ``HF_ENDPOINT``, else huggingface.co.
        token: a Hub token; default ``HF_TOKEN``, else the saved login.
        confirm: called with the plan before the first change; publishing stops unless it
            returns True. None publishes without asking.
        progress: ``progress(event, payload)`` for ``inspect``, ``create_repo``, ``create_branch``,
            ``upload`` (files and bytes done), ``commit`` and ``check``.
        batch: files uploaded per request batch (each batch reports progress).

    Returns:
        What happened: the commit, the files uploaded and deleted, whether the remote was checked.

    Raises:
        HubError: no token; the repo holds different content (without ``replace``) or is public
            while ``private`` was asked; not confirmed; or any Hub or network error (the message
            says whether something was committed).

    Example:
        >>> publish(prepare_publication("out", "me/Qwen3-NVFP4"), confirm=lambda plan: True)  # doctest: +SKIP
        PublishResult(repo_id='me/Qwen3-NVFP4', revision='main', status='published', ...)
    """
    from huggingface_hub import HfApi, get_token

    pub = publication
    hook: Progress = progress or (lambda event, payload: None)
    endpoint = hub_endpoint(endpoint)
    token = token or get_token()
    if not token:
        raise HubError(
            f"no Hugging Face token to publish {pub.repo_id} with",
            hint="set HF_TOKEN to a token with write access, or run `hf auth login`",
            repo_id=pub.repo_id,
        )
    api = HfApi(endpoint=endpoint, token=token, library_name="fp4convert", library_version=__version__)
    stage = _Stage(f"reading {pub.repo_id}")
    try:
        hook("inspect", {"repo_id": pub.repo_id, "revision": pub.revision, "endpoint": endpoint})
        plan = _plan(pub, _inspect(api, pub), endpoint, replace)
        if plan.noop:
            return PublishResult(
                pub.repo_id, pub.revision, "unchanged", plan.head or "", f"{api.endpoint}/{pub.repo_id}"
            )
        if confirm is not None and not confirm(plan):
            raise HubError(f"publishing to {pub.repo_id} was not confirmed; nothing was changed", repo_id=pub.repo_id)
        commit, url = _execute(api, plan, stage, hook, batch)
    except Fp4ConvertError:
        raise
    except Exception as exc:
        raise _failure(exc, stage, pub, endpoint, token) from _scrubbed(exc, token)
    return PublishResult(
        pub.repo_id,
        pub.revision,
        "published",
        commit,
        url,
        created_repo=plan.create_repo,
        created_branch=plan.create_branch,
        uploaded=plan.upload,
        deleted=plan.delete,
        uploaded_bytes=plan.upload_bytes,
        remote_verified=True,
    )


class _Stage:
    """What :func:`publish` is doing, for the message if it fails there."""

    def __init__(self, doing: str) -> None:
        self.doing = doing
        self.committing = False


def _additions(pub: Publication, paths: tuple[str, ...]) -> list[Any]:
    from huggingface_hub import CommitOperationAdd

    by_path = {f.path: f for f in pub.files}
    additions = []
    for path in paths:
        local = by_path[path]
        content = local.content if local.content is not None else str(local.local)
        op = CommitOperationAdd(path_in_repo=path, path_or_fileobj=content)
        op.upload_info.sha256 = bytes.fromhex(local.sha256)  # hashed already: do not read it again
        additions.append(op)
    return additions


def _execute(api: Any, plan: PublishPlan, stage: _Stage, hook: Progress, batch: int) -> tuple[str, str]:
    """Create what is missing, upload, commit once, check the remote; returns (commit, url)."""
    from huggingface_hub import CommitOperationDelete

    pub = plan.publication
    head = plan.head
    if plan.create_repo:
        stage.doing = f"creating {pub.repo_id}"
        hook("create_repo", {"repo_id": pub.repo_id, "private": pub.private})
        # exist_ok=False: a repo someone else created since the inspection must not be reused blindly.
        api.create_repo(pub.repo_id, private=pub.private, exist_ok=False)
        head = None
    if plan.create_branch:
        stage.doing = f"creating the branch {pub.revision}"
        hook("create_branch", {"branch": pub.revision})
        api.create_branch(pub.repo_id, branch=pub.revision, revision=head)
    if head is None:
        head = api.repo_info(pub.repo_id, revision=pub.revision).sha
    additions = _additions(pub, plan.upload)
    deletes = [CommitOperationDelete(path_in_repo=path) for path in plan.delete]
    if not additions and not deletes:  # a new branch of content main already holds: nothing to commit
        return head, f"{api.endpoint}/{pub.repo_id}/tree/{pub.revision}"
    stage.doing = f"uploading the files of {pub.directory}"
    _upload(api, plan, additions, hook, batch)
    stage.doing, stage.committing = f"committing to {pub.repo_id}@{pub.revision}", True
    hook("commit", {"files": len(additions), "delete": len(deletes)})
    title, body = _commit_message(pub)
    info = api.create_commit(
        pub.repo_id,
        operations=[*additions, *deletes],
        commit_message=title,
        commit_description=body,
        revision=pub.revision,
        parent_commit=head,
    )
    stage.doing, stage.committing = f"checking the files of commit {info.oid[:12]}", False
    hook("check", {"commit": info.oid})
    _check_remote(api, pub, info.oid)
    return info.oid, str(info.commit_url)


def _failure(exc: Exception, stage: _Stage, pub: Publication, endpoint: str | None, token: str) -> HubError:
    """The error for a failure of the client, saying whether anything may have been committed."""
    from huggingface_hub.errors import HfHubHTTPError

    if stage.committing and not isinstance(_http_cause(exc), HfHubHTTPError):  # no answer came back
        hint = (
            f"the answer to the commit was lost, so {pub.repo_id}@{pub.revision} may or may not hold it; "
            "run publish again: it finds the files already there, or commits them"
        )
    else:
        hint = (
            f"nothing was committed: {pub.repo_id}@{pub.revision} is as it was; run publish again "
            "(files that reached the Hub are not sent twice)"
        )
    return hub_error(
        exc, doing=stage.doing, repo_id=pub.repo_id, endpoint=endpoint, revision=pub.revision, token=token, hint=hint
    )


def _scrubbed(exc: BaseException, token: str) -> BaseException:
    """``exc`` as the cause of our error, unless its chain carries the token (then a scrubbed summary).

    The cause is only printed with ``FP4CONVERT_DEBUG=1``, but a traceback is output too.
    """
    chain: list[str] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 20:
        chain.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    if any(token in text for text in chain):
        return RuntimeError(redact(" <- ".join(chain), token))
    return exc
