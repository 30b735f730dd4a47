"""The shipped golden fixtures: complete, byte-equal, deterministic, and tamper-evident."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from fp4convert.checkpoint.hashing import file_sha256
from fp4convert.cli import cli
from fp4convert.errors import CheckpointError
from fp4convert.formats import profiles
from fp4convert.verify import golden

GOLDEN = Path(__file__).resolve().parents[2] / "golden"


def test_shipped_fixtures_cover_every_variant_kind_and_dtype():
    manifest = json.loads((GOLDEN / "manifest.json").read_text())
    entries = manifest["fixtures"]
    combos = {(e["kind"], e["variant"], e["dtype"]) for e in entries}
    for kind in ("random", "boundary", "zeros", "maxes"):
        for variant in golden.VARIANTS:
            for dtype in ("bfloat16", "float16", "float32"):
                assert (kind, variant, dtype) in combos
    assert any(e["shape"][0] % 128 for e in entries)  # shapes that are not multiples of 128
    assert sum(p.stat().st_size for p in GOLDEN.iterdir()) < 20 * 2**20


def test_shipped_fixtures_cover_every_4over6_profile():
    entries = json.loads((GOLDEN / "manifest.json").read_text())["fixtures"]
    combos = {(e["profile"], e["kind"], e["variant"], e["dtype"]) for e in entries}
    nvfp4_variants = [v for v, params in golden.VARIANTS.items() if params["format"] == "nvfp4"]
    for profile in profiles.FOUR_OVER_SIX_PROFILES:
        for kind in ("random", "boundary", "zeros", "maxes"):
            for variant in nvfp4_variants:
                for dtype in ("bfloat16", "float16", "float32"):
                    assert (profile, kind, variant, dtype) in combos


def test_every_shipped_fixture_is_byte_equal_on_cpu():
    results = list(golden.verify(GOLDEN))
    assert len(results) == len(golden.default_specs())
    bad = [r for r in results if not r.equal]
    assert not bad, bad[:3]


def test_regeneration_is_deterministic(tmp_path):
    manifest = golden.regenerate(tmp_path)
    shipped = json.loads((GOLDEN / "manifest.json").read_text())
    assert manifest["file_sha256"] == shipped["file_sha256"]


def test_fixture_inputs_follow_te_and_flashinfer_constructions():
    rnd = golden.fixture_input(golden.FixtureSpec("random", "nvfp4-1x16-row", "float32", (3, 128)))
    assert rnd[0].eq(0).all() and rnd[1].ne(0).all()
    assert torch.equal(rnd[1:], torch.randn(3, 128, generator=torch.Generator().manual_seed(42))[1:])
    b = golden.fixture_input(golden.FixtureSpec("boundary", "nvfp4-1x16-tensor", "float32", (16, 128)))
    assert b[0, 0].item() == pytest.approx(-12.001) and b[0, 1].item() == pytest.approx(-11.999)
    m = golden.fixture_input(golden.FixtureSpec("maxes", "mxfp8-row", "float16", (3, 128)))
    assert m.eq(65504).all()


@pytest.fixture
def tampered(tmp_path):
    """A copy of the fixtures with one data byte flipped (and the file hash updated to match)."""
    shutil.copytree(GOLDEN, tmp_path / "g")
    path = tmp_path / "g" / "fixtures.safetensors"
    tensors = load_file(str(path))
    key = "random-nvfp4-1x16-tensor-bfloat16-128x128/data"
    tensors[key] = tensors[key].clone()
    tensors[key][5, 7] ^= 0x01
    save_file(tensors, str(path))
    manifest_path = tmp_path / "g" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["file_sha256"] = file_sha256(path)
    manifest_path.write_text(json.dumps(manifest))
    return tmp_path / "g"


def test_a_flipped_byte_is_reported_with_its_position(tampered):
    bad = [r for r in golden.verify(tampered) if not r.equal]
    assert [r.name for r in bad] == ["random-nvfp4-1x16-tensor-bfloat16-128x128"]
    assert bad[0].mismatches["data"].startswith("1 of 8192 bytes differ; first at byte 327:")


def test_cli_verify_exit_codes(tampered):
    runner = CliRunner()
    ok = runner.invoke(cli, ["golden", "verify", "--dir", str(GOLDEN)])
    assert ok.exit_code == 0
    assert ok.output.endswith(
        f"{len(golden.default_specs())}/{len(golden.default_specs())} fixtures byte-equal on cpu\n"
    )
    bad = runner.invoke(cli, ["golden", "verify", "--dir", str(tampered)])
    assert bad.exit_code == 1
    assert bad.output.startswith("DIFF random-nvfp4-1x16-tensor-bfloat16-128x128: data: 1 of 8192 bytes differ")


def test_modified_file_without_manifest_update_is_refused(tmp_path):
    shutil.copytree(GOLDEN, tmp_path / "g")
    with (tmp_path / "g" / "fixtures.safetensors").open("r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(CheckpointError, match=r"does not match the sha256 recorded"):
        list(golden.verify(tmp_path / "g"))


def test_missing_fixtures_say_how_to_create_them(tmp_path):
    with pytest.raises(CheckpointError, match=r"manifest.json is missing; run `fp4convert golden regenerate`"):
        list(golden.verify(tmp_path))
