"""A Hugging Face Hub in miniature, served over real HTTP on 127.0.0.1, for the hub tests.

It implements the part of the Hub API that ``huggingface_hub`` calls when fp4convert downloads a
source (``snapshot_download``, ``hf_hub_download``) and publishes an output (``create_repo``,
``create_branch``, ``create_commit``, ``list_repo_tree``, ``repo_info``). The routes and payloads
were read from the installed ``huggingface_hub`` (2.4.0): ``hf_api.py``, ``_commit_api.py``,
``lfs.py``, ``file_download.py``, ``_snapshot_download.py``, ``utils/_http.py``.

========================================================  ===============================================
route                                                     used by
========================================================  ===============================================
``POST /api/repos/create``                                ``create_repo`` (409 when the repo exists)
``GET  /api/models/{repo}[/revision/{rev}]``              ``repo_info`` / ``model_info``; snapshot start
``GET  /api/models/{repo}/tree/{rev}[/{path}]``           ``list_repo_tree``, ``snapshot_download``
``POST /api/models/{repo}/branch/{branch}``               ``create_branch``
``POST /api/models/{repo}/preupload/{rev}``               upload mode per file (``regular`` or ``lfs``)
``POST /{repo}.git/info/lfs/objects/batch``               LFS batch API, ``basic`` transfer only
``PUT  /lfs-upload/{oid}``  ``POST /lfs-verify``          the upload / verify actions the batch hands out
``POST /api/models/{repo}/commit/{rev}``                  the NDJSON commit (``parentCommit`` checked)
``POST /api/validate-yaml``                               README.md front matter check before a commit
``HEAD|GET /{repo}/resolve/{rev}/{path}``                 file metadata and download (``Range`` honoured)
``GET  /api/agent-harnesses``                             huggingface_hub's user-agent probe (empty)
========================================================  ===============================================

Files are stored as on the Hub: a regular file is a git blob (its ``oid`` is the git SHA-1); a
binary file (NUL in its first 512 bytes, like git's own test) or one of ``lfs_threshold`` bytes or
more goes through LFS, and the tree lists the pointer's git SHA-1 with ``lfs.oid`` = SHA-256.
Xet is never advertised: no ``X-Xet-Hash`` header on downloads. Uploads must still be told not to
use Xet (``HF_HUB_DISABLE_XET=1``): huggingface_hub >= 1.0 uploads through Xet whenever ``hf_xet``
is installed, without asking the server.

Writes need ``Authorization: Bearer <token>`` with a token from ``tokens`` whose user owns the
namespace. ``fail(...)`` injects faults: drop the connection halfway through the request body,
process the request but drop the response, or answer with an HTTP status. Every request is
recorded in ``requests`` as ``(method, path)``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n"
GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
INVALID_TOKEN = "Invalid credentials in Authorization header"


def git_oid(data: bytes) -> str:
    """Git's blob SHA-1 (what the Hub lists as a file's ``oid``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class Blob:
    """One file of a commit: its bytes, and whether it is stored through LFS."""

    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def pointer(self) -> bytes:
        return LFS_POINTER.format(oid=self.sha256, size=len(self.data)).encode()

    @property
    def oid(self) -> str:
        return git_oid(self.pointer if self.lfs else self.data)

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.oid

    def tree_entry(self, path: str) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "oid": self.oid, "size": len(self.data), "path": path}
        if self.lfs:
            entry["lfs"] = {"oid": self.sha256, "size": len(self.data), "pointerSize": len(self.pointer)}
        return entry


@dataclass(frozen=True)
class Commit:
    oid: str
    parent: str | None
    title: str
    files: dict[str, Blob]


@dataclass
class Repo:
    repo_id: str
    private: bool
    branches: dict[str, str] = field(default_factory=dict)  # branch -> commit oid
    commits: dict[str, Commit] = field(default_factory=dict)

    def resolve(self, revision: str) -> Commit | None:
        oid = self.branches.get(revision, revision)
        return self.commits.get(oid)


@dataclass
class Fault:
    """An injected failure: ``mode`` is ``drop`` (close halfway through the request body),
    ``drop-response`` (process the request, then close without answering) or an HTTP status."""

    method: str
    path: re.Pattern[str]
    mode: str | int
    times: int


