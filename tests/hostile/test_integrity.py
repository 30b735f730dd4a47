"""Integrity under hostile conditions: a resume never mixes old and new source bytes, never writes
through a symlink an interrupted folder holds, never trusts a damaged journal; NaN/inf weights are
refused unless allowed, and then recorded; tracebacks (FP4CONVERT_DEBUG=1) carry no token."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import _sources
import pytest
from _helpers import NVFP4_EXPERTS, tree_hashes
from hostile.cases import EXPERT, NORM
from hostile.corpus import INDEX, MANIFEST, assert_error, assert_same_output, edit_tensors, run_cli

from fp4convert.checkpoint.hashing import file_sha256
from fp4convert.convert import execute
from fp4convert.convert.execute import convert_checkpoint
from fp4convert.errors import HubError

JOURNAL = ".fp4convert-journal.json"
TOKEN = "hf_SECRETtokenValue0123456789abcdefgh"


def _convert(src: Path, dst: Path, *extra: object) -> list[object]:
    return ["convert", src, dst, "--contract", NVFP4_EXPERTS, "-q", *extra]


@pytest.fixture
def interrupted(good_inputs, tmp_path):
    """(src, dst, ref): an uninterrupted conversion ``ref`` and a run into ``dst`` stopped (as by
    Ctrl-C) when its third shard began, so DST.partial holds two finished shards and the journal."""
    src = tmp_path / "src"
    shutil.copytree(good_inputs[0], src)
    ref = tmp_path / "ref"
    convert_checkpoint(src, ref, contract=NVFP4_EXPERTS)
    dst = tmp_path / "dst"
    shards = []

    def stop(event, payload):
        if event == "shard":
            shards.append(payload["file"])
            if len(shards) == 3:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(src, dst, contract=NVFP4_EXPERTS, progress=stop)
    assert (tmp_path / "dst.partial" / JOURNAL).is_file()
    return src, dst, ref


@pytest.fixture
def unpublished(good_inputs, tmp_path, monkeypatch):
    """(src, dst): a run into ``dst`` stopped (as by Ctrl-C) after its last shard, before publishing:
    the journal then holds every source file's sha256 (the hashes run on threads beside the
    shards, so a run stopped earlier may or may not have finished a given file's)."""
    src = tmp_path / "src"
    shutil.copytree(good_inputs[0], src)
    dst = tmp_path / "dst"

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(execute, "_publish", stop)
        with pytest.raises(KeyboardInterrupt):
            convert_checkpoint(src, dst, contract=NVFP4_EXPERTS)
    journal = json.loads((tmp_path / "dst.partial" / JOURNAL).read_text())
    assert sorted(journal["sources"]) == sorted(p.name for p in src.glob("*.safetensors"))
    return src, dst


def _flip_a_value(shard: Path) -> None:
    blob = bytearray(shard.read_bytes())
    blob[-5] ^= 0x01  # one value, headers unchanged: only the bytes can tell
    shard.write_bytes(bytes(blob))


def test_resume_refuses_a_source_whose_bytes_changed(unpublished):
    src, dst = unpublished
    first = sorted(src.glob("*.safetensors"))[0]
    _flip_a_value(first)
    staging = dst.with_name("dst.partial")
    before = tree_hashes(staging)
    outcome = run_cli(_convert(src, dst, "--resume"))
    assert_error(outcome, rf"the source changed since the interrupted run: {first.name} had sha256 [0-9a-f]{{16}}")
    assert "--overwrite" in outcome.stderr and tree_hashes(staging) == before
    assert run_cli(_convert(src, dst, "--overwrite")).code == 0


def test_a_resume_hashes_each_recorded_source_file_once(unpublished, tmp_path):
    # the resume checks every file the journal recorded against its sha256 (in parallel), then
    # takes those hashes as they are: before, every file was hashed a second time for the manifest
    src, dst = unpublished
    report = convert_checkpoint(src, dst, contract=NVFP4_EXPERTS, resume=True, workers=4)
    assert len(report.resumed_files) == 8 and report.ranks[0]["hashed_files"] == 0
    files = json.loads((dst / MANIFEST).read_text())["source"]["files"]
    shards = sorted(p.name for p in src.glob("*.safetensors"))
    assert {f: files[f] for f in shards} == {f: file_sha256(src / f) for f in shards}
    fresh = tmp_path / "fresh"
    convert_checkpoint(src, fresh, contract=NVFP4_EXPERTS)
    assert_same_output(dst, fresh)


