"""Hub sources over real HTTP: convert / plan / resolve_source from a repo id, revisions, offline mode."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from _helpers import NVFP4_EXPERTS
from click.testing import CliRunner

from fp4convert.checkpoint.manifest import read_manifest
from fp4convert.cli import cli
from fp4convert.convert.execute import convert_checkpoint
from fp4convert.errors import HubError
from fp4convert.hub import SOURCE_ALLOW_PATTERNS, resolve_model_config, resolve_source

REPO = "Qwen/tiny-moe"
PICKLE = b"\x80\x04\x95 not a real pickle, and never to be fetched"


@pytest.fixture
def source_repo(hub, source_files):
    """The tiny Qwen3-MoE source on the fake Hub, next to a pickle and a README it must not fetch."""
    files = source_files("qwen3_moe")
    commit = hub.push(REPO, {**files, "pytorch_model.bin": PICKLE, "README.md": b"# tiny\n"})
    return files, commit


def test_snapshot_holds_exactly_the_allowed_files_byte_for_byte(hub, source_repo):
    files, commit = source_repo
    snapshot = resolve_source(REPO)
    assert snapshot.name == commit  # huggingface_hub's cache layout: snapshots/<commit>
    assert {p.name: p.read_bytes() for p in snapshot.iterdir()} == files
    assert not hub.requested(path=r"pytorch_model\.bin|README\.md")  # never requested, not even HEAD
    assert hub.requested("GET", rf"^/api/models/{REPO}/revision/main$")
    assert hub.requested("GET", rf"^/api/models/{REPO}/tree/{commit}$")
    assert "*.bin" not in SOURCE_ALLOW_PATTERNS and "*.pt" not in SOURCE_ALLOW_PATTERNS


def test_revision_selects_the_commit(hub, source_repo):
    files, first = source_repo
    config = json.loads(files["config.json"])
    hub.push(REPO, {"config.json": json.dumps({**config, "note": "v2"}).encode()})
    assert json.loads((resolve_source(REPO) / "config.json").read_text())["note"] == "v2"
    old = resolve_source(REPO, revision=first)
    assert old.name == first and (old / "config.json").read_bytes() == files["config.json"]


def test_convert_from_a_repo_id_equals_converting_the_folder(hub, source_repo, converted, tmp_path):
    out = tmp_path / "out"
    convert_checkpoint(REPO, out, contract=NVFP4_EXPERTS)
    remote, local = read_manifest(out), read_manifest(converted())
    assert remote["source"]["location"] == REPO
    assert remote["source"]["repo_id"] == REPO and local["source"]["repo_id"] is None
    assert remote["source"]["commit"] == resolve_source(REPO).name  # the snapshot commit converted
    assert remote["source"]["files"] == local["source"]["files"]
    assert remote["tensors"] == local["tensors"]  # every output tensor's sha256 included


def test_offline_convert_works_from_the_cache_without_a_request(hub, hub_env, source_repo, tmp_path):
    resolve_source(REPO)  # online: fills the cache
    before = len(hub.requests)
    out = tmp_path / "offline-out"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "fp4convert.cli",
            "convert",
            REPO,
            str(out),
            "--contract",
            str(NVFP4_EXPERTS),
            "--quiet",
            "--json",
        ],
        env=hub_env(HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["formats"] == {"bf16": 32, "nvfp4": 24}
    assert len(hub.requests) == before  # the server was up and saw nothing
    assert read_manifest(out)["source"]["location"] == REPO


def test_offline_and_not_cached_says_so(hub, source_repo, monkeypatch):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(
        HubError,
        match=rf"^{REPO} \(source checkpoint\) is not in the local Hub cache and "
        r"HF_HUB_OFFLINE is set; download it once with network access",
    ):
        resolve_source(REPO)
    assert hub.requests == []


def test_unreachable_hub_and_not_cached_says_so(hub, source_repo):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(
        HubError,
        match=rf"^could not reach {closed} \(ConnectError\) and {REPO} \(source "
        r"checkpoint\) is not in the local cache; check the network",
    ):
        resolve_source(REPO, endpoint=closed)


def test_missing_repo_revision_and_weights(hub, source_repo):
    with pytest.raises(HubError, match=r"^no repo Qwen/absent on http://127\.0\.0\.1:\d+, or it is private"):
        resolve_source("Qwen/absent")
    with pytest.raises(HubError, match=rf"^{REPO} has no revision 'v9' on .*; give an existing branch"):
        resolve_source(REPO, revision="v9")
    hub.push("Qwen/pickles-only", {"config.json": b"{}", "pytorch_model.bin": PICKLE})
    with pytest.raises(
        HubError,
        match=r"^Qwen/pickles-only \(revision main\) has no \*\.safetensors weights; "
        r".*never downloads pickles",
    ):
        resolve_source("Qwen/pickles-only")
    assert not hub.requested(path=r"pytorch_model\.bin")


def test_private_repo_needs_the_owners_token(hub, source_files, monkeypatch):
    for repo in ("alice/private-moe", "alice/private-too"):
        hub.create(repo, private=True)
        hub.push(repo, source_files("qwen3_moe"))
    assert (resolve_source("alice/private-moe") / "config.json").is_file()  # HF_TOKEN is alice's
    monkeypatch.delenv("HF_TOKEN")  # (a cached snapshot would still be served: try one never fetched)
    with pytest.raises(HubError, match=r"^no repo alice/private-too on .*, or it is private and the token "):
        resolve_source("alice/private-too")


def test_local_folder_with_a_revision_is_refused(tiny_checkpoint):
    folder = tiny_checkpoint("qwen3_moe")
    with pytest.raises(
        HubError, match=r"^revision main \(--revision\) applies to Hub repo ids, but .* is a local path"
    ):
        resolve_source(folder, revision="main")


def _plan_json(runner: CliRunner, *args: str) -> dict:
    result = runner.invoke(cli, ["plan", "nvfp4-experts-per-token", "--json", "--summary", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_plan_from_a_repo_id_fetches_config_json_only(hub, source_repo, tiny_checkpoint):
    files, first = source_repo
    runner = CliRunner()
    remote = _plan_json(runner, "--model", REPO)
    assert hub.requested("GET", r"/resolve/") == [("GET", f"/{REPO}/resolve/main/config.json")]
    assert remote == _plan_json(runner, "--model", str(tiny_checkpoint("qwen3_moe") / "config.json"))
    wider = {**json.loads(files["config.json"]), "moe_intermediate_size": 64}
    hub.push(REPO, {"config.json": json.dumps(wider).encode()})
    assert _plan_json(runner, "--model", REPO) != remote  # main moved: the new config is fetched
    assert _plan_json(runner, "--model", REPO, "--revision", first) == remote  # pinned to the first commit


def test_model_config_passthrough_and_errors(hub, source_repo):
    assert resolve_model_config("DeepSeek-V3") == "DeepSeek-V3"  # a shipped config name
    hub.push("Qwen/no-config", {"model.safetensors": b"\0" * 16})
    with pytest.raises(HubError, match=r"^Qwen/no-config \(revision main\) has no config\.json"):
        resolve_model_config("Qwen/no-config")
    with pytest.raises(
        HubError, match=r"^revision v1 \(--revision\) applies to Hub repo ids, but DeepSeek-V3 is a local"
    ):
        resolve_model_config("DeepSeek-V3", revision="v1")
