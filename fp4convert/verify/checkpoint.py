"""``verify``: prove a converted checkpoint is what its manifest, its dialect and the contract say.

Without the source: every file the index names exists; every tensor has the manifest's dtype,
shape and sha256; nothing is missing or extra; each quantized module carries exactly its dialect's
tensors with the right dtypes; fused NVFP4 siblings share a bit-identical global scale; config.json
routes engines to the dialect's loader; the embedded contract hashes to ``contract_sha256``; the
folder holds no file fp4convert did not write (a stray ``.tmp`` or ``.safetensors``, a ``.py`` an
engine would run with ``trust_remote_code``; only a ``README.md`` is tolerated, which ``publish``
replaces), and the files copied from the source (tokenizer ...) still have the sha256 the manifest
recorded. With the source: every tensor is quantized again from the source (through the one
dequantizer of an FP8 / MXFP4 / fused source) with the embedded contract and compared byte for
byte, the first differing block reported with its values; and every tensor the plan calls lossless
is decoded and compared with the dequantized source bit for bit (:mod:`fp4convert.verify.lossless`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fp4convert.checkpoint.file_hashes import SourceHashes
from fp4convert.checkpoint.hashing import file_sha256, tensor_sha256
from fp4convert.checkpoint.manifest import MANIFEST, read_manifest
from fp4convert.checkpoint.reader import SourceReader
from fp4convert.checkpoint.safetensors_io import TORCH_FORMAT, SafetensorsFile, TensorEntry, read_header
from fp4convert.checkpoint.source import (
    INDEX_NAME,
    DuplicateKeyError,
    checked_file,
    loads_unique,
    open_checkpoint,
    shard_name_problem,
)
from fp4convert.contract import contract_hash, parse_contract
from fp4convert.dialects import Dialect, get_dialect, module_of
from fp4convert.errors import CheckpointError, ContractError
from fp4convert.formats.devices import check_device
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK
from fp4convert.hub import resolve_source
from fp4convert.plan import SharedAmax, input_amax, load_calibration, plan_conversion, quantize_tensor
from fp4convert.verify.lossless import lossless_finding

__all__ = ["TensorCheck", "VerifyReport", "verify_checkpoint"]


@dataclass
class TensorCheck:
    """One finding: the tensor (or file) it concerns, whether it passed, and why not."""

    name: str
    ok: bool
    check: str
    detail: str = ""


@dataclass
class VerifyReport:
    """The verdict on one converted checkpoint: every check made, and whether the source was compared.

    ``ok`` is the verdict, ``failures`` the failed checks, ``summary()`` one line, ``to_json()`` for
    ``verify --json``.
    """

    directory: str
    checks: list[TensorCheck] = field(default_factory=list)
    compared_with_source: bool = False

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[TensorCheck]:
        return [c for c in self.checks if not c.ok]

    def summary(self) -> str:
        bad = self.failures
        what = "structure, hashes and source bytes" if self.compared_with_source else "structure and hashes"
        if not bad:
            return f"OK: {len(self.checks)} checks passed ({what})"
        first = bad[0]
        return f"FAILED: {len(bad)} of {len(self.checks)} checks ({first.check} {first.name}: {first.detail})"

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "ok": self.ok,
            "compared_with_source": self.compared_with_source,
            "checks": len(self.checks),
            "failures": [c.__dict__ for c in self.failures],
        }


def _headers(directory: Path, files: set[str], report: VerifyReport) -> dict[str, tuple[str, TensorEntry]]:
    """tensor name -> (file, entry) over every shard; missing or unreadable files are findings."""
    found: dict[str, tuple[str, TensorEntry]] = {}
    for name in sorted(files, key=str):
        problem = shard_name_problem(name)
        if problem is not None:  # a crafted manifest: never read outside the checkpoint
            report.checks.append(TensorCheck(str(name), False, "file", f"the manifest names a file that {problem}"))
            continue
        path = directory / name
        if not path.is_file():
            report.checks.append(TensorCheck(name, False, "file", "listed in the manifest but missing"))
            continue
        try:
            entries, metadata = read_header(checked_file(directory, name))
        except CheckpointError as exc:
            report.checks.append(TensorCheck(name, False, "file", str(exc)))
            continue
        if metadata.get("format") != TORCH_FORMAT:  # no tensor's bytes show it
            report.checks.append(
                TensorCheck(
                    name,
                    False,
                    "file",
                    f"its header metadata says format {metadata.get('format')!r}, not {TORCH_FORMAT!r} (the header "
                    "was edited; transformers 4.x refuses such a shard: 'does not contain the valid metadata')",
                )
            )
        for tensor, entry in entries.items():
            found[tensor] = (name, entry)
    return found


def _check_config(directory: Path, dialect: Dialect, report: VerifyReport) -> None:
    try:
        config = json.loads((directory / "config.json").read_text())
        quantization = config.get("quantization_config") if isinstance(config, dict) else None
        method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    except (OSError, UnicodeDecodeError, RecursionError, json.JSONDecodeError) as exc:
        report.checks.append(TensorCheck("config.json", False, "config", f"unreadable: {exc}"))
        return
    expected = dialect.quant_method
    report.checks.append(
        TensorCheck(
            "config.json",
            method == expected,
            "config",
            "" if method == expected else f"quant_method {method!r}, expected {expected!r}",
        )
    )
    for side_file in dialect.side_file_names:
        present = (directory / side_file).is_file()
        report.checks.append(TensorCheck(side_file, present, "config", "" if present else "missing"))


def _check_structure(name: str, info: Mapping[str, Any], dialect: Dialect, report: VerifyReport) -> None:
    fmt = info["format"]
    if fmt == "bf16":
        ok = list(info["outputs"]) == [name]
        report.checks.append(TensorCheck(name, ok, "structure", "" if ok else "a BF16 tensor must be copied as is"))
        return
    dtypes = {out: entry["dtype"] for out, entry in info["outputs"].items()}
    for role, out, found in dialect.tensor_problems(name.rsplit(".", 1)[0], fmt, dtypes):
        if found is None:
            report.checks.append(TensorCheck(out, False, "structure", f"{fmt} module lacks its {role} tensor"))
        else:
            expected = dialect.output_dtypes[fmt][role]
            report.checks.append(TensorCheck(out, False, "dtype", f"{role} tensor is {found}, expected {expected}"))


def _check_contract(directory: Path, manifest: Mapping[str, Any], report: VerifyReport) -> None:
    """The embedded contract is a valid contract and hashes to the manifest's ``contract_sha256``."""
    try:
        contract = parse_contract(json.dumps(manifest["contract"]), source=f"{directory}/{MANIFEST}", json_text=True)
    except ContractError as exc:
        report.checks.append(TensorCheck("contract", False, "contract", f"the embedded contract is invalid: {exc}"))
        return
    same = contract_hash(contract) == manifest["contract_sha256"]
    detail = "" if same else "the embedded contract does not hash to contract_sha256: the manifest was edited"
    report.checks.append(TensorCheck("contract", same, "contract", detail))


