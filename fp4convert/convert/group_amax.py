"""The shared outer scale of fused groups that no single read stream holds whole, agreed before the work.

The converter reads each source file front to back in one stream (:mod:`fp4convert.convert.parallel`),
and a fused group (gate/up, q/k/v, MLA q_a/kv_a) whose members all come up in one stream gets its
shared amax there, from the members as they are read. Any other group needs its amax before its
first member is quantized: members stored in two source files, written by two ranks, a member in a
shard that a resumed run keeps, or members so far apart in one file that holding the first ones
until the last arrives would cost too much memory. For those, :func:`groups_to_agree` says which
rank reads which member, each rank reads its members once more (there are a few per boundary) and
takes their amax, and one max-reduce over the ranks (:meth:`fp4convert.ranks.Team.max_reduce`)
gives every rank the same value. A maximum never rounds, so the value is bit for bit the one a
single process computes (:class:`fp4convert.plan.SharedAmax`): the maximum of the members' amaxes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch

from fp4convert.checkpoint.file_hashes import SourceHashes
from fp4convert.checkpoint.reader import SourceReader
from fp4convert.plan import ConversionPlan, member_amax
from fp4convert.ranks import Team

__all__ = ["HOLD_SPAN", "agree_group_amaxes", "groups_to_agree"]

#: most source bytes between a group's first and last member for one stream to hold the group whole
HOLD_SPAN = 512 << 20


def groups_to_agree(
    plan: ConversionPlan, owner: Mapping[str, int], writing: Collection[str]
) -> dict[str, dict[str, int]]:
    """Group -> {member: the rank that reads it for the amax}, for every group a rank writes a member
    of and that no single stream holds whole (see the module docstring).

    Args:
        plan: the conversion plan.
        owner: output shard -> the rank writing it (every shard in ``writing``).
        writing: the output shards written in this run (a resumed run keeps the others).
    """
    items = {item.info.name: item for item in plan.items}
    view = plan.source.view()
    out: dict[str, dict[str, int]] = {}
    for group, members in plan.groups.items():
        its = [items[m] for m in members]
        writers = sorted({owner[i.output_file] for i in its if i.output_file in writing})
        if not writers:
            continue  # every member is in kept shards: nothing to quantize
        logical = [view.tensors[m] for m in members]  # where each member's data is read
        one_stream = (
            len(writers) == 1
            and all(i.output_file in writing for i in its)
            and len({i.source_file for i in its}) == 1
            and max(t.position[1] + t.nbytes for t in logical) - min(t.position[1] for t in logical) <= HOLD_SPAN
        )
        if not one_stream:
            readers = [owner[i.output_file] if i.output_file in writing else writers[0] for i in its]
            out[group] = dict(zip(members, readers, strict=True))
    return out


def agree_group_amaxes(
    plan: ConversionPlan, groups: Mapping[str, Mapping[str, int]], team: Team
) -> dict[str, torch.Tensor]:
    """The shared amax (a float32 scalar) of every group of :func:`groups_to_agree`, the same on every rank.

    Each rank reads the members the mapping gives it (without hashing them: the conversion's own
    stream hashes the files) and contributes their maximum amax.
    """
    if not groups:
        return {}
    values = torch.full((len(groups),), float("-inf"), dtype=torch.float32)
    mine = [(index, member) for index, g in enumerate(groups) for member, r in groups[g].items() if r == team.rank]
    if mine:
        reader = SourceReader(plan.source, hashes=SourceHashes(plan.source, files=()))
        try:
            for index, member in mine:
                values[index] = torch.maximum(values[index], member_amax(reader.read(member)))
        finally:
            reader.close()
    agreed = team.max_reduce(values)
    return {group: agreed[index].clone() for index, group in enumerate(groups)}
