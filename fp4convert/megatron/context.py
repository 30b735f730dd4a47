"""One ``validate-export`` run: the plan, both sides, and what was found so far.

:class:`Context` is shared by the batched byte check (:mod:`fp4convert.megatron.batches`) and the
slow, diagnosing path (:mod:`fp4convert.megatron.diagnose`): it reads the master's HF pieces on the
validation device (keeping a layer's tensors while they are needed), the exported tensors per
module, and the reference outputs the converter's arithmetic gives for an item, or would give if
exported the faulty way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from fp4convert.checkpoint.safetensors_io import dtype_name
from fp4convert.families import unpack
from fp4convert.formats.uploads import upload
from fp4convert.inventory.dtypes import SAFETENSORS_DTYPES, itemsize
from fp4convert.megatron.encode import encode_group
from fp4convert.megatron.groups import sent_dtype
from fp4convert.megatron.plan import ExportPlan
from fp4convert.megatron.report import ExportReport, Finding
from fp4convert.megatron.resolve import Piece
from fp4convert.plan import PlannedTensor

__all__ = ["Context", "all_same_bytes", "core_outputs", "same_bytes"]


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same elements of the same memory (so the same bytes)."""
    return (
        a.data_ptr() == b.data_ptr()
        and a.device == b.device
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
    )


