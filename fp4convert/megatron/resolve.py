"""Where a master holds each HF tensor: master name -> HF pieces (rows of which tensor), resolved once.

Export and validation both need, for every master tensor, the HF tensors it holds and their rows
(``linear_fc1.weight7``: gate rows 0..I-1 and up rows I..2I-1 of expert 7 + the EP offset;
``linear_qkv``: q, k and v as runs of rows, query group by query group). The family tables are the
one source of these facts (:func:`~fp4convert.families.megatron_to_hf`), but asking them per tensor
costs tens of microseconds each, a whole pass over tens of thousands of tensors. So the answer is
derived from the plan instead: each planned HF tensor knows its canonical Megatron name and fused
kind, the rows follow from the families' own split transforms applied once to ``arange`` per
(kind, rows), and one name per naming pattern is checked against ``megatron_to_hf``. Names the
plan does not spell (SequentialMLP experts, separate norms, other MTP names) take the families'
path once, in one batched call whose ``arange`` markers tell every piece's source and rows;
stacked experts and MLA's fused down projection are unpacked by :func:`~fp4convert.families.unpack`.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from fp4convert.errors import MappingError
from fp4convert.families import megatron_to_hf, split_gate_up, split_qkv, unpack
from fp4convert.inventory import FusedKind
from fp4convert.megatron.plan import ExportPlan

__all__ = ["MasterNames", "Piece", "row_runs"]

Runs = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Piece:
    """One HF tensor inside a master tensor.

    Attributes:
        name: the HF tensor.
        key: the master's name for the tensor holding it.
        sub: None (the master tensor itself) or the index into what
            :func:`~fp4convert.families.unpack` makes of it (stacked experts, fused MLA down projection).
        runs: ``(first row, rows)`` runs of that tensor, in the HF tensor's row order.
        whole: the HF tensor is that whole tensor (no split).
        shape: the HF tensor's shape as the master holds it.
    """

    name: str
    key: str
    sub: int | None
    runs: Runs
    whole: bool
    shape: tuple[int, ...] = ()

    @property
    def rows(self) -> int:
        return sum(n for _, n in self.runs)

    def strided(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """The piece's rows of ``tensor`` as one ``(runs, rows per run, ...)`` view when its runs
        are equal and evenly spaced (q, k or v of ``linear_qkv``: a run per query group), so that
        one copy gathers them (on a GPU each copy is a launch); None otherwise.

        Example:
            >>> piece = Piece("q", "qkv", None, ((0, 2), (6, 2)), False)
            >>> piece.strided(torch.arange(12).reshape(12, 1)).flatten().tolist()
            [0, 1, 6, 7]
        """
        runs = self.runs
        if len(runs) < 2 or tensor.dim() == 0:
            return None
        (first, count), step = runs[0], runs[1][0] - runs[0][0]
        if step < count or first + (len(runs) - 1) * step + count > tensor.shape[0]:
            return None
        if any(n != count or start != first + i * step for i, (start, n) in enumerate(runs)):
            return None
        row = tensor.stride(0)
        shape, strides = (len(runs), count, *tensor.shape[1:]), (step * row, *tensor.stride())
        return tensor.as_strided(shape, strides, tensor.storage_offset() + first * row)

    def index(self) -> torch.Tensor:
        """The rows as an int64 index (for ``index_select``)."""
        return (
            torch.cat([torch.arange(s, s + n) for s, n in self.runs])
            if self.runs
            else torch.zeros(0, dtype=torch.long)
        )


def row_runs(index: torch.Tensor) -> Runs:
    """Consecutive runs of an integer row index.

    Example:
        >>> row_runs(torch.tensor([4, 5, 6, 0, 1, 9]))
        ((4, 3), (0, 2), (9, 1))
    """
    flat = index.reshape(-1).long()
    if flat.numel() == 0:
        return ()
    breaks = (torch.nonzero(flat[1:] - flat[:-1] != 1).reshape(-1) + 1).tolist()
    bounds = [0, *breaks, flat.numel()]
    firsts = flat[bounds[:-1]].tolist()
    return tuple((first, bounds[i + 1] - bounds[i]) for i, first in enumerate(firsts))


def _shape(runs: Runs, held: tuple[int, ...]) -> tuple[int, ...]:
    """An HF piece's shape: its rows and the holding tensor's trailing dims (a scalar stays one)."""
    return (sum(n for _, n in runs), *held[1:]) if held else ()


def _unwrapped(name: str) -> str:
    # DDP / Float16Module wrappers prefix every name with ``module.`` (megatron_to_hf strips them too)
    while name.startswith("module."):
        name = name[len("module.") :]
    return name


#: numbers -> "#": a name's naming pattern (``decoder.layers.#.mlp.experts.linear_fc#.weight#``)
_DIGITS = re.compile(r"\d+")


class MasterNames:
    """Master name -> :class:`Piece` list for one plan and EP position, cached per (name, shape).

    Args:
        plan: the export plan.
        ep_rank: the EP rank the master belongs to (its expert ids are local).
        ep_size: expert-parallel size.
    """

    def __init__(self, plan: ExportPlan, ep_rank: int, ep_size: int) -> None:
        self.plan = plan
        self.ep_rank, self.ep_size = ep_rank, ep_size
        self.per_rank = plan.experts_per_rank(ep_size) or None
        self.q_lora_rank = plan.config.get("q_lora_rank")
        grouped: dict[str, list[str]] = {}
        for item in plan.expected(ep_rank, ep_size):
            info = item.info
            name = info.megatron_name
            if name is None:
                continue
            if info.expert is not None and self.per_rank is not None:
                local = str(info.expert - ep_rank * self.per_rank)
                if not name.endswith(str(info.expert)):
                    continue  # not the grouped spelling: the families' path resolves it
                name = name[: -len(str(info.expert))] + local
            grouped.setdefault(name, []).append(info.name)
        #: canonical Megatron name (this rank's expert ids) -> (HF names in piece order, fused kind, pattern)
        self._fast: dict[str, tuple[tuple[str, ...], object, str]] = {
            name: (
                tuple(names),
                plan.items[names[0]].info.fused_kind if len(names) > 1 else None,
                _DIGITS.sub("#", name),
            )
            for name, names in grouped.items()
        }
        self._splits: dict[tuple[object, int], list[Runs]] = {}
        self._cache: dict[tuple[str, tuple[int, ...]], list[Piece]] = {}
        self._checked: set[str] = set()

    def canonical(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every master tensor under the plan's own Megatron spelling (TE grouped
        experts, fused QKV / gate-up), as a learner with the standard layer specs names them: what
        an exporter can resolve before the first sync. Names given otherwise resolve when they come."""
        out: list[tuple[str, tuple[int, ...]]] = []
        for name, (names, kind, _) in self._fast.items():
            shapes = [tuple(self.plan.items[n].info.shape) for n in names]
            if len(names) > 1 and kind is None:  # not fused: one tensor the HF names share (MTP's embedding, head)
                if all(s == shapes[0] for s in shapes):
                    out.append((name, shapes[0]))
                continue
            if not shapes[0] or any(len(s) != len(shapes[0]) or s[1:] != shapes[0][1:] for s in shapes):
                continue  # a scalar, or members that do not stack by rows: nothing to predict
            out.append((name, (sum(s[0] for s in shapes), *shapes[0][1:])))
        return out

    def prepare(self) -> list[tuple[str, tuple[int, ...]]]:
        """Resolve the :meth:`canonical` names now, in one batched pass (an exporter's or
        validator's constructor: the first sync then finds them); returns them. Where the families
        disagree with the plan's spelling nothing is kept, and names resolve as they come."""
        predicted = self.canonical()
        try:
            self.resolve(predicted)
        except MappingError:
            self._cache.clear()
            self._checked.clear()
            return []
        return predicted

    # -- resolution --------------------------------------------------------------------------------

    def pieces(self, key: str, shape: tuple[int, ...]) -> list[Piece]:
        """The HF tensors master tensor ``key`` of ``shape`` holds (resolving it on first sight)."""
        found = self._cache.get((key, shape))
        if found is None:
            self.resolve([(key, shape)])
            found = self._cache[(key, shape)]
        return found

    def resolve(self, keys: Iterable[tuple[str, tuple[int, ...]]]) -> None:
        """Resolve many master tensors at once (one batched families call for the slow ones and
        for checking one name of each new naming pattern).

        Raises:
            MappingError: a name that is not a tensor of this model.
        """
        slow: list[tuple[str, int | None, str, tuple[int, ...]]] = []
        verify: list[tuple[str, int | None, str, tuple[int, ...]]] = []
        waiting: dict[str, tuple[str, tuple[int, ...]]] = {}  # master key -> its cache key
        fresh: list[tuple[str, tuple[int, ...]]] = []
        for key, shape in keys:
            if (key, shape) in self._cache:
                continue
            fresh.append((key, shape))
            name = _unwrapped(key)
            parts: list[tuple[int | None, str, tuple[int, ...]]]
            if name in self._fast:
                parts = [(None, name, shape)]
            else:
                subs = unpack(key, torch.empty(shape, device="meta"), experts_per_rank=self.per_rank,
                              q_lora_rank=self.q_lora_rank)  # fmt: skip
                parts = (
                    [(None, name, shape)]
                    if subs is None
                    else [(i, n, tuple(t.shape)) for i, (n, t) in enumerate(subs)]
                )
            pieces: list[Piece] = []
            for sub, part, part_shape in parts:
                fast = self._fast_pieces(key, sub, part, part_shape)
                if fast is None:
                    slow.append((key, sub, part, part_shape))
                    waiting[key] = (key, shape)
                    continue
                pieces += fast
                template = self._fast[part][2]
                if template not in self._checked:
                    self._checked.add(template)
                    verify.append((key, sub, part, part_shape))
            self._cache[(key, shape)] = pieces
        if not (slow or verify):
            return
        found = self._families_pieces(slow + verify)
        for key, sub, _, _ in verify:
            if found[(key, sub)] != [p for p in self._cache[next(k for k in fresh if k[0] == key)] if p.sub == sub]:
                # the plan's names disagree with the families here: trust the families for everything
                self._fast.clear()
                for cache_key in fresh:
                    del self._cache[cache_key]
                self.resolve(fresh)
                return
        for key, sub, _, _ in slow:
            self._cache[waiting[key]] += found[(key, sub)]

    def _fast_pieces(self, key: str, sub: int | None, name: str, shape: tuple[int, ...]) -> list[Piece] | None:
        entry = self._fast.get(name)
        if entry is None or not shape:
            return None
        names, kind, _ = entry
        runs = self._split_runs(kind, shape[0], len(names))
        if runs is None:
            return None
        return [Piece(n, key, sub, r, len(names) == 1, _shape(r, shape)) for n, r in zip(names, runs, strict=True)]

    def _split_runs(self, kind: object, rows: int, count: int) -> list[Runs] | None:
        if count == 1:
            return [((0, rows),)]
        cache_key = (kind, rows)
        if cache_key not in self._splits:
            index = torch.arange(rows).reshape(rows, 1)
            try:
                parts: tuple[torch.Tensor, ...]
                if kind is FusedKind.QKV:
                    parts = split_qkv(
                        index,
                        num_attention_heads=self.plan.config["num_attention_heads"],
                        num_query_groups=self.plan.config.get(
                            "num_key_value_heads", self.plan.config["num_attention_heads"]
                        ),
                    )
                elif kind is FusedKind.GATE_UP:
                    parts = split_gate_up(index)
                else:
                    return None
            except (MappingError, KeyError):
                return None
            self._splits[cache_key] = [row_runs(p) for p in parts]
        runs = self._splits[cache_key]
        return runs if len(runs) == count else None

    def _families_pieces(
        self, parts: list[tuple[str, int | None, str, tuple[int, ...]]]
    ) -> dict[tuple[str, int | None], list[Piece]]:
        """One ``megatron_to_hf`` call for many (sub)tensors: each gets an ``arange`` marker whose
        values say which (sub)tensor and which rows every HF piece came from."""
        markers: dict[str, torch.Tensor] = {}
        owners: list[tuple[str, int | None, int]] = []
        base = 0
        for key, sub, name, shape in parts:
            rows = shape[0] if shape else 1
            if name in markers:
                raise MappingError(
                    f"`{name}` is given twice (again as `{key}`)",
                    hint="pass each tensor once, in one expert layout and one spelling",
                    tensor=key,
                )
            markers[name] = torch.arange(base, base + rows).reshape(rows, *([1] * (len(shape) > 1)))
            owners.append((key, sub, base))
            base += rows
        hf = megatron_to_hf(markers, self.plan.family, self.plan.config, ep_rank=self.ep_rank, ep_size=self.ep_size)
        starts = [b for _, _, b in owners]
        found: dict[tuple[str, int | None], list[Piece]] = {(k, s): [] for k, s, _ in owners}
        for hf_name, marker in hf.items():
            if marker.numel() == 0:
                continue
            owner = bisect.bisect_right(starts, int(marker.reshape(-1)[0])) - 1
            key, sub, start = owners[owner]
            rows = parts[owner][3][0] if parts[owner][3] else 1
            index = marker.reshape(-1) - start
            runs = row_runs(index)
            whole = int(index.numel()) == rows
            found[(key, sub)].append(Piece(hf_name, key, sub, runs, whole, _shape(runs, parts[owner][3])))
        return found

    # -- what a whole master gives ---------------------------------------------------------------

    def sources(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Piece]:
        """HF name -> :class:`Piece` for a master given as name -> shape; HF-named masters map to
        themselves.

        Raises:
            MappingError: a name that is neither an HF nor a Megatron name of this model, or an HF
                tensor held twice.
        """
        out: dict[str, Piece] = {}
        megatron = [(k, s) for k, s in shapes.items() if k not in self.plan.items]
        self.resolve(megatron)
        for key, shape in shapes.items():
            if key in self.plan.items:
                pieces = [Piece(key, key, None, ((0, shape[0] if shape else 1),), True, shape)]
            else:
                pieces = self.pieces(key, shape)
            for piece in pieces:
                if piece.name in out:
                    raise MappingError(
                        f"`{piece.name}` is produced twice (again from `{key}`)",
                        hint="pass each tensor once, in one expert layout and one spelling",
                        tensor=piece.name,
                    )
                out[piece.name] = piece
        return out
