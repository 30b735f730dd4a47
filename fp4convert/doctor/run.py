"""``doctor_checkpoint``: every check of :mod:`fp4convert.doctor` over one checkpoint, into one report.

Order of work, cheapest first: the scan (config, side files, every shard header, the index), the
model's description, the routing of each engine, structure and building (exclude list) from the
headers; then, unless ``headers_only``, the scale values (scalars and block scales, one module
at a time; the packed data is never read); then the contract, and with a source the provenance
of every byte.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from fp4convert.contract import Contract, load_contract
from fp4convert.dialects import ConfigView, dialect_for_config, get_dialect
from fp4convert.doctor.activations import check_activations
from fp4convert.doctor.building import check_building
from fp4convert.doctor.contract_check import check_contract
from fp4convert.doctor.engines import loader
from fp4convert.doctor.model import describe_model
from fp4convert.doctor.provenance import check_provenance
from fp4convert.doctor.report import ENGINES, DoctorReport, Finding
from fp4convert.doctor.scales import ScaleValues, check_scales
from fp4convert.doctor.scan import Scan, scan_checkpoint
from fp4convert.doctor.siblings import check_siblings
from fp4convert.doctor.structure import check_structure, module_dialect
from fp4convert.errors import ConversionError
from fp4convert.hub import resolve_source

__all__ = ["config_view", "diagnose_scan", "doctor_checkpoint"]


def side_file_quantization(side_files: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """ModelOpt's side file (``hf_quant_config.json``) when it has a ``quantization`` block."""
    content = side_files.get("hf_quant_config.json")
    return content if isinstance(content, Mapping) and isinstance(content.get("quantization"), Mapping) else None


def config_view(scan: Scan) -> ConfigView | None:
    """The config as its dialect reads it: config.json's ``quantization_config``, or ModelOpt's side
    file when config.json has none (SGLang and TensorRT-LLM then read the side file)."""
    quantization = scan.quantization
    if quantization is not None:
        dialect = dialect_for_config(scan.config)
        return None if dialect is None else dialect.read_config(quantization)
    side = side_file_quantization(scan.side_files)
    return get_dialect("modelopt").read_config(side) if side is not None else None


def _loader_findings(report: DoctorReport, engine: str | None, refusals: Mapping[str, str]) -> list[Finding]:
    if engine is not None and engine in refusals:
        return [
            Finding(
                "routing",
                "engine-refuses",
                "error",
                f"{engine} cannot load this checkpoint",
                (),
                {engine: refusals[engine]},
                "write the dialect this engine loads",
                None,
            )
        ]
    if engine is None and len(refusals) == len(ENGINES):
        return [
            Finding(
                "routing",
                "engine-refuses",
                "error",
                "no engine doctor knows loads this checkpoint",
                (),
                dict(refusals),
                "write the quantization_config of a dialect",
                None,
            )
        ]
    return []


def _side_file_findings(scan: Scan, view: ConfigView, engines: tuple[str, ...]) -> list[Finding]:
    if view.dialect != "modelopt" or scan.quantization is None:
        return []
    side = side_file_quantization(scan.side_files)
    if side is None:
        if "trtllm" not in engines:
            return []
        return [
            Finding(
                "routing",
                "side-file-missing",
                "warning",
                "no hf_quant_config.json beside config.json",
                (),
                {"trtllm": "older TensorRT-LLM versions read only hf_quant_config.json"},
                "write hf_quant_config.json from config.json's quantization_config",
                "config",
            )
        ]
    nested = get_dialect("modelopt").read_config(side)
    differs = [
        what
        for what, a, b in (
            ("quant_algo", nested.algo, view.algo),
            ("exclude list", set(nested.excluded), set(view.excluded)),
            ("quantized_layers", dict(nested.listed), dict(view.listed)),
        )
        if a != b
    ]
    # Only TensorRT-LLM reads the side file when config.json has a quantization_config: the nested
    # form's own needs (vLLM's parser) do not apply here, its agreement with config.json does.
    findings: list[Finding] = []
    if differs:
        findings.append(
            Finding(
                "routing",
                "side-file-differs",
                "warning",
                f"hf_quant_config.json and config.json disagree on {', '.join(differs)}",
                ("hf_quant_config.json",),
                {"trtllm": "reads hf_quant_config.json", "sglang": "reads config.json", "vllm": "reads config.json"},
                "write hf_quant_config.json from config.json's quantization_config",
                "config",
            )
        )
    return findings