#: a file fp4convert never writes that verify still accepts (``publish`` replaces it with the card)
TOLERATED_FILES = ("README.md",)


def _check_files(
    directory: Path,
    manifest: Mapping[str, Any],
    dialect: Dialect,
    shards: set[str],
    ignore: set[str],
    report: VerifyReport,
) -> None:
    """Nothing in the folder but what a conversion writes; copied source files unchanged."""
    copied = {
        name: digest
        for name, digest in manifest["source"]["files"].items()
        if not name.endswith(".safetensors") and name != "config.json"
    }
    known = {*shards, *copied, "config.json", INDEX_NAME, MANIFEST, *dialect.side_file_names, *TOLERATED_FILES}
    for entry in sorted(directory.iterdir()):
        if entry.name in ignore:
            continue
        if entry.is_symlink() or entry.name not in known or not entry.is_file():
            kind = "symlink" if entry.is_symlink() else "folder" if entry.is_dir() else "file"
            report.checks.append(
                TensorCheck(entry.name, False, "extra-file", f"a {kind} fp4convert did not write; remove it")
            )
    for name, digest in sorted(copied.items()):
        if shard_name_problem(name + ".safetensors") is not None:  # a crafted manifest: never read outside
            report.checks.append(TensorCheck(name, False, "file", "the manifest names a file outside the checkpoint"))
            continue
        path = directory / name
        if not path.is_file() or path.is_symlink():
            report.checks.append(TensorCheck(name, False, "file", "copied from the source, but missing"))
            continue
        same = file_sha256(path) == digest
        report.checks.append(
            TensorCheck(name, same, "file", "" if same else "differs from the source file the manifest recorded")
        )


def _tensor_bytes(directory: Path, file: str, tensor: str, cache: dict[str, SafetensorsFile]) -> torch.Tensor:
    if file not in cache:
        cache[file] = SafetensorsFile(directory / file)
    return cache[file].read(tensor)


