"""What the remote repo holds, and the plan of the one commit that makes it equal to the folder.

:func:`inspect_remote` reads the repo, the branch and its files without changing anything;
:func:`plan_publication` compares them with the :class:`~fp4convert.publish.prepare.Publication`
and refuses a repo or branch that already holds *different* content unless replacing was asked
for (then the commit also deletes the remote files the folder does not have); identical content
is a no-op. :func:`check_remote` compares the tree of the new commit with the folder, file by
file (SHA-256 for LFS files, git SHA-1 for regular ones).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fp4convert.errors import HubError
from fp4convert.plan import human_bytes
from fp4convert.publish.prepare import LocalFile, Publication

__all__ = ["PublishPlan", "Remote", "RemoteFile", "check_remote", "inspect_remote", "plan_publication", "remote_files"]

# The Hub writes it into every new repo; it is never ours to compare, replace or delete.
_HUB_FILES = frozenset({".gitattributes"})


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
class Remote:
    exists: bool
    private: bool | None = None
    branch_exists: bool = False
    head: str | None = None
    files: dict[str, RemoteFile] = field(default_factory=dict)


def remote_files(api: Any, repo_id: str, revision: str) -> dict[str, RemoteFile]:
    from huggingface_hub.hf_api import RepoFile

    return {
        f.path: RemoteFile(f.path, f.size, f.blob_id, f.lfs.sha256 if f.lfs is not None else None)
        for f in api.list_repo_tree(repo_id, revision=revision, recursive=True)
        if isinstance(f, RepoFile) and f.path not in _HUB_FILES
    }


def inspect_remote(api: Any, pub: Publication) -> Remote:
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = api.repo_info(pub.repo_id, revision=pub.revision)
        branch_exists = True
    except RepositoryNotFoundError:
        return Remote(exists=False)
    except RevisionNotFoundError:
        info = api.repo_info(pub.repo_id)  # the new branch will start from main
        branch_exists = False
    return Remote(True, info.private, branch_exists, info.sha, remote_files(api, pub.repo_id, info.sha))


def plan_publication(pub: Publication, remote: Remote, endpoint: str | None, replace: bool) -> PublishPlan:
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
            hint="publish to a new repo or branch (--revision, revision=), or replace its content (--replace, "
            "replace=True): the one commit makes the branch equal to the folder, deleting the files not in it",
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


def check_remote(api: Any, pub: Publication, commit: str) -> None:
    remote = remote_files(api, pub.repo_id, commit)
    wrong = [f.path for f in pub.files if f.path not in remote or not remote[f.path].matches(f)]
    extra = sorted(set(remote) - {f.path for f in pub.files})
    if wrong or extra:
        raise HubError(
            f"after commit {commit[:12]}, {pub.repo_id} does not hold the published folder: "
            f"{len(wrong)} files missing or different ({', '.join(wrong[:3])}), {len(extra)} extra",
            hint="the commit is on the Hub; inspect it there, then publish again replacing its content "
            "(--replace, replace=True)",
            repo_id=pub.repo_id,
        )
