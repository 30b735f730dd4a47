"""Checkpoints written the way other tools write them, for doctor's corpus (test code only).

Three styles, each from a BF16 tiny checkpoint, with ``safetensors.torch.save_file`` and the
tool's own config spelling:

* ``modelopt``: NVFP4 routed experts (ModelOpt's arithmetic, profile ``modelopt``), gate/up
  sharing ``max(amax)`` as ModelOpt's fused-layer pass does, calibrated ``input_scale =
  amax / 2688``, ``exclude_modules`` as ModelOpt summarises them (prefix wildcards
  ``model.layers.*.self_attn*``), config.json flat form plus hf_quant_config.json.
* ``llmcompressor``: compressed-tensors NVFP4A16 (weight-only) on every decoder Linear, targets
  ``["Linear"]``, ``ignore: ["lm_head", "re:.*mlp.gate$"]``, reciprocal global scales.
* ``miles-mxfp8``: SGLang MXFP8 (``weight_scale_inv``) on every Linear but norms, embeddings,
  routers and lm_head, ``modules_to_not_convert`` with full names.

``faults`` reproduce what those tools get wrong in the field: ``separate-gate-up`` (each
projection its own global scale: llm-compressor's fused regex misses per-expert pairs),
``no-input-scale`` (W4A4 config without activation scales), ``input-ones`` (Miles' 1.0
placeholders without any per-token note), ``no-model-prefix`` (exclude entries without
``model.``), ``no-fused-names`` (q/k/v excluded one by one, but ``self_attn*`` not written).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from fp4convert.formats import profiles, quantize_mxfp8, quantize_nvfp4

_GROUPS = (("gate_proj", "up_proj"), ("q_proj", "k_proj", "v_proj"))
_CALIBRATED_AMAX = 4.0


def _group_amax(tensors: dict[str, torch.Tensor], name: str, separate_gate_up: bool) -> torch.Tensor | None:
    """The amax a fused group shares (the max of its members'), as the tools' fused-layer passes compute it."""
    module, _, _ = name.rpartition(".")
    head, _, last = module.rpartition(".")
    for pieces in _GROUPS:
        if last in pieces and not (separate_gate_up and pieces[0] == "gate_proj"):
            members = [tensors[f"{head}.{p}.weight"] for p in pieces if f"{head}.{p}.weight" in tensors]
            return torch.stack([t.float().abs().amax() for t in members]).amax()
    return None


def _quantized(name: str, style: str) -> bool:
    if not name.endswith(".weight") or "layers." not in name:
        return False
    if style == "modelopt":
        return ".mlp.experts." in name
    return "norm" not in name and not name.endswith(".mlp.gate.weight")


def _exclude(tensors: dict[str, torch.Tensor], style: str, faults: frozenset[str]) -> list[str]:
    """The exclude list as the tool writes it: ModelOpt summarises a BF16 subtree as a prefix
    wildcard (``model.layers.0.self_attn*``) and names routers and lm_head; Miles names modules."""
    bf16 = sorted(
        n.rsplit(".", 1)[0]
        for n, t in tensors.items()
        if n.endswith(".weight") and t.dim() == 2 and "embed" not in n and not _quantized(n, style)
    )
    entries = {"lm_head"}
    for module in bf16:
        if style != "modelopt" or module.endswith(".mlp.gate") or module == "lm_head":
            entries.add(module)
        elif ".self_attn." in module and "no-fused-names" in faults:
            entries.add(module)  # each projection alone: SGLang never sees its qkv_proj excluded
        elif ".self_attn." in module:
            entries.add(module.split(".self_attn.", 1)[0] + ".self_attn*")
        else:
            entries.add(module.split(".mlp.", 1)[0] + ".mlp*")
    if "no-model-prefix" in faults:
        entries = {e.removeprefix("model.") for e in entries}
    return sorted(entries)


def write_peer(source: Path, destination: Path, style: str, faults: frozenset[str] = frozenset()) -> Path:
    """Write ``source`` (a BF16 tiny checkpoint) quantized in ``style`` with ``faults`` to ``destination``."""
    destination.mkdir(parents=True)
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(source.glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
    out: dict[str, torch.Tensor] = {}
    for name, x in tensors.items():
        if not _quantized(name, style):
            out[name] = x
            continue
        module = name.rsplit(".", 1)[0]
        if style == "miles-mxfp8":
            q = quantize_mxfp8(x)
            out[name], out[f"{module}.weight_scale_inv"] = q.data.view(torch.float8_e4m3fn), q.scale
            continue
        profile = "modelopt" if style == "modelopt" else "te"
        amax = _group_amax(tensors, name, "separate-gate-up" in faults)
        n = quantize_nvfp4(x, amax=amax, profile=profile)
        assert n.data is not None and n.scale is not None
        outer = profiles.outer_scales(n.amax, n.profile)  # type: ignore[arg-type]
        if style == "modelopt":
            out[name], out[f"{module}.weight_scale"] = n.data, n.scale.view(torch.float8_e4m3fn)
            out[f"{module}.weight_scale_2"] = outer.s_dec.reshape(())
            if "no-input-scale" not in faults:
                value = 1.0 if "input-ones" in faults else torch.tensor(_CALIBRATED_AMAX) / torch.tensor(2688.0)
                out[f"{module}.input_scale"] = torch.as_tensor(value, dtype=torch.float32).reshape(())
        else:
            out[f"{module}.weight_packed"], out[f"{module}.weight_scale"] = n.data, n.scale.view(torch.float8_e4m3fn)
            out[f"{module}.weight_global_scale"] = outer.s_enc.reshape(1)
    save_file(out, str(destination / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    exclude = _exclude(tensors, style, faults)
    if style == "modelopt":
        group = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
        config["quantization_config"] = {
            "config_groups": {"group_0": {"input_activations": group, "weights": group, "targets": ["Linear"]}},
            "ignore": exclude,
            "quant_algo": "NVFP4",
            "producer": {"name": "modelopt", "version": "0.39.0"},
            "quant_method": "modelopt",
        }
        side = {
            "producer": {"name": "modelopt", "version": "0.39.0"},
            "quantization": {
                "quant_algo": "NVFP4",
                "kv_cache_quant_algo": None,
                "group_size": 16,
                "exclude_modules": exclude,
            },
        }
        (destination / "hf_quant_config.json").write_text(json.dumps(side, indent=2))
    elif style == "llmcompressor":
        weights = {
            "num_bits": 4,
            "type": "float",
            "symmetric": True,
            "group_size": 16,
            "strategy": "tensor_group",
            "dynamic": False,
            "observer": "minmax",
            "scale_dtype": "torch.float8_e4m3fn",
        }
        config["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "format": "nvfp4-pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": weights,
                    "input_activations": None,
                    "output_activations": None,
                    "format": "nvfp4-pack-quantized",
                }
            },
            "ignore": ["lm_head", "re:.*mlp.gate$"],
            "kv_cache_scheme": None,
            "sparsity_config": {},
            "version": "0.12.2",
        }
    else:
        config["quantization_config"] = {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "mxfp8",
            "weight_block_size": [1, 32],
            "scale_fmt": "ue8m0",
            "modules_to_not_convert": exclude,
        }
    (destination / "config.json").write_text(json.dumps(config, indent=2))
    return destination
