"""``validate_export``: prove that a live weight update followed the contract, byte for byte.

The export (HF names, the dialect's tensors) is compared with the reference quantizer applied to
the BF16 master (HF or Megatron names). Checks, per HF tensor: every expected tensor is present and
nothing else is; format, dtype and shape are those the contract and dialect give; the bytes equal
the reference (data, block scales, outer scale; fused siblings quantized with their shared amax);
the exported siblings of a fused group carry one outer scale; no ``input_scale`` unless asked for.

Speed is the point (it should run at every sync). What a master's names and shapes fix (row maps,
expected tensors, batches, index tensors) is planned once and cached. The reference is then
computed per layer: on CUDA every tensor of one shape and format is stacked and quantized in one
call with ``scope="expert"`` (one outer amax per stacked tensor: the same bytes as one call per
tensor); on the CPU, where each kernel call is already multi-threaded, tensor by tensor. The
members' amaxes are reduced to their group's shared amax with one ``scatter_reduce``, and the
comparisons produce device booleans that are read back once, at the end. Only tensors that fail
go through the slow, per-tensor diagnosis (:mod:`fp4convert.bridge.diagnose`).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fp4convert.bridge._bytes import bits, same_bytes
from fp4convert.bridge.diagnose import Diagnoser
from fp4convert.bridge.export import check_can_export, input_scale_name
from fp4convert.bridge.files import tensor_metas
from fp4convert.bridge.report import ExportReport, Finding, TensorResult
from fp4convert.bridge.tables import ConfigLike, ContractLike, FamilyLike, ModelTables, Piece, model_tables
from fp4convert.checkpoint.safetensors_io import DTYPES
from fp4convert.convert.groups import group_input_amax, member_amax
from fp4convert.convert.plan import PlannedTensor
from fp4convert.dialects import Dialect, OutputSpec, get_dialect
from fp4convert.errors import MappingError
from fp4convert.formats import kernels
from fp4convert.formats.mxfp8 import quantize_mxfp8
from fp4convert.formats.nvfp4 import quantize_nvfp4

__all__ = ["ExportValidator", "validate_export", "validate_export_files"]

#: master bytes one batch of experts may span (larger layers are validated in expert chunks)
UNIT_BYTES = 4 * 10**9


@dataclass
class Source:
    """One expected HF tensor: its decision, where it is in the master, what the export must hold.

    Attributes:
        item: the HF tensor and its contract decision.
        piece: where its BF16 values sit in the master.
        outputs: the exported tensors expected for it (name, safetensors dtype, shape).
        roles: data / scale / global / input -> output name (quantized tensors only).
        input_scale: the expected activation scale, when the export must carry one.
    """

    item: PlannedTensor
    piece: Piece
    outputs: tuple[OutputSpec, ...]
    roles: dict[str, str] = field(default_factory=dict)
    input_scale: torch.Tensor | None = None

    @property
    def name(self) -> str:
        return self.item.info.name

    @property
    def format(self) -> str:
        return self.item.decision.format if self.item.quantized else "bf16"


@dataclass
class _Batch:
    """Sources of one format, tile and shape in one unit (stacked together on CUDA).

    Attributes:
        whole: master tensors whose stack, reshaped to ``(len(sources), rows, cols)``, is exactly the
            sources in order (e.g. each expert's ``linear_fc1`` = its gate and up rows), so the
            batch is one stack of whole tensors without slicing; None when the pieces do not tile
            whole master tensors in order (QKV rows).
    """

    fmt: str
    tile: str
    rows: int
    cols: int
    sources: list[int]
    whole: list[str] | None = None


def _whole_sources(pieces: list[Piece], master_rows: Mapping[str, int]) -> list[str] | None:
    """The master tensors ``pieces`` tile in order, row range after row range (see :class:`_Batch`)."""
    keys: list[str] = []
    row = 0
    for piece in pieces:
        rows = piece.rows
        if rows is None:
            start, stop = 0, master_rows[piece.source]
        elif isinstance(rows, slice):
            start, stop = rows.start, rows.stop
        else:
            return None
        if start == 0 and row == 0:
            keys.append(piece.source)
        elif start != row or piece.source != keys[-1]:
            return None
        row = 0 if stop == master_rows[piece.source] else stop
    if row != 0 or len({master_rows[key] for key in keys}) != 1:  # torch.stack needs one shape
        return None
    return keys


class _Unit:
    """Sources validated together: one layer (or a chunk of its experts), closed under fused groups."""

    def __init__(self, sources: list[int], plan: ValidationPlan) -> None:
        batches: dict[tuple[str, str, int, int], list[int]] = {}
        self.bf16: list[int] = []
        for index in sources:
            src = plan.sources[index]
            if src.format == "bf16":
                self.bf16.append(index)
                continue
            rows, cols = src.item.info.shape
            tile = getattr(src.item.decision.recipe, "tile", "1x32")
            batches.setdefault((src.format, tile, rows, cols), []).append(index)
        self.batches = [
            _Batch(f, t, r, c, members, _whole_sources([plan.sources[i].piece for i in members], plan.master_rows))
            for (f, t, r, c), members in batches.items()
        ]
        self.master_keys = sorted({plan.sources[i].piece.source for i in sources})
        # NVFP4 sources in batch order, each with its shared-amax slot and its group's first member.
        self.nvfp4 = [i for b in self.batches if b.fmt == "nvfp4" for i in b.sources]
        slot_of: dict[str, int] = {}
        slots, first = [], []
        for position, index in enumerate(self.nvfp4):
            key = plan.sources[index].item.decision.fused_group or plan.sources[index].name
            if key not in slot_of:
                slot_of[key] = len(slot_of)
                first.append(position)
            slots.append(slot_of[key])
        self.num_slots = len(slot_of)
        self._slots = torch.tensor(slots, dtype=torch.int64)
        self._first = torch.tensor([first[s] for s in slots], dtype=torch.int64)
        self._on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def indices(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(slot of each NVFP4 source, position of its group's first member), on ``device`` (cached)."""
        if device not in self._on_device:
            self._on_device[device] = (self._slots.to(device), self._first.to(device))
        return self._on_device[device]


class ValidationPlan:
    """What to expect from one master (its names and shapes), decided once and reused at every sync."""

    def __init__(
        self,
        tables: ModelTables,
        dialect: Dialect,
        master: Mapping[str, tuple[str, tuple[int, ...]]],
        *,
        ep_rank: int,
        ep_size: int,
        include_input_scale: bool,
        calibration: Mapping[str, float] | None,
        unit_bytes: int,
    ) -> None:
        self.naming = tables.naming(master)
        self.candidates: dict[str, Piece] = {}  # every HF tensor the master holds (EP diagnosis uses all)
        self.master_dtype: dict[str, str] = {}
        self.master_rows = {key: shape[0] if shape else 1 for key, (_, shape) in master.items()}
        for key, (dtype, shape) in master.items():
            if self.naming == "hf":
                tables.check_shape(key, shape, key, shape)
                pieces: tuple[Piece, ...] = (Piece(key, key, None, shape),)
            else:
                pieces = tables.pieces(key, shape, ep_rank=ep_rank, ep_size=ep_size)
            for piece in pieces:
                if piece.name in self.candidates:
                    raise MappingError(
                        f"the master holds `{piece.name}` twice (from `{self.candidates[piece.name].source}` "
                        f"and `{key}`)",
                        hint="pass each master tensor once, in one expert layout",
                        tensor=key,
                    )
                self.candidates[piece.name] = piece
                self.master_dtype[piece.name] = dtype
        experts = tables.experts_on_rank(ep_rank, ep_size) if self.naming == "hf" else None
        order = {name: n for n, name in enumerate(tables.infos)}
        expected = sorted(
            (name for name in self.candidates if experts is None or tables.infos[name].expert in (None, *experts)),
            key=order.__getitem__,
        )
        self.sources = [self._source(tables, dialect, name, include_input_scale, calibration) for name in expected]
        self.index = {src.name: i for i, src in enumerate(self.sources)}
        self.expected_outputs = {spec[0]: i for i, src in enumerate(self.sources) for spec in src.outputs}
        #: name -> (dtype, shape) of every tensor an exact export holds: one comparison at every sync
        self.expected_metas = {
            name: (dtype, tuple(shape)) for src in self.sources for name, dtype, shape in src.outputs
        }
        self.groups: dict[str, list[int]] = {}
        for i, src in enumerate(self.sources):
            group = src.item.decision.fused_group
            if src.format == "nvfp4" and group and len(tables.members(src.name)) > 1:
                self.groups.setdefault(group, []).append(i)
        for group, members in self.groups.items():
            absent = [m for m in tables.groups[group] if m not in self.index]
            if absent:
                raise MappingError(
                    f"the master lacks `{absent[0]}`, which shares one outer scale with "
                    f"`{self.sources[members[0]].name}`",
                    hint="pass every member of a fused group in the master",
                    tensor=absent[0],
                )
        self.units = self._units(unit_bytes)
        self.master_bytes = sum(self.nbytes(i) for i in range(len(self.sources)))

    def _source(
        self,
        tables: ModelTables,
        dialect: Dialect,
        name: str,
        include_input_scale: bool,
        calibration: Mapping[str, float] | None,
    ) -> Source:
        item = tables.planned(name)
        piece = self.candidates[name]
        if not item.quantized:  # passed through as the master holds it
            return Source(item, piece, ((name, self.master_dtype[name], piece.shape),))
        dropped = None if include_input_scale else input_scale_name(item, dialect)
        outputs = tuple(spec for spec in dialect.layout(item) if spec[0] != dropped)
        suffixes = dialect.suffixes[item.decision.format]
        roles = {role: f"{item.module}.{suffix}" for role, suffix in suffixes.items()}
        roles = {role: out for role, out in roles.items() if out in {spec[0] for spec in outputs}}
        input_scale = None
        if "input" in roles:
            amax = group_input_amax(tables.members(name), calibration)
            input_scale = dialect.input_scale(amax).reshape(())
        return Source(item, piece, outputs, roles, input_scale)

    def nbytes(self, index: int) -> int:
        """Master bytes of source ``index``."""
        src = self.sources[index]
        return _numel(src.piece.shape) * DTYPES[self.master_dtype[src.name]].itemsize

    def _units(self, unit_bytes: int) -> list[_Unit]:
        # One unit per layer; a layer's experts are split into chunks of at most unit_bytes of master.
        by_layer: dict[int | None, list[int]] = {}
        for i, src in enumerate(self.sources):
            by_layer.setdefault(src.item.info.layer, []).append(i)
        units = []
        for members in by_layer.values():
            plain = [i for i in members if self.sources[i].item.info.expert is None]
            experts: dict[int, list[int]] = {}
            for i in members:
                if (e := self.sources[i].item.info.expert) is not None:
                    experts.setdefault(e, []).append(i)
            if plain:
                units.append(_Unit(plain, self))
            chunk: list[int] = []
            size = 0
            for sources in experts.values():
                nbytes = sum(self.nbytes(i) for i in sources)
                if chunk and size + nbytes > unit_bytes:
                    units.append(_Unit(chunk, self))
                    chunk, size = [], 0
                chunk += sources
                size += nbytes
            if chunk:
                units.append(_Unit(chunk, self))
        return units


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class ExportValidator:
    """Validates exports of one model under one contract; keep it to reuse its plans across syncs.

    Args:
        contract: a :class:`~fp4convert.contract.Contract`, a contract file or a shipped name.
        config: the model's config.json (parsed, a path, a checkpoint folder or a shipped name).
        family: the model family; default: the config's.
        dialect: the dialect the export is in.
        ep_rank: the EP rank whose export is checked (an HF master is then restricted to the experts
            this rank holds; a Megatron master holds this rank's experts under local ids).
        ep_size: the expert-parallel size.
        include_input_scale: the export must carry the activation scales (as a checkpoint does);
            by default it must not (a live update never re-sends them).
        calibration: ``{module: activation amax}`` for the expected activation scales, when the
            contract quantizes activations per tensor and ``include_input_scale`` is set.
        diagnose: how many failing tensors to analyse for a first differing block and a cause.
        unit_bytes: master bytes validated per batch of experts (bounds memory).
        stack: quantize each batch as one stacked tensor (default: on CUDA, where launches would
            dominate) or tensor by tensor (default on the CPU); the bytes are the same.

    Raises:
        ConversionError: the dialect cannot express the contract.

    Example:
        >>> validator = ExportValidator(contract="nvfp4-experts-per-token", config="Qwen3-30B-A3B")
        >>> report = validator.validate(exported, master)  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        contract: ContractLike,
        config: ConfigLike,
        family: FamilyLike = None,
        dialect: str = "modelopt",
        ep_rank: int = 0,
        ep_size: int = 1,
        include_input_scale: bool = False,
        calibration: Mapping[str, float] | None = None,
        diagnose: int = 32,
        unit_bytes: int = UNIT_BYTES,
        stack: bool | None = None,
    ) -> None:
        self.tables = model_tables(contract, config, family)
        per_token = self.tables.contract.formats.nvfp4.per_token_activations
        self.dialect = get_dialect(dialect, per_token_activations=per_token)
        self.tables.experts_on_rank(ep_rank, ep_size)
        check_can_export(self.tables, self.dialect, include_input_scale, calibration)
        self.ep_rank, self.ep_size = ep_rank, ep_size
        self.include_input_scale = include_input_scale
        self.calibration = None if calibration is None else dict(calibration)
        self.diagnose = diagnose
        self.unit_bytes = unit_bytes
        self.stack = stack
        self._plans: OrderedDict[tuple[tuple[str, tuple[str, tuple[int, ...]]], ...], ValidationPlan] = OrderedDict()

    def _plan(self, master: Mapping[str, torch.Tensor]) -> ValidationPlan:
        """The expectations for a master with these names and shapes (built once, then cached)."""
        metas = tensor_metas(master)
        key = tuple(metas.items())
        plan = self._plans.get(key)
        if plan is None:
            plan = ValidationPlan(
                self.tables,
                self.dialect,
                metas,
                ep_rank=self.ep_rank,
                ep_size=self.ep_size,
                include_input_scale=self.include_input_scale,
                calibration=self.calibration,
                unit_bytes=self.unit_bytes,
            )
            self._plans[key] = plan
            while len(self._plans) > 2:
                self._plans.popitem(last=False)
        return plan

    def validate(
        self,
        exported: Mapping[str, torch.Tensor],
        master: Mapping[str, torch.Tensor],
        *,
        duplicates: Mapping[str, list[str]] | None = None,
    ) -> ExportReport:
        """Compare ``exported`` with the contract applied to ``master``; see :func:`validate_export`."""
        started = time.perf_counter()
        plan = self._plan(master)
        metas = tensor_metas(exported)
        results = [
            TensorResult(src.name, "tensor", src.format, src.item.decision.rule, tuple(o[0] for o in src.outputs))
            for src in plan.sources
        ]
        diagnoser = Diagnoser(
            self.tables,
            self.dialect,
            plan,
            exported,
            master,
            metas,
            ep_rank=self.ep_rank,
            ep_size=self.ep_size,
            budget=self.diagnose,
            calibration=self.calibration,
        )
        if metas == plan.expected_metas:  # the usual case: exactly the expected names, dtypes, shapes
            eligible, extras = [True] * len(plan.sources), []
        else:
            eligible = diagnoser.structure(results)
            extras = diagnoser.unexpected()
            diagnoser.annotate_missing(results)
        device = _device_of(master)
        byte_flags: list[tuple[list[int], torch.Tensor]] = []
        sibling_flags: list[tuple[list[int], torch.Tensor]] = []
        for unit in plan.units:
            stack = device.type != "cpu" if self.stack is None else self.stack
            run = _UnitRun(
                unit,
                plan,
                exported,
                master,
                eligible,
                self.tables.contract.quantizer,
                self.dialect,
                device,
                stack=stack,
            )
            run.run(byte_flags, sibling_flags)
        byte_ok, sibling_ok = _read_back(byte_flags, sibling_flags)  # the one host synchronization
        for index, ok in byte_ok.items():
            if not ok:
                results[index].findings.append(diagnoser.bytes_finding(index))
        results += diagnoser.group_results(sibling_ok, eligible)
        results += extras
        results += [_duplicate(name, files) for name, files in sorted((duplicates or {}).items())]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return ExportReport(
            contract=self.tables.contract.name,
            dialect=self.dialect.name,
            device=str(device),
            results=results,
            master_bytes=plan.master_bytes,
            seconds=time.perf_counter() - started,
            ep_rank=self.ep_rank,
            ep_size=self.ep_size,
        )


def _device_of(master: Mapping[str, torch.Tensor]) -> torch.device:
    device = getattr(master, "device", None)
    if isinstance(device, torch.device):
        return device
    for tensor in master.values():
        return tensor.device
    return torch.device("cpu")


def _read_back(*flag_lists: list[tuple[list[int], torch.Tensor]]) -> list[dict[int, bool]]:
    """Every flag list as ``{source index: bool}``, with one device -> host copy for all of them."""
    flags = [f.reshape(-1) for flags in flag_lists for _, f in flags]
    values = torch.cat(flags).cpu().tolist() if flags else []
    out: list[dict[int, bool]] = []
    position = 0
    for flag_list in flag_lists:
        indices = [i for index_list, _ in flag_list for i in index_list]
        out.append(dict(zip(indices, values[position : position + len(indices)], strict=True)))
        position += len(indices)
    return out


def _duplicate(name: str, files: list[str]) -> TensorResult:
    detail = f"in {len(files)} update buckets: {', '.join(files)}; the last one sent wins"
    cause = "the exporter sent this tensor more than once in one update"
    return TensorResult(name, "unexpected", findings=[Finding("duplicate", detail, cause)])


def _stack_bits(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack`` viewed as integers of the element size (one view for the whole stack)."""
    try:
        return bits(torch.stack(tensors))
    except RuntimeError:  # a build without float8 concatenation: stack the integer views instead
        return torch.stack([bits(t) for t in tensors])


def _rows_equal(found: torch.Tensor, reference: torch.Tensor, n: int) -> torch.Tensor:
    """Per stacked tensor: are all its bytes equal? (compared as int64 words where rows allow)."""
    a, b = bits(found).reshape(n, -1), bits(reference).reshape(n, -1)
    width = a.shape[1] * a.element_size()
    if width % 8 == 0 and a.is_contiguous() and b.is_contiguous():  # 8x fewer comparisons
        a, b = a.view(torch.uint8).view(torch.int64), b.view(torch.uint8).view(torch.int64)
    return (a == b).all(dim=1)


def _quantize(
    fmt: str, x: torch.Tensor, *, tile: str, scope: str, amax: torch.Tensor | None, profile: str, dialect: Dialect
) -> dict[str, torch.Tensor]:
    """The data / scale / global tensors the dialect sends for ``x`` (one tensor or a stack)."""
    if fmt == "nvfp4":
        q = quantize_nvfp4(x, tile=tile, scope=scope, amax=amax, profile=profile)  # type: ignore[arg-type]
        assert q.data is not None and q.scale is not None  # rowwise is always produced
        return {"data": q.data, "scale": q.scale, "global": dialect.global_scale(q)}
    mx = quantize_mxfp8(x)
    return {"data": mx.data, "scale": mx.scale}


class _UnitRun:
    """The reference and the comparison for one unit, producing device booleans (no host sync).

    On CUDA every batch is stacked and quantized in one call (``scope="expert"``: one outer amax
    per stacked tensor, the bytes of one call per tensor), so launches do not dominate. On the CPU
    the kernel is already one multi-threaded call per tensor and a stack would only add a copy of
    the layer, so tensors are quantized one by one. Both give the converter's bytes.
    """

    def __init__(
        self,
        unit: _Unit,
        plan: ValidationPlan,
        exported: Mapping[str, torch.Tensor],
        master: Mapping[str, torch.Tensor],
        eligible: list[bool],
        profile: str,
        dialect: Dialect,
        device: torch.device,
        *,
        stack: bool,
    ) -> None:
        self.unit, self.plan, self.exported, self.eligible = unit, plan, exported, eligible
        self.profile, self.dialect, self.device = profile, dialect, device
        self.stacked = stack
        self.held = {key: master[key] for key in unit.master_keys}  # each master tensor read once per unit

    def value(self, index: int) -> torch.Tensor:
        """The master's values of source ``index`` (a view unless its rows are gathered)."""
        piece = self.plan.sources[index].piece
        return piece.take(self.held[piece.source])

    def _stack(self, batch: _Batch) -> torch.Tensor:
        if batch.whole is not None:  # whole master tensors: no slicing, half the stack inputs for fc1
            stacked = torch.stack([self.held[key] for key in batch.whole])
            return stacked.reshape(len(batch.sources), batch.rows, batch.cols)
        return torch.stack([self.value(i) for i in batch.sources])

    def run(
        self, byte_flags: list[tuple[list[int], torch.Tensor]], sibling_flags: list[tuple[list[int], torch.Tensor]]
    ) -> None:
        unit = self.unit
        stacks = [self._stack(b) for b in unit.batches] if self.stacked else []
        shared = self._shared_amax(stacks)
        scales = []
        offset = 0
        for n, batch in enumerate(unit.batches):
            amax = None
            if batch.fmt == "nvfp4":
                amax = shared[offset : offset + len(batch.sources)]
                offset += len(batch.sources)
            check = self._check_stacked if self.stacked else self._check_each
            kept, ok, batch_scales = check(batch, stacks[n] if self.stacked else None, amax)
            if kept:
                byte_flags.append((kept, ok))
            if batch_scales is not None:
                scales.append(batch_scales)
        if scales:
            # Exported siblings must carry one outer scale: compare each with its group's first member.
            exported_scales = torch.cat(scales)
            _, first = unit.indices(exported_scales.device)
            sibling_flags.append((unit.nvfp4, exported_scales == exported_scales[first]))
        for index in unit.bf16:
            if self.eligible[index]:
                want = self.value(index)
                found = self.exported[self.plan.sources[index].name].to(want.device)
                same = (bits(found).reshape(-1) == bits(want.contiguous()).reshape(-1)).all()
                byte_flags.append(([index], same.reshape(1)))

    def _shared_amax(self, stacks: list[torch.Tensor]) -> torch.Tensor:
        """Each NVFP4 tensor's outer amax: the max over its fused group's members (their shared amax)."""
        unit = self.unit
        if not unit.nvfp4:
            return torch.empty(0)
        if self.stacked:
            own = torch.cat(
                [
                    kernels.row_amax(x.reshape(-1, b.cols)).reshape(len(b.sources), b.rows).amax(dim=1)
                    for b, x in zip(unit.batches, stacks, strict=True)
                    if b.fmt == "nvfp4"
                ]
            )
        else:
            own = torch.stack([member_amax(self.value(i)) for i in unit.nvfp4])
        slots, _ = unit.indices(own.device)
        group_amax = torch.zeros(unit.num_slots, dtype=torch.float32, device=own.device)
        return group_amax.scatter_reduce(0, slots, own, reduce="amax", include_self=False)[slots]

    def _names(self, kept: list[int], role: str) -> list[str]:
        return [self.plan.sources[i].roles[role] for i in kept]

    def _check_stacked(
        self, batch: _Batch, x: torch.Tensor | None, amax: torch.Tensor | None
    ) -> tuple[list[int], torch.Tensor, torch.Tensor | None]:
        """(compared sources, whether each equals its reference, every source's exported outer-scale bits).

        Sources with a structural finding are not compared; their outer scale is the reference's, so
        they cannot fail a sibling's shared-scale check.
        """
        assert x is not None
        n = len(batch.sources)
        reference = _quantize(
            batch.fmt, x, tile=batch.tile, scope="expert", amax=amax, profile=self.profile, dialect=self.dialect
        )
        keep = [k for k, i in enumerate(batch.sources) if self.eligible[i]]
        kept = [batch.sources[k] for k in keep]
        select = None if len(keep) == n else torch.tensor(keep, dtype=torch.int64, device=x.device)
        ok = torch.ones(len(keep), dtype=torch.bool, device=x.device)
        scales = bits(reference["global"]).reshape(n).clone() if "global" in reference else None
        if not kept:
            return kept, ok, scales
        for role, ref in reference.items():
            ref = ref if select is None else ref.index_select(0, select)
            tensors = [self.exported[name] for name in self._names(kept, role)]
            if role == "global":  # () in ModelOpt, (1,) in compressed-tensors
                tensors = [t if t.dim() == 0 else t.reshape(()) for t in tensors]
            found = _stack_bits(tensors).to(x.device)
            ok &= _rows_equal(found, ref, len(keep))
            if role == "global" and scales is not None:
                if select is None:
                    scales = bits(found).reshape(n)
                else:
                    scales[select] = bits(found).reshape(-1)
        if "input" in self.plan.sources[kept[0]].roles:
            ok &= self._input_scales_equal(kept, x.device)
        return kept, ok, scales

    def _check_each(
        self, batch: _Batch, x: torch.Tensor | None, amax: torch.Tensor | None
    ) -> tuple[list[int], torch.Tensor, torch.Tensor | None]:
        """:meth:`_check_stacked`, one tensor at a time (the CPU default; syncs per tensor on CUDA)."""
        kept, flags, scales = [], [], []
        for k, index in enumerate(batch.sources):
            reference = _quantize(
                batch.fmt,
                self.value(index),
                tile=batch.tile,
                scope="tensor",
                amax=None if amax is None else amax[k],
                profile=self.profile,
                dialect=self.dialect,
            )
            roles = self.plan.sources[index].roles
            if "global" in reference:
                scales.append(bits(reference["global"]).reshape(()))
            if not self.eligible[index]:
                continue
            kept.append(index)
            found = {role: self.exported[roles[role]].to(ref.device) for role, ref in reference.items()}
            flags.append(all(same_bytes(found[r].reshape(ref.shape), ref) for r, ref in reference.items()))
            if "global" in reference:
                scales[-1] = bits(found["global"]).reshape(())
        ok = torch.tensor(flags, dtype=torch.bool, device=self.device)
        if kept and "input" in self.plan.sources[kept[0]].roles:
            ok &= self._input_scales_equal(kept, self.device)
        return kept, ok, torch.stack(scales) if scales else None

    def _input_scales_equal(self, kept: list[int], device: torch.device) -> torch.Tensor:
        expected = torch.stack([self.plan.sources[i].input_scale for i in kept]).to(device)  # type: ignore[misc]
        found = _stack_bits([self.exported[name].reshape(()) for name in self._names(kept, "input")]).to(device)
        return found.reshape(-1) == bits(expected).reshape(-1)


_VALIDATORS: OrderedDict[str, ExportValidator] = OrderedDict()


def validate_export(
    exported: Mapping[str, torch.Tensor],
    master: Mapping[str, torch.Tensor],
    *,
    contract: ContractLike,
    config: ConfigLike,
    family: FamilyLike = None,
    dialect: str = "modelopt",
    ep_rank: int = 0,
    ep_size: int = 1,
    include_input_scale: bool = False,
    calibration: Mapping[str, float] | None = None,
    diagnose: int = 32,
    stack: bool | None = None,
) -> ExportReport:
    """Check that ``exported`` is exactly what the contract makes of ``master``.

    Runs where the master lives (CPU or CUDA; on CUDA the quantizers are Triton kernels and the
    whole check synchronizes with the host once), cheap enough to run at every weight sync.
    Validators are cached per (contract, model, dialect, EP position, options), and each caches
    its plan for the master's names and shapes.

    Args:
        exported: HF name -> tensor, as the exporter sent it (several update buckets merged).
        master: the BF16 master, with HF names or Megatron-Core names (TP-gathered; expert ids local
            to ``ep_rank``).
        contract: a :class:`~fp4convert.contract.Contract`, a contract file or a shipped name.
        config: the model's config.json (parsed, a path, a checkpoint folder or a shipped name).
        family: the model family; default: the config's.
        dialect: the dialect the export is in (``modelopt``, ``sglang-mxfp8``, ``compressed-tensors``).
        ep_rank: the EP rank that produced the export.
        ep_size: the expert-parallel size.
        include_input_scale: the export must carry activation scales (a checkpoint does; a live
            update must not, which is the default).
        calibration: activation amaxes for the expected activation scales (calibrated contracts).
        diagnose: how many failing tensors get a first differing block and a likely cause.
        stack: quantize batches stacked (default on CUDA) or tensor by tensor (default on the CPU).

    Returns:
        An :class:`~fp4convert.bridge.report.ExportReport`; ``report.ok`` is the verdict and
        ``report.raise_for_failures()`` turns a failure into a
        :class:`~fp4convert.errors.VerificationError`.

    Raises:
        ConversionError: the dialect cannot express the contract.
        MappingError: a master tensor is not part of the model, is duplicated, or does not fit
            the config, or a fused group is incomplete in the master.

    Example:
        >>> import torch
        >>> from fp4convert.bridge import export_hf
        >>> fc1 = torch.randn(1536, 2048).to(torch.bfloat16)
        >>> master = {"decoder.layers.0.mlp.experts.linear_fc1.weight3": fc1}
        >>> kwargs = {"contract": "nvfp4-experts-per-token", "config": "Qwen3-30B-A3B"}
        >>> exported = dict(export_hf(master, **kwargs))
        >>> validate_export(exported, master, **kwargs).summary().split(";")[0]
        'OK: 2 tensors follow contract nvfp4-experts-per-token (2 nvfp4)'
        >>> exported["model.layers.0.mlp.experts.3.up_proj.weight_scale_2"] *= 1.0001
        >>> print("\\n".join(validate_export(exported, master, **kwargs).lines()[:1]))  # doctest: +ELLIPSIS
        FAIL bytes        model.layers.0.mlp.experts.3.up_proj.weight: weight_scale_2 ...
    """
    tables = model_tables(contract, config, family)
    key = json.dumps(
        [id(tables), dialect, ep_rank, ep_size, include_input_scale, calibration, diagnose, stack],
        sort_keys=True,
        default=str,
    )
    validator = _VALIDATORS.get(key)
    if validator is None or validator.tables is not tables:
        validator = ExportValidator(
            contract=tables.contract,
            config=tables.config,
            family=family,
            dialect=dialect,
            ep_rank=ep_rank,
            ep_size=ep_size,
            include_input_scale=include_input_scale,
            calibration=calibration,
            diagnose=diagnose,
            stack=stack,
        )
        _VALIDATORS[key] = validator
        while len(_VALIDATORS) > 4:
            _VALIDATORS.popitem(last=False)
    _VALIDATORS.move_to_end(key)
    return validator.validate(exported, master)


def validate_export_files(
    dump: str | Path,
    master: str | Path,
    *,
    contract: ContractLike,
    config: ConfigLike | None = None,
    family: FamilyLike = None,
    dialect: str = "modelopt",
    ep_rank: int = 0,
    ep_size: int = 1,
    include_input_scale: bool = False,
    calibration: str | Path | Mapping[str, float] | None = None,
    device: str = "cpu",
    diagnose: int = 32,
) -> ExportReport:
    """:func:`validate_export` on files: an exporter's dump against a BF16 master on disk.

    Tensors are read when their layer is validated, so memory holds about one layer (or one chunk
    of a layer's experts), not the model.

    Args:
        dump: a folder of safetensors files with HF names (one per update bucket, no index), or one file.
        master: an HF checkpoint folder, or Megatron-named safetensors (a folder, e.g. from
            :func:`~fp4convert.bridge.import_hf`, or one file).
        contract: a contract file or a shipped name.
        config: the model's config.json; default: the master folder's.
        family: the model family; default: the config's.
        dialect: the dialect of the dump.
        ep_rank: the EP rank that produced the dump.
        ep_size: the expert-parallel size.
        include_input_scale: the dump must carry activation scales.
        calibration: activation amaxes (a JSON file or a mapping), for calibrated contracts.
        device: where the reference is computed (``cpu``, ``cuda``, ``cuda:1``).
        diagnose: how many failing tensors to analyse.

    Returns:
        The :class:`~fp4convert.bridge.report.ExportReport`; tensors stored in several buckets are
        ``duplicate`` findings.

    Raises:
        CheckpointError: unreadable files, or no config.json next to the master and no ``config``.

    Example:
        >>> report = validate_export_files(  # doctest: +SKIP
        ...     "dump/", "Qwen3-30B-A3B/", contract="nvfp4-experts-per-token")
        >>> report.ok  # doctest: +SKIP
        True
    """
    from fp4convert.bridge.files import SafetensorsFolder
    from fp4convert.convert.plan import load_calibration
    from fp4convert.errors import CheckpointError

    master_path = Path(master)
    if config is None:
        found = master_path / "config.json" if master_path.is_dir() else master_path.with_name("config.json")
        if not found.is_file():
            raise CheckpointError(
                f"no config.json next to the master {master_path}",
                hint="pass the model's config.json with --config",
                file=str(master_path),
            )
        config = found
    if calibration is not None and not isinstance(calibration, Mapping):
        calibration = load_calibration(calibration)
    validator = ExportValidator(
        contract=contract,
        config=config,
        family=family,
        dialect=dialect,
        ep_rank=ep_rank,
        ep_size=ep_size,
        include_input_scale=include_input_scale,
        calibration=calibration,
        diagnose=diagnose,
    )
    with SafetensorsFolder(dump) as exported, SafetensorsFolder(master_path, device=device) as weights:
        return validator.validate(exported, weights, duplicates=exported.duplicates)
