"""Publish a prepared checkpoint to the Hugging Face Hub: inspect, confirm, one commit, check.

What to upload is decided offline by :func:`fp4convert.publish.prepare.prepare_publication`.
:func:`publish` then

1. reads the remote state (repo, branch, files) without changing anything;
2. refuses a repo or branch that already holds *different* content, unless ``replace=True``, in
   which case the one commit also deletes the remote files the folder does not have (a branch
   that does not exist yet is compared with ``main``, where it will start); identical content is
   a no-op; an existing public repo is refused when ``private=True`` was asked;
3. asks ``confirm`` (the CLI prompts unless told yes), then creates the repo / branch if needed;
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

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fp4convert.checkpoint.manifest import MANIFEST
from fp4convert.errors import Fp4ConvertError, HubError
from fp4convert.hub import http_cause, hub_endpoint, hub_error, redact
from fp4convert.publish.prepare import Publication
from fp4convert.publish.remote import PublishPlan, check_remote, inspect_remote, plan_publication
from fp4convert.version import __version__

__all__ = ["Progress", "PublishResult", "publish"]

Progress = Callable[[str, Mapping[str, Any]], None]


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

    Example (not run: it writes to the Hub):
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
        plan = plan_publication(pub, inspect_remote(api, pub), endpoint, replace)
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
    check_remote(api, pub, info.oid)
    return info.oid, str(info.commit_url)


def _failure(exc: Exception, stage: _Stage, pub: Publication, endpoint: str | None, token: str) -> HubError:
    """The error for a failure of the client, saying whether anything may have been committed."""
    from huggingface_hub.errors import HfHubHTTPError

    if stage.committing and not isinstance(http_cause(exc), HfHubHTTPError):  # no answer came back
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
