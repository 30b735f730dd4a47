"""Prove that a live export followed the contract: every tensor, every byte, in one pass.

:class:`ExportValidator` (and :func:`validate_export`, its one-call form) compares what an exporter
sent (HF names, a dialect's tensors) with the reference quantizer applied to the BF16 master
(HF or Megatron-Core names). It checks that every expected tensor is present and nothing else;
dtypes and shapes per the contract's format; bytes equal to the reference; fused siblings sharing
one outer scale; no ``input_scale`` where the update must not carry one. Failures are then handed
to :mod:`fp4convert.megatron.diagnose`, which names the first differing block and the likely cause.

The fast path is built to run at every weight sync on the learner's GPU (target >= 100 GB/s of
BF16 master on an H200): what the master's layout fixes is compiled once and kept between syncs,
the bytes are compared in batches (:mod:`fp4convert.megatron.batches`), and the mismatch counts
are read back once at the end; only failing tensors take the slow, diagnosing path.
:func:`validate_export_files` is the same check on an exporter's dump and a master on disk.
"""

from __future__ import annotations

import operator
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import torch

from fp4convert.checkpoint.decoded import decoded_source
from fp4convert.checkpoint.safetensors_io import dtype_name
from fp4convert.contract import contract_hash
from fp4convert.dialects import OutputSpec
from fp4convert.errors import CheckpointError, ConversionError
from fp4convert.families import load_config
from fp4convert.formats.devices import tensor_device
from fp4convert.inventory.dtypes import SAFETENSORS_DTYPES
from fp4convert.megatron import diagnose
from fp4convert.megatron.batches import Batch, Step, lay_out, mismatches, plan_steps, unit_of
from fp4convert.megatron.batches import prepare as prepare_step
from fp4convert.megatron.context import Context
from fp4convert.megatron.plan import ContractLike, DialectLike, export_plan, gc_paused, loaded_contract
from fp4convert.megatron.replay import GraphReplay
from fp4convert.megatron.report import ExportReport, Finding
from fp4convert.megatron.resolve import MasterNames, Piece
from fp4convert.megatron.sources import (
    MASTER_DTYPES,
    MASTER_DTYPES_PHRASE,
    MASTER_TORCH_DTYPES,
    SafetensorsFolder,
    check_master_tensor,
    meta_dtype,
    tensor_meta,
)
from fp4convert.plan import PlannedTensor

__all__ = ["ExportValidator", "validate_export", "validate_export_files"]


@dataclass
class _Compiled:
    """What one master layout fixes: where each HF tensor is, what the export must hold, batches."""

    sources: dict[str, Piece]
    outputs: dict[str, list[OutputSpec]]  # item name -> expected outputs (BF16: the master's dtype)
    problems: list[Finding]  # items the master cannot provide
    expected_names: dict[str, PlannedTensor]
    master_bytes: int
    checks: list[tuple[str, torch.dtype, tuple[int, ...], PlannedTensor]]
    steps: list[list[Step]] | None = None  # per layer, when every item is fit (the usual case)
    #: per layer of ``steps``, how far into the checks its tensors reach (non-decreasing)
    layer_ends: list[int] | None = None

    def __post_init__(self) -> None:  # the checks' columns, compared as whole lists
        self.names = [c[0] for c in self.checks]
        self.dtypes = [c[1] for c in self.checks]
        self.shapes = [c[2] for c in self.checks]
        self.index = {name: i for i, name in enumerate(self.names)}

    def set_steps(self, steps: list[list[Step]]) -> None:
        """The byte check's steps, layers ordered by how far into the checks their tensors reach (the
        embedding's layer holds the last head too), and how many checks must pass before each runs."""
        ends = []
        for layer in steps:
            items = [p for _, payload in layer for p in (payload.items if isinstance(payload, Batch) else [payload])]
            ends.append(max((self.index[o[0]] + 1 for i in items for o in self.outputs[i.info.name]), default=0))
        order = sorted(range(len(steps)), key=ends.__getitem__)
        self.steps = [steps[i] for i in order]
        self.layer_ends = [ends[i] for i in order]


_DTYPE = operator.attrgetter("dtype")
_NBYTES = operator.attrgetter("nbytes")
_SHAPE = operator.attrgetter("shape")
_IS_META = operator.attrgetter("is_meta")


