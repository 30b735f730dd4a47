"""The reusable live exporter: one object per (contract, model, dialect, EP position), called every sync.

:class:`LiveExporter` does what :func:`~fp4convert.megatron.export_hf` does (it is what that
function runs), with everything a sync repeats kept between syncs: the plan, where each master
name's HF tensors are (:mod:`fp4convert.megatron.resolve`), the quantized groups and their segment
layouts (:mod:`fp4convert.megatron.groups`), and the output buffers with their per-tensor views.
A sync then reads each master tensor's address, launches a few kernels per group (per run of
groups, with runs on: :data:`MERGE_RUNS_BY_DEFAULT`) with no host synchronisation, and hands out
views of the output buffers.

Output buffers are reused only when nothing from an earlier sync still refers to them: every
output's reference count and every buffer's storage use count are compared with what the exporter
itself holds, so a caller that keeps an update (``update = dict(exporter(params))`` while the next
sync runs) gets a second set, and a third concurrent one is allocated afresh. Steady state holds
one set (two in the ``update = ...`` pattern): no allocation grows across syncs, and the extra
device memory is the quantized output itself.
"""

from __future__ import annotations

import collections
import itertools
import operator
import os
import sys
from collections.abc import ItemsView, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch

from fp4convert.errors import MappingError
from fp4convert.families import unpack
from fp4convert.formats.devices import current_cuda_device, tensor_device
from fp4convert.megatron.encode import encode_group
from fp4convert.megatron.groups import (
    Group,
    GroupBuffers,
    Matrices,
    Run,
    RunBuffers,
    piece_value,
    plan_groups,
    plan_runs,
    run_bound,
    run_group,
    sent_dtype,
)
from fp4convert.megatron.plan import ContractLike, DialectLike, ExportPlan, export_plan, gc_paused
from fp4convert.megatron.replay import GraphReplay
from fp4convert.megatron.resolve import MasterNames, Piece
from fp4convert.megatron.sources import check_master_tensor
from fp4convert.plan import PlannedTensor

__all__ = ["LiveExporter", "bucketed"]

_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")
_IS_META = operator.attrgetter("is_meta")
_NAME = operator.attrgetter("name")
_KEY = _PIECE = operator.itemgetter(0)
_TENSOR = _MEMBERS = _GROUP = operator.itemgetter(1)
_CHECKED = operator.itemgetter(2)  # a record's dtype that passes unchecked


def _is_high_precision(member: tuple[Piece, int]) -> bool:
    return member[1] < 0


#: a whole update's groups of one format, tile and width quantized by one set of launches (:class:`Run`),
#: up to MAX_RUN_BYTES of output each: an eager sync (a first call, a capture) issues a few launches
#: per run instead of per layer. On by default since an H100 ran every GPU test with it and timed it
#: (stop 45: a constructed exporter's first call 69 against 132 ms on one machine, steady syncs the
#: same); ``FP4CONVERT_MERGE_RUNS=0`` (read at import) turns it off.
MERGE_RUNS_BY_DEFAULT = True
_MERGE_RUNS = os.environ.get("FP4CONVERT_MERGE_RUNS", "1" if MERGE_RUNS_BY_DEFAULT else "0") == "1"
MAX_RUN_BYTES = 4 << 30

Pair = tuple[str, torch.Tensor]
#: what one master tensor gives: unpacked or not, (piece, group: -1 for high precision) per HF tensor,
#: and a dtype a tensor of it may have without being checked again (one it was checked with, or
#: BF16 where the constructor predicted it: a master dtype, so that check would pass)
_Record = tuple[bool, list[tuple[Piece, int]], torch.dtype]


