"""A 4over6 contract end to end: each dialect stores the decode scale the 4over6 bytes need."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from _helpers import NVFP4_EXPERTS, assert_bytes_equal
from safetensors import safe_open

from fp4convert.contract import Contract, load_contract
from fp4convert.convert.execute import convert_checkpoint
from fp4convert.formats import quantize_nvfp4
from fp4convert.formats.codecs import e2m1_decode, e4m3_decode, unpack_fp4
from fp4convert.verify.checkpoint import verify_checkpoint

PREFIX = "model.layers.0.mlp.experts.1"


def four_over_six_contract(tmp_path, mode: str = "mse", bound: int = 256):
    """A copy of the per-token experts contract with 4over6 switched on, written to ``tmp_path``."""
    data = load_contract(NVFP4_EXPERTS).canonical_dict()
    data["name"] = f"experts-4over6-{mode}-{bound}"
    data["formats"]["nvfp4"] |= {"four_over_six": mode, "four_over_six_e4m3_max": bound}
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    Contract.model_validate(data)  # the file is a valid contract
    return path


def _read(directory, names):
    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            out |= {n: f.get_tensor(n) for n in f.keys() if n in names}
    return out


@pytest.mark.parametrize("dialect", ["modelopt", "compressed-tensors"])
def test_4over6_checkpoint_verifies_and_stores_the_decode_scale(tmp_path, tiny_checkpoint, dialect):
    path = four_over_six_contract(tmp_path)
    src = tiny_checkpoint("qwen3_moe")
    out = tmp_path / "out"
    convert_checkpoint(src, out, contract=path, dialect=dialect)
    report = verify_checkpoint(out, source=src)  # re-derives every byte with the 4over6 profile
    assert report.ok, report.summary()
    manifest = json.loads((out / "fp4convert.json").read_text())
    assert manifest["quantizer_profile"] == "te-4over6-mse-256"

    source = _read(src, {f"{PREFIX}.gate_proj.weight", f"{PREFIX}.up_proj.weight"})
    gate, up = source[f"{PREFIX}.gate_proj.weight"], source[f"{PREFIX}.up_proj.weight"]
    shared = torch.maximum(gate.float().abs().amax(), up.float().abs().amax())
    q = quantize_nvfp4(gate, amax=shared, profile="te-4over6-mse-256")
    plain = quantize_nvfp4(gate, amax=shared)
    names = (
        ("weight", "weight_scale", "weight_scale_2")
        if dialect == "modelopt"
        else ("weight_packed", "weight_scale", "weight_global_scale")
    )
    stored = _read(out, {f"{PREFIX}.gate_proj.{n}" for n in names})
    data, scale, glob = (stored[f"{PREFIX}.gate_proj.{n}"] for n in names)
    assert_bytes_equal(data, q.data)
    assert_bytes_equal(scale, q.scale)
    assert not torch.equal(q.scale, plain.scale)  # 4over6 bytes, not plain NVFP4
    s_enc = torch.div(torch.tensor(1536.0), shared)  # S_enc under the 256 bound
    if dialect == "modelopt":  # the decode scale itself: rn32(1 / S_enc)
        assert_bytes_equal(glob.reshape(()), torch.div(torch.tensor(1.0), s_enc))
        decode = glob.reshape(())
    else:  # compressed-tensors stores the encode scale; loaders take its reciprocal
        assert_bytes_equal(glob.reshape(()), s_enc)
        decode = torch.div(torch.tensor(1.0), glob.reshape(()))
    # e2m1 * sf * decode inverts the 4over6 encoding within one E2M1 step of each block's scale
    values = e2m1_decode(unpack_fp4(data)).reshape(gate.shape[0], -1, 16)
    factor = (e4m3_decode(scale.view(torch.uint8)) * decode).unsqueeze(-1)
    err = (values * factor).reshape(gate.shape) - gate.float()
    assert (err.abs().reshape(gate.shape[0], -1, 16) <= factor * 1.01).all()
