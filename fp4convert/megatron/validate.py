"""Prove that a live export followed the contract: every tensor, every byte, in one pass.

:class:`ExportValidator` (and :func:`validate_export`, its one-call form) compares what an exporter
sent (HF names, a dialect's tensors) with the reference quantizer applied to the BF16 master
(HF or Megatron-Core names). It checks that every expected tensor is present and nothing else;
dtypes and shapes per the contract's format; bytes equal to the reference; fused siblings sharing
one outer scale; no ``input_scale`` where the update must not carry one. Failures are then handed
to :mod:`fp4convert.megatron.diagnose`, which names the first differing block and the likely cause.

The fast path is built to run at every weight sync on the learner's GPU (target >= 100 GB/s of
BF16 master on an H200). Per-tensor work would be bound by kernel launches (a Qwen3-30B-A3B sync
has ~18k expert tensors of a few MB), so tensors are batched: the master rows of all tensors of one
layer, format and width are concatenated and quantized with one amax kernel, one scatter-max for
the shared outer amaxes and one quantize kernel, and compared with the export concatenated the same
way. Quantization is row-independent given each row's outer amax (1x16 blocks; 16x16 tiles never
straddle tensors, whose rows are multiples of 16), so the batch's bytes are the per-tensor bytes
the converter writes; tests compare both byte for byte. Mismatch counts stay on the device and
are read back once at the end; only failing tensors take the slow, diagnosing path.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fp4convert.errors import ConversionError
from fp4convert.formats import kernels
from fp4convert.formats.nvfp4 import NVFP4Tensor, _tile_amax
from fp4convert.megatron import diagnose
from fp4convert.megatron.diagnose import Context
from fp4convert.megatron.plan import ContractLike, DialectLike, ExportItem, export_plan
from fp4convert.megatron.report import ExportReport, Finding
from fp4convert.megatron.sources import PieceSource, SafetensorsFolder, piece_sources, tensor_meta

__all__ = ["ExportValidator", "validate_export", "validate_export_files"]

_NVFP4_COLUMNS = ("data", "scale", "global", "shared")
_MXFP8_COLUMNS = ("data", "scale")


@dataclass
class _Batch:
    """Tensors of one layer, format and width, quantized together; their mismatch counts."""

    fmt: str
    items: list[ExportItem]
    counts: torch.Tensor | None = None  # (items, columns) int64, on the device


@dataclass
class _Layout:
    """Device index tensors of one batch, kept across syncs (the batch is the same every time)."""

    row_unit: torch.Tensor
    row_item: torch.Tensor
    item_unit: torch.Tensor
    unit_first: torch.Tensor
    units: int
    rows: list[int] = field(default_factory=list)


def _device_of(master: Mapping[str, torch.Tensor]) -> torch.device:
    if isinstance(master, SafetensorsFolder) or not master:
        return torch.device("cpu")
    return next(iter(master.values())).device


class ExportValidator:
    """Validate live exports of one model under one contract; build once, call at every sync.

    Args:
        contract: a :class:`~fp4convert.contract.Contract`, a contract file or a shipped name.
        config: the model's config.json.
        dialect: the dialect the exporter writes.
        family: family key; None takes it from the config.
        ep_rank: the EP rank whose export is checked (it holds that rank's experts).
        ep_size: expert-parallel size.
        include_input_scale: the export is meant to carry NVFP4 input scales (live updates do not).
        calibration: activation amax per HF module, for sent input scales of per-tensor contracts.
        device: where to compare; default the master's device.
        max_batch_bytes: BF16 master bytes quantized in one batch (bounds the extra memory).
        max_diagnosed: failing modules diagnosed in full; the rest are only reported.

    Example:
        >>> validator = ExportValidator(contract="nvfp4-experts-per-token", config=config)  # doctest: +SKIP
        >>> validator(dict(export_hf(params, ...)), dict(model.named_parameters())).raise_if_failed()  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        contract: ContractLike,
        config: Mapping[str, Any] | str | Path,
        dialect: DialectLike = "modelopt",
        family: str | None = None,
        ep_rank: int = 0,
        ep_size: int = 1,
        include_input_scale: bool = False,
        calibration: Mapping[str, float] | None = None,
        device: str | torch.device | None = None,
        max_batch_bytes: int = 1 << 30,
        max_diagnosed: int = 64,
    ) -> None:
        self.plan = export_plan(
            contract=contract, config=config, dialect=dialect, family=family,
            include_input_scale=include_input_scale, calibration=calibration,
        )  # fmt: skip
        self.ep_rank, self.ep_size = ep_rank, ep_size
        self.items = self.plan.expected(ep_rank, ep_size)
        self.plan.experts_per_rank(ep_size)
        self.device = None if device is None else torch.device(device)
        self.max_batch_bytes = max_batch_bytes
        self.max_diagnosed = max_diagnosed
        self._sources: tuple[Any, dict[str, PieceSource]] = (None, {})
        self._layouts: dict[tuple[str, ...], _Layout] = {}
        self._rows_on: dict[tuple[str, str], torch.Tensor] = {}

    # -- the master ---------------------------------------------------------------------------------

    def _piece_sources(self, master: Mapping[str, torch.Tensor]) -> dict[str, PieceSource]:
        shapes = {key: tensor_meta(master, key)[1] for key in master}
        signature = tuple((key, shape[:1]) for key, shape in shapes.items())
        if self._sources[0] != signature:  # computed once for a master layout, then reused
            self._sources = (
                signature,
                piece_sources(shapes, self.plan, ep_rank=self.ep_rank, ep_size=self.ep_size),
            )
        return self._sources[1]

    # -- structure ----------------------------------------------------------------------------------

    def _structure(self, ctx: Context) -> list[ExportItem]:
        """Presence, dtype and shape of every expected tensor; returns the items fit for byte checks."""
        fit: list[ExportItem] = []
        for item in self.items:
            outputs = ctx.expected_outputs(item)
            if outputs is None:
                continue  # the master lacks it: reported by expected_outputs
            ok = True
            for name, dtype, shape in outputs:
                if name not in ctx.exported:
                    ctx.add(Finding(name, "missing", "not in the export (no update bucket holds it)"))
                    ok = False
                    continue
                got_dtype, got_shape = tensor_meta(ctx.exported, name)
                if got_dtype != dtype:
                    ctx.add(
                        Finding(
                            name, "dtype", f"{got_dtype} {list(got_shape)}, expected {dtype} {list(shape)}"
                        )
                    )
                    ok = False
                elif tuple(got_shape) != tuple(shape) and not (shape == () and got_shape in ((), (1,))):
                    ctx.add(Finding(name, "shape", f"{list(got_shape)}, expected {list(shape)}"))
                    ok = False
            if ok:
                fit.append(item)
            else:
                ctx.structure_failed.append(item)
        return fit

    def _extras(self, ctx: Context) -> None:
        for name, files in getattr(ctx.exported, "duplicates", {}).items():
            ctx.add(Finding(name, "duplicate", f"sent in more than one update bucket ({', '.join(files)})"))
        for name in ctx.exported:
            if name not in ctx.expected_names:
                ctx.extras.append(name)

    # -- the batched byte comparison -----------------------------------------------------------------

    def _unit(self, item: ExportItem) -> str:
        group = item.decision.fused_group
        return group if group is not None and group in self.plan.groups else item.info.name

    def _batches(self, items: list[ExportItem], complete: set[str]) -> Iterator[list[ExportItem]]:
        """Items of one layer split by (format, width, tile), whole units at a time, size-capped."""
        keyed: OrderedDict[tuple[Any, ...], OrderedDict[str, list[ExportItem]]] = OrderedDict()
        for item in items:
            unit = self._unit(item)
            if unit not in complete:
                continue
            key = (item.decision.format, item.info.shape[-1], getattr(item.decision.recipe, "tile", ""))
            keyed.setdefault(key, OrderedDict()).setdefault(unit, []).append(item)
        for units in keyed.values():
            batch: list[ExportItem] = []
            size = 0
            for members in units.values():
                nbytes = sum(m.info.numel * 2 for m in members)
                if batch and size + nbytes > self.max_batch_bytes:
                    yield batch
                    batch, size = [], 0
                batch += members
                size += nbytes
            if batch:
                yield batch

    def _layout(self, batch: list[ExportItem], rows: list[int], device: torch.device) -> _Layout:
        key = (str(device), *(item.info.name for item in batch))
        layout = self._layouts.get(key)
        if layout is None:
            units: dict[str, int] = {}
            item_unit = [units.setdefault(self._unit(item), len(units)) for item in batch]
            first = {u: i for i, u in reversed(list(enumerate(item_unit)))}
            counts = torch.tensor(rows)
            layout = _Layout(
                row_unit=torch.repeat_interleave(torch.tensor(item_unit), counts).to(device),
                row_item=torch.repeat_interleave(torch.arange(len(batch)), counts).to(device),
                item_unit=torch.tensor(item_unit, device=device),
                unit_first=torch.tensor([first[u] for u in range(len(units))], device=device),
                units=len(units),
                rows=rows,
            )
            self._layouts[key] = layout
        return layout

    @staticmethod
    def _bad_rows(layout: _Layout, items: int, actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
        bad = (actual.reshape(expected.shape) != expected).any(dim=1).long()
        return torch.zeros(items, dtype=torch.int64, device=expected.device).index_add_(
            0, layout.row_item, bad
        )

    def _nvfp4(self, ctx: Context, batch: list[ExportItem]) -> torch.Tensor:
        xs = [ctx.master_piece(item) for item in batch]
        x = xs[0] if len(xs) == 1 else torch.cat(xs)
        layout = self._layout(batch, [t.shape[0] for t in xs], x.device)
        row_amax = kernels.row_amax(x)
        unit_amax = torch.zeros(layout.units, dtype=torch.float32, device=x.device).scatter_reduce_(
            0, layout.row_unit, row_amax, "amax", include_self=False
        )
        tile = getattr(batch[0].decision.recipe, "tile", "1x16")
        block_amax = _tile_amax(x) if tile == "16x16" else None
        data, scale = kernels.nvfp4_matrix(x, unit_amax[layout.row_unit], self.plan.profile, block_amax)  # type: ignore[arg-type]
        # Dialect global scales are elementwise in the amax: one call for every unit of the batch.
        amaxes = NVFP4Tensor((layout.units,), x.dtype, tile, "tensor", self.plan.profile, unit_amax)
        expected_global = self.plan.dialect.global_scale(amaxes).float()[layout.item_unit]
        names = [[name for name, _, _ in item.outputs] for item in batch]
        act_data = torch.cat([ctx.exported_tensor(n[0]) for n in names])
        act_scale = torch.cat([ctx.exported_tensor(n[1]).view(torch.uint8) for n in names])
        act_global = torch.cat([ctx.exported_tensor(n[2]).reshape(1) for n in names]).view(torch.int32)
        global_bad = act_global != expected_global.view(torch.int32)
        shared_bad = act_global != act_global[layout.unit_first[layout.item_unit]]
        return torch.stack(
            [
                self._bad_rows(layout, len(batch), act_data, data),
                self._bad_rows(layout, len(batch), act_scale, scale),
                global_bad.long(),
                shared_bad.long(),
            ],
            dim=1,
        )

    def _mxfp8(self, ctx: Context, batch: list[ExportItem]) -> torch.Tensor:
        xs = [ctx.master_piece(item) for item in batch]
        x = xs[0] if len(xs) == 1 else torch.cat(xs)
        layout = self._layout(batch, [t.shape[0] for t in xs], x.device)
        data, scale = kernels.mxfp8_matrix(x)
        names = [[name for name, _, _ in item.outputs] for item in batch]
        act_data = torch.cat([ctx.exported_tensor(n[0]).view(torch.uint8) for n in names])
        act_scale = torch.cat([ctx.exported_tensor(n[1]) for n in names])
        return torch.stack(
            [
                self._bad_rows(layout, len(batch), act_data, data),
                self._bad_rows(layout, len(batch), act_scale, scale),
            ],
            dim=1,
        )

    def _compare(self, ctx: Context, fit: list[ExportItem]) -> list[tuple[ExportItem, dict[str, int]]]:
        """Byte checks of every structurally fit item; returns the failing ones with their counts."""
        unit_members: dict[str, int] = {}
        for item in self.items:
            unit_members[self._unit(item)] = unit_members.get(self._unit(item), 0) + 1
        fit_units: dict[str, int] = {}
        for item in fit:
            fit_units[self._unit(item)] = fit_units.get(self._unit(item), 0) + 1
        # A group with a broken member cannot be batched (its shared amax needs every member's
        # master rows): its fit members are checked one by one on the slow path instead.
        complete = {u for u, n in fit_units.items() if n == unit_members[u]}
        layers: OrderedDict[int | None, list[ExportItem]] = OrderedDict()
        for item in fit:
            layers.setdefault(item.info.layer, []).append(item)
        results: list[tuple[list[ExportItem], torch.Tensor, tuple[str, ...]]] = []
        slow: list[ExportItem] = []
        for items in layers.values():
            ctx.begin_chunk()
            for item in items:
                if not item.quantized:
                    results.append(([item], ctx.bf16_mismatch(item).reshape(1, 1).long(), ("data",)))
                elif self._unit(item) not in complete:
                    slow.append(item)
            for batch in self._batches([i for i in items if i.quantized], complete):
                if batch[0].decision.format == "nvfp4":
                    results.append((batch, self._nvfp4(ctx, batch), _NVFP4_COLUMNS))
                else:
                    results.append((batch, self._mxfp8(ctx, batch), _MXFP8_COLUMNS))
            ctx.end_chunk()
        failing: list[tuple[ExportItem, dict[str, int]]] = []
        if results:  # one device -> host transfer for the whole export
            counts = torch.cat([c.reshape(-1) for _, c, _ in results]).cpu().tolist()
            offset = 0
            for batch, tensor, columns in results:
                for item in batch:
                    row = dict(zip(columns, counts[offset : offset + len(columns)]))
                    offset += len(columns)
                    if any(row.values()):
                        failing.append((item, row))
        failing += [(item, {"slow": 1}) for item in slow]
        return failing

    # -- the whole check ------------------------------------------------------------------------------

    def __call__(
        self, exported: Mapping[str, torch.Tensor], master: Mapping[str, torch.Tensor]
    ) -> ExportReport:
        """Validate one export against its master.

        Args:
            exported: HF name -> tensor, as the exporter sent it (any device).
            master: the BF16 master, HF or Megatron-Core names (TP-gathered; Megatron expert ids
                local to ``ep_rank``).

        Returns:
            The :class:`~fp4convert.megatron.report.ExportReport`.
        """
        started = time.perf_counter()
        device = self.device or _device_of(master)
        plan = self.plan
        sources = self._piece_sources(master)
        report = ExportReport(
            contract=plan.contract.name, dialect=plan.dialect.name, ep_rank=self.ep_rank, ep_size=self.ep_size,
            expected=[], received=len(exported), formats={},
        )  # fmt: skip
        ctx = Context(
            plan, exported, master, sources, device, report, self.ep_rank, self.ep_size, self._rows_on
        )
        fit = self._structure(ctx)
        report.expected = list(ctx.expected_names)
        for item in self.items:
            fmt = item.decision.format if item.quantized else "bf16"
            report.formats[fmt] = report.formats.get(fmt, 0) + 1
        self._extras(ctx)
        failing = self._compare(ctx, fit)
        diagnose.explain(ctx, failing, self.max_diagnosed)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        report.master_bytes = ctx.master_bytes
        report.seconds = time.perf_counter() - started
        return report


_VALIDATORS: OrderedDict[tuple[Any, ...], ExportValidator] = OrderedDict()


def validate_export(
    exported: Mapping[str, torch.Tensor],
    master: Mapping[str, torch.Tensor],
    *,
    contract: ContractLike,
    family: str | None,
    config: Mapping[str, Any],
    dialect: DialectLike = "modelopt",
    ep_rank: int = 0,
    ep_size: int = 1,
    include_input_scale: bool = False,
    device: str | torch.device | None = None,
) -> ExportReport:
    """Check that a live export followed the contract, byte for byte; see :class:`ExportValidator`.

    Cheap enough for every weight sync: validators are cached per (contract, model, dialect, EP
    position), so the plan is built once; on the GPU the check is a few batched kernels per layer.

    Args:
        exported: HF name -> tensor, what the exporter sent (one rank's update, all buckets).
        master: the BF16 master, HF or Megatron-Core names.
        contract: a :class:`~fp4convert.contract.Contract`, a contract file or a shipped name.
        family: family key; None takes it from ``config``.
        config: the model's config.json.
        dialect: the dialect the exporter writes.
        ep_rank: the EP rank whose export this is.
        ep_size: expert-parallel size.
        include_input_scale: the export is meant to carry NVFP4 input scales (live updates do not).
        device: where to compare; default the master's device.

    Returns:
        An :class:`~fp4convert.megatron.report.ExportReport`; ``report.raise_if_failed()`` turns
        a failure into a :class:`~fp4convert.errors.VerificationError`.

    Raises:
        ConversionError, ContractError, MappingError: the contract cannot be exported on this
            model, or the master holds names that are not this model's.

    Example:
        >>> megatron = hf_to_megatron(hf_state_dict, "qwen3_moe", config)  # doctest: +SKIP
        >>> exported = dict(export_hf(megatron.items(), contract=c, family="qwen3_moe", config=config))  # doctest: +SKIP
        >>> validate_export(exported, megatron, contract=c, family="qwen3_moe", config=config).ok  # doctest: +SKIP
        True
    """
    from fp4convert.contract import Contract, contract_hash, load_contract

    the_contract = contract if isinstance(contract, Contract) else load_contract(contract)
    key = (
        contract_hash(the_contract), family, repr(sorted(config.items())), getattr(dialect, "name", dialect),
        ep_rank, ep_size, include_input_scale, None if device is None else str(device),
    )  # fmt: skip
    validator = _VALIDATORS.get(key)
    if validator is None:
        validator = ExportValidator(
            contract=the_contract, config=config, dialect=dialect, family=family, ep_rank=ep_rank,
            ep_size=ep_size, include_input_scale=include_input_scale, device=device,
        )  # fmt: skip
        _VALIDATORS[key] = validator
        while len(_VALIDATORS) > 4:
            _VALIDATORS.popitem(last=False)
    _VALIDATORS.move_to_end(key)
    return validator(exported, master)


def validate_export_files(
    dump: str | Path,
    master: str | Path,
    *,
    contract: ContractLike,
    dialect: DialectLike = "modelopt",
    config: str | Path | None = None,
    ep_rank: int = 0,
    ep_size: int = 1,
    include_input_scale: bool = False,
    device: str = "cpu",
) -> ExportReport:
    """``validate-export``: an exporter's dump on disk against a master on disk.

    Args:
        dump: a folder of safetensors files with HF names (update buckets; no index needed), or
            one file.
        master: the BF16 master: an HF checkpoint folder, or a folder / file of Megatron-named
            safetensors (``fp4convert to-megatron`` writes one).
        contract: a contract file or a shipped name.
        dialect: the dialect the exporter writes.
        config: the model's config.json; default ``config.json`` in the master folder.
        ep_rank: the EP rank the dump comes from.
        ep_size: expert-parallel size.
        include_input_scale: the dump is meant to carry NVFP4 input scales.
        device: where to compare (``cpu``, ``cuda``).

    Returns:
        The report.

    Raises:
        CheckpointError: unreadable files, or no config.json.
    """
    from fp4convert.errors import CheckpointError
    from fp4convert.families import load_config

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConversionError(
            "--device cuda was asked for, but no CUDA device is available", hint="use --device cpu"
        )
    master_path = Path(master)
    config_path = (
        Path(config) if config is not None else (master_path if master_path.is_dir() else master_path.parent)
    )
    if config_path.is_dir() and not (config_path / "config.json").is_file():
        raise CheckpointError(
            f"{config_path} has no config.json",
            hint="pass --config with the model's config.json",
            file=str(config_path),
        )
    the_config = load_config(config_path)
    with SafetensorsFolder(dump) as dumped, SafetensorsFolder(master_path) as masters:
        if masters.duplicates:
            name = next(iter(masters.duplicates))
            raise CheckpointError(f"master tensor {name!r} is stored in more than one file", tensor=name)
        validator = ExportValidator(
            contract=contract, config=the_config, dialect=dialect, ep_rank=ep_rank, ep_size=ep_size,
            include_input_scale=include_input_scale, device=device,
        )  # fmt: skip
        return validator(dumped, masters)
