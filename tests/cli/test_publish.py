"""``fp4convert publish``: dry run, confirmation, output on stdout / progress on stderr, tokens never shown."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hub import fixtures
from hub.fixtures import TOKEN, USER

from fp4convert.cli import cli
from fp4convert.plan import human_bytes
from fp4convert.publish import prepare_publication

REPO = f"{USER}/tiny-moe-nvfp4"
# The fixtures of tests/hub (its conftest.py hands them to the tests there).
hub, hub_env = fixtures.hub, fixtures.hub_env


@pytest.fixture
def output(converted, tmp_path) -> Path:
    return Path(shutil.copytree(converted(), tmp_path / "out"))


def test_dry_run_lists_every_file_and_prints_the_card_without_a_request(hub, output):
    result = CliRunner().invoke(cli, ["publish", str(output), REPO, "--dry-run"])
    assert result.exit_code == 0, result.output
    pub = prepare_publication(output, REPO)
    lines = result.stdout.splitlines()
    assert lines[0] == (
        f"would publish 14 files ({human_bytes(pub.total_bytes)}) to {REPO}@main; "
        "OK: 172 checks passed (structure and hashes)"
    )
    width = max(len(f"{f.size:,}") for f in pub.files)
    for f, line in zip(pub.files, lines[1:15], strict=True):
        suffix = "  (generated model card)" if f.path == "README.md" else ""
        assert line == f"  {f.size:>{width},}  {f.path}{suffix}"
    assert {f.path for f in pub.files} == {p.name for p in output.iterdir()} | {"README.md"}
    assert lines[16] == "--- README.md (the generated model card) ---"
    assert result.stdout.endswith(pub.card)
    assert hub.requests == []


def test_dry_run_json(hub, output):
    result = CliRunner().invoke(cli, ["publish", str(output), REPO, "--dry-run", "--json", "--private"])
    data = json.loads(result.stdout)
    local = {p.name: p.stat().st_size for p in output.iterdir()}
    assert {f["path"]: f["size"] for f in data["files"] if f["path"] != "README.md"} == local
    assert (data["repo_id"], data["revision"], data["private"]) == (REPO, "main", True)
    assert data["card"] == prepare_publication(output, REPO).card and hub.requests == []


def test_declining_the_prompt_changes_nothing(hub, output):
    result = CliRunner().invoke(cli, ["publish", str(output), REPO], input="n\n")
    assert result.exit_code == 1
    assert f"publish {output} to {REPO}@main on {hub.url}:\n  create the repo (public)\n" in result.stderr
    assert "  upload 14 files (" in result.stderr and "Proceed? [y/N]: n" in result.stderr
    assert REPO not in hub.repos and not hub.requested("POST")


def test_accepting_the_prompt_publishes_with_progress_on_stderr(hub, output):
    result = CliRunner().invoke(cli, ["publish", str(output), REPO, "--revision", "nvfp4"], input="y\n")
    assert result.exit_code == 0, result.output
    head = hub.repos[REPO].branches["nvfp4"]
    pub = prepare_publication(output, REPO, revision="nvfp4")
    assert result.stdout == (
        f"published 14 files ({human_bytes(pub.total_bytes)}) to {REPO}@nvfp4 in commit "
        f"{head[:12]}, remote files checked: {hub.url}/{REPO}/commit/{head}\n"
    )
    for line in (
        f"reading {REPO}@nvfp4 on {hub.url}",
        f"creating {REPO}",
        "creating the branch nvfp4 from main",
        "uploaded 14/14 files",
        "committing 14 files, deleting 0",
        f"checking the remote files of {head[:12]} against the folder",
    ):
        assert line in result.stderr
    assert hub.files(REPO, "nvfp4")["README.md"].decode() == pub.card


def test_yes_json_quiet(hub, output):
    from huggingface_hub.utils import enable_progress_bars

    try:
        result = CliRunner().invoke(cli, ["publish", str(output), REPO, "--yes", "--json", "--quiet"])
    finally:
        enable_progress_bars()  # --quiet switched huggingface_hub's bars off for this process
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["commit"] == hub.repos[REPO].branches["main"] and data["status"] == "published"
    assert data["remote_verified"] is True and data["created_repo"] is True and len(data["uploaded"]) == 14
    assert result.stderr == ""
    again = CliRunner().invoke(cli, ["publish", str(output), REPO, "--yes"])
    assert (
        again.stdout
        == f"{REPO}@main already holds exactly {output} (commit {data['commit'][:12]}): nothing to publish\n"
    )


def test_an_unverified_folder_is_one_error_line(hub, output, capsys):
    from fp4convert.cli import main

    (output / "model-00003-of-00008.safetensors").write_bytes(b"")
    with pytest.raises(SystemExit) as exit_info:
        main(["publish", str(output), REPO, "--yes"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1
    assert err.startswith(f"error[hub]: {output} does not verify, so it is not published: FAILED: ")
    assert f"\n  hint: `fp4convert verify {output}` lists every failure" in err
    assert hub.requests == []


@pytest.mark.parametrize("scenario", ["dry-run", "published", "rejected-token", "dropped-commit"])
def test_the_token_never_appears_in_any_output(hub, hub_env, output, scenario):
    token, env = TOKEN, {"HF_DEBUG": "1"}  # huggingface_hub's debug log of every request, too
    args = ["publish", str(output), REPO, "--yes"]
    expected_code = 0
    if scenario == "dry-run":
        args.append("--dry-run")
    elif scenario == "rejected-token":
        token = "hf_notValidAtAll_0123456789abcdefghijklm"
        hub.echo_auth_in_errors = True  # even a server that echoes the Authorization header
        env = {"FP4CONVERT_DEBUG": "1"}  # and with the traceback
        expected_code = 1
    elif scenario == "dropped-commit":
        hub.fail("POST", r"/commit/main$", "drop")
        expected_code = 1
    run = subprocess.run(
        [sys.executable, "-m", "fp4convert.cli", *args],
        env=hub_env(HF_TOKEN=token, **env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == expected_code, run.stderr[-2000:]
    assert token not in run.stdout and token not in run.stderr
    if scenario == "rejected-token":
        assert hub.requested()  # the token did travel, to the Hub only
        assert f"HubError: {hub.url} rejected the token (HTTP 401) while reading {REPO}" in run.stderr
    if scenario == "published":
        assert "<TOKEN>" in run.stderr  # the debug log ran, and hid the header
        assert hub.repos[REPO].branches["main"][:12] in run.stdout
