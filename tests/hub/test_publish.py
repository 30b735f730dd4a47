"""publish() over real HTTP against the fake Hub: what arrives, refusals, failures, and retries."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import yaml
from hub.fixtures import TOKEN, USER

from fp4convert.errors import CheckpointError, HubError
from fp4convert.publish import prepare_publication, publish

REPO = f"{USER}/tiny-moe-nvfp4"


@pytest.fixture
def output(converted, tmp_path) -> Path:
    """A private copy of the converted tiny checkpoint (tests may damage it)."""
    return Path(shutil.copytree(converted(), tmp_path / "out"))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _assert_remote_is(hub, output: Path, pub, revision: str = "main") -> None:
    remote = hub.files(REPO, revision)
    local = {p.name: _sha(p.read_bytes()) for p in output.iterdir()}
    assert {path: _sha(data) for path, data in remote.items() if path not in {".gitattributes", "README.md"}} == local
    assert remote["README.md"].decode() == pub.card


def test_publish_creates_the_repo_in_one_commit(hub, output):
    pub = prepare_publication(output, REPO, private=True)
    events = []
    result = publish(pub, progress=lambda event, payload: events.append((event, dict(payload))))
    _assert_remote_is(hub, output, pub)
    history = hub.history(REPO)
    assert [c.title for c in history] == [
        "fp4convert 0.1.0: nvfp4-experts-per-token (modelopt)",
        "initial commit",
    ]  # the Hub's own first commit, then exactly one
    assert hub.repos[REPO].private
    assert result.status == "published" and result.commit == history[0].oid and result.remote_verified
    assert result.created_repo and not result.created_branch
    assert result.url == f"{hub.url}/{REPO}/commit/{result.commit}"
    assert set(result.uploaded) == {f.path for f in pub.files} and result.deleted == ()
    # binary shards went through LFS (one PUT each), JSON and the card as regular git blobs
    shards = sorted(p.name for p in output.glob("*.safetensors"))
    assert len(hub.requested("PUT", r"^/lfs-upload/")) == len(shards)
    blobs = hub.repos[REPO].commits[result.commit].files
    assert sorted(p for p, b in blobs.items() if b.lfs) == shards
    assert not blobs["README.md"].lfs and not blobs["fp4convert.json"].lfs
    assert [e for e, _ in events] == [
        "inspect",
        "create_repo",
        "upload",
        "upload",
        "upload",
        "upload",
        "commit",
        "check",
    ]
    last = events[-3][1]
    assert (last["files"], last["of"], last["bytes"]) == (len(pub.files), len(pub.files), pub.total_bytes)
    meta = yaml.safe_load(pub.card.split("---\n")[1])
    assert "nvfp4" in meta["tags"] and hub.requested("POST", r"^/api/validate-yaml$")


def test_republishing_the_same_folder_changes_nothing(hub, output):
    pub = prepare_publication(output, REPO)
    first = publish(pub)
    puts, commits = len(hub.requested("PUT")), len(hub.history(REPO))
    again = publish(prepare_publication(output, REPO), confirm=lambda plan: pytest.fail("nothing to confirm"))
    assert (again.status, again.commit) == ("unchanged", first.commit)
    assert len(hub.requested("PUT")) == puts and len(hub.history(REPO)) == commits


def test_a_folder_that_does_not_verify_is_refused_before_any_request(hub, output):
    shard = output / "model-00002-of-00008.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01  # one bit of one tensor
    shard.write_bytes(bytes(data))
    with pytest.raises(
        HubError,
        match=r"does not verify, so it is not published: FAILED: 1 of \d+ checks "
        r"\(sha256 model\.layers\..*: bytes differ from the manifest\); "
        r"`fp4convert verify .*` lists every failure",
    ):
        prepare_publication(output, REPO)
    (output / "fp4convert.json").unlink()
    with pytest.raises(CheckpointError, match=r"has no fp4convert\.json: it is not a finished fp4convert output"):
        prepare_publication(output, REPO)
    assert hub.requests == []


def test_pickles_and_subfolders_are_refused(hub, output):
    (output / "training_args.bin").write_bytes(b"\x80\x04")
    with pytest.raises(HubError, match=r"holds training_args\.bin, a pickle file fp4convert never writes"):
        prepare_publication(output, REPO)
    (output / "training_args.bin").unlink()
    (output / "extra").mkdir()
    with pytest.raises(HubError, match=r"holds a folder extra/, which fp4convert does not write"):
        prepare_publication(output, REPO)
    assert hub.requests == []


def test_no_token_is_refused_before_any_request(hub, output, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    pub = prepare_publication(output, REPO)
    with pytest.raises(HubError, match=rf"^no Hugging Face token to publish {REPO} with; set HF_TOKEN"):
        publish(pub)
    assert hub.requests == []


def test_a_token_from_the_saved_login_is_used(hub, output, monkeypatch):
    import huggingface_hub.constants as constants

    monkeypatch.delenv("HF_TOKEN")
    Path(constants.HF_TOKEN_PATH).parent.mkdir(parents=True, exist_ok=True)
    Path(constants.HF_TOKEN_PATH).write_text(TOKEN)  # where `hf auth login` saves it
    assert publish(prepare_publication(output, REPO)).status == "published"


def test_a_rejected_token_is_a_clear_error_without_the_token(hub, output, monkeypatch):
    wrong = "hf_wrongTOKEN_abcdefghijklmnopqrstuvwxyz"
    monkeypatch.setenv("HF_TOKEN", wrong)
    hub.echo_auth_in_errors = True  # a server that echoes the header back must not make us print it
    with pytest.raises(HubError) as caught:
        publish(prepare_publication(output, REPO))
    text = str(caught.value)
    assert text.startswith(f"{hub.url} rejected the token (HTTP 401) while reading {REPO}; set HF_TOKEN")
    assert wrong not in text and wrong not in repr(caught.value.__cause__)
    assert REPO not in hub.repos


def test_an_existing_repo_with_other_content_is_refused_then_replaced(hub, output):
    hub.push(REPO, {"model.safetensors": b"\0bf16 weights", "config.json": b"{}", "README.md": b"# mine\n"})
    before = hub.history(REPO)[0].oid
    pub = prepare_publication(output, REPO)
    with pytest.raises(
        HubError,
        match=rf"^{REPO}@main already holds different content: 14 of the 14 files to "
        r"publish are missing or differ there, 1 of its files are not in .* "
        r"\(e\.g\. model\.safetensors, README\.md, config\.json\); publish to a new "
        r"repo or branch \(--revision, revision=\), or replace its content \(--replace, replace=True\)",
    ):
        publish(pub)
    assert hub.history(REPO)[0].oid == before and not hub.requested("POST", "/commit/")
    plans = []
    result = publish(pub, replace=True, confirm=lambda plan: plans.append(plan) or True)
    assert plans[0].delete == ("model.safetensors",) and "delete 1 files that are not in" in plans[0].describe()
    assert result.deleted == ("model.safetensors",)
    assert hub.history(REPO)[1].oid == before  # one commit on top of what was there
    _assert_remote_is(hub, output, pub)


def test_a_new_branch_starts_from_main_and_leaves_main_alone(hub, output):
    publish(prepare_publication(output, REPO))
    main = hub.history(REPO)[0].oid
    result = publish(prepare_publication(output, REPO, revision="nvfp4"))
    assert result.created_branch and hub.repos[REPO].branches["nvfp4"] == main == result.commit
    assert result.status == "published" and result.uploaded == () and hub.history(REPO)[0].oid == main


def test_a_new_branch_of_a_repo_holding_another_model_is_refused(hub, output):
    hub.push(REPO, {"model.safetensors": b"\0bf16 weights", "config.json": b"{}"})
    with pytest.raises(HubError, match=rf"^{REPO} \(main, where nvfp4 would start\) already holds different"):
        publish(prepare_publication(output, REPO, revision="nvfp4"))
    assert "nvfp4" not in hub.repos[REPO].branches
    result = publish(prepare_publication(output, REPO, revision="nvfp4"), replace=True)
    assert result.created_branch and result.deleted == ("model.safetensors",)  # config.json is overwritten
    assert set(hub.files(REPO, "nvfp4")) - {".gitattributes"} == {f.name for f in output.iterdir()} | {"README.md"}
    assert set(hub.files(REPO, "main")) == {".gitattributes", "model.safetensors", "config.json"}


def test_an_existing_public_repo_is_refused_for_a_private_publication(hub, output):
    hub.create(REPO, private=False)
    with pytest.raises(HubError, match=rf"^{REPO} exists and is public, but a private publication was asked"):
        publish(prepare_publication(output, REPO, private=True))
    assert not hub.requested("POST")


def test_declining_the_confirmation_changes_nothing(hub, output):
    with pytest.raises(HubError, match=rf"^publishing to {REPO} was not confirmed; nothing was changed"):
        publish(prepare_publication(output, REPO), confirm=lambda plan: False)
    assert REPO not in hub.repos and not hub.requested("POST") and not hub.requested("PUT")


def test_a_connection_dropped_mid_upload_is_retried(hub, output):
    hub.fail("PUT", r"^/lfs-upload/", "drop")  # the first shard upload loses its connection halfway
    pub = prepare_publication(output, REPO)
    result = publish(pub)
    shards = len(list(output.glob("*.safetensors")))
    assert len(hub.requested("PUT", r"^/lfs-upload/")) == shards + 1  # huggingface_hub's backoff resent it
    assert result.status == "published"
    _assert_remote_is(hub, output, pub)


def test_a_failed_commit_publishes_nothing_and_the_rerun_resends_no_file(hub, output):
    hub.create(REPO)
    hub.fail("POST", r"/commit/main$", "drop")  # the commit request dies before the server reads it
    pub = prepare_publication(output, REPO)
    with pytest.raises(HubError) as caught:
        publish(pub)
    assert str(caught.value).startswith(
        f"network error while committing to {REPO}@main on {hub.url}: RemoteProtocolError"
    )
    assert "may or may not hold it; run publish again" in str(caught.value)
    assert set(hub.files(REPO)) == {".gitattributes"}  # nothing half-published: the repo is as it was
    puts = len(hub.requested("PUT"))
    assert puts == len(list(output.glob("*.safetensors")))  # ... though the shards reached LFS storage
    result = publish(prepare_publication(output, REPO))
    assert result.status == "published" and len(hub.requested("PUT")) == puts  # resumed: nothing resent
    _assert_remote_is(hub, output, pub)


def test_a_lost_commit_answer_is_an_error_and_the_rerun_finds_it_done(hub, output):
    hub.create(REPO)
    hub.fail("POST", r"/commit/main$", "drop-response")  # committed, but the answer never arrives
    with pytest.raises(HubError, match=r"the answer to the commit was lost, so .* may or may not hold it"):
        publish(prepare_publication(output, REPO))
    assert len(hub.history(REPO)) == 2
    assert publish(prepare_publication(output, REPO)).status == "unchanged"


def test_a_concurrent_commit_makes_the_commit_fail(hub, output):
    hub.create(REPO)

    def someone_else_pushes(plan):
        hub.push(REPO, {"notes.txt": b"pushed meanwhile\n"})
        return True

    with pytest.raises(
        HubError,
        match=rf"^{REPO} changed on .* while committing to {REPO}@main \(another commit "
        r"landed first\); nothing of this run was committed",
    ):
        publish(prepare_publication(output, REPO), confirm=someone_else_pushes)
    assert set(hub.files(REPO)) == {".gitattributes", "notes.txt"}


def test_a_commit_rejected_by_the_server_says_nothing_was_committed(hub, output):
    hub.fail("POST", r"/commit/main$", 422)
    with pytest.raises(
        HubError,
        match=rf"answered HTTP 422 while committing to {REPO}@main: injected HTTP 422; "
        rf"nothing was committed: {REPO}@main is as it was",
    ):
        publish(prepare_publication(output, REPO))