@contextmanager
def _one_thread() -> Iterator[None]:
    """Run thousands of tiny tensor ops on one thread: with more, each op wakes torch's worker
    threads, which spin, and on a shared machine that costs 5-20x the work (measured: bench/doctor.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _expand(finding: Finding, engines: tuple[str, ...]) -> Finding:
    """``all`` spelled out as the judged engines; engines not judged dropped."""
    spelled: dict[str, str] = {}
    for engine, what in finding.engines.items():
        for name in engines if engine == "all" else (engine,):
            if name in engines:
                spelled[name] = what
    return Finding(
        finding.check,
        finding.code,
        finding.severity,
        finding.message,
        finding.tensors,
        spelled,
        finding.fix,
        finding.repair,
    )


def doctor_checkpoint(
    path: str | Path,
    *,
    contract: str | Path | Contract | None = None,
    source: str | Path | None = None,
    engine: str | None = None,
    headers_only: bool = False,
    revision: str | None = None,
    device: str = "cpu",
) -> DoctorReport:
    """Diagnose a quantized checkpoint before an engine loads it (see :mod:`fp4convert.doctor`).

    Args:
        path: a checkpoint folder or a Hub repo id (safetensors only).
        contract: judge every tensor's format and exceptions against this contract too.
        source: the BF16 source: re-derive every quantized tensor under every profile.
        engine: judge for this engine only (``sglang``, ``vllm``, ``trtllm``); default: every
            engine whose loader the config routes to.
        headers_only: read no tensor data (skips the scale, sibling and provenance checks).
        revision: the Hub revision when ``path`` is a repo id.
        device: where ``source`` re-derivation quantizes.

    Returns:
        The :class:`DoctorReport`; ``report.exit_code`` is 0 when healthy, 1 with errors.

    Raises:
        CheckpointError: the folder has no readable config.json or no readable shard.
        HubError: a repo id that cannot be fetched.

    Example (not run: it needs a checkpoint folder):
        >>> doctor_checkpoint("out", engine="vllm").ok  # doctest: +SKIP
        True
    """
    if engine is not None and engine not in ENGINES:
        raise ConversionError(f"unknown engine {engine!r}", hint=f"use one of {', '.join(ENGINES)}", field="engine")
    if source is not None and headers_only:
        raise ConversionError("--source re-derives tensor data; it cannot run headers-only", hint="drop one of them")
    judged = load_contract(contract) if contract is not None and not isinstance(contract, Contract) else contract
    scan = scan_checkpoint(resolve_source(path, revision=revision))
    try:
        return diagnose_scan(scan, judged, source, engine, headers_only, device)
    finally:
        scan.close()


def diagnose_scan(
    scan: Scan,
    contract: Contract | None,
    source: str | Path | None,
    engine: str | None,
    headers_only: bool,
    device: str,
) -> DoctorReport:
    view = config_view(scan)
    model = describe_model(scan)
    method = (scan.quantization or {}).get("quant_method")
    loaders = {e: loader(e, view, method if isinstance(method, str) else None) for e in ENGINES}
    refusals = {e: ld.refusal for e, ld in loaders.items() if ld.refusal is not None}
    engines = (engine,) if engine is not None else tuple(e for e in ENGINES if e not in refusals)
    spelled = {
        module_dialect(m, view.dialect if view else None)
        for m in model.modules.values()
        if m.format in ("nvfp4", "mxfp8")
    }
    report = DoctorReport(
        str(scan.root),
        dialect=view.dialect if view else None,
        spelling=spelled.pop() if len(spelled) == 1 else None,
        engines=engines,
        loaders={e: ld.describe() for e, ld in loaders.items()},
        mode="headers" if headers_only else "full",
        notes=list(model.notes),
    )
    formats: dict[str, int] = {}
    for module in model.modules.values():
        if module.format != "absent" and (w := model.weight(module.name)) is not None and w.gemm_weight:
            formats[module.format] = formats.get(module.format, 0) + 1
    report.formats = formats
    findings = list(scan.findings) + _loader_findings(report, engine, refusals) + check_structure(view, model, engines)
    values = None if headers_only else ScaleValues(scan, model, view.dialect if view else None)
    if view is not None:
        findings += check_building(view, model, engines or ENGINES)
        findings += _side_file_findings(scan, view, engines)
        findings += check_activations(view, model, values, (engines or ("vllm",))[0])
    if values is not None:
        with _one_thread():
            findings += check_scales(values) + check_siblings(values, model)
    if contract is not None:
        findings += check_contract(contract, model, values)
    if source is not None and values is not None:
        findings += check_provenance(values, model, source, contract, device)
    report.findings = [_expand(f, engines) for f in findings]
    report.sort()
    report.bytes_read = scan.bytes_read
    if headers_only:
        report.notes.append("headers only: scale values, fused siblings' scales and placeholders were not read")
    return report