def verify_checkpoint(
    directory: str | Path,
    *,
    source: str | Path | None = None,
    device: str = "cpu",
    read_back: Mapping[str, str] | None = None,
    ignore_files: Iterable[str] = (),
    files: Collection[str] | None = None,
) -> VerifyReport:
    """Verify a converted checkpoint; see the module docstring for what is checked.

    Args:
        directory: the converted checkpoint (holding ``fp4convert.json``).
        source: the BF16 source checkpoint (folder or Hub repo id); when given, every tensor is
            re-quantized from it and compared byte for byte.
        device: where the re-quantization runs.
        read_back: sha256 of tensors already read back from these files (the converter reads every
            write back and compares it with the bytes it hashed); they are not read again.
        ignore_files: names in the folder that are not checked (the converter's resume journal,
            removed after this check).
        files: check the bytes (sha256, and the source comparison) of the tensors stored in these
            shards only (one rank's share, :func:`fp4convert.verify.distributed.verify_distributed`);
            every other check is made in full.

    Returns:
        A :class:`VerifyReport` (``report.ok`` is the verdict).

    Example (not run: it needs a converted checkpoint in ``out`` and its source):
        >>> verify_checkpoint("out", source="Qwen3-30B-A3B").ok  # doctest: +SKIP
        True
    """
    directory = Path(directory)
    if device != "cpu":
        check_device(device)
    manifest = read_manifest(directory)
    report = VerifyReport(str(directory))
    dialect = get_dialect(manifest["dialect"])
    _check_config(directory, dialect, report)
    _check_contract(directory, manifest, report)
    expected: dict[str, Mapping[str, Any]] = {}
    for name, info in manifest["tensors"].items():
        _check_structure(name, info, dialect, report)
        expected.update(info["outputs"])
    share = None if files is None else set(files)  # this rank's shards
    files = {o["file"] for o in expected.values()}
    _check_index(directory, {k: v["file"] for k, v in expected.items()}, report)
    _check_files(directory, manifest, dialect, files, set(ignore_files), report)
    found = _headers(directory, files, report)
    for extra in sorted(set(found) - set(expected)):
        report.checks.append(TensorCheck(extra, False, "extra", f"in {found[extra][0]} but not in the manifest"))
    cache: dict[str, SafetensorsFile] = {}
    try:
        to_hash: dict[str, list[str]] = {}
        for name, out in expected.items():
            if name not in found:
                report.checks.append(TensorCheck(name, False, "missing", f"expected in {out['file']}"))
                continue
            file, entry = found[name]
            if (entry.dtype, list(entry.shape), file) != (out["dtype"], out["shape"], out["file"]):
                report.checks.append(
                    TensorCheck(
                        name,
                        False,
                        "dtype",
                        f"{file}: {entry.dtype} {list(entry.shape)}, "
                        f"expected {out['dtype']} {out['shape']} in {out['file']}",
                    )
                )
                continue
            if share is None or file in share:
                to_hash.setdefault(file, []).append(name)
        known = dict(read_back or {})
        missing = {f: [n for n in names if n not in known] for f, names in to_hash.items()}
        known.update(_hash_tensors(directory, {f: names for f, names in missing.items() if names}))
        for name, digest in ((n, known[n]) for names in to_hash.values() for n in names):
            ok = digest == expected[name]["sha256"]
            report.checks.append(TensorCheck(name, ok, "sha256", "" if ok else "bytes differ from the manifest"))
        _check_shared_scales(directory, manifest, dialect, found, cache, report)
        if source is not None:
            _compare_with_source(directory, manifest, source, device, found, cache, report, share)
    finally:
        for f in cache.values():
            f.close()
    return report


def _check_index(directory: Path, weight_map: Mapping[str, str], report: VerifyReport) -> None:
    index_path = directory / INDEX_NAME
    if not index_path.is_file():
        return
    try:
        index = loads_unique(index_path.read_text())
    except DuplicateKeyError as exc:  # engines would each keep the copy their JSON parser keeps
        report.checks.append(TensorCheck(INDEX_NAME, False, "index", f"lists {exc.args[0]!r} twice"))
        return
    except (OSError, UnicodeDecodeError, RecursionError, json.JSONDecodeError) as exc:
        report.checks.append(TensorCheck(INDEX_NAME, False, "index", f"unreadable: {exc}"))
        return
    found = index.get("weight_map") if isinstance(index, dict) else None
    if found != dict(weight_map):
        report.checks.append(TensorCheck(INDEX_NAME, False, "index", "weight_map differs from the manifest"))


