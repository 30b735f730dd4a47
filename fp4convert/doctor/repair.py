"""``--fix DST``: repair a checkpoint into a new folder; the checkpoint itself is never touched.

Repairs that need no tensor data: ``quantization_config`` and side files rewritten by the dialect
the tensors are spelled in, from the formats actually stored (exclude list with fused engine
names, the tied lm_head and full module names; ``quantized_layers`` in config.json; routing to
the right loader; weight-only groups labelled weight-only), the index rewritten from the shards'
headers, and for ModelOpt NVFP4 stored without any activation scale the 1.0 placeholders with
the per-token activation mode recorded. With the BF16 source, modules whose scales are wrong
(differing fused siblings, invalid or inconsistent scales, bytes no arithmetic reproduces) are
re-derived, each fused group with one shared amax, under the contract (``--contract``, else the
one embedded in ``fp4convert.json``, else the arithmetic the healthy modules were made with).

Everything is written into ``DST.partial/`` (:mod:`fp4convert.checkpoint.staging`) and diagnosed
again there; it is renamed to ``DST`` only when no error is left, else removed (the report says
what remains), so ``DST`` never holds a repaired copy an engine would still fail on.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from fp4convert.checkpoint.hashing import tensor_sha256
from fp4convert.checkpoint.manifest import MANIFEST
from fp4convert.checkpoint.safetensors_io import SafetensorsFile, StreamingWriter, dtype_name, shard_metadata
from fp4convert.checkpoint.source import INDEX_NAME
from fp4convert.checkpoint.staging import prepare_staging, publish, write_json_atomic
from fp4convert.contract import Contract, Decision, contract_hash, load_contract, parse_contract
from fp4convert.dialects import Dialect, Planned, get_dialect
from fp4convert.doctor.model import Model, describe_model
from fp4convert.doctor.provenance import (
    Arithmetic,
    encode_module,
    expected_arithmetic,
    group_amaxes,
    provenance,
    source_weights,
)
from fp4convert.doctor.report import DoctorReport
from fp4convert.doctor.run import config_view, diagnose_scan, doctor_checkpoint
from fp4convert.doctor.scales import ScaleValues
from fp4convert.doctor.scan import Scan, scan_checkpoint
from fp4convert.errors import ConversionError
from fp4convert.hub import resolve_source

__all__ = ["RepairReport", "repair_checkpoint"]

_PLACEHOLDER_SHARD = "model-doctor-input-scales.safetensors"


@dataclass
class RepairReport:
    """What ``--fix`` wrote: the folder, whether it was published (only when the repaired copy has no
    error left), each repair made, the modules re-derived, and the diagnosis of the repaired copy."""

    destination: str
    published: bool = False
    repairs: list[str] = field(default_factory=list)
    rederived: list[str] = field(default_factory=list)
    before: DoctorReport | None = None
    after: DoctorReport | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "destination": self.destination,
            "published": self.published,
            "repairs": self.repairs,
            "rederived": self.rederived,
            "before": self.before.to_json() if self.before else None,
            "after": self.after.to_json() if self.after else None,
        }


def _embedded_contract(scan: Scan) -> Contract | None:
    if scan.manifest is None or not isinstance(scan.manifest.get("contract"), dict):
        return None
    return parse_contract(json.dumps(scan.manifest["contract"]), source=f"{scan.root}/{MANIFEST}", json_text=True)


def _per_token(scan: Scan, model: Model, values: ScaleValues, contract: Contract | None) -> bool:
    """Whether the repaired config records per-token activations: the contract's word, else what is
    stored (no activation scale, or only 1.0 placeholders)."""
    if contract is not None:
        return contract.formats.nvfp4.per_token_activations
    stored = [values.stored(m, "input") for m, mod in model.modules.items() if mod.format == "nvfp4"]
    return all(v is None or v == 1.0 for v in stored)


def _writer_contract(base: Contract | None, per_token: bool, config: dict[str, Any]) -> Contract:
    """What a dialect's config writer reads from a contract (activation mode, KV cache), nothing else."""
    if base is not None:
        return base
    kv = "fp8_e4m3" if str(config.get("kv_cache_quant_algo") or "").upper() == "FP8" else "bf16"
    return Contract.model_validate(
        {
            "version": 1,
            "name": "doctor-repair",
            "default": "bf16",
            "rules": [{"kind": "exact", "namespace": "hf", "pattern": "lm_head.weight", "format": "bf16"}],
            "formats": {"nvfp4": {"per_token_activations": per_token}},
            "kv_cache": kv,
        }
    )


def _planned(model: Model) -> list[Planned] | None:
    """Every logical tensor with its stored format as the decision (None: a format no dialect writes)."""
    items = []
    for info in model.infos.values():
        module = info.name.rsplit(".", 1)[0]
        fmt = model.modules[module].format if info.gemm_weight and module in model.modules else "bf16"
        if fmt in ("other", "absent"):
            return None
        items.append(Planned(info, Decision(info.name, fmt, None, "stored", "as stored", ())))  # type: ignore[arg-type]
    return items


