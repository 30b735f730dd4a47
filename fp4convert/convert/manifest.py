"""The manifest every converted checkpoint carries (``fp4convert.json``): what the converter records.

The manifest embeds the contract and its hash, the fp4convert version and quantizer profile, the
source files' sha256, the source's formats and dequantizers, and for every source tensor its
decision, its source format, whether it is lossless (and why) and the sha256 of each output
tensor. Its file name, version and reader are :mod:`fp4convert.checkpoint.manifest`; ``verify``
and ``publish`` read it; it is written last, so its presence marks a finished conversion.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import torch

from fp4convert.checkpoint.manifest import MANIFEST, MANIFEST_VERSION
from fp4convert.contract import contract_hash
from fp4convert.plan import ConversionPlan
from fp4convert.version import __version__

__all__ = ["MANIFEST", "build_manifest"]


def build_manifest(
    plan: ConversionPlan,
    sha: Mapping[str, str],
    source_hashes: Mapping[str, str],
    *,
    location: str,
    revision: str | None,
    hub_commit: str | None,
    device: str,
    calibration_path: str | None,
) -> dict[str, Any]:
    """The manifest of a conversion (see the module docstring).

    Args:
        plan: the conversion plan.
        sha: sha256 of every output tensor.
        source_hashes: sha256 of every source file read or copied.
        location: the source as given (folder or repo id).
        revision: the Hub revision asked for.
        hub_commit: the snapshot commit converted (None for a local folder).
        device: where tensors were quantized.
        calibration_path: the calibration file, if any.
    """
    tensors: dict[str, Any] = {}
    formats: dict[str, int] = {}
    for item in plan.items:
        fmt = item.decision.format if item.quantized else "bf16"
        formats[fmt] = formats.get(fmt, 0) + 1
        tensors[item.info.name] = {
            "format": fmt,
            "rule": item.decision.rule,
            "reason": item.decision.reason,
            "role": item.info.role.value,
            "layer": item.info.layer,
            "fused_group": item.decision.fused_group,
            "source_dtype": item.info.dtype,
            "source_format": item.info.source_format,
            "lossless": item.lossless.lossless,
            "lossless_why": item.lossless.why,
            "shape": list(item.info.shape),
            "outputs": {
                name: {"file": item.output_file, "dtype": dtype, "shape": list(shape), "sha256": sha[name]}
                for name, dtype, shape in item.outputs
            },
        }
    nvfp4 = plan.contract.formats.nvfp4
    uses_nvfp4 = formats.get("nvfp4", 0) > 0
    activation = "none" if not uses_nvfp4 else ("per-token" if nvfp4.per_token_activations else "calibrated")
    return {
        "manifest_version": MANIFEST_VERSION,
        "producer": {"name": "fp4convert", "version": __version__, "torch": torch.__version__},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "dialect": plan.dialect.name,
        "quantizer_profile": plan.contract.nvfp4_profile,
        "device": device,
        "activation_mode": activation,
        "contract_sha256": contract_hash(plan.contract),
        "contract": plan.contract.canonical_dict(),
        "source": {
            "location": location,
            # Set only when the source came from the Hub: the repo id and the commit actually used.
            "repo_id": location if hub_commit else None,
            "commit": hub_commit,
            "revision": revision,
            "family": plan.inventory.family,
            "files": dict(source_hashes),
            "calibration": calibration_path,
            # How the source stored its tensors, and the one dequantizer of each quantized format
            # (docs/sources.md): the BF16 master every consumer derives from.
            "formats": plan.source.view().formats(),
            "dequantizers": plan.source.view().dequantizers(),
        },
        "formats": formats,
        "tensors": tensors,
    }
