"""Read a checkpoint for diagnosis: config, side files, every shard header, the index, leniently.

Unlike :func:`fp4convert.checkpoint.open_checkpoint`, which refuses a source at its first problem,
a scan records index and shard problems as findings and goes on with what it can read: a shard
named by the index but missing, a tensor the index maps to a shard that does not hold it, a
tensor in two shards, a shard the index does not know, an unreadable header. Only a folder
without a readable ``config.json`` or without any readable shard cannot be diagnosed
(:class:`~fp4convert.errors.CheckpointError`, exit status 2). Shard names from the index are
untrusted: a name that is not a plain file inside the folder is never opened.

Tensor data is read only on request (:meth:`Scan.read`), one tensor at a time, and counted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from fp4convert.checkpoint.manifest import MANIFEST
from fp4convert.checkpoint.safetensors_io import SafetensorsFile, TensorEntry, read_header
from fp4convert.checkpoint.source import INDEX_NAME, checked_file, shard_name_problem
from fp4convert.dialects import DIALECTS, Dialect, spellings_of, stored_format
from fp4convert.doctor.report import Finding
from fp4convert.errors import CheckpointError

__all__ = ["Module", "Scan", "scan_checkpoint"]

#: Every leaf name some dialect gives a module's data tensor (``weight``, ``weight_packed``).
DATA_LEAVES: frozenset[str] = frozenset(fmt["data"] for cls in DIALECTS.values() for fmt in cls.suffixes.values())
#: Every leaf name some dialect gives a module's other tensors (scales of any kind).
SCALE_LEAVES: frozenset[str] = frozenset(
    {leaf for cls in DIALECTS.values() for fmt in cls.suffixes.values() for leaf in fmt.values()} - DATA_LEAVES
    | {name for cls in DIALECTS.values() for name in cls.activation_scale_names}
)


@dataclass
class Module:
    """One module's tensors, as stored: ``leaves`` maps ``weight``, ``weight_scale``... to entries."""

    name: str
    leaves: dict[str, TensorEntry] = field(default_factory=dict)

    @property
    def dtypes(self) -> dict[str, str]:
        return {leaf: entry.dtype for leaf, entry in self.leaves.items()}

    @property
    def spellings(self) -> list[tuple[str, str]]:
        """``(dialect, format)`` pairs whose tensors this module holds (:func:`spellings_of`)."""
        return spellings_of(self.dtypes)

    @property
    def format(self) -> str:
        """``nvfp4`` / ``mxfp8`` (in some dialect's spelling), ``bf16`` (a high-precision weight),
        ``other`` (quantized in a way no dialect spells), ``absent`` (no weight: a scale alone)."""
        spelled = self.spellings
        if spelled:
            return spelled[0][1]
        fmt = stored_format(self.dtypes)
        if fmt in ("nvfp4", "mxfp8"):
            return "other"  # the data tensor of a format without the scales that go with it
        weight = self.leaves.get("weight")
        if weight is not None and weight.dtype in ("BF16", "F16", "F32"):
            return "bf16"
        return "other" if weight is not None else "absent"

    def partial(self, prefer: str | None = None) -> tuple[Dialect, str] | None:
        """The dialect and format whose data and block-scale tensors this module holds (the data
        with its dtype; the rest may be missing or mistyped), preferring dialect ``prefer``."""
        names = ([prefer] if prefer in DIALECTS else []) + [n for n in DIALECTS if n != prefer]
        dtypes = self.dtypes
        for name in names:
            cls = DIALECTS[name]
            for fmt in sorted(cls.formats, reverse=True):  # nvfp4 first: its data dtype is the stricter
                suffixes = cls.suffixes[fmt]
                if dtypes.get(suffixes["data"]) == cls.output_dtypes[fmt]["data"] and suffixes["scale"] in dtypes:
                    return cls(), fmt
        return None


@dataclass
class Scan:
    """What a scan found; see the module docstring."""

    root: Path
    config: dict[str, Any]
    side_files: dict[str, Any]
    tensors: dict[str, tuple[str, TensorEntry]]  # name -> (shard, entry)
    findings: list[Finding]
    manifest: dict[str, Any] | None = None
    bytes_read: int = 0
    _files: dict[str, SafetensorsFile] = field(default_factory=dict)

    @cached_property
    def modules(self) -> dict[str, Module]:
        found: dict[str, Module] = {}
        for name, (_, entry) in self.tensors.items():
            module, _, leaf = name.rpartition(".")
            found.setdefault(module or name, Module(module or name)).leaves[leaf] = entry
        return found

    @property
    def quantization(self) -> dict[str, Any] | None:
        value = self.config.get("quantization_config")
        return value if isinstance(value, dict) else None

    def read(self, name: str) -> torch.Tensor:
        """Tensor ``name`` (one positional read), counted in :attr:`bytes_read`."""
        shard, entry = self.tensors[name]
        if shard not in self._files:
            self._files[shard] = SafetensorsFile(self.root / shard)
        self.bytes_read += entry.nbytes
        return self._files[shard].read(name)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def _json_file(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text()), None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, str(exc)


def _index_finding(code: str, message: str, tensors: tuple[str, ...], fix: str) -> Finding:
    return Finding("index", code, "error", message, tensors, fix=fix)


