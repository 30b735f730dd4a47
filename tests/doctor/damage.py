"""Damage for doctor's corpus: plain safetensors and JSON edits of a copied checkpoint, as a broken
tool or a hand edit makes them. Each function returns (or is) a ``damage(folder)`` callable."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from fp4convert.formats import profiles, quantize_nvfp4, to_layout
from fp4convert.formats.codecs import e2m1_decode, e4m3_decode, unpack_fp4

INDEX = "model.safetensors.index.json"


def quantization(folder: Path, edit: Callable[[dict[str, Any]], None], side: bool = True) -> None:
    """Edit config.json's quantization_config (and hf_quant_config.json's ``quantization`` block)."""
    config = json.loads((folder / "config.json").read_text())
    edit(config["quantization_config"])
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    side_file = folder / "hf_quant_config.json"
    if side and side_file.is_file():
        content = json.loads(side_file.read_text())
        inner = content["quantization"]
        if "exclude_modules" in inner:
            inner["ignore"] = inner.pop("exclude_modules")
            edit(inner)
            inner["exclude_modules"] = inner.pop("ignore")
        side_file.write_text(json.dumps(content, indent=2))


def tensors(folder: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    """Edit every shard's tensors in place (removed tensors leave the index too)."""
    index_path = folder / INDEX
    index = json.loads(index_path.read_text()) if index_path.is_file() else None
    for shard in sorted(folder.glob("*.safetensors")):
        content = load_file(str(shard))
        before = set(content)
        edit(content)
        save_file(content, str(shard), metadata={"format": "pt"})
        if index is not None:
            for gone in before - set(content):
                index["weight_map"].pop(gone, None)
            for new in set(content) - before:
                index["weight_map"][new] = shard.name
    if index is not None:
        index_path.write_text(json.dumps(index, indent=2))


def set_value(name: str, value: float) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        def edit(content: dict[str, torch.Tensor]) -> None:
            if name in content:
                content[name] = torch.full_like(content[name], value)

        tensors(folder, edit)

    return damage


def drop(*names: str, prefix: bool = False) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        def edit(content: dict[str, torch.Tensor]) -> None:
            for key in list(content):
                if key in names or (prefix and key.startswith(names)):
                    del content[key]

        tensors(folder, edit)

    return damage


def exclude(edit: Callable[[list[str]], list[str]]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        def change(quant: dict[str, Any]) -> None:
            key = "modules_to_not_convert" if "modules_to_not_convert" in quant else "ignore"
            quant[key] = edit(list(quant[key]))

        quantization(folder, change)

    return damage


def _dequantized(content: dict[str, torch.Tensor], module: str) -> torch.Tensor:
    """A ModelOpt NVFP4 module's weight as engines decode it: e2m1 * block scale * weight_scale_2."""
    packed = content[f"{module}.weight"]
    values = e2m1_decode(unpack_fp4(packed)).reshape(packed.shape[0], -1, 16)
    blocks = e4m3_decode(content[f"{module}.weight_scale"].view(torch.uint8)).unsqueeze(-1)
    return (values * blocks * content[f"{module}.weight_scale_2"].float()).reshape(packed.shape[0], -1)


def requantize(module: str, *, amax_factor: float) -> Callable[[Path], None]:
    """Re-quantize one ModelOpt NVFP4 module from its dequantized values with ``amax_factor`` times
    its amax: a global scale from another amax (a fused sibling then no longer shares its group's)."""

    def damage(folder: Path) -> None:
        def edit(content: dict[str, torch.Tensor]) -> None:
            if f"{module}.weight" not in content:
                return
            w = _dequantized(content, module)
            amax = w.abs().amax() * amax_factor if amax_factor else None
            q = quantize_nvfp4(w, amax=amax)
            assert q.data is not None and q.scale is not None
            content[f"{module}.weight"] = q.data
            content[f"{module}.weight_scale"] = q.scale.view(torch.float8_e4m3fn)
            content[f"{module}.weight_scale_2"] = profiles.outer_scales(q.amax, "te").s_dec.reshape(())

        tensors(folder, edit)

    return damage


def config_edit(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        quantization(folder, edit, side=False)

    return damage


def index_edit(edit: Callable[[dict[str, str]], None]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        index = json.loads((folder / INDEX).read_text())
        edit(index["weight_map"])
        (folder / INDEX).write_text(json.dumps(index, indent=2))

    return damage


def flip_byte(name: str, value: int, offset: int = 0) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        def edit(content: dict[str, torch.Tensor]) -> None:
            if name in content:
                t = content[name].clone()
                t.reshape(-1).view(torch.uint8)[offset] = value
                content[name] = t

        tensors(folder, edit)

    return damage


def swizzle(name: str) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        def edit(content: dict[str, torch.Tensor]) -> None:
            if name in content:
                content[name] = to_layout(content[name].view(torch.uint8), "swizzled").view(torch.float8_e4m3fn)

        tensors(folder, edit)

    return damage


def retype(name: str) -> Callable[[Path], None]:
    return lambda folder: tensors(
        folder, lambda c: c.__setitem__(name, c[name].view(torch.uint8)) if name in c else None
    )


def delete_quantization(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "hf_quant_config.json").unlink()


def modelopt_config_for_mxfp8(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    old = config["quantization_config"]
    config["quantization_config"] = {
        "quant_method": "modelopt",
        "quant_algo": "MXFP8",
        "ignore": old["modules_to_not_convert"],
        "group_size": 32,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def without(entry: str) -> Callable[[list[str]], list[str]]:
    return lambda entries: [e for e in entries if e != entry]


def mtp_dropped(entries: list[str]) -> list[str]:
    """A writer that knew only the decoder layers: explicit layers 0-2, nothing for MTP layer 3."""
    out = []
    for e in entries:
        if e.startswith("model.layers.*."):
            out += [e.replace("*", str(i), 1) for i in range(3)]
        elif not e.startswith("model.layers.3."):
            out.append(e)
    return out


def ct_untarget(quant: dict[str, Any]) -> None:
    for group in quant["config_groups"].values():
        group["targets"] = [t for t in group["targets"] if t != "model.layers.0.self_attn.o_proj"]


def ct_static_inputs(quant: dict[str, Any]) -> None:
    group = next(g for g in quant["config_groups"].values() if g["format"] == "nvfp4-pack-quantized")
    group["input_activations"] = {**group["weights"], "dynamic": "local", "observer": "static_minmax"}


def side_differs(folder: Path) -> None:
    side = json.loads((folder / "hf_quant_config.json").read_text())
    side["quantization"]["exclude_modules"] = ["lm_head"]
    (folder / "hf_quant_config.json").write_text(json.dumps(side, indent=2))