def test_a_resume_never_mixes_old_and_new_source_bytes(interrupted, tmp_path):
    """Stopped mid-run, the journal may or may not hold a changed file's sha256 (hashing runs
    beside the shards): if it does, the resume is refused; if not, the file's ctime moved, so every
    shard made from it is converted again and the output is that of the new bytes."""
    src, dst, _ = interrupted
    first = sorted(src.glob("*.safetensors"))[0]
    hashed = json.loads((dst.with_name("dst.partial") / JOURNAL).read_text())["sources"]
    _flip_a_value(first)
    outcome = run_cli(_convert(src, dst, "--resume"))
    if first.name in hashed:
        assert_error(outcome, rf"the source changed since the interrupted run: {first.name}")
    else:
        assert outcome.code == 0, outcome.text()
        fresh = tmp_path / "fresh"
        convert_checkpoint(src, fresh, contract=NVFP4_EXPERTS)
        assert_same_output(dst, fresh)


def test_resume_refuses_a_symlink_into_the_source(interrupted):
    src, dst, ref = interrupted
    staging = dst.with_name("dst.partial")
    before = tree_hashes(src)
    for name, target in (
        ("model-00001-of-00008.safetensors", src / "model-00001-of-00008.safetensors"),
        ("generation_config.json", src / "generation_config.json"),  # a copy would write through it
    ):
        link = staging / name
        saved = link.read_bytes() if link.is_file() else None
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        assert_error(run_cli(_convert(src, dst, "--resume")), rf"{name} is a symlink \(to {target}\)")
        assert tree_hashes(src) == before
        link.unlink()
        if saved is not None:
            link.write_bytes(saved)
    assert run_cli(_convert(src, dst, "--resume")).code == 0
    assert_same_output(dst, ref)


def test_a_staging_folder_that_is_a_symlink_is_refused(good_inputs, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(good_inputs[0], src)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "dst.partial").symlink_to(elsewhere)
    for extra in ((), ("--resume",), ("--overwrite",)):
        assert_error(run_cli(_convert(src, tmp_path / "dst", *extra)), r"dst\.partial is a symlink \(to .*elsewhere\)")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize(
    ("journal", "says"),
    [
        ("{not json", r"is unreadable: the interrupted run cannot be resumed"),
        ("[1, 2]", r"is unreadable: the interrupted run cannot be resumed"),
        ('{"fingerprint": "x", "files": 3}', r"is unreadable"),
        (
            '{"fingerprint": "0000", "files": {}, "sources": {}}',
            r"was started with another contract, dialect, options",
        ),
    ],
)
def test_a_damaged_or_foreign_journal_is_refused(interrupted, journal, says):
    src, dst, _ = interrupted
    (dst.with_name("dst.partial") / JOURNAL).write_text(journal)
    outcome = run_cli(_convert(src, dst, "--resume"))
    assert_error(outcome, says)
    assert "--overwrite" in outcome.stderr


def test_resume_refuses_a_stray_file_and_drops_half_written_ones(interrupted):
    src, dst, ref = interrupted
    staging = dst.with_name("dst.partial")
    (staging / "notes.txt").write_text("not ours")
    assert_error(run_cli(_convert(src, dst, "--resume")), r"holds notes\.txt, which this conversion does not write")
    (staging / "notes.txt").unlink()
    (staging / "config.json.tmp").write_text("half")  # what a kill during a JSON write leaves
    (staging / "model-00005-of-00008.safetensors.tmp").write_bytes(b"half")
    assert run_cli(_convert(src, dst, "--resume")).code == 0
    assert_same_output(dst, ref)


def _nan_source(good_inputs, tmp_path) -> Path:
    """A copy of the tiny source with one NaN in a routed expert and one -inf in a norm."""
    src = tmp_path / "src"
    shutil.copytree(good_inputs[0], src)
    edit_tensors(src, EXPERT, lambda t: t[EXPERT].view(-1).__setitem__(3, float("nan")))
    edit_tensors(src, NORM, lambda t: t[NORM].view(-1).__setitem__(0, float("-inf")))
    return src


def test_nonfinite_weights_are_refused_then_allowed_and_recorded(good_inputs, tmp_path):
    src = _nan_source(good_inputs, tmp_path)
    dst = tmp_path / "dst"
    refused = run_cli(_convert(src, dst))
    assert_error(
        refused, rf"2 source tensors hold non-finite values \(1 NaN, 1 inf\):.*{EXPERT}: 1 nan.*{NORM}: 1 inf"
    )
    assert "--allow-nonfinite" in refused.stderr and not dst.exists()
    allowed = run_cli(_convert(src, dst, "--resume", "--allow-nonfinite"))  # keeps every converted shard
    assert allowed.code == 0, allowed.text()
    assert "2 source tensors held NaN/inf values" in allowed.stderr
    manifest = json.loads((dst / MANIFEST).read_text())
    assert manifest["nonfinite"] == {EXPERT: {"nan": 1}, NORM: {"inf": 1}}
    assert run_cli(["verify", dst, "--source", src]).code == 0  # the same bytes, re-derived
    card = run_cli(["publish", dst, "me/tiny", "--dry-run"])
    assert card.code == 0 and "**Non-finite source values.** 2 source tensors held NaN or infinite" in card.stdout
    assert f"`{EXPERT}` (1 nan)" in card.stdout