def scan_checkpoint(root: str | Path) -> Scan:
    """Scan the checkpoint folder ``root`` (headers only).

    Raises:
        CheckpointError: ``root`` is not a folder, has no readable config.json, or no readable shard.
    """
    root = Path(root)
    if not root.is_dir():
        raise CheckpointError(f"{root} is not a directory", hint="pass a checkpoint folder or a Hub repo id")
    config, error = _json_file(root / "config.json")
    if not isinstance(config, dict):
        raise CheckpointError(
            f"{root}/config.json is missing or not a JSON object ({error or 'not an object'})",
            hint="point at the model's top folder",
            file=str(root / "config.json"),
        )
    findings: list[Finding] = []
    side_files = _side_files(root, findings)
    manifest, _ = _json_file(root / MANIFEST) if (root / MANIFEST).is_file() else (None, None)
    weight_map = _read_index(root, findings)
    present = sorted(p.name for p in root.iterdir() if p.is_file() and p.name.endswith(".safetensors"))
    named = sorted(set(weight_map.values())) if weight_map is not None else []
    tensors = _read_shards(root, sorted(set(present) | set(named)), weight_map or {}, findings)
    if weight_map is not None:
        _compare_index(weight_map, tensors, set(present) - set(named), findings)
    elif len(present) > 1:
        findings.append(
            Finding(
                "index",
                "index-missing",
                "warning",
                f"{len(present)} shards and no {INDEX_NAME}: transformers cannot load it (vLLM and SGLang read every "
                "*.safetensors file)",
                tuple(present),
                fix=f"write {INDEX_NAME}",
                repair="config",
            )
        )
    return Scan(root, config, side_files, tensors, findings, manifest if isinstance(manifest, dict) else None)


def _side_files(root: Path, findings: list[Finding]) -> dict[str, Any]:
    """The dialects' side files present (an unreadable one is a finding)."""
    side_files: dict[str, Any] = {}
    for name in sorted({n for cls in DIALECTS.values() for n in cls.side_file_names}):
        if (root / name).is_file():
            content, error = _json_file(root / name)
            side_files[name] = content
            if not isinstance(content, dict):
                findings.append(
                    Finding("routing", "side-file-unreadable", "error", f"{name}: not a JSON object ({error})")
                )
    return side_files


def _read_shards(
    root: Path, shards: list[str], weight_map: dict[str, str], findings: list[Finding]
) -> dict[str, tuple[str, TensorEntry]]:
    """Every readable shard's header: tensor -> (shard, entry); missing, unreadable and duplicate
    entries are findings."""
    tensors: dict[str, tuple[str, TensorEntry]] = {}
    twice: list[str] = []
    readable = 0
    for shard in shards:
        if not (root / shard).is_file():
            held = tuple(sorted(t for t, s in weight_map.items() if s == shard))
            message = f"{INDEX_NAME} names {shard}, which is not in the folder"
            findings.append(_index_finding("shard-missing", message, held, "re-download it"))
            continue
        try:
            entries, _ = read_header(checked_file(root, shard))
        except CheckpointError as exc:
            findings.append(_index_finding("shard-unreadable", exc.message, (shard,), "re-download the shard"))
            continue
        readable += 1
        for tensor, entry in entries.items():
            if tensor in tensors:
                twice.append(tensor)
            else:
                tensors[tensor] = (shard, entry)
    if not readable:
        raise CheckpointError(
            f"{root} holds no readable *.safetensors shard", hint="download the weights", file=str(root)
        )
    if twice:
        message = "tensors stored in two shards: engines load whichever they meet last"
        findings.append(_index_finding("tensor-twice", message, tuple(sorted(twice)), "remove the stale copy"))
    return tensors


def _read_index(root: Path, findings: list[Finding]) -> dict[str, str] | None:
    """The index's weight map, its unusable entries dropped as findings (None: no index)."""
    if not (root / INDEX_NAME).is_file():
        return None
    data, error = _json_file(root / INDEX_NAME)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        findings.append(
            _index_finding(
                "index-unreadable", f"{INDEX_NAME} has no weight_map object ({error or 'malformed'})", (), "rewrite it"
            )
        )
        return None
    usable: dict[str, str] = {}
    bad: list[str] = []
    for tensor, shard in weight_map.items():
        if shard_name_problem(shard) is not None:
            bad.append(str(tensor))  # never opened: it could point outside the checkpoint
        else:
            usable[str(tensor)] = shard
    if bad:
        findings.append(
            _index_finding(
                "index-bad-name",
                f"{INDEX_NAME} maps tensors to names that are not plain shard files of the folder "
                f"(first: {weight_map[bad[0]]!r}); they were not read",
                tuple(bad),
                "rewrite the index from the shards' headers",
            )
        )
    return usable


def _compare_index(
    weight_map: dict[str, str],
    tensors: dict[str, tuple[str, TensorEntry]],
    unlisted_shards: set[str],
    findings: list[Finding],
) -> None:
    elsewhere = [t for t, s in weight_map.items() if t in tensors and tensors[t][0] != s]
    absent = [t for t, s in weight_map.items() if t not in tensors and s in {v[0] for v in tensors.values()}]
    unindexed = [t for t in tensors if t not in weight_map]
    fix = "rewrite the index from the shards' headers"
    if elsewhere:
        findings.append(
            _index_finding(
                "index-wrong-shard",
                f"{INDEX_NAME} maps tensors to shards that do not hold them",
                tuple(elsewhere),
                fix,
            )
        )
    if absent:
        findings.append(
            _index_finding(
                "index-tensor-missing",
                f"{INDEX_NAME} lists tensors no shard holds",
                tuple(absent),
                "re-download the shards",
            )
        )
    if unindexed:
        findings.append(
            Finding(
                "index",
                "index-tensor-unlisted",
                "error",
                f"tensors in the shards that {INDEX_NAME} does not list: loaders that follow the index never see them"
                + (f" (shards not in the index: {', '.join(sorted(unlisted_shards))})" if unlisted_shards else ""),
                tuple(unindexed),
                fix=fix,
                repair="config",
            )
        )