def _as_expected(
    exported: Mapping[str, torch.Tensor],
    compiled: _Compiled,
    ctx: Context,
    start: int = 0,
    end: int | None = None,
    fetched: list[torch.Tensor | None] | None = None,
) -> bool:
    """Whether every expected tensor (of checks ``start:end``) is there with its dtype and shape: the
    usual case, in C-level passes over the ~55k tensors of a sync rather than a Python loop (which
    then names the faults). When so, the tensors are kept in ``ctx.fetched`` for the byte check (no
    second lookup); a range starting at 0 begins a new list. ``fetched``: all of them, looked up already."""
    count = len(compiled.names)
    end = count if end is None else end
    whole = start == 0 and end == count
    if fetched is not None and whole:
        tensors = fetched
    else:
        tensors = list(map(exported.get, compiled.names if whole else compiled.names[start:end]))
    try:
        dtypes = list(map(_DTYPE, tensors))  # a missing tensor (None) has no dtype
    except AttributeError:
        return False
    if whole:
        fit = dtypes == compiled.dtypes and list(map(_SHAPE, tensors)) == compiled.shapes
    else:
        fit = dtypes == compiled.dtypes[start:end] and list(map(_SHAPE, tensors)) == compiled.shapes[start:end]
    if not fit or any(map(_IS_META, tensors)):  # a meta tensor has no bytes: named by the slow pass
        return False
    if whole:
        ctx.fetched = cast(list[torch.Tensor], tensors)  # no None: each had a dtype
    else:
        if start == 0 or ctx.fetched is None:
            ctx.fetched = cast(list[torch.Tensor], [None] * count)
        ctx.fetched[start:end] = cast(list[torch.Tensor], tensors)
    ctx.fetched_index = compiled.index
    return True


#: one step's mismatch counts: its items, ``(items, columns)`` counts on the device, the columns' names
_Counts = tuple[list[PlannedTensor], torch.Tensor, tuple[str, ...]]


def _issue(ctx: Context, compiled: _Compiled, steps: list[list[Step]], ends: list[int] | None) -> list[_Counts] | None:
    """Issue every step's byte check (nothing here waits for the GPU), each layer's structure checked
    just before where ``ends`` says how far into the checks it reaches (None: checked already).
    None: a structural fault."""
    results: list[_Counts] = []
    checked = 0
    for number, layer in enumerate(steps):
        if ends is not None and ends[number] > checked:
            if not _as_expected(ctx.exported, compiled, ctx, checked, ends[number]):
                return None
            checked = ends[number]
        ctx.begin_chunk()
        for kind, payload in layer:
            counts, columns = mismatches(ctx, kind, payload)
            results.append((payload.items if isinstance(payload, Batch) else [payload], counts, columns))
        ctx.end_chunk()
    if ends is not None and not _as_expected(ctx.exported, compiled, ctx, checked, None):
        return None  # a fault among the tensors no step reads (none, while the plan is whole)
    return results