def _config_files(scan: Scan, dialect: Dialect, contract: Contract, items: list[Planned]) -> dict[str, Any]:
    """config.json and the side files, as ``dialect`` writes them for the stored formats."""
    quantization = dialect.quantization_config(contract, items)
    old = scan.quantization or {}
    if "producer" in old:
        quantization["producer"] = old["producer"]
    config = {k: v for k, v in scan.config.items() if k != "quantization_config"}
    config["quantization_config"] = quantization
    files: dict[str, Any] = {"config.json": config}
    for name, content in dialect.side_files(contract, items).items():
        previous = scan.side_files.get(name)
        if isinstance(previous, dict) and "producer" in previous:
            content["producer"] = previous["producer"]
        files[name] = content
    return files


def _rederive(
    values: ScaleValues, model: Model, modules: set[str], source: str | Path, contract: Contract | None, device: str
) -> dict[str, torch.Tensor]:
    """New bytes for ``modules`` (and every member of their fused groups), each in its stored dtype and shape."""
    groups = model.fused_groups()
    for members in groups.values():
        if modules & set(members):
            modules |= set(members)
    out: dict[str, torch.Tensor] = {}
    with source_weights(source) as weights:
        found = provenance(values, model, weights, device) if contract is None else {}
        usual = Counter(a[0] for m, a in found.items() if a and m not in modules).most_common(1)
        detected = usual[0][0] if usual else Arithmetic("te", "1x16", True)
        shared = group_amaxes(model, weights, device)
        for module in sorted(modules):
            spelled = values.spelling(module)
            info = model.weight(module)
            if spelled is None or info is None or f"{module}.weight" not in weights:
                continue
            dialect, fmt = spelled
            group = info.fused_group
            # without a contract: the arithmetic the healthy modules show, a fused group always sharing its amax
            arithmetic = (
                expected_arithmetic(contract, model, module)
                if contract is not None
                else replace(detected, shared=group in shared)
            )
            amax = shared.get(group) if group and arithmetic.shared else None
            made = encode_module(dialect, fmt, module, weights.read(f"{module}.weight").to(device), arithmetic, amax)
            for name, tensor in made.items():
                stored = values.scan.tensors.get(name)
                # the stored spelling of the shape ([] or [1] for a global scale) where it holds these
                # values; a header whose shape cannot (it lies) gets the dialect's own
                shape = tensor.shape if stored is None else stored[1].shape
                out[name] = tensor.cpu().reshape(shape) if math.prod(shape) == tensor.numel() else tensor.cpu()
    return out


def _placeholders(model: Model, values: ScaleValues, dialect: Dialect) -> dict[str, torch.Tensor]:
    """ModelOpt's 1.0 activation-scale placeholders for NVFP4 modules that store none."""
    out = {}
    for module, stored in model.modules.items():
        spelled = values.spelling(module)
        if stored.format != "nvfp4" or spelled is None or spelled[0].name != "modelopt":
            continue
        if values.leaf_name(module, "input") is None:
            out[f"{module}.{dialect.suffixes['nvfp4']['input']}"] = torch.ones((), dtype=torch.float32)
    return out


def _write(
    scan: Scan,
    staging: Path,
    files: dict[str, Any],
    replaced: dict[str, torch.Tensor],
    extra: dict[str, torch.Tensor],
    manifest: dict[str, Any] | None,
) -> None:
    shards = sorted({shard for shard, _ in scan.tensors.values()})
    for shard in shards:
        entries = sorted((e for s, e in scan.tensors.values() if s == shard), key=lambda e: e.start)
        if not any(e.name in replaced for e in entries):
            shutil.copy2(scan.root / shard, staging / shard)
            continue
        with SafetensorsFile(scan.root / shard) as original:
            layout = [  # a replaced tensor as made (its header may have lied about it), the rest as stored
                (e.name, dtype_name(replaced[e.name].dtype), tuple(replaced[e.name].shape))
                if e.name in replaced
                else (e.name, e.dtype, e.shape)
                for e in entries
            ]
            writer = StreamingWriter(staging / (shard + ".tmp"), layout, original.metadata or None)
            for entry in entries:
                writer.write(entry.name, replaced[entry.name] if entry.name in replaced else original.read(entry.name))
            writer.close()
        (staging / (shard + ".tmp")).rename(staging / shard)
    weight_map = {name: shard for name, (shard, _) in scan.tensors.items()}
    if extra:
        writer = StreamingWriter(
            staging / _PLACEHOLDER_SHARD, [(n, "F32", tuple(t.shape)) for n, t in extra.items()], shard_metadata()
        )
        for name, tensor in extra.items():
            writer.write(name, tensor)
            weight_map[name] = _PLACEHOLDER_SHARD
        writer.close()
    if (scan.root / INDEX_NAME).is_file() or len(set(weight_map.values())) > 1:
        total = sum((staging / s).stat().st_size for s in set(weight_map.values()))
        files[INDEX_NAME] = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    if manifest is not None:
        files[MANIFEST] = manifest
    for name, content in files.items():
        write_json_atomic(staging / name, content)
    for path in sorted(scan.root.iterdir()):
        if (
            path.is_file()
            and not path.name.endswith(".safetensors")
            and path.name not in files
            and path.name != INDEX_NAME
            and (path.name != MANIFEST or manifest is None)
        ):
            shutil.copy2(path, staging / path.name)