@dataclass
class Context:
    """One validation run: the plan, both sides, and what was found so far."""

    plan: ExportPlan
    exported: Mapping[str, torch.Tensor]
    master: Mapping[str, torch.Tensor]
    sources: Mapping[str, Piece]
    device: torch.device
    report: ExportReport
    ep_rank: int
    ep_size: int
    rows_on: dict[tuple[str, str], torch.Tensor]
    expected_names: dict[str, PlannedTensor] = field(default_factory=dict)
    structure_failed: list[PlannedTensor] = field(default_factory=list)
    extras: list[str] = field(default_factory=list)
    #: the expected exported tensors in the validator's check order, when all were there as expected
    fetched: list[torch.Tensor] | None = None
    fetched_index: Mapping[str, int] | None = None  # name -> its place in ``fetched``
    master_bytes: int = 0
    _chunk: dict[tuple[str, int | None], torch.Tensor] | None = None
    _references: dict[tuple[Any, ...], dict[str, torch.Tensor]] = field(default_factory=dict)
    _by_module: dict[str, list[str]] | None = None
    _false: torch.Tensor | None = None

    def add(self, finding: Finding) -> None:
        self.report.findings.append(finding)

    def set_cause(self, names: set[str], cause: str) -> None:
        """Give findings on ``names`` that have no cause yet this one."""
        findings = self.report.findings
        for index, finding in enumerate(findings):
            if finding.tensor in names and not finding.cause:
                findings[index] = replace(finding, cause=cause)

    # -- the master -----------------------------------------------------------------------------------

    def begin_chunk(self) -> None:
        """Keep master tensors read from now on until :meth:`end_chunk` (gate and up share one)."""
        self._chunk = {}

    def end_chunk(self) -> None:
        self._chunk = None

    def master_tensor(self, key: str, sub: int | None = None) -> torch.Tensor:
        """Master tensor ``key`` on the validation device, or the ``sub``-th tensor the families'
        :func:`~fp4convert.families.unpack` makes of it (stacked experts, fused MLA down projection)."""
        cache_key = (key, sub)
        if self._chunk is not None and cache_key in self._chunk:
            return self._chunk[cache_key]
        tensor = self.master[key].to(self.device)
        if sub is not None:
            per_rank = self.plan.experts_per_rank(self.ep_size) or None
            subs = unpack(key, tensor, experts_per_rank=per_rank, q_lora_rank=self.plan.config.get("q_lora_rank"))
            assert subs is not None
            tensor = subs[sub][1]
        if self._chunk is not None:
            self._chunk[cache_key] = tensor
        return tensor

    def master_piece(self, item: PlannedTensor | str) -> torch.Tensor:
        """The HF tensor's values from the master, on the validation device (master dtype)."""
        name = item if isinstance(item, str) else item.info.name
        piece = self.sources[name]
        tensor = self.master_tensor(piece.key, piece.sub)
        if piece.whole:
            return tensor
        if len(piece.runs) == 1:
            start, count = piece.runs[0]
            return tensor[start : start + count]
        return tensor.index_select(0, self.rows_index(name))

    def rows_index(self, name: str) -> torch.Tensor:
        """The master rows of HF tensor ``name`` whose rows are interleaved there (QKV), as an index
        on the validation device (made once per tensor and device)."""
        key = (name, str(self.device))
        if key not in self.rows_on:
            (self.rows_on[key],) = upload([self.sources[name].index()], self.device)
        return self.rows_on[key]

    def expected_outputs(
        self, item: PlannedTensor, master_dtypes: Mapping[str, str]
    ) -> list[tuple[str, str, tuple[int, ...]]] | None:
        """The tensors the export must hold for ``item`` (BF16 ones take the master's dtype, given
        per master tensor as its safetensors dtype); None, with a finding, when the master cannot
        provide it."""
        name = item.info.name
        for out, _, _ in item.outputs:
            self.expected_names[out] = item
        piece = self.sources.get(name)
        if piece is None:
            self._master_problem(
                item, f"the master has no tensor holding `{name}` (Megatron: `{item.info.megatron_name}`)"
            )
            return None
        dtype = master_dtypes[piece.key]
        if piece.shape != tuple(item.info.shape):
            self._master_problem(
                item,
                f"master `{piece.key}` gives it shape {list(piece.shape)}, the config says "
                f"{list(item.info.shape)} (pass tensor-parallel-gathered tensors)",
            )
            return None
        self.master_bytes += item.info.numel * (itemsize(dtype) or 2)  # unknown dtypes count as 16-bit
        if item.quantized:
            return list(item.outputs)
        master_dtype = SAFETENSORS_DTYPES.get(dtype)
        sent = dtype if master_dtype is None else dtype_name(sent_dtype(item, master_dtype))
        return [(name, sent, piece.shape)]

    def _master_problem(self, item: PlannedTensor, problem: str) -> None:
        for out, _, _ in item.outputs:
            self.add(Finding(out, "master", problem))

    # -- the export -----------------------------------------------------------------------------------

    def exported_tensor(self, name: str) -> torch.Tensor:
        return self.exported[name].to(self.device)

    def _modules(self) -> dict[str, list[str]]:
        if self._by_module is None:
            self._by_module = {}
            for name in self.exported:
                self._by_module.setdefault(name.rsplit(".", 1)[0], []).append(name)
        return self._by_module

    def module_outputs(self, module: str) -> list[str]:
        """Exported names of one module (``model.layers.0.mlp.experts.3.up_proj``)."""
        return self._modules().get(module, [])

    def module_names(self) -> list[str]:
        """Every module the export holds tensors of."""
        return list(self._modules())

    def bf16_mismatch(self, item: PlannedTensor) -> torch.Tensor:
        """Does the exported BF16 tensor differ from the master's bytes? An int64 ``(1, 1)`` 0/1 on the
        device (a batch's mismatch counts, ready to concatenate)."""
        value = self.master_piece(item)
        sent = self.exported[item.info.name]
        dtype = sent_dtype(item, value.dtype)
        if sent.dtype == dtype and _same_memory(sent, value):
            return self._no_mismatch()  # the master's own tensor was sent: its bytes are the master's
        expected = value.to(dtype).contiguous().reshape(-1).view(torch.uint8)
        actual = sent.to(self.device).contiguous().reshape(-1).view(torch.uint8)
        if expected.device.type == "cpu":  # no temporary the size of the tensor, and no sync to avoid
            return torch.tensor([[int(not torch.equal(actual, expected))]])
        return (actual != expected).any().reshape(1, 1).long()

    def _no_mismatch(self) -> torch.Tensor:
        """One shared zero for the whole run (most BF16 outputs are the master's own tensors: no launch each)."""
        if self._false is None or self._false.device != self.device:
            self._false = torch.zeros((1, 1), dtype=torch.int64, device=self.device)
        return self._false

    # -- references -----------------------------------------------------------------------------------

    def reference(
        self, item: PlannedTensor, *, profile: str | None = None, shared: bool = True
    ) -> dict[str, torch.Tensor]:
        """The core outputs (data, scales, global) ``item`` should have, or would have if exported the
        faulty way, on the CPU. Input scales are checked on their own."""
        members = [self.plan.item(m) for m in self.plan.members(item)]
        if any(m.info.name not in self.sources for m in members):
            members = [item]
        key = (members[0].info.name, profile, shared)
        if key not in self._references:
            xs = [self.master_piece(m) for m in members]
            encoded = encode_group(self.plan, members, xs, profile=profile, shared=shared)
            self._references[key] = {n: t.cpu() for n, t in encoded}
        return {name: self._references[key][name] for name in core_outputs(item)}

    def actual(self, item: PlannedTensor) -> dict[str, torch.Tensor]:
        """The core outputs the export holds for ``item``, on the CPU."""
        return {name: self.exported[name].cpu() for name in core_outputs(item) if name in self.exported}


def core_outputs(item: PlannedTensor) -> list[str]:
    """Output names byte checks cover: data, block scales and global scale (not the input scale)."""
    count = {"nvfp4": 3, "mxfp8": 2}.get(item.decision.format, 1) if item.quantized else 1
    return [name for name, _, _ in item.outputs[:count]]


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape and the same bytes."""
    return a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    )


def all_same_bytes(
    actual: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], rename: Mapping[str, str]
) -> bool:
    """Every expected tensor is in ``actual`` (under its ``rename``, if any) with the same bytes."""
    return all(rename.get(n, n) in actual and same_bytes(actual[rename.get(n, n)], t) for n, t in expected.items())