def _hash_tensors(directory: Path, by_file: Mapping[str, list[str]]) -> dict[str, str]:
    """sha256 of each listed tensor; files are read in parallel (hashlib and reads release the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    def hash_file(file: str) -> dict[str, str]:
        with SafetensorsFile(directory / file) as f:
            return {n: tensor_sha256(f.read_bytes(n)) for n in by_file[file]}

    out: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(len(by_file), torch.get_num_threads()))) as pool:
        for digests in pool.map(hash_file, sorted(by_file)):
            out.update(digests)
    return out


def _check_shared_scales(
    directory: Path,
    manifest: Mapping[str, Any],
    dialect: Dialect,
    found: Mapping[str, Any],
    cache: dict[str, SafetensorsFile],
    report: VerifyReport,
) -> None:
    groups: dict[str, list[str]] = {}
    for name, info in manifest["tensors"].items():
        if info["format"] == "nvfp4" and info.get("fused_group"):
            groups.setdefault(info["fused_group"], []).append(name)
    # the global scale as the dialect stores it ([] or [1], F32); any other header is the dtype
    # check's failure, not a value to compare
    stored = (dialect.output_dtypes["nvfp4"]["global"], dialect.global_shape)
    for group, members in groups.items():
        scales = []
        for name in members:
            out = dialect.output_name(module_of(name), "nvfp4", "global")
            if out is not None and out in found and (found[out][1].dtype, found[out][1].shape) == stored:
                scales.append((name, _tensor_bytes(directory, found[out][0], out, cache)))
        same = all(
            torch.equal(s.reshape(-1).view(torch.uint8), scales[0][1].reshape(-1).view(torch.uint8))
            for _, s in scales[1:]
        )
        detail = "" if same else ", ".join(f"{n}: {s.item():.9g}" for n, s in scales)
        report.checks.append(
            TensorCheck(
                group, same, "shared-scale", detail and f"fused siblings carry different global scales ({detail})"
            )
        )


def _first_difference(dialect: Dialect, name: str, fmt: str, actual: torch.Tensor, expected: torch.Tensor) -> str:
    a = actual.reshape(-1).view(torch.uint8)
    e = expected.reshape(-1).view(torch.uint8)
    if a.shape != e.shape:
        return f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    diff = (a != e).nonzero().flatten()
    i = int(diff[0])
    where = f"byte {i}"
    if actual.dim() == 2:
        row, col = divmod(i, actual.shape[1] * actual.element_size())
        # bytes per block: NVFP4 data packs 16 values in 8 bytes, its block scales are one byte each
        data = name == dialect.output_name(module_of(name), fmt, "data")
        per_block = (NVFP4_BLOCK // 2 if data else 1) if fmt == "nvfp4" else MXFP8_BLOCK
        where = f"row {row}, block {col // per_block}"
    return (
        f"{diff.numel()} of {a.numel()} bytes differ; first at {where}: {int(a[i]):#04x} != expected {int(e[i]):#04x}"
    )


def _compare_with_source(
    directory: Path,
    manifest: Mapping[str, Any],
    source: str | Path,
    device: str,
    found: Mapping[str, Any],
    cache: dict[str, SafetensorsFile],
    report: VerifyReport,
    share: Collection[str] | None,
) -> None:
    contract = parse_contract(json.dumps(manifest["contract"]), source=f"{directory}/fp4convert.json", json_text=True)
    dialect = get_dialect(manifest["dialect"], per_token_activations=contract.formats.nvfp4.per_token_activations)
    ckpt = open_checkpoint(resolve_source(source))
    plan = plan_conversion(ckpt, contract, dialect)
    calib_path = manifest["source"].get("calibration")
    calibration = load_calibration(calib_path) if calib_path and Path(calib_path).is_file() else None
    reader = SourceReader(ckpt, hashes=SourceHashes(ckpt, files=()))  # nothing here needs the source hashes
    amaxes = SharedAmax(plan, reader.read)
    report.compared_with_source = True
    try:
        for item in plan.items:
            if share is not None and not any(found.get(n, ("",))[0] in share for n, _, _ in item.outputs):
                continue  # another rank's share
            early = amaxes.take(item.info.name)
            x = early if early is not None else reader.read(item.info.name)
            tensors = quantize_tensor(
                item,
                x,
                dialect=dialect,
                profile=contract.nvfp4_profile,
                amax=amaxes.amax_for(item, x),
                input_amax=input_amax(item, plan.groups, calibration),
                device=device,
            )
            input_name = dialect.output_name(item.module, item.decision.format, "input")
            for name, tensor in tensors.items():
                if name == input_name and calibration is None and calib_path:
                    continue  # calibration file not available here: nothing to recompute it from
                if name not in found:
                    report.checks.append(TensorCheck(name, False, "source", "the contract requires it; it is missing"))
                    continue
                actual = _tensor_bytes(directory, found[name][0], name, cache)
                same = actual.shape == tensor.shape and torch.equal(
                    actual.reshape(-1).view(torch.uint8), tensor.cpu().contiguous().reshape(-1).view(torch.uint8)
                )
                report.checks.append(
                    TensorCheck(
                        name,
                        same,
                        "source",
                        "" if same else _first_difference(dialect, name, item.decision.format, actual, tensor.cpu()),
                    )
                )
            proof = lossless_finding(item, x, tensors, dialect)  # dequantize(output) == dequantize(source)
            if proof is not None:
                report.checks.append(TensorCheck(item.info.name, proof[0], "lossless", proof[1]))
    finally:
        reader.close()