class _OutputSet:
    """One sync's worth of output buffers (allocated per group on first use) and their views.

    Free for reuse when nothing outside holds them: each view's reference count is the exporter's
    own two (its pair and its entry in the group's ready list; the exporter hands out fresh pairs),
    and each buffer's storage has no more users (views) than the exporter made.
    """

    def __init__(self, made_for: torch.device | None = None) -> None:
        #: the device a constructor made this set for, until the set's first sync: a first sync on
        #: another device empties it first (nothing handed out refers to it yet)
        self.made_for = made_for
        self._empty()

    def _empty(self) -> None:
        self.groups: dict[int, GroupBuffers] = {}
        self.runs: dict[int, RunBuffers] = {}  # per run, the matrices its groups' buffers are rows of
        #: per group, the plan positions, names and views of its outputs, in member order
        self.ready: dict[int, tuple[list[int], list[str], list[torch.Tensor]]] = {}
        self.copies: dict[str, Pair] = {}  # high-precision outputs that are not the master's tensor
        self._views: list[torch.Tensor] = []  # every group output, once
        self._view_refs: list[int] = []  # each view's reference count when only this set holds it (measured)
        self._storages: list[tuple[torch.Tensor, int]] = []

    def group(
        self,
        plan: ExportPlan,
        index: int,
        group: Group,
        device: torch.device,
        positions: list[int],
        into: Matrices | None = None,
    ) -> tuple[GroupBuffers, tuple[list[int], list[str], list[torch.Tensor]]]:
        """The group's buffers on ``device`` (allocated on first use, or rows of its run's ``into``)
        and its ready list; ``positions``: each member's first plan position."""
        self._first_use(device)
        found = self.groups.get(index)
        if found is None or found.data.device != device:
            found = GroupBuffers.allocate(plan, group, device, into)
            self.groups[index] = found
            if into is None:  # a run's matrices are counted once, when all its groups' views exist
                self._keep(found.data, found.scale, found.global_scale)
            triples = [
                (position + i, name, tensor)
                for position, pairs in zip(positions, found.outputs, strict=True)
                for i, (name, tensor) in enumerate(pairs)
            ]
            self.ready[index] = ([t[0] for t in triples], [t[1] for t in triples], [t[2] for t in triples])
            del triples
            start = len(self._views)
            self._views.extend(tensor for member in found.outputs for _, tensor in member)
            # counted the way free() counts (no temporary list holding them): the set's own references
            self._view_refs.extend(map(sys.getrefcount, itertools.islice(self._views, start, None)))
        return found, self.ready[index]

    def run(
        self,
        plan: ExportPlan,
        index: int,
        run: Run,
        groups: list[Group],
        device: torch.device,
        firsts: list[list[int]],
    ) -> RunBuffers | None:
        """The run's matrices on ``device`` and its groups' buffers as rows of them (allocated on
        first use); None when one of its groups has buffers of its own (a sync that ran it alone)."""
        self._first_use(device)
        found = self.runs.get(index)
        if found is not None and found.data.device == device:
            return found
        if any(g in self.groups for g in run.members):
            return None
        found = RunBuffers.allocate(run, device)
        self.runs[index] = found
        for g, into in zip(run.members, found.of_groups(run, groups), strict=True):
            self.group(plan, g, groups[g], device, firsts[g], into)
        self._keep(found.data, found.scale, found.global_scale)
        return found

    def _first_use(self, device: torch.device) -> None:
        """A set made at construction for another device than its first sync's is emptied, so
        that the buffers made there are freed rather than kept beside the ones made here."""
        if self.made_for is not None:
            if device != self.made_for:
                self._empty()
            self.made_for = None

    def _keep(self, *buffers: torch.Tensor | None) -> None:
        """Count the views of each buffer's storage that this set holds (what :meth:`free` compares)."""
        self._storages.extend((t, _use_count(t)) for t in buffers if t is not None)

    def copy_of(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Pair:
        pair = self.copies.get(name)
        if pair is None or pair[1].device != device or pair[1].dtype != dtype:
            pair = (name, torch.empty(shape, dtype=dtype, device=device))
            self.copies[name] = pair
            self._keep(pair[1])
        return pair

    def free(self) -> bool:
        """Whether nothing outside the exporter refers to these buffers any more."""
        refcount = sys.getrefcount
        return (
            all(map(operator.le, map(refcount, self._views), self._view_refs))  # C-level passes over ~55k
            and all(refcount(pair[1]) <= 3 for pair in self.copies.values())  # + its _storages entry
            and all(_use_count(t) <= count for t, count in self._storages)
        )


def _use_count(tensor: torch.Tensor) -> int:
    return int(torch._C._storage_Use_Count(tensor.untyped_storage()._cdata))


def _make_tables(unit: Group | Run, device: torch.device) -> None:
    """Make now the static tables a laid-out group's or run's launches read on ``device``: its
    segment tables and, for NVFP4, each member's unit (by which its global scale is picked)."""
    assert unit.layout is not None
    unit.layout.make_tables(device)
    if unit.fmt == "nvfp4":
        unit.item_units(device)


def _replays_on(device: torch.device) -> bool:
    """Whether syncs on ``device`` are replayed as CUDA graphs (CUDA devices)."""
    return device.type == "cuda"


class _Template:
    """Where each output of a replayed sync comes from, as positions: a view of the output set
    (``_OutputSet._views``), a high-precision copy (``copies``, by name), or a parameter sent as
    itself (its place in the call's parameters). No tensor is held: a held view would keep the set
    busy (:meth:`_OutputSet.free`), a held parameter would outlive the learner's."""

    def __init__(self, names: list[str], view_slots: list[int], views: list[int], others: list[tuple[int, str, Any]]):
        self.names = names
        self.view_slots = view_slots
        self.pick_views = operator.itemgetter(*views) if views else None
        self.single = len(views) == 1
        self.others = others  # (position, "copy", name) or (position, "param", index)

    @classmethod
    def of(cls, pairs: list[Pair], out: _OutputSet, params: list[tuple[str, torch.Tensor]]) -> _Template | None:
        """The template of an eager sync's ``pairs``; None when an output is none of the three
        (a partial update's freshly encoded group)."""
        view_at = {id(v): k for k, v in enumerate(out._views)}
        copy_at = {id(pair[1]): name for name, pair in out.copies.items()}
        param_at = {t.data_ptr(): i for i, (_, t) in reversed(list(enumerate(params)))}
        names: list[str] = []
        view_slots: list[int] = []
        views: list[int] = []
        others: list[tuple[int, str, Any]] = []
        for slot, (name, tensor) in enumerate(pairs):
            names.append(name)
            k = view_at.get(id(tensor))
            if k is not None:
                view_slots.append(slot)
                views.append(k)
            elif id(tensor) in copy_at:
                others.append((slot, "copy", copy_at[id(tensor)]))
            else:
                i = param_at.get(tensor.data_ptr())
                param = None if i is None else params[i][1]
                same = param is not None and tensor.numel() > 0 and (param.dtype, param.shape, param.stride()) == (
                    tensor.dtype, tensor.shape, tensor.stride()
                )  # fmt: skip
                if not same:
                    return None
                others.append((slot, "param", i))
        return cls(names, view_slots, views, others)

    def pairs(self, out: _OutputSet, params: list[tuple[str, torch.Tensor]]) -> list[Pair]:
        """This sync's ``(name, tensor)`` pairs, fresh, in the eager sync's order (C-level passes)."""
        tensors: list[Any] = [None] * len(self.names)
        if self.pick_views is not None:
            got = self.pick_views(out._views)
            collections.deque(map(tensors.__setitem__, self.view_slots, (got,) if self.single else got), maxlen=0)
        for slot, kind, ref in self.others:
            tensors[slot] = out.copies[ref][1] if kind == "copy" else params[ref][1].detach()
        return list(zip(self.names, tensors, strict=True))


class LiveExporter:
    """Export Megatron parameters as a dialect's HF tensors, sync after sync (see the module docstring).

    Args:
        contract: a :class:`~fp4convert.contract.Contract`, a contract file or a shipped name.
        config: the model's config.json (or its path / a shipped name).
        dialect: ``modelopt``, ``sglang-mxfp8`` or ``compressed-tensors`` (or a dialect instance).
        family: family key; None takes it from the config.
        ep_rank: the expert-parallel rank the parameters come from (expert ids local to it).
        ep_size: expert-parallel size.
        include_input_scale: also send NVFP4 activation scales.
        calibration: activation amax per HF module, for per-tensor activation contracts.
        output_sets: how many sets of output buffers are kept for reuse (more are allocated per
            call when every kept set is still referenced).
        device: where to allocate the first set of output buffers (and make the kernels' static
            tables) now, at construction, so that the first sync does not: ``"auto"``, the current
            CUDA device where CUDA is available (a learner's GPU: construct it after
            ``torch.cuda.set_device``, as Megatron's initialisation calls it) and else none; None: at
            the first sync, on the device the parameters arrive on (parameters arriving on another
            device than the one named get buffers there, and the ones made here are dropped).
        cuda_graphs: on a CUDA device, a whole update (:meth:`__call__`, :meth:`buckets`) of
            parameters passed as a collection (``dict(model.named_parameters())``, its ``items()``,
            a list; an iterator is consumed lazily and never replayed) is replayed as one CUDA graph
            from the third sync with the same parameters at the same addresses into the same output
            set (:mod:`~fp4convert.megatron.replay`): the host's kernel launches, not the GPU, bound a
            sync otherwise. The graph keeps the sync's temporaries (a few small tables per group)
            reserved between syncs.

    Raises:
        ConversionError: the contract cannot be exported in this dialect, or ``device`` is not
            one this machine has.
        MappingError: a bad EP position, or a family that does not match the config.

    Example (not run: it needs a Megatron model):
        >>> exporter = LiveExporter(contract="nvfp4-experts-per-token", config=config)  # doctest: +SKIP
        >>> for bucket in exporter.buckets(dict(model.named_parameters()), max_bytes=1 << 30):  # doctest: +SKIP
        ...     engine.update_weights(bucket)
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
        output_sets: int = 2,
        device: str | torch.device | None = "auto",
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
        self.plan.experts_per_rank(ep_size)  # a bad EP size fails before any tensor is read
        self.ep_rank, self.ep_size = ep_rank, ep_size
        self.items = self.plan.expected(ep_rank, ep_size)
        self.names = MasterNames(self.plan, ep_rank, ep_size)
        self.groups = plan_groups(self.plan, self.items)
        self._member: dict[str, tuple[int, int]] = {
            item.info.name: (g, m) for g, group in enumerate(self.groups) for m, item in enumerate(group.items)
        }
        position = 0
        self._position: dict[str, int] = {}  # HF item -> plan position of its first output
        for item in self.items:
            self._position[item.info.name] = position
            position += len(item.outputs)
        self.num_outputs = position
        self._firsts = [[self._position[item.info.name] for item in group.items] for group in self.groups]
        #: (name, shape) -> what that master tensor gives, and the dtype it passes with unchecked
        #: (:data:`_Record`)
        self._records: dict[tuple[str, tuple[int, ...]], _Record] = {}
        self._sets: list[_OutputSet] = []
        self.output_sets = output_sets
        self.cuda_graphs = cuda_graphs
        self._replay: GraphReplay[_Template] = GraphReplay(slots=max(1, output_sets))
        self._layout_of: list[list[Piece] | None] = [None] * len(self.groups)
        self._runs = plan_runs(self.groups, MAX_RUN_BYTES) if _MERGE_RUNS else []
        self._in_run = {g for run in self._runs for g in run.members}
        where = (
            current_cuda_device()
            if isinstance(device, str) and device == "auto"
            else None
            if device is None
            else tensor_device(device)
        )
        self._prepare(where)
        if where is not None and output_sets > 0:
            out = _OutputSet()
            for r, run in enumerate(self._runs):
                out.run(self.plan, r, run, self.groups, where, self._firsts)
            for g, group in enumerate(self.groups):
                out.group(self.plan, g, group, where, self._firsts[g])  # found when its run made it
            out.made_for = where
            self._sets.append(out)

    def _prepare(self, device: torch.device | None) -> None:
        """What the first sync would otherwise work out, done now for the plan's own Megatron
        names: each name's pieces (resolved in one batched pass) and each group's segment layout,
        with its device tables when the device is known. A learner spelling names otherwise
        (SequentialMLP experts, a wrapper prefix) has them resolved at its first sync instead."""
        pieces_of: dict[str, Piece] = {}
        for key, shape in self.names.prepare():
            try:
                _, members, _ = self._record(key, shape)
            except MappingError:  # not this learner's shape after all: resolved when it comes
                continue
            pieces_of.update((piece.name, piece) for piece, _ in members)
        for g, group in enumerate(self.groups):
            names = [item.info.name for item in group.items]
            if not all(name in pieces_of for name in names):
                continue  # a member the plan's spelling does not give: laid out at the first sync
            pieces = [pieces_of[name] for name in names]
            group.build_layout(pieces)
            self._layout_of[g] = pieces
            if device is not None:
                _make_tables(group, device)
        for run in self._runs:
            if all(self._layout_of[g] is not None for g in run.members):
                run.lay_out(self.groups)
                if device is not None:
                    _make_tables(run, device)

    # -- one sync ------------------------------------------------------------------------------

    def _free_set(self) -> _OutputSet:
        for out in self._sets:
            if out.free():
                return out
        out = _OutputSet()
        if len(self._sets) < self.output_sets:
            self._sets.append(out)
        return out

    def _check(self, key: str, shape: tuple[int, ...], pieces: list[Piece]) -> None:
        """Shapes against the config."""
        for piece in pieces:
            item = self.plan.item(piece.name)
            expected = tuple(item.info.shape)
            if piece.shape != expected:
                raise MappingError(
                    f"`{key}` gives `{piece.name}` the shape {piece.shape}, but the config says {expected}",
                    hint="pass tensor-parallel-gathered parameters (whole tensors) of this model",
                    tensor=key,
                )

    def _outputs(self, out: _OutputSet, item: PlannedTensor, tensor: torch.Tensor, piece: Piece) -> list[Pair]:
        """A high-precision item's output: the master tensor itself when it is the whole HF tensor
        in the dtype it is sent in (:func:`~fp4convert.megatron.groups.sent_dtype`), else a copy
        (split rows, or a norm cast to the plan's dtype)."""
        name, _, shape = item.outputs[0]
        dtype = sent_dtype(item, tensor.dtype)
        if piece.whole and tensor.dtype == dtype:
            return [(name, tensor.detach())]
        buffer = out.copy_of(name, tuple(shape), dtype, tensor.device)[1]
        if piece.whole:
            buffer.copy_(tensor.reshape(shape))
        elif (rows := piece.strided(tensor)) is not None:  # q/k/v: a run per query group, one copy
            buffer.view(rows.shape).copy_(rows)
        else:  # each run of rows straight into place
            row = 0
            for start, count in piece.runs:
                buffer[row : row + count].copy_(tensor[start : start + count])
                row += count
        return [(name, buffer)]

    def _events(
        self,
        named_params: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
        out: _OutputSet | None = None,
        whole: bool = False,
    ) -> Iterator[tuple[list[int], list[Pair]]]:
        """``(plan positions, outputs)``, each as soon as its tensors are complete (into ``out``, or
        a free output set); ``whole``: the caller takes the update whole, so the groups of a run
        wait for the last parameter and are quantized together (:meth:`_run_waiting`)."""
        params = named_params.items() if isinstance(named_params, Mapping) else named_params
        out = self._free_set() if out is None else out
        known = self._known(params) if whole and isinstance(params, (ItemsView, Sequence)) else None
        if known is not None:
            return self._known_events(out, *known)
        return self._walk(params, out, whole)

    def _walk(
        self, params: Iterable[tuple[str, torch.Tensor]], out: _OutputSet, whole: bool
    ) -> Iterator[tuple[list[int], list[Pair]]]:
        """:meth:`_events` tensor by tensor: each is checked when it is not the shape and dtype
        seen (or predicted) before, and each group runs as soon as its last tensor arrived."""
        groups = self.groups
        sizes = [len(group.items) for group in groups]
        counts = [0] * len(groups)
        arrived: dict[tuple[str, int | None], torch.Tensor] = {}
        pieces_of: dict[str, Piece] = {}
        records = self._records
        in_run = self._in_run if whole else set()
        waiting: list[int] = []  # complete groups of a run
        for key, tensor in params:
            if tensor.is_meta:  # checked at every sync: a record made from a real tensor would let it pass
                check_master_tensor(key, tensor)
            shape = tuple(tensor.shape)
            record = records.get((key, shape))
            if record is None:
                record = self._record(key, shape, tensor)
            elif record[2] is not tensor.dtype:  # another dtype than predicted or last seen: checked
                check_master_tensor(key, tensor)
                record = records[(key, shape)] = (record[0], record[1], tensor.dtype)
            stacked, members, _ = record
            if stacked:
                subs = unpack(key, tensor, experts_per_rank=self.names.per_rank, q_lora_rank=self.names.q_lora_rank)
                for index, (_, view) in enumerate(subs or []):
                    arrived[(key, index)] = view
            else:
                arrived[(key, None)] = tensor
            positions: list[int] = []
            ready: list[Pair] = []
            for piece, g in members:
                name = piece.name
                if name in pieces_of:
                    raise MappingError(
                        f"`{name}` is produced twice (again from `{key}`)",
                        hint="pass each tensor once, in one expert layout and one spelling",
                        tensor=name,
                    )
                pieces_of[name] = piece
                if g < 0:
                    with torch.no_grad():
                        outputs = self._outputs(out, self.plan.items[name], arrived[(key, piece.sub)], piece)
                    positions += [self._position[name]] * len(outputs)
                    ready += outputs
                    continue
                counts[g] += 1
                if counts[g] == sizes[g]:
                    if g in in_run:
                        waiting.append(g)
                        continue
                    with torch.no_grad():
                        at, pairs = self._run(out, g, arrived, pieces_of)
                    positions += at
                    ready += pairs
            if ready:
                yield positions, ready
        if waiting:
            yield from self._run_waiting(out, waiting, arrived, pieces_of)
        yield from self._finish(out, counts, arrived, pieces_of)

    def _known(
        self, params: ItemsView[str, torch.Tensor] | Sequence[tuple[str, torch.Tensor]]
    ) -> tuple[list[str], list[torch.Tensor], list[_Record], list[tuple[Piece, int]], dict[str, Piece]] | None:
        """A whole update read in C-level passes (a first sync's ~12k parameters walked one by one
        cost the host ~2 us each): every tensor's record, its members and their pieces by name;
        None when a tensor needs the per-tensor walk of :meth:`_events` (one not seen or predicted
        in this shape and dtype, a meta tensor, a piece given twice: it checks, and names the tensor)."""
        keys = list(map(_KEY, params))
        tensors = list(map(_TENSOR, params))
        found = list(map(self._records.get, zip(keys, map(_SHAPE, tensors), strict=True)))  # Size hashes as tuple
        if None in found or any(map(_IS_META, tensors)):
            return None
        records = cast(list[_Record], found)
        if list(map(_DTYPE, tensors)) != list(map(_CHECKED, records)):
            return None
        members = list(itertools.chain.from_iterable(map(_MEMBERS, records)))
        pieces = list(map(_PIECE, members))
        pieces_of = dict(zip(map(_NAME, pieces), pieces, strict=True))
        if len(pieces_of) != len(pieces):
            return None
        return keys, tensors, records, members, pieces_of

    def _known_events(
        self,
        out: _OutputSet,
        keys: list[str],
        tensors: list[torch.Tensor],
        records: list[_Record],
        members: list[tuple[Piece, int]],
        pieces_of: dict[str, Piece],
    ) -> Iterator[tuple[list[int], list[Pair]]]:
        """:meth:`_events` of a whole update :meth:`_known` read: the high-precision outputs, the
        groups outside runs, then the runs (the order of launches changes no byte)."""
        arrived: dict[tuple[str, int | None], torch.Tensor] = dict(
            zip(zip(keys, itertools.repeat(None), strict=False), tensors, strict=True)
        )
        for key, tensor, record in zip(keys, tensors, records, strict=True):
            if record[0]:  # stacked experts, a fused MLA down projection: few per model
                subs = unpack(key, tensor, experts_per_rank=self.names.per_rank, q_lora_rank=self.names.q_lora_rank)
                arrived.update(((key, index), view) for index, (_, view) in enumerate(subs or []))
        counts = [0] * len(self.groups)
        for g, count in collections.Counter(map(_GROUP, members)).items():
            if g >= 0:
                counts[g] = count
        positions: list[int] = []
        ready: list[Pair] = []
        with torch.no_grad():
            for piece, _ in filter(_is_high_precision, members):
                outputs = self._outputs(out, self.plan.items[piece.name], arrived[(piece.key, piece.sub)], piece)
                positions += [self._position[piece.name]] * len(outputs)
                ready += outputs
        yield positions, ready
        waiting: list[int] = []
        for g, group in enumerate(self.groups):
            if counts[g] != len(group.items):
                continue
            if g in self._in_run:
                waiting.append(g)
                continue
            with torch.no_grad():
                yield self._run(out, g, arrived, pieces_of)
        if waiting:
            yield from self._run_waiting(out, waiting, arrived, pieces_of)
        yield from self._finish(out, counts, arrived, pieces_of)

    def _record(self, key: str, shape: tuple[int, ...], tensor: torch.Tensor | None = None) -> _Record:
        """What a master tensor gives, resolved and checked once per (name, shape) (its dtype checked
        again when it changes): whether it is unpacked (stacked experts, fused MLA down projection), each piece
        with its group (-1: a high-precision tensor), and the dtype checked (``tensor`` None: the
        plan's own layout, predicted by the constructor, in BF16, which needs no check: the
        learners' usual master dtype, so their first sync checks none again)."""
        if tensor is not None:
            check_master_tensor(key, tensor)
        pieces = self.names.pieces(key, shape)
        self._check(key, shape, pieces)
        members = [(p, self._member[p.name][0] if p.name in self._member else -1) for p in pieces]
        dtype = torch.bfloat16 if tensor is None else tensor.dtype
        record = (any(p.sub is not None for p in pieces), members, dtype)
        self._records[(key, shape)] = record
        return record

    def _run(
        self,
        out: _OutputSet,
        g: int,
        arrived: Mapping[tuple[str, int | None], torch.Tensor],
        pieces_of: Mapping[str, Piece],
    ) -> tuple[list[int], list[Pair]]:
        group = self.groups[g]
        pieces = self._laid_out(g, pieces_of)
        buffers, ready = out.group(self.plan, g, group, self._device_of(g, arrived), self._firsts[g])
        run_group(self.plan, group, arrived, pieces, buffers)
        positions, names, tensors = ready
        return positions, list(zip(names, tensors, strict=True))  # fresh pairs (C-level: ~55k outputs a sync)

    def _laid_out(self, g: int, pieces_of: Mapping[str, Piece]) -> list[Piece]:
        """Group ``g``'s members' pieces, its layout (re)built when they are not the ones it was
        built from (a first sync, or a new spelling)."""
        group = self.groups[g]
        pieces = list(map(pieces_of.__getitem__, group.names))  # C-level passes: ~12k items a sync
        known = self._layout_of[g]
        if known is None or not all(map(operator.is_, known, pieces)):
            group.build_layout(pieces)
            self._layout_of[g] = pieces
        return pieces

    def _device_of(self, g: int, arrived: Mapping[tuple[str, int | None], torch.Tensor]) -> torch.device:
        first = self.groups[g].segments[0]
        return arrived[(first[0], first[1])].device

    def _run_waiting(
        self,
        out: _OutputSet,
        waiting: list[int],
        arrived: Mapping[tuple[str, int | None], torch.Tensor],
        pieces_of: Mapping[str, Piece],
    ) -> Iterator[tuple[list[int], list[Pair]]]:
        """The complete groups of runs: each run whose groups all came quantized by one set of
        launches into its matrices; the others (a run's groups that cannot be read in place, or in
        buffers of their own) one by one."""
        alone = set(waiting)
        for r, run in enumerate(self._runs):
            if alone.issuperset(run.members):
                with torch.no_grad():
                    merged = self._run_merged(out, r, run, arrived, pieces_of)
                if merged is not None:
                    alone.difference_update(run.members)
                    yield merged
        for g in waiting:
            if g in alone:
                with torch.no_grad():
                    one = self._run(out, g, arrived, pieces_of)
                yield one

    def _run_merged(
        self,
        out: _OutputSet,
        r: int,
        run: Run,
        arrived: Mapping[tuple[str, int | None], torch.Tensor],
        pieces_of: Mapping[str, Piece],
    ) -> tuple[list[int], list[Pair]] | None:
        """Run ``r`` by one set of launches; None (nothing written) when its groups cannot be."""
        for g in run.members:
            self._laid_out(g, pieces_of)
        run.lay_out(self.groups)
        device = self._device_of(run.members[0], arrived)
        buffers = out.run(self.plan, r, run, self.groups, device, self._firsts)
        if buffers is None or not run_bound(
            self.plan, run, arrived, (buffers.data, buffers.scale, buffers.global_scale)
        ):
            return None
        positions: list[int] = []
        pairs: list[Pair] = []
        for g in run.members:
            at, names, tensors = out.ready[g]
            positions += at
            pairs += zip(names, tensors, strict=True)  # fresh pairs
        return positions, pairs

    def _finish(
        self,
        out: _OutputSet,
        counts: list[int],
        arrived: Mapping[tuple[str, int | None], torch.Tensor],
        pieces_of: Mapping[str, Piece],
    ) -> Iterator[tuple[list[int], list[Pair]]]:
        """Groups that never completed: their complete shared-scale units are exported one by one
        (a partial update), an incomplete unit is an error."""
        missing: list[str] = []
        for g, group in enumerate(self.groups):
            if counts[g] in (0, len(group.items)):
                continue
            by_unit: dict[int, list[int]] = {}
            for index, unit in enumerate(group.units):
                by_unit.setdefault(unit, []).append(index)
            for members in by_unit.values():
                names = [group.items[i].info.name for i in members]
                got = [n for n in names if n in pieces_of]
                if len(got) == len(names):
                    part = Group(group.fmt, group.tile, group.cols, [group.items[i] for i in members],
                                 [0] * len(members), [0] * len(members), 0)  # fmt: skip
                    yield self._partial(out, part, arrived, pieces_of)
                elif got:
                    missing += [n for n in names if n not in pieces_of]
        if missing:
            raise MappingError(
                f"fused groups left incomplete: {', '.join(f'`{m}`' for m in missing[:4])}"
                + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
                + " never arrived",
                hint="export every member of a shared-scale group in the same update",
                tensor=missing[0],
            )

    def _partial(
        self,
        out: _OutputSet,
        unit: Group,
        arrived: Mapping[tuple[str, int | None], torch.Tensor],
        pieces_of: Mapping[str, Piece],
    ) -> tuple[list[int], list[Pair]]:
        items = unit.items
        pieces = [pieces_of[i.info.name] for i in items]
        with torch.no_grad():
            values = [piece_value(arrived[(p.key, p.sub)], p) for p in pieces]
            encoded = dict(encode_group(self.plan, items, values))
        positions: list[int] = []
        ready: list[Pair] = []
        for item in items:
            position = self._position[item.info.name]
            positions += [position + i for i in range(len(item.outputs))]
            ready += [(name, encoded[name].detach()) for name, _, _ in item.outputs]
        return positions, ready

    # -- the three ways to call it -----------------------------------------------------------------

    def stream(self, named_params: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]) -> Iterator[Pair]:
        """``(HF name, tensor)`` as each group completes: parameters are consumed lazily, and a
        group's outputs are yielded as soon as its last master tensor arrived."""
        for _, pairs in self._events(named_params):
            yield from pairs

    def __call__(self, named_params: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]) -> list[Pair]:
        """The whole update, in plan order (the garbage collector paused meanwhile: :func:`gc_paused`)."""
        with gc_paused():
            if self.cuda_graphs and held_whole(named_params):
                params = list(named_params.items() if isinstance(named_params, Mapping) else named_params)
                return self._replayed(params)
            return self._whole(named_params, None)

    def _whole(
        self, named_params: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor], out: _OutputSet | None
    ) -> list[Pair]:
        slots: list[Pair | None] = [None] * self.num_outputs
        for positions, pairs in self._events(named_params, out, whole=True):
            collections.deque(map(slots.__setitem__, positions, pairs), maxlen=0)  # C-level: ~55k a sync
        return list(filter(None, slots))  # pairs are non-empty tuples

    def _replayed(self, params: list[tuple[str, torch.Tensor]]) -> list[Pair]:
        """A whole update through :mod:`~fp4convert.megatron.replay`: keyed by every parameter's
        name, address, shape and dtype (each contiguous) and the output set it goes into; the first
        sync with a key runs eagerly, the second is captured, later ones are replayed and hand out
        fresh pairs of the same outputs (a parameter sent as itself: this call's tensor)."""
        tensors = [t for _, t in params]
        if not tensors or not _replays_on(tensors[0].device) or not all(map(torch.Tensor.is_contiguous, tensors)):
            return self._whole(params, None)
        key: list[Any] = [name for name, _ in params]
        key += map(torch.Tensor.data_ptr, tensors)
        key += map(_SHAPE, tensors)
        key += map(_DTYPE, tensors)
        out = self._free_set()
        replay = self._replay
        if replay.holds(out, key):
            return replay.replay(out, key).pairs(out, params)
        if not replay.seen(out, key):
            pairs = self._whole(params, out)
            # a whole update into a kept set (a partial one, or a set made for one call, never replays)
            if len(pairs) == self.num_outputs and any(map(operator.is_, self._sets, itertools.repeat(out))):
                replay.saw(out, key)
            return pairs

        def work() -> _Template:
            template = _Template.of(self._whole(params, out), out, params)
            if template is None:  # not what the first sight was: abandon this capture
                raise MappingError("a sync's outputs changed between two calls with the same parameters")
            return template

        template = replay.capture(out, key, tensors[0].device, work)
        if template is None:
            return self._whole(params, out)
        return template.pairs(out, params)

    def buckets(
        self, named_params: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor], *, max_bytes: int
    ) -> Iterator[list[Pair]]:
        """The whole update in plan order, as buckets of at most ``max_bytes`` (a larger tensor
        is a bucket of its own), what RL frameworks send one at a time."""
        return bucketed(self(named_params), max_bytes)


def held_whole(named_params: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]) -> bool:
    """Whether ``named_params`` is a collection already held (a dict, its items, a list), which a
    sync may take whole (replays need every parameter first); an iterator, which may gather each
    tensor as it goes, is consumed lazily instead."""
    return isinstance(named_params, (Mapping, ItemsView, Sequence))


def bucketed(pairs: list[Pair], max_bytes: int) -> Iterator[list[Pair]]:
    """Split ``pairs`` in order into buckets of at most ``max_bytes``.

    Example:
        >>> pairs = [(str(i), torch.zeros(n, dtype=torch.uint8)) for i, n in enumerate([3, 3, 5, 1])]
        >>> [[name for name, _ in bucket] for bucket in bucketed(pairs, 6)]
        [['0', '1'], ['2', '3']]
    """
    bucket: list[Pair] = []
    size = 0
    for pair in pairs:
        nbytes = pair[1].numel() * pair[1].element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append(pair)
        size += nbytes
    if bucket:
        yield bucket