def repair_checkpoint(
    path: str | Path,
    destination: str | Path,
    *,
    source: str | Path | None = None,
    contract: str | Path | Contract | None = None,
    engine: str | None = None,
    overwrite: bool = False,
    revision: str | None = None,
    device: str = "cpu",
) -> RepairReport:
    """Diagnose ``path``, write the repaired checkpoint to ``destination``, diagnose that (module docstring).

    Args:
        path: the checkpoint (folder or Hub repo id, ``revision``); only read.
        destination: the new folder (refused when it exists, unless ``overwrite``, or overlaps ``path``).
        source: the BF16 source: re-derive the modules whose scales are wrong.
        contract: the contract to re-derive under and to judge against (default: the one embedded
            in ``fp4convert.json``, if any).
        engine: judge for this engine only.
        device: where re-derivation quantizes.

    Returns:
        The :class:`RepairReport`: what was repaired, and the diagnosis before and after.

    Raises:
        ConversionError: ``destination`` overlaps the checkpoint or exists (without ``overwrite``).
        CheckpointError: the checkpoint cannot be read.
    """
    root = resolve_source(path, revision=revision)
    given = load_contract(contract) if contract is not None and not isinstance(contract, Contract) else contract
    scan = scan_checkpoint(root)
    destination = Path(destination)
    report = RepairReport(str(destination))
    try:
        embedded = _embedded_contract(scan)
        chosen = given or embedded
        before = diagnose_scan(scan, given, source, engine, False, device)
        report.before = before
        model = describe_model(scan)
        view = config_view(scan)
        values = ScaleValues(scan, model, view.dialect if view else None)
        codes = {f.repair for f in before.findings}
        files: dict[str, Any] = {}
        extra: dict[str, torch.Tensor] = {}
        target = before.spelling or (view.dialect if view else None)
        items = _planned(model)
        if "config" in codes and target is not None and items is not None:
            per_token = _per_token(scan, model, values, chosen)
            dialect = get_dialect(target, per_token_activations=per_token)
            files = _config_files(scan, dialect, _writer_contract(chosen, per_token, scan.quantization or {}), items)
            report.repairs.append(
                f"quantization_config and side files rewritten in the {target} dialect from the stored formats"
            )
            if target == "modelopt" and per_token:
                extra = _placeholders(model, values, dialect)
                if extra:
                    report.repairs.append(
                        f"{len(extra)} input_scale = 1.0 placeholders written to {_PLACEHOLDER_SHARD}"
                    )
        replaced: dict[str, torch.Tensor] = {}
        to_rederive = {
            t.rsplit(".", 1)[0] if t.rsplit(".", 1)[0] in model.modules else t
            for f in before.findings
            if f.repair == "rederive"
            for t in f.tensors
        }
        to_rederive = {m for m in to_rederive if m in model.modules}
        if to_rederive and source is not None:
            replaced = _rederive(values, model, to_rederive, source, chosen, device)
            report.rederived = sorted({n.rsplit(".", 1)[0] for n in replaced})
            report.repairs.append(f"{len(report.rederived)} modules re-derived from {source}")
        elif to_rederive:
            report.repairs.append(f"{len(to_rederive)} modules need re-deriving: pass --source to repair them")
        manifest = _manifest(scan, replaced, given, embedded)
        staging = prepare_staging(root, destination, overwrite=overwrite, resumable=False)
        try:
            _write(scan, staging, files, replaced, extra, manifest)
            # Judged before it is published: a repaired copy that still has errors would be a
            # complete-looking folder an engine fails on (or computes wrong values with).
            report.after = doctor_checkpoint(staging, contract=given, source=source, engine=engine, device=device)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if report.after.errors:
            shutil.rmtree(staging, ignore_errors=True)
        else:
            publish(staging, destination)
            report.published = True
    finally:
        scan.close()
    return report


def _manifest(
    scan: Scan, replaced: dict[str, torch.Tensor], given: Contract | None, embedded: Contract | None
) -> dict[str, Any] | None:
    """The manifest to write: the same, with the re-derived tensors' sha256 (they follow its
    contract); None to copy it as it is. A manifest whose contract is not the one re-derived under
    no longer describes the checkpoint and is dropped."""
    if scan.manifest is None or not replaced:
        return None
    if given is not None and embedded is not None and contract_hash(given) != contract_hash(embedded):
        raise ConversionError(
            "the checkpoint's fp4convert.json embeds another contract than --contract; re-deriving under it would "
            "leave a manifest that no longer describes the bytes",
            hint="drop --contract (the embedded one is used), or re-convert the checkpoint",
        )
    manifest = json.loads(json.dumps(scan.manifest))
    for info in manifest.get("tensors", {}).values():
        for name, out in info.get("outputs", {}).items():
            if name in replaced:
                out["sha256"] = tensor_sha256(replaced[name].reshape(-1).view(torch.uint8))
    return manifest