def _failing(results: list[_Counts], every: torch.Tensor | None) -> list[tuple[PlannedTensor, dict[str, int]]]:
    """The items with a nonzero count, given every count on the CPU (``results``' counts, flat)."""
    failing: list[tuple[PlannedTensor, dict[str, int]]] = []
    if every is None or not every.any():  # only a failing export walks its ~19k items in Python
        return failing
    flat: list[int] = every.tolist()
    offset = 0
    for batch, _, columns in results:
        width = len(columns)
        for item in batch:
            row = flat[offset : offset + width]
            offset += width
            if any(row):
                failing.append((item, dict(zip(columns, row, strict=True))))
    return failing


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
        device: where to compare; default the master's device. Given, the tables the byte check
            reads there (index and segment tables) are made at construction, for the layout the
            plan predicts: a learner that knows its GPU takes them out of its first sync.
        max_batch_bytes: BF16 master bytes quantized in one batch (bounds the extra memory).
        max_diagnosed: failing modules diagnosed in full; the rest are only reported.
        cuda_graphs: on a CUDA device, replay the byte check as one CUDA graph from the third sync on
            the same addresses (the learner's parameters updated in place, the exporter's buffers
            reused): the host's kernel launches, not the GPU, bound it otherwise. Graphs of the last
            two address sets are kept, each keeping the check's temporaries (at most about
            ``max_batch_bytes``) reserved between syncs.

    Example (not run: it needs a Megatron model and an exporter):
        >>> validator = ExportValidator(contract="nvfp4-experts-per-token", config=config)  # doctest: +SKIP
        >>> report = validator(dict(export_hf(params, ...)), dict(model.named_parameters()))  # doctest: +SKIP
        >>> report.raise_if_failed()  # doctest: +SKIP
    """

    @gc_paused()  # tens of thousands of small objects (names, pieces, layouts): see gc_paused
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
        cuda_graphs: bool = True,
    ) -> None:
        self.plan = export_plan(
            contract=contract,
            config=config,
            dialect=dialect,
            family=family,
            include_input_scale=include_input_scale,
            calibration=calibration,
        )
        self.ep_rank, self.ep_size = ep_rank, ep_size
        self.items = self.plan.expected(ep_rank, ep_size)
        self.plan.experts_per_rank(ep_size)
        self.device = None if device is None else tensor_device(device)
        self.max_batch_bytes = max_batch_bytes
        self.max_diagnosed = max_diagnosed
        self.cuda_graphs = cuda_graphs
        self._replay: GraphReplay[tuple[list[_Counts], torch.Tensor]] = GraphReplay()
        self._compiled: tuple[Any, _Compiled | None] = (None, None)
        self._names = MasterNames(self.plan, ep_rank, ep_size)
        #: name -> shape of the master under the plan's own Megatron names (resolved now), the layout
        #: a learner with the standard layer specs passes
        self._canonical = dict(self._names.prepare())
        self._rows_on: dict[tuple[str, str], torch.Tensor] = {}
        #: the byte check's steps when the master gives every expected item (the usual case)
        self._all_steps = self._steps(self.items, complete=None)
        #: what the canonical layout fixes, per master dtype: a first sync with that layout then
        #: only compares names, shapes and dtypes (C-level list and dict comparisons) instead of a
        #: Python pass over every expected tensor. BF16, the masters' usual dtype, is built now.
        self._canonical_compiled: dict[torch.dtype, _Compiled] = {}
        if self._canonical:
            compiled = self._canonical_plan(torch.bfloat16)
            if compiled.steps:  # its batches' segments, index tables and pickers: host work a first sync skips
                lay_out(compiled.steps, compiled.sources, compiled.index, self.device)
                if self.device is not None:
                    self._interleaved_rows(compiled.steps, compiled.sources, self.device)
        #: expected items per format, as every report states them (fixed by the plan)
        self._formats: dict[str, int] = {}
        for item in self.items:
            fmt = item.decision.format if item.quantized else "bf16"
            self._formats[fmt] = self._formats.get(fmt, 0) + 1

    def _interleaved_rows(self, steps: list[list[Step]], sources: dict[str, Piece], device: torch.device) -> None:
        """Upload the row index of every BF16 check whose rows the master interleaves (QKV)."""
        ctx = self._master_context({}, sources, device, self._rows_on)
        for layer in steps:
            for _, payload in layer:
                piece = None if isinstance(payload, Batch) else sources.get(payload.info.name)
                if piece is not None and not piece.whole and len(piece.runs) > 1:
                    ctx.rows_index(piece.name)

    def prepare(self, master: Mapping[str, torch.Tensor]) -> ExportValidator:
        """Build now what the master's layout fixes (its names, dtypes and shapes; not its values), so
        the first sync costs about what later ones do: the check list of every expected tensor, where
        each comes from in the master, the byte check's steps and the tables it reads on the device
        (index tables, the master segments' address tables: these keep references to the master's
        tensors, as every sync's do). A later call with a master of another layout builds them again.

        Returns:
            This validator, for ``ExportValidator(...).prepare(master)``.
        """
        with torch.no_grad(), gc_paused():
            compiled = self._compile(master)
            if compiled.steps and not hasattr(master, "meta"):  # tensors: the byte check's tables too
                ctx = self._master_context(master, compiled.sources, self.device or _device_of(master), self._rows_on)
                for layer in compiled.steps:
                    ctx.begin_chunk()
                    for kind, payload in layer:
                        prepare_step(ctx, kind, payload)
                    ctx.end_chunk()
        return self

    # -- what a master layout fixes ------------------------------------------------------------------

    def _compile(self, master: Mapping[str, torch.Tensor]) -> _Compiled:
        files = hasattr(master, "meta")
        if files:  # headers
            signature: tuple[Any, ...] = tuple((key, tensor_meta(master, key)) for key in master)
        else:  # tensors: names, dtypes and shapes as three lists (C-level passes, compared as they are)
            tensors = list(master.values())
            signature = (list(master), list(map(_DTYPE, tensors)), list(map(_SHAPE, tensors)))
            if any(map(_IS_META, tensors)):  # no values: the layout alone would pass (a C-level pass)
                key = next(k for k, t in master.items() if t.is_meta)
                check_master_tensor(key, master[key])
        if self._compiled[0] == signature and self._compiled[1] is not None:
            return self._compiled[1]  # the same master layout as last sync: nothing to redo
        if not files and not set(signature[1]) <= MASTER_TORCH_DTYPES:  # a new layout
            for key, tensor in master.items():  # names the first tensor the quantizers cannot read
                check_master_tensor(key, tensor)
        compiled = None if files else self._canonical_layout(*signature)
        if compiled is None:
            compiled = self._compile_layout({key: tensor_meta(master, key) for key in master})
        self._compiled = (signature, compiled)
        return compiled

    def _canonical_layout(self, names: list[str], dtypes: list[torch.dtype], shapes: list[Any]) -> _Compiled | None:
        """What the canonical layout fixes, if the master has it (any order, one dtype), else None."""
        if not dtypes or len(names) != len(self._canonical) or dtypes.count(dtypes[0]) != len(dtypes):
            return None
        if dict(zip(names, shapes, strict=True)) != self._canonical:  # torch.Size equals its tuple
            return None
        return self._canonical_plan(dtypes[0])

    def _canonical_plan(self, dtype: torch.dtype) -> _Compiled:
        """What the canonical layout fixes with every tensor of ``dtype`` (built once per dtype)."""
        if dtype not in self._canonical_compiled:
            name = meta_dtype(dtype)
            metas = {key: (name, shape) for key, shape in self._canonical.items()}
            self._canonical_compiled[dtype] = self._compile_layout(metas)
        return self._canonical_compiled[dtype]

    def _compile_layout(self, metas: Mapping[str, tuple[str, tuple[int, ...]]]) -> _Compiled:
        """What a master's names, dtypes and shapes (``metas``: name -> (safetensors dtype, shape), as
        :func:`tensor_meta` gives them) fix: one Python pass over the expected tensors."""
        sources = self._names.sources({k: s for k, (_, s) in metas.items()})
        ctx = self._master_context({}, sources, torch.device("cpu"), {})
        dtypes = {k: d for k, (d, _) in metas.items()}
        outputs: dict[str, list[OutputSpec]] = {}
        for item in self.items:
            found = ctx.expected_outputs(item, dtypes)
            if found is not None:
                outputs[item.info.name] = found
        checks = [
            (name, SAFETENSORS_DTYPES[dtype], tuple(shape), item)
            for item in self.items
            for name, dtype, shape in outputs.get(item.info.name, ())
        ]
        compiled = _Compiled(sources, outputs, list(ctx.report.findings), ctx.expected_names, ctx.master_bytes, checks)
        everything = len(outputs) == len(self.items)
        compiled.set_steps(self._all_steps if everything else self._steps([self.plan.items[n] for n in outputs], None))
        return compiled

    def _master_context(
        self,
        master: Mapping[str, torch.Tensor],
        sources: Mapping[str, Piece],
        device: torch.device,
        rows_on: dict[tuple[str, str], torch.Tensor],
    ) -> Context:
        """A context with the master and no export, its findings in a scratch report: what building
        from the master's layout needs."""
        scratch = ExportReport("", "", 0, 1, [], 0, {})
        return Context(self.plan, {}, master, sources, device, scratch, self.ep_rank, self.ep_size, rows_on)

    def _steps(self, items: list[PlannedTensor], complete: set[str] | None) -> list[list[Step]]:
        return plan_steps(self.plan, items, complete, self.max_batch_bytes)

    # -- structure ----------------------------------------------------------------------------------

    def _structure(self, ctx: Context, compiled: _Compiled) -> set[str]:
        """Presence, dtype and shape of every expected tensor; returns the items that failed."""
        broken: set[str] = set()
        exported = ctx.exported
        if hasattr(exported, "meta"):  # files: read headers, never tensors
            meta = exported.meta
            for name, dtype, shape, item in compiled.checks:
                if name not in exported or meta(name) != (dtype_name(dtype), shape):
                    self._structure_finding(ctx, name, dtype, shape)
                    broken.add(item.info.name)
        elif not _as_expected(exported, compiled, ctx):  # else ctx.fetched holds them, in check order
            get = exported.get
            for name, dtype, shape, item in compiled.checks:
                tensor = get(name)
                if tensor is None or tensor.dtype != dtype or tensor.shape != shape or tensor.is_meta:
                    self._structure_finding(ctx, name, dtype, shape)
                    broken.add(item.info.name)
        ctx.structure_failed = [self.plan.items[n] for n in compiled.outputs if n in broken]
        return broken

    @staticmethod
    def _structure_finding(ctx: Context, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        if name not in ctx.exported:
            ctx.add(Finding(name, "missing", "not in the export (no update bucket holds it)"))
            return
        got_dtype, got_shape = tensor_meta(ctx.exported, name)
        expected = f"expected {dtype_name(dtype)} {list(shape)}"
        if getattr(ctx.exported[name], "is_meta", False):
            ctx.add(Finding(name, "dtype", "a tensor on the meta device: it holds no bytes to compare"))
        elif got_dtype != dtype_name(dtype):
            ctx.add(Finding(name, "dtype", f"{got_dtype} {list(got_shape)}, {expected}"))
        else:
            ctx.add(Finding(name, "shape", f"{list(got_shape)}, {expected}"))

    def _extras(self, ctx: Context) -> None:
        for name, files in getattr(ctx.exported, "duplicates", {}).items():
            ctx.add(Finding(name, "duplicate", f"sent in more than one update bucket ({', '.join(files)})"))
        if ctx.fetched is not None and len(ctx.exported) == len(ctx.fetched):
            return  # every expected name is there and nothing else can be: no pass over the names
        expected = ctx.expected_names
        ctx.extras = [name for name in ctx.exported if name not in expected]

    # -- the byte comparison ---------------------------------------------------------------------------

    def _compare(
        self, ctx: Context, compiled: _Compiled, broken: set[str], *, structure_as_issued: bool = False
    ) -> list[tuple[PlannedTensor, dict[str, int]]] | None:
        """Byte checks of every structurally fit item; returns the failing ones with their counts.

        ``structure_as_issued``: the structure has not been checked yet; each layer's tensors are
        checked (:func:`_as_expected`) just before its kernels are issued, so the GPU starts after one
        layer's checks rather than all ~55k, and the rest run while it works. Returns None at the first
        structural fault (the caller then checks the structure in full and compares again)."""
        slow: list[PlannedTensor] = []
        steps = compiled.steps
        ends = compiled.layer_ends if structure_as_issued else None
        if broken or steps is None:
            # A group with a broken member cannot be batched (its shared amax needs every member's
            # master rows): its fit members are checked one by one on the slow path instead.
            bad_units = {unit_of(self.plan, self.plan.items[n]) for n in broken}
            fit = [self.plan.items[n] for n in compiled.outputs if n not in broken]
            slow = [i for i in fit if i.quantized and unit_of(self.plan, i) in bad_units]
            complete = {unit_of(self.plan, i) for i in fit} - bad_units
            steps = self._steps(fit, complete)
        results = _issue(ctx, compiled, steps, ends)
        if results is None:
            return None
        every = torch.cat([c.reshape(-1) for _, c, _ in results]).cpu() if results else None  # one transfer
        return _failing(results, every) + [(item, {"slow": 1}) for item in slow]

    def _compare_replayed(
        self, ctx: Context, compiled: _Compiled, master: Mapping[str, torch.Tensor]
    ) -> list[tuple[PlannedTensor, dict[str, int]]] | None:
        """The byte check of a whole, well-formed export as one CUDA graph (:mod:`~fp4convert.megatron.replay`):
        captured at the second sync on the same addresses, replayed while the exported and master
        tensors stay where they were. None at a structural fault, as :meth:`_compare`.

        The key is every exported tensor's address and size and every master tensor's address; each
        must be contiguous. The same key then means the graph reads exactly the memory of these
        tensors (never past one someone reshaped in place), so a replay is launched at once and the
        dtypes and shapes of the ~55k tensors are checked while the GPU works; a structural fault
        found then discards what it computed. A first sight of a key checks the structure before
        any kernel, as the eager and capturing runs read the tensors by their expected shapes."""
        tensors: list[torch.Tensor | None] = list(map(ctx.exported.get, compiled.names))
        masters = list(master.values())
        try:
            key = list(map(torch.Tensor.data_ptr, tensors))  # type: ignore[arg-type]
        except TypeError:  # a missing tensor (None)
            return None
        key += map(_NBYTES, tensors)
        key += map(torch.Tensor.data_ptr, masters)
        contiguous = all(map(torch.Tensor.is_contiguous, tensors)) and all(map(torch.Tensor.is_contiguous, masters))  # type: ignore[arg-type]
        steps = cast(list[list[Step]], compiled.steps)

        def work() -> tuple[list[_Counts], torch.Tensor]:
            # a context of its own: what a failed capture allocated (never computed) is not reused
            own = replace(ctx, _chunk=None, _false=None)
            results = cast(list[_Counts], _issue(own, compiled, steps, None))
            if not results:  # a plan with nothing to compare (torch.cat needs one tensor)
                return results, torch.zeros(0, dtype=torch.int64, device=ctx.device)
            return results, torch.cat([c.reshape(-1) for _, c, _ in results])

        if contiguous and self._replay.holds(compiled, key):
            results, every = self._replay.replay(compiled, key)  # launched: the GPU works meanwhile
            if not _as_expected(ctx.exported, compiled, ctx, fetched=tensors):
                return None
        elif contiguous and self._replay.seen(compiled, key):  # the second sight: captured
            if not _as_expected(ctx.exported, compiled, ctx, fetched=tensors):
                return None
            captured = self._replay.capture(compiled, key, ctx.device, work)
            if captured is None:
                return self._compare(ctx, compiled, set())
            results, every = captured
        else:  # a first sight: the eager check, each layer's structure checked as its kernels go out
            failing = self._compare(ctx, compiled, set(), structure_as_issued=True)
            if contiguous and failing is not None:
                self._replay.saw(compiled, key)
            return failing
        return _failing(results, every.cpu())

    # -- the whole check ------------------------------------------------------------------------------

    def __call__(self, exported: Mapping[str, torch.Tensor], master: Mapping[str, torch.Tensor]) -> ExportReport:
        """Validate one export against its master.

        Args:
            exported: HF name -> tensor, as the exporter sent it (any device).
            master: the BF16 master, HF or Megatron-Core names (TP-gathered; Megatron expert ids
                local to ``ep_rank``).

        Returns:
            The :class:`~fp4convert.megatron.report.ExportReport`.
        """
        with torch.no_grad(), gc_paused():  # masters are often the learner's Parameters; gc: see gc_paused
            return self._validate(exported, master)

    def _validate(self, exported: Mapping[str, torch.Tensor], master: Mapping[str, torch.Tensor]) -> ExportReport:
        started = time.perf_counter()
        device = self.device or _device_of(master)
        plan = self.plan
        compiled = self._compile(master)
        report = ExportReport(
            contract=plan.contract.name,
            dialect=plan.dialect.name,
            ep_rank=self.ep_rank,
            ep_size=self.ep_size,
            expected=list(compiled.expected_names),
            received=len(exported),
            formats=dict(self._formats),
            findings=list(compiled.problems),
            master_bytes=compiled.master_bytes,
        )
        ctx = Context(
            plan,
            exported,
            master,
            compiled.sources,
            device,
            report,
            self.ep_rank,
            self.ep_size,
            self._rows_on,
            expected_names=compiled.expected_names,
        )
        failing = None
        if compiled.steps and not hasattr(exported, "meta"):  # tensors
            if self.cuda_graphs and device.type == "cuda":
                failing = self._compare_replayed(ctx, compiled, master)
            else:  # the structure checked per layer, just before its kernels
                failing = self._compare(ctx, compiled, set(), structure_as_issued=True)
        if failing is None:  # files, or a structural fault: the whole structure first, naming each fault
            ctx.fetched = ctx.fetched_index = None
            broken = self._structure(ctx, compiled)
            failing = self._compare(ctx, compiled, broken)
        assert failing is not None
        self._extras(ctx)
        diagnose.explain(ctx, failing, self.max_diagnosed)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
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
            model, ``device`` is not one this machine has, or the master holds names that are not
            this model's.

    Example (not run: it needs a model's state dict and config):
        >>> megatron = hf_to_megatron(hf_state_dict, "qwen3_moe", config)  # doctest: +SKIP
        >>> kwargs = {"contract": "nvfp4-experts-per-token", "family": "qwen3_moe", "config": config}  # doctest: +SKIP
        >>> exported = dict(export_hf(megatron.items(), **kwargs))  # doctest: +SKIP
        >>> validate_export(exported, megatron, **kwargs).ok  # doctest: +SKIP
        True
    """
    the_contract = loaded_contract(contract)
    key = (
        contract_hash(the_contract),
        family,
        repr(sorted(config.items())),
        getattr(dialect, "name", dialect),
        ep_rank,
        ep_size,
        include_input_scale,
        None if device is None else str(device),
    )
    validator = _VALIDATORS.get(key)
    if validator is None:
        validator = ExportValidator(
            contract=the_contract,
            config=config,
            dialect=dialect,
            family=family,
            ep_rank=ep_rank,
            ep_size=ep_size,
            include_input_scale=include_input_scale,
            device=device,
        )
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
        master: the BF16 master: an HF checkpoint folder (an FP8 / MXFP4 release or a fused-expert
            save is read through its one dequantization, docs/sources.md), or a folder / file of
            Megatron-named safetensors (``fp4convert to-megatron`` writes one).
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
        CheckpointError: unreadable files, no config.json, or a master tensor that is not BF16/F16/F32.

    Example (not run: it needs an exporter's dump and a master checkpoint):
        >>> report = validate_export_files("dump/", "Qwen3-30B-A3B/", contract="nvfp4-experts-per-token")
        ... # doctest: +SKIP
        >>> report.ok, report.summary()  # doctest: +SKIP
        (True, 'OK: all 55443 exported tensors follow contract nvfp4-experts-per-token (...)')
    """
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConversionError("--device cuda was asked for, but no CUDA device is available", hint="use --device cpu")
    master_path = Path(master)
    config_path = Path(config) if config is not None else (master_path if master_path.is_dir() else master_path.parent)
    if config_path.is_dir() and not (config_path / "config.json").is_file():
        raise CheckpointError(
            f"{config_path} has no config.json",
            hint="pass --config with the model's config.json",
            file=str(config_path),
        )
    the_config = load_config(config_path)
    # An FP8 / MXFP4 release or a fused-expert save is read through its one dequantization.
    decoded = decoded_source(master_path)
    with SafetensorsFolder(dump) as dumped, decoded or SafetensorsFolder(master_path) as masters:
        if masters.duplicates:
            name = next(iter(masters.duplicates))
            raise CheckpointError(f"master tensor {name!r} is stored in more than one file", tensor=name)
        odd = next((n for n in masters if masters.meta(n)[0] not in MASTER_DTYPES), None)
        if odd is not None:  # a master is what the quantizers read: never an int, bool or FP8 tensor
            raise CheckpointError(
                f"master tensor {odd!r} is {masters.meta(odd)[0]}, not {MASTER_DTYPES_PHRASE}",
                hint="validate against the high-precision master the exporter quantized from",
                tensor=odd,
            )
        validator = ExportValidator(
            contract=contract,
            config=the_config,
            dialect=dialect,
            ep_rank=ep_rank,
            ep_size=ep_size,
            include_input_scale=include_input_scale,
            device=device,
        )
        return validator(dumped, masters)
