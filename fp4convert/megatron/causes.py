"""Why a tensor differs: the faults real exporters make, each tried as a hypothesis.

Each hypothesis re-quantizes the master the faulty way (:func:`fp4convert.megatron.encode.encode_group`,
the converter's own arithmetic) and compares bytes: fused siblings quantized separately, another
arithmetic profile, a global scale a few ulps off (alone or also used to encode), another expert's
tensor under this name (expert ids not offset by the EP rank). What matches none of them is a
tensor whose values differ from the master's: a stale tensor, or an export of another master.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from fp4convert.formats import profiles
from fp4convert.formats.codecs import nan_ignoring_abs, pack_fp4
from fp4convert.formats.nvfp4 import tile_amax
from fp4convert.formats.spec import NVFP4_BLOCK
from fp4convert.megatron.context import Context, all_same_bytes, core_outputs, same_bytes
from fp4convert.megatron.difference import ulps_apart
from fp4convert.megatron.plan import fused_members_phrase
from fp4convert.plan import PlannedTensor, shared_amax

__all__ = ["STALE_BF16", "ep_words", "expert_name", "matches_other", "other_expert_cause", "quantized_cause"]

_EXPERT = re.compile(r"\.experts\.(\d+)\.")


def _with_global(ctx: Context, item: PlannedTensor, glob: torch.Tensor) -> dict[str, torch.Tensor]:
    """The item quantized with the contract's amax but the exporter's global scale imposed (what an
    approximate reciprocal gives when the exporter also encodes with its scale)."""
    members = [ctx.plan.item(m) for m in ctx.plan.members(item)]
    amax = shared_amax([ctx.master_piece(m) for m in members]).cpu().reshape(1, 1)
    profile = ctx.plan.profile
    g = glob.float().cpu().reshape(1, 1)
    # The stored global is the encode scale S_enc (compressed-tensors), or the decode scale the
    # blocks were encoded with (ModelOpt's weight_scale_2; always under the modelopt profile).
    if ctx.plan.dialect.stores_encode_scale and profile != "modelopt":
        outer = profiles.outer_scales(amax, profile, encode_scale=g)  # type: ignore[arg-type]
    else:
        outer = profiles.outer_scales(amax, profile, decode_scale=g)  # type: ignore[arg-type]
    x = ctx.master_piece(item).cpu().float()
    rows, cols = x.shape
    blocks = x.reshape(rows, cols // NVFP4_BLOCK, NVFP4_BLOCK)
    tiled = getattr(item.decision.recipe, "tile", "1x16") == "16x16"
    block_amax = tile_amax(x) if tiled else nan_ignoring_abs(blocks).amax(dim=-1)
    codes, scale, _ = profiles.quantize_blocks(blocks, block_amax, outer, profile, tile_rows=16 if tiled else 1)  # type: ignore[arg-type]
    names = [name for name, _, _ in item.outputs]
    return {
        names[0]: pack_fp4(codes.reshape(rows, cols)),
        names[1]: scale.view(torch.float8_e4m3fn),
        names[2]: glob.cpu(),
    }


def _scale_cause(ctx: Context, item: PlannedTensor, actual: Mapping[str, torch.Tensor]) -> str | None:
    reference = ctx.reference(item)
    names = [name for name, _, _ in item.outputs]
    ulps = ulps_apart(actual[names[2]], reference[names[2]])
    if ulps == 0 or abs(ulps) > 4:
        return None
    what = f"{names[2].rsplit('.', 1)[1]} is {abs(ulps)} ulp {'above' if ulps > 0 else 'below'} the reference"
    data_equal = all(same_bytes(actual[n], reference[n]) for n in names[:2])
    if data_equal:
        return (
            f"{what} while data and block scales match: the exporter computes the global scale with an "
            "approximate reciprocal or division (fast math)"
        )
    if all_same_bytes(actual, _with_global(ctx, item, actual[names[2]]), {}):
        return (
            f"{what}, and the data is what that scale encodes: the exporter's scale chain uses an "
            "approximate reciprocal (fast math) instead of round-to-nearest 1/S_enc"
        )
    return None


def _present_experts(ctx: Context, layer: int | None) -> int:
    """How many distinct experts of ``layer`` the export holds (an EP rank's local expert count)."""
    prefix = f"model.layers.{layer}.mlp.experts."
    ids = set()
    for module in ctx.module_names():
        if module.startswith(prefix):
            ids.add(module[len(prefix) :].split(".", 1)[0])
    return len(ids)


def expert_name(name: str, expert: int) -> str:
    return _EXPERT.sub(f".experts.{expert}.", name, count=1)


def _expert_candidates(ctx: Context, item: PlannedTensor) -> list[int]:
    """Other experts of the same layer the master holds, likeliest EP offsets first."""
    expert = item.info.expert
    if expert is None:
        return []
    step = ctx.plan.experts_per_rank(ctx.ep_size) if ctx.ep_size > 1 else _present_experts(ctx, item.info.layer)
    ids = [e for e in range(ctx.plan.num_experts) if e != expert and expert_name(item.info.name, e) in ctx.sources]
    return sorted(ids, key=lambda e: (step == 0 or (e - expert) % step != 0, abs(e - expert)))[:16]


def matches_other(ctx: Context, item: PlannedTensor, other: PlannedTensor, actual: Mapping[str, torch.Tensor]) -> bool:
    expected = ctx.reference(other) if other.quantized else {other.info.name: ctx.master_piece(other).cpu()}
    rename = dict(zip(core_outputs(other), core_outputs(item), strict=True))
    return all_same_bytes(actual, expected, rename)


def ep_words(ctx: Context, named: int, holds: int, layer: int | None) -> str:
    if ctx.ep_size > 1:
        per_rank = ctx.plan.experts_per_rank(ctx.ep_size)
        rank_range = f"EP rank {ctx.ep_rank} holds experts {ctx.ep_rank * per_rank}-{(ctx.ep_rank + 1) * per_rank - 1}"
        if holds - named == ctx.ep_rank * per_rank:
            return (
                f"matches expert {holds} of the master, named expert {named}: EP offset missing? ({rank_range}; "
                "global id = ep_rank x experts per rank + local id)"
            )
        return f"matches expert {holds} of the master, named expert {named}: expert ids offset wrongly? ({rank_range})"
    local = _present_experts(ctx, layer)
    if local and (holds - named) % local == 0 and named < local:
        return (
            f"matches expert {holds} of the master, named expert {named}: EP offset missing? (the export holds "
            f"{local} experts per layer named 0-{local - 1}: one EP rank's local ids; validate with "
            "--ep-rank/--ep-size, and have the exporter add ep_rank x experts per rank)"
        )
    return f"matches expert {holds} of the master, named expert {named}: the exporter mislabels experts"


def other_expert_cause(ctx: Context, item: PlannedTensor, actual: Mapping[str, torch.Tensor]) -> str | None:
    for expert in _expert_candidates(ctx, item):
        other = ctx.plan.item(expert_name(item.info.name, expert))
        if matches_other(ctx, item, other, actual):
            cause = ep_words(ctx, item.info.expert, expert, item.info.layer)  # type: ignore[arg-type]
            ctx.set_cause({n for n, _, _ in other.outputs}, cause)  # e.g. its tensors, missing under their name
            return cause
    return None


_STALE = (
    "bytes match no variant of the master's tensor (the contract's arithmetic, other profiles, separate "
    "scales, other experts): the export holds other values than this master: a stale tensor from an older "
    "step, or an export of another master?"
)
STALE_BF16 = (
    "the BF16 values differ from the master's and match no other expert: a stale tensor from an older step, "
    "or an export of another master?"
)


def quantized_cause(ctx: Context, item: PlannedTensor, actual: Mapping[str, torch.Tensor]) -> str:
    members = ctx.plan.members(item)
    grouped = len(members) > 1
    together = fused_members_phrase(members)
    if grouped and all_same_bytes(actual, ctx.reference(item, shared=False), {}):
        return (
            f"{together} global scales differ: the exporter quantized {together} separately (each its own "
            "amax) instead of with one shared amax"
        )
    if item.decision.format == "nvfp4":
        for profile in profiles.PROFILES:
            if profile == ctx.plan.profile:
                continue
            for shared in (True, False) if grouped else (True,):
                if all_same_bytes(actual, ctx.reference(item, profile=profile, shared=shared), {}):
                    also = "" if shared else f"; and {together} were quantized separately"
                    return (
                        f"bytes match the {profile} profile, not {ctx.plan.profile}: the exporter uses "
                        f"{profiles.profile_spec(profile).description}, the contract "
                        f"{profiles.profile_spec(ctx.plan.profile).description}{also}"
                    )
        scale = _scale_cause(ctx, item, actual)
        if scale:
            return scale
    return other_expert_cause(ctx, item, actual) or _STALE