def test_a_resume_with_allow_nonfinite_converts_nothing_again(good_inputs, tmp_path):
    src = _nan_source(good_inputs, tmp_path)
    dst = tmp_path / "dst"
    with pytest.raises(Exception, match="non-finite"):
        convert_checkpoint(src, dst, contract=NVFP4_EXPERTS)
    report = convert_checkpoint(src, dst, contract=NVFP4_EXPERTS, resume=True, allow_nonfinite=True)
    assert len(report.resumed_files) == 8 and report.nonfinite == {EXPERT: {"nan": 1}, NORM: {"inf": 1}}


def test_a_clean_source_records_no_nonfinite_values(good_inputs):
    manifest = json.loads((good_inputs[1] / MANIFEST).read_text())
    assert manifest["nonfinite"] == {}


def test_debug_tracebacks_never_show_a_token(good_inputs, tmp_path, monkeypatch):
    import fp4convert.convert.execute as execute

    def echoing_server(source, revision=None):
        try:
            raise RuntimeError(f"401 Client Error; request headers: {{'authorization': 'Bearer {TOKEN}'}}")
        except RuntimeError as exc:
            raise HubError(f"the Hub rejected {source} (token {TOKEN})") from exc

    monkeypatch.setattr(execute, "resolve_source", echoing_server)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    argv = _convert("acme/tiny", tmp_path / "dst")
    monkeypatch.setenv("FP4CONVERT_DEBUG", "1")
    debug = run_cli(argv)
    assert debug.code == 1 and "Traceback (most recent call last)" in debug.stderr
    assert "RuntimeError: 401 Client Error" in debug.stderr and "Bearer ***" in debug.stderr
    monkeypatch.delenv("FP4CONVERT_DEBUG")
    plain = run_cli(argv)
    assert_error(plain, r"the Hub rejected acme/tiny \(token \*\*\*\)")
    for outcome in (debug, plain):
        assert TOKEN not in outcome.stderr + outcome.stdout


def test_a_bug_is_an_internal_error_with_how_to_report_it(good_inputs, tmp_path, monkeypatch):
    import fp4convert.convert.execute as execute

    def broken(*args, **kwargs):
        raise ValueError("an invariant broke")

    monkeypatch.setattr(execute, "build_manifest", broken)
    monkeypatch.delenv("FP4CONVERT_DEBUG", raising=False)
    src = tmp_path / "src"
    shutil.copytree(good_inputs[0], src)
    outcome = run_cli(_convert(src, tmp_path / "dst"))
    assert outcome.code == 70 and outcome.escaped is None
    assert outcome.stderr.startswith("error[internal]: ValueError: an invariant broke\n")
    assert "run again with FP4CONVERT_DEBUG=1 and report the traceback" in outcome.stderr
    assert "Traceback" not in outcome.stderr


def test_verify_accepts_a_readme_and_nothing_else_extra(good_inputs, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(good_inputs[1], out)
    (out / "README.md").write_text("# notes")  # publish replaces it with the generated card
    assert run_cli(["verify", out]).code == 0
    for name in (".hidden", "run.sh", INDEX + ".bak"):
        (out / name).write_text("x")
        report = run_cli(["verify", out])
        assert report.code == 1 and f"FAIL extra-file   {name}: a file fp4convert did not write" in report.stdout
        os.unlink(out / name)


@pytest.mark.parametrize("kind", ["fp8", "mxfp4"])
def test_an_interrupted_conversion_of_a_quantized_source_resumes_byte_identical(good_inputs, tmp_path, kind):
    """A decoded source's shards depend on every stored part they are read from (an FP8 weight and
    its scales, one expert's slice of a fused tensor): resume keeps what it may, and the output is
    the uninterrupted one."""
    build = {"fp8": lambda s, d: _sources.fp8_checkpoint(s, d, block=(32, 48)), "mxfp4": _sources.mxfp4_checkpoint}
    src = build[kind](good_inputs[0], tmp_path / "src")
    options = {} if kind == "fp8" else {"max_shard_size": 40_000}  # a one-file source: several output shards
    ref = tmp_path / "ref"
    convert_checkpoint(src, ref, contract=NVFP4_EXPERTS, **options)
    dst = tmp_path / "dst"
    begun = []

    def stop(event, payload):
        if event == "shard":
            begun.append(payload["file"])
            if len(begun) == 3:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(src, dst, contract=NVFP4_EXPERTS, **options, progress=stop)
    before = tree_hashes(src)
    report = convert_checkpoint(src, dst, contract=NVFP4_EXPERTS, **options, resume=True)
    assert tree_hashes(src) == before
    assert_same_output(dst, ref)
    if kind == "fp8":  # sharded source, each shard's inputs hashed by the interrupted run: kept
        assert report.resumed_files, "nothing of the interrupted run was kept"