class _Reply(Exception):
    """Raised by a route to answer with an error status (and Hub error headers)."""

    def __init__(self, status: int, error: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(error)
        self.status, self.error, self.headers = status, error, headers or {}


_REPO = r"(?P<repo>[^/]+/[^/]+)"


class FakeHub:
    """The server and its state; use as a context manager (``with FakeHub() as hub: hub.url``).

    Args:
        tokens: valid tokens and the user each belongs to.
        lfs_threshold: files of this many bytes or more go through LFS even when they are text.
        echo_auth_in_errors: put the request's Authorization header in error bodies, like a badly
            behaved proxy would, to prove fp4convert scrubs tokens from what it prints.
    """

    def __init__(
        self,
        *,
        tokens: dict[str, str] | None = None,
        lfs_threshold: int = 10 * 2**20,
        echo_auth_in_errors: bool = False,
    ) -> None:
        self.tokens = dict(tokens or {})
        self.lfs_threshold = lfs_threshold
        self.echo_auth_in_errors = echo_auth_in_errors
        self.repos: dict[str, Repo] = {}
        self.lfs_objects: dict[str, bytes] = {}  # sha256 -> bytes (content-addressed, like LFS)
        self.requests: list[tuple[str, str]] = []
        self.faults: list[Fault] = []
        self.lock = threading.RLock()
        self._counter = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.block_on_close = False  # idle keep-alive connections must not block shutdown
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- state helpers for tests -----------------------------------------------------------------

    def fail(self, method: str, path: str, mode: str | int, *, times: int = 1) -> None:
        """Make the next ``times`` requests matching ``method`` and the ``path`` regex fail."""
        with self.lock:
            self.faults.append(Fault(method, re.compile(path), mode, times))

    def create(self, repo_id: str, *, private: bool = False) -> Repo:
        """A repo with the initial commit the Hub makes (a ``.gitattributes``)."""
        with self.lock:
            repo = Repo(repo_id, private)
            self.repos[repo_id] = repo
            self._commit(repo, "main", None, {".gitattributes": Blob(GITATTRIBUTES, lfs=False)}, "initial commit")
            return repo

    def push(self, repo_id: str, files: dict[str, bytes], *, branch: str = "main", title: str = "push") -> str:
        """Commit ``files`` on top of ``branch`` directly (a writer other than the client)."""
        with self.lock:
            repo = self.repos.get(repo_id) or self.create(repo_id)
            head = repo.commits[repo.branches[branch]]
            tree = dict(head.files)
            for path, data in files.items():
                tree[path] = self._blob(path, data)
                if tree[path].lfs:
                    self.lfs_objects[tree[path].sha256] = data
            return self._commit(repo, branch, head.oid, tree, title).oid

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """Path -> bytes of a revision, as a download would see them."""
        with self.lock:
            commit = self.repos[repo_id].resolve(revision)
            assert commit is not None, f"{repo_id} has no revision {revision}"
            return {path: blob.data for path, blob in commit.files.items()}

    def history(self, repo_id: str, branch: str = "main") -> list[Commit]:
        """Commits of ``branch``, newest first."""
        with self.lock:
            repo = self.repos[repo_id]
            commits, oid = [], repo.branches[branch]
            while oid is not None:
                commits.append(repo.commits[oid])
                oid = repo.commits[oid].parent
            return commits

    def requested(self, method: str | None = None, path: str = "") -> list[tuple[str, str]]:
        """Recorded requests, filtered by method and a path regex."""
        with self.lock:
            return [(m, p) for m, p in self.requests if (method is None or m == method) and re.search(path, p)]

    # -- internals -------------------------------------------------------------------------------

    def _blob(self, path: str, data: bytes) -> Blob:
        return Blob(data, lfs=self._is_lfs(data[:512], len(data)))

    def _is_lfs(self, sample: bytes, size: int) -> bool:
        return b"\0" in sample or size >= self.lfs_threshold

    def _commit(self, repo: Repo, branch: str, parent: str | None, files: dict[str, Blob], title: str) -> Commit:
        self._counter += 1
        seed = json.dumps([repo.repo_id, parent, title, self._counter, sorted(b.oid for b in files.values())])
        commit = Commit(hashlib.sha1(seed.encode()).hexdigest(), parent, title, files)
        repo.commits[commit.oid] = commit
        repo.branches[branch] = commit.oid
        return commit

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.times > 0 and fault.method == method and fault.path.search(path):
                    fault.times -= 1
                    return fault
        return None


class _Handler(BaseHTTPRequestHandler):
    """Routes one request; ``hub`` is set on a per-server subclass."""

    hub: FakeHub
    protocol_version = "HTTP/1.1"  # keep-alive, as huggingface_hub's pooled client expects
    timeout = 10  # idle keep-alive connections end on their own

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    # -- plumbing --------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        path, query = url.path, parse_qs(url.query)
        with self.hub.lock:
            self.hub.requests.append((method, path))
        fault = self.hub._take_fault(method, path)
        if fault is not None and fault.mode == "drop":
            self._read_body(limit_half=True)
            self._drop()
            return
        body = self._read_body()
        try:
            status, payload, headers = self._route(method, path, query, body)
        except _Reply as reply:
            error = reply.error
            if self.hub.echo_auth_in_errors and self.headers.get("Authorization"):
                error += f" (received {self.headers['Authorization']})"
            status, payload = reply.status, {"error": error}
            headers = {"X-Error-Message": reply.error, **reply.headers}
        except Exception as exc:  # a bug in the fake: 599 (not retried by the client), never a hang
            status, payload, headers = 599, {"error": f"fake Hub crashed: {exc!r}"}, {}
        if fault is not None and fault.mode == "drop-response":
            self._drop()
            return
        if fault is not None and isinstance(fault.mode, int):
            status, payload, headers = fault.mode, {"error": f"injected HTTP {fault.mode}"}, {}
        self._send(method, status, payload, headers)

    def _read_body(self, *, limit_half: bool = False) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
                if limit_half:
                    return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length // 2 if limit_half else length)

    def _drop(self) -> None:
        """Close the connection without an answer (a network failure as the client sees it)."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _send(self, method: str, status: int, payload: Any, headers: dict[str, str]) -> None:
        if isinstance(payload, bytes):
            data, kind = payload, "application/octet-stream"
        else:
            data, kind = json.dumps(payload).encode(), "application/json"
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", headers.pop("Content-Length", str(len(data))))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)

    # -- auth ------------------------------------------------------------------------------------

    def _user(self, *, required: bool) -> str | None:
        auth = self.headers.get("Authorization")
        if auth is None:
            if required:
                raise _Reply(401, "You must be authenticated to access this endpoint")
            return None
        token = auth.removeprefix("Bearer ").strip()
        if token not in self.hub.tokens:
            raise _Reply(401, INVALID_TOKEN)
        return self.hub.tokens[token]

    def _readable(self, repo_id: str) -> Repo:
        repo = self.hub.repos.get(repo_id)
        user = self._user(required=False)
        if repo is None or (repo.private and user != repo_id.split("/")[0]):
            raise _Reply(404 if user else 401, "Repository not found", {"X-Error-Code": "RepoNotFound"})
        return repo

    def _writable(self, repo_id: str) -> Repo:
        user = self._user(required=True)
        repo = self._readable(repo_id)
        if user != repo_id.split("/")[0]:
            raise _Reply(403, f"You don't have the rights to write to {repo_id}")
        return repo

    @staticmethod
    def _revision(repo: Repo, revision: str) -> Commit:
        commit = repo.resolve(revision)
        if commit is None:
            raise _Reply(404, f"Invalid rev id: {revision}", {"X-Error-Code": "RevisionNotFound"})
        return commit

    # -- routes ----------------------------------------------------------------------------------

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> tuple[int, Any, dict]:
        hub = self.hub
        routes = (
            ("GET", r"/api/agent-harnesses", lambda m: (200, {"harnesses": {}, "standardEnvVars": []}, {})),
            ("POST", r"/api/repos/create", lambda m: self._create_repo(json.loads(body))),
            ("POST", r"/api/validate-yaml", lambda m: self._validate_yaml(json.loads(body))),
            ("GET", rf"/api/models/{_REPO}(?:/revision/(?P<rev>[^/]+))?", self._repo_info),
            (
                "GET",
                rf"/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<sub>.+))?",
                lambda m: self._tree(m, query),
            ),
            (
                "POST",
                rf"/api/models/{_REPO}/branch/(?P<branch>[^/]+)",
                lambda m: self._branch(m, json.loads(body)),
            ),
            (
                "POST",
                rf"/api/models/{_REPO}/preupload/(?P<rev>[^/]+)",
                lambda m: self._preupload(m, json.loads(body)),
            ),
            ("POST", rf"/api/models/{_REPO}/commit/(?P<rev>[^/]+)", lambda m: self._commit(m, body)),
            (
                "POST",
                rf"/{_REPO}\.git/info/lfs/objects/batch",
                lambda m: self._lfs_batch(m, json.loads(body)),
            ),
            ("PUT", r"/lfs-upload/(?P<oid>[0-9a-f]{64})", lambda m: self._lfs_put(m, body)),
            ("POST", r"/lfs-verify", lambda m: self._lfs_verify(json.loads(body))),
            ("GET", rf"/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<file>.+)", lambda m: self._resolve(m, "GET")),
            ("HEAD", rf"/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<file>.+)", lambda m: self._resolve(m, "HEAD")),
        )
        for verb, pattern, handler in routes:
            match = re.fullmatch(pattern, path)
            if verb == method and match:
                with hub.lock:
                    return handler(match)
        raise _Reply(404, f"no route {method} {path} in the fake Hub")

    def _create_repo(self, payload: dict[str, Any]) -> tuple[int, Any, dict]:
        user = self._user(required=True)
        namespace = payload.get("organization") or user
        repo_id = f"{namespace}/{payload['name']}"
        if namespace != user:
            raise _Reply(403, f"You don't have the rights to create a model under the namespace {namespace}")
        if repo_id in self.hub.repos:
            raise _Reply(409, "You already created this model repo")
        private = payload.get("visibility") == "private" or bool(payload.get("private"))
        self.hub.create(repo_id, private=private)
        return 200, {"url": f"{self.hub.url}/{repo_id}", "name": repo_id}, {}

    def _validate_yaml(self, payload: dict[str, Any]) -> tuple[int, Any, dict]:
        content: str = payload["content"]
        errors = []
        match = re.match(r"^---\n(.*?)\n---\n", content, re.DOTALL)
        if match is None:
            return 200, {"errors": [], "warnings": [{"message": "empty or missing yaml metadata"}]}, {}
        try:
            meta = yaml.safe_load(match.group(1))
        except yaml.YAMLError as exc:
            meta, errors = None, [{"message": f"yaml: {exc}"}]
        if meta is not None and not isinstance(meta, dict):
            errors.append({"message": "metadata must be a mapping"})
        elif meta:
            for key in ("tags", "base_model"):
                value = meta.get(key, [])
                values = [value] if isinstance(value, str) else value
                if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                    errors.append({"message": f"{key} must be a string or a list of strings"})
        return (400 if errors else 200), {"errors": errors, "warnings": []}, {}

    def _repo_info(self, m: re.Match[str]) -> tuple[int, Any, dict]:
        repo = self._readable(m["repo"])
        commit = self._revision(repo, unquote(m["rev"] or "main"))
        info = {
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "sha": commit.oid,
            "private": repo.private,
            "author": repo.repo_id.split("/")[0],
            "siblings": [{"rfilename": p} for p in sorted(commit.files)],
        }
        return 200, info, {}

    def _tree(self, m: re.Match[str], query: dict[str, list[str]]) -> tuple[int, Any, dict]:
        commit = self._revision(self._readable(m["repo"]), unquote(m["rev"]))
        prefix = (unquote(m["sub"]) + "/") if m["sub"] else ""
        recursive = query.get("recursive", ["False"])[0].lower() == "true"
        entries, folders = [], set()
        for path in sorted(commit.files):
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix) :]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/")[0])
                continue
            entries.append(commit.files[path].tree_entry(path))
        entries += [{"type": "directory", "oid": git_oid(f.encode()), "size": 0, "path": f} for f in sorted(folders)]
        return 200, entries, {}

    def _branch(self, m: re.Match[str], payload: dict[str, Any]) -> tuple[int, Any, dict]:
        repo = self._writable(m["repo"])
        branch = unquote(m["branch"])
        if branch in repo.branches:
            raise _Reply(409, f"Reference already exists: refs/heads/{branch}")
        start = self._revision(repo, payload.get("startingPoint") or "main")
        repo.branches[branch] = start.oid
        return 200, {}, {}

    def _preupload(self, m: re.Match[str], payload: dict[str, Any]) -> tuple[int, Any, dict]:
        repo = self._writable(m["repo"])
        commit = self._revision(repo, unquote(m["rev"]))
        files = []
        for item in payload["files"]:
            lfs = self.hub._is_lfs(base64.b64decode(item["sample"]), item["size"])
            existing = commit.files.get(item["path"])
            oid = None if existing is None else (existing.sha256 if existing.lfs else existing.oid)
            files.append(
                {
                    "path": item["path"],
                    "uploadMode": "lfs" if lfs else "regular",
                    "shouldIgnore": False,
                    "oid": oid,
                }
            )
        return 200, {"files": files}, {}

    def _lfs_batch(self, m: re.Match[str], payload: dict[str, Any]) -> tuple[int, Any, dict]:
        self._writable(m["repo"])
        if payload.get("operation") != "upload" or "basic" not in payload.get("transfers", ["basic"]):
            raise _Reply(400, "the fake Hub only takes basic LFS uploads")
        objects = []
        for obj in payload["objects"]:
            entry: dict[str, Any] = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in self.hub.lfs_objects:  # present objects get no actions: nothing to send
                entry["actions"] = {
                    "upload": {"href": f"{self.hub.url}/lfs-upload/{obj['oid']}"},
                    "verify": {"href": f"{self.hub.url}/lfs-verify"},
                }
            objects.append(entry)
        return 200, {"transfer": "basic", "objects": objects}, {}

    def _lfs_put(self, m: re.Match[str], body: bytes) -> tuple[int, Any, dict]:
        if hashlib.sha256(body).hexdigest() != m["oid"]:
            raise _Reply(400, f"uploaded bytes do not hash to {m['oid']}")
        self.hub.lfs_objects[m["oid"]] = body
        return 200, {}, {}

    def _lfs_verify(self, payload: dict[str, Any]) -> tuple[int, Any, dict]:
        self._user(required=True)
        data = self.hub.lfs_objects.get(payload["oid"])
        if data is None or len(data) != payload["size"]:
            raise _Reply(404, f"LFS object {payload['oid']} was not uploaded")
        return 200, {}, {}

    def _commit(self, m: re.Match[str], body: bytes) -> tuple[int, Any, dict]:
        repo = self._writable(m["repo"])
        branch = unquote(m["rev"])
        if branch not in repo.branches:
            raise _Reply(404, f"Invalid rev id: {branch}", {"X-Error-Code": "RevisionNotFound"})
        head = repo.commits[repo.branches[branch]]
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = lines[0]["value"]
        parent = header.get("parentCommit")
        if parent is not None and not head.oid.startswith(parent):
            raise _Reply(412, "A commit has happened since. Please refresh and try again.")
        tree = dict(head.files)
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            if key == "file":
                tree[value["path"]] = Blob(base64.b64decode(value["content"]), lfs=False)
            elif key == "lfsFile":
                data = self.hub.lfs_objects.get(value["oid"])
                if data is None:
                    raise _Reply(422, f"LFS object {value['oid']} for {value['path']} was never uploaded")
                tree[value["path"]] = Blob(data, lfs=True)
            elif key == "deletedFile":
                if tree.pop(value["path"], None) is None:
                    raise _Reply(
                        404,
                        f"A file with this name doesn't exist: {value['path']}",
                        {"X-Error-Code": "EntryNotFound"},
                    )
            elif key == "deletedFolder":
                tree = {p: b for p, b in tree.items() if not p.startswith(value["path"].rstrip("/") + "/")}
            else:
                raise _Reply(400, f"unknown commit operation {key!r}")
        commit = self.hub._commit(repo, branch, head.oid, tree, header["summary"])
        return (
            200,
            {
                "success": True,
                "commitOid": commit.oid,
                "commitMessage": header["summary"],
                "commitUrl": f"{self.hub.url}/{repo.repo_id}/commit/{commit.oid}",
                "hookOutput": "",
                "pullRequestUrl": None,
            },
            {},
        )

    def _resolve(self, m: re.Match[str], method: str) -> tuple[int, Any, dict]:
        repo = self._readable(m["repo"])
        commit = self._revision(repo, unquote(m["rev"]))
        blob = commit.files.get(unquote(m["file"]))
        if blob is None:
            raise _Reply(404, "Entry not found", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit.oid})
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{blob.etag}"', "Accept-Ranges": "bytes"}
        data, status = blob.data, 200
        ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if ranged and method == "GET":
            start = int(ranged[1])
            end = int(ranged[2]) if ranged[2] else len(data) - 1
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start : end + 1], 206
        if method == "HEAD":
            headers["Content-Length"] = str(len(data))
            return status, b"", headers
        return status, data, headers
