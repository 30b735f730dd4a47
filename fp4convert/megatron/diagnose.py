"""The slow path of ``validate-export``: say where a failing tensor differs, and why.

Only failing tensors come here. Each byte mismatch is reported with its first differing block:
the exported and the expected values dequantized (what the sampler would compute with), and the
master's BF16 values. Then the faults real exporters make are tried as hypotheses, each by
re-quantizing the master the faulty way (:func:`fp4convert.megatron.encode.encode_group`, the
converter's own arithmetic) and comparing bytes:

* fused siblings quantized separately (gate/up, q/k/v, MLA q_a/kv_a each with its own amax);
* another arithmetic profile (ModelOpt's division order, TE <= 2.13's);
* a global scale a few ulps off (an approximate reciprocal), alone or also used to encode;
* another expert's tensor under this name (expert ids not offset by the EP rank);
* a tensor the contract keeps BF16 sent quantized, or the reverse (ignored exceptions);
* an ``input_scale`` the update must not carry.

What matches none of them is a tensor whose values differ from the master's: a stale tensor from
an older step, or an export of another master.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from fp4convert.dialects import stored_format
from fp4convert.formats import profiles
from fp4convert.formats.codecs import e2m1_decode, nan_ignoring_abs, pack_fp4, unpack_fp4
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK
from fp4convert.inventory.dtypes import itemsize
from fp4convert.megatron.encode import encode_group
from fp4convert.megatron.plan import ExportPlan, fused_members_phrase
from fp4convert.megatron.report import ExportReport, Finding
from fp4convert.megatron.sources import PieceSource, tensor_meta
from fp4convert.plan import PlannedTensor, group_input_amax, shared_amax

__all__ = ["Context", "explain"]

_PROFILE_WORDS = {
    "te": "TransformerEngine >= 2.14's order (block amax times S_enc/6)",
    "te-2.13": "TransformerEngine <= 2.13's order (block amax / 6 first)",
    "modelopt": "ModelOpt's division order (x / (sf * s2))",
}
_EXPERT = re.compile(r"\.experts\.(\d+)\.")


@dataclass
class Context:
    """One validation run: the plan, both sides, and what was found so far."""

    plan: ExportPlan
    exported: Mapping[str, torch.Tensor]
    master: Mapping[str, torch.Tensor]
    sources: Mapping[str, PieceSource]
    device: torch.device
    report: ExportReport
    ep_rank: int
    ep_size: int
    rows_on: dict[tuple[str, str], torch.Tensor]
    expected_names: dict[str, PlannedTensor] = field(default_factory=dict)
    structure_failed: list[PlannedTensor] = field(default_factory=list)
    extras: list[str] = field(default_factory=list)
    master_bytes: int = 0
    _chunk: dict[str, torch.Tensor] | None = None
    _references: dict[tuple[Any, ...], dict[str, torch.Tensor]] = field(default_factory=dict)
    _by_module: dict[str, list[str]] | None = None

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

    def master_tensor(self, key: str) -> torch.Tensor:
        if self._chunk is not None and key in self._chunk:
            return self._chunk[key]
        tensor = self.master[key].to(self.device)
        if self._chunk is not None:
            self._chunk[key] = tensor
        return tensor

    def master_piece(self, item: PlannedTensor | str) -> torch.Tensor:
        """The HF tensor's BF16 values from the master, on the validation device."""
        name = item if isinstance(item, str) else item.info.name
        source = self.sources[name]
        tensor = self.master_tensor(source.key)
        if isinstance(source.rows, torch.Tensor):  # QKV interleave: a row index, kept on the device
            key = (name, str(self.device))
            if key not in self.rows_on:
                self.rows_on[key] = source.rows.to(self.device)
            return tensor.index_select(0, self.rows_on[key])
        return source.take(tensor)

    def expected_outputs(self, item: PlannedTensor) -> list[tuple[str, str, tuple[int, ...]]] | None:
        """The tensors the export must hold for ``item`` (BF16 ones take the master's dtype);
        None, with a finding, when the master cannot provide it."""
        name = item.info.name
        for out, _, _ in item.outputs:
            self.expected_names[out] = item
        source = self.sources.get(name)
        if source is None:
            self._master_problem(
                item, f"the master has no tensor holding `{name}` (Megatron: `{item.info.megatron_name}`)"
            )
            return None
        dtype, shape = tensor_meta(self.master, source.key)
        rows = shape[0] if shape else 0
        if isinstance(source.rows, slice):
            rows = source.rows.stop - source.rows.start
        elif isinstance(source.rows, torch.Tensor):
            rows = source.rows.numel()
        piece_shape = (rows, *shape[1:]) if shape else ()
        if piece_shape != tuple(item.info.shape):
            self._master_problem(
                item,
                f"master `{source.key}` gives it shape {list(piece_shape)}, the config says "
                f"{list(item.info.shape)} (pass tensor-parallel-gathered tensors)",
            )
            return None
        self.master_bytes += item.info.numel * (itemsize(dtype) or 2)  # unknown dtypes count as 16-bit
        return list(item.outputs) if item.quantized else [(name, dtype, piece_shape)]

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
        """A device bool: does the exported BF16 tensor differ from the master's bytes?"""
        expected = self.master_piece(item).contiguous().reshape(-1).view(torch.uint8)
        actual = self.exported_tensor(item.info.name).contiguous().reshape(-1).view(torch.uint8)
        if expected.device.type == "cpu":  # no temporary the size of the tensor, and no sync to avoid
            return torch.tensor(not torch.equal(actual, expected))
        return (actual != expected).any()

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


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    )


def _all_same(
    actual: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], rename: Mapping[str, str]
) -> bool:
    return all(rename.get(n, n) in actual and _same(actual[rename.get(n, n)], t) for n, t in expected.items())


# -- where a tensor differs ---------------------------------------------------------------------------


def _fmt(values: torch.Tensor) -> str:
    return "[" + " ".join(f"{v:.4g}" for v in values.float().tolist()) + "]"


def _ulps(actual: torch.Tensor, expected: torch.Tensor) -> int:
    a = int(actual.float().reshape(-1)[0].view(torch.int32))
    e = int(expected.float().reshape(-1)[0].view(torch.int32))
    return a - e


def _block_values(
    plan: ExportPlan, item: PlannedTensor, outputs: Mapping[str, torch.Tensor], row: int, block: int
) -> torch.Tensor:
    names = [name for name, _, _ in item.outputs]
    if item.decision.format == "nvfp4":
        data = outputs[names[0]][row, block * 8 : block * 8 + 8]
        sf = outputs[names[1]].view(torch.uint8)[row, block].view(torch.float8_e4m3fn).float()
        return e2m1_decode(unpack_fp4(data)) * sf * plan.dialect.decode_scale(outputs[names[2]])
    data = outputs[names[0]].view(torch.uint8)[row, block * MXFP8_BLOCK : (block + 1) * MXFP8_BLOCK]
    exponent = outputs[names[1]][row, block].int() - 127
    return data.view(torch.float8_e4m3fn).float() * torch.ldexp(torch.ones(()), exponent)


def _where(item: PlannedTensor, role: int, flat: int, width: int) -> tuple[int, int]:
    """(row, block) of flat byte ``flat`` of output ``role`` (0 data, 1 scale) of ``width`` bytes a row."""
    row, col = divmod(flat, width)
    if role == 1:
        return row, col
    per_block = NVFP4_BLOCK // 2 if item.decision.format == "nvfp4" else MXFP8_BLOCK
    return row, col // per_block


def difference(
    ctx: Context, item: PlannedTensor, actual: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]
) -> tuple[str, str] | None:
    """``(tensor, detail)`` of the first output that differs, with its first differing block; None if equal."""
    for role, (name, tensor) in enumerate(expected.items()):
        got = actual[name]
        if _same(got, tensor):
            continue
        if not item.quantized:
            a, e = got.reshape(-1), tensor.reshape(-1)
            bad = (a.view(torch.uint8) != e.view(torch.uint8)).reshape(len(a), -1).any(1).nonzero().flatten()
            i = int(bad[0])
            return name, (
                f"{bad.numel()} of {a.numel()} elements differ; first at flat index {i}: "
                f"exported {a[i].item():.6g} vs master {e[i].item():.6g}"
            )
        if role >= 2:  # the FP32 global (or input) scale
            return name, (
                f"{got.float().reshape(-1)[0].item():.9g} vs expected {tensor.float().reshape(-1)[0].item():.9g} "
                f"({_ulps(got, tensor):+d} ulp)"
            )
        a = got.contiguous().view(torch.uint8)
        e = tensor.contiguous().view(torch.uint8)
        bad = (a != e).reshape(-1).nonzero().flatten()
        row, block = _where(item, role, int(bad[0]), e.shape[-1])
        per = NVFP4_BLOCK if item.decision.format == "nvfp4" else MXFP8_BLOCK
        master = ctx.master_piece(item)[row, block * per : (block + 1) * per].cpu()
        return name, (
            f"{bad.numel()} of {e.numel()} bytes differ; first at row {row}, block {block}: "
            f"exported {_fmt(_block_values(ctx.plan, item, actual, row, block))} vs expected "
            f"{_fmt(_block_values(ctx.plan, item, expected, row, block))} (master {_fmt(master)})"
        )
    return None


# -- hypotheses ---------------------------------------------------------------------------------------


def _with_global(ctx: Context, item: PlannedTensor, glob: torch.Tensor) -> dict[str, torch.Tensor]:
    """The item quantized with the contract's amax but the exporter's global scale imposed (what an
    approximate reciprocal gives when the exporter also encodes with its scale)."""
    members = [ctx.plan.item(m) for m in ctx.plan.members(item)]
    amax = shared_amax([ctx.master_piece(m) for m in members]).cpu().reshape(1, 1)
    profile = ctx.plan.profile
    outer = profiles.outer_scales(amax, profile)  # type: ignore[arg-type]
    g = glob.float().cpu().reshape(1, 1)
    if ctx.plan.dialect.stores_encode_scale and profile != "modelopt":  # global = S_enc
        mult = g * torch.div(torch.ones(()), torch.tensor(6.0)) if profile == "te" else g
        outer = replace(outer, s_enc=g, s_dec=torch.div(torch.ones(()), g), mult=mult)
    else:  # global = the decode scale the blocks are encoded with
        outer = replace(outer, s_dec=g, mult=g * 6.0 if profile == "modelopt" else outer.mult)
    x = ctx.master_piece(item).cpu().float()
    rows, cols = x.shape
    blocks = x.reshape(rows, cols // NVFP4_BLOCK, NVFP4_BLOCK)
    if getattr(item.decision.recipe, "tile", "1x16") == "16x16":
        from fp4convert.formats.nvfp4 import _tile_amax

        block_amax = _tile_amax(x)
    else:
        block_amax = nan_ignoring_abs(blocks).amax(dim=-1)
    scale = profiles.block_scale_bytes(block_amax, outer, profile)  # type: ignore[arg-type]
    codes = profiles.encode_blocks(blocks, scale, outer, profile)  # type: ignore[arg-type]
    names = [name for name, _, _ in item.outputs]
    return {
        names[0]: pack_fp4(codes.reshape(rows, cols)),
        names[1]: scale.view(torch.float8_e4m3fn),
        names[2]: glob.cpu(),
    }


def _scale_cause(ctx: Context, item: PlannedTensor, actual: Mapping[str, torch.Tensor]) -> str | None:
    reference = ctx.reference(item)
    names = [name for name, _, _ in item.outputs]
    ulps = _ulps(actual[names[2]], reference[names[2]])
    if ulps == 0 or abs(ulps) > 4:
        return None
    what = f"{names[2].rsplit('.', 1)[1]} is {abs(ulps)} ulp {'above' if ulps > 0 else 'below'} the reference"
    data_equal = all(_same(actual[n], reference[n]) for n in names[:2])
    if data_equal:
        return (
            f"{what} while data and block scales match: the exporter computes the global scale with an "
            "approximate reciprocal or division (fast math)"
        )
    if _all_same(actual, _with_global(ctx, item, actual[names[2]]), {}):
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


def _expert_name(name: str, expert: int) -> str:
    return _EXPERT.sub(f".experts.{expert}.", name, count=1)


def _expert_candidates(ctx: Context, item: PlannedTensor) -> list[int]:
    """Other experts of the same layer the master holds, likeliest EP offsets first."""
    expert = item.info.expert
    if expert is None:
        return []
    step = ctx.plan.experts_per_rank(ctx.ep_size) if ctx.ep_size > 1 else _present_experts(ctx, item.info.layer)
    ids = [e for e in range(ctx.plan.num_experts) if e != expert and _expert_name(item.info.name, e) in ctx.sources]
    return sorted(ids, key=lambda e: (step == 0 or (e - expert) % step != 0, abs(e - expert)))[:16]


def _matches_other(
    ctx: Context, item: PlannedTensor, other: PlannedTensor, actual: Mapping[str, torch.Tensor]
) -> bool:
    expected = ctx.reference(other) if other.quantized else {other.info.name: ctx.master_piece(other).cpu()}
    rename = dict(zip(core_outputs(other), core_outputs(item), strict=True))
    return _all_same(actual, expected, rename)


def _ep_words(ctx: Context, named: int, holds: int, layer: int | None) -> str:
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


def _other_expert_cause(ctx: Context, item: PlannedTensor, actual: Mapping[str, torch.Tensor]) -> str | None:
    for expert in _expert_candidates(ctx, item):
        other = ctx.plan.item(_expert_name(item.info.name, expert))
        if _matches_other(ctx, item, other, actual):
            cause = _ep_words(ctx, item.info.expert, expert, item.info.layer)  # type: ignore[arg-type]
            ctx.set_cause({n for n, _, _ in other.outputs}, cause)  # e.g. its tensors, missing under their name
            return cause
    return None


_STALE = (
    "bytes match no variant of the master's tensor (the contract's arithmetic, other profiles, separate "
    "scales, other experts): the export holds other values than this master: a stale tensor from an older "
    "step, or an export of another master?"
)
_STALE_BF16 = (
    "the BF16 values differ from the master's and match no other expert: a stale tensor from an older step, "
    "or an export of another master?"
)


def _quantized_cause(ctx: Context, item: PlannedTensor, actual: Mapping[str, torch.Tensor]) -> str:
    members = ctx.plan.members(item)
    grouped = len(members) > 1
    together = fused_members_phrase(members)
    if grouped and _all_same(actual, ctx.reference(item, shared=False), {}):
        return (
            f"{together} global scales differ: the exporter quantized {together} separately (each its own "
            "amax) instead of with one shared amax"
        )
    if item.decision.format == "nvfp4":
        for profile in profiles.PROFILES:
            if profile == ctx.plan.profile:
                continue
            for shared in (True, False) if grouped else (True,):
                if _all_same(actual, ctx.reference(item, profile=profile, shared=shared), {}):
                    also = "" if shared else f"; and {together} were quantized separately"
                    return (
                        f"bytes match the {profile} profile, not {ctx.plan.profile}: the exporter uses "
                        f"{_PROFILE_WORDS[profile]}, the contract {_PROFILE_WORDS[ctx.plan.profile]}{also}"
                    )
        scale = _scale_cause(ctx, item, actual)
        if scale:
            return scale
    return _other_expert_cause(ctx, item, actual) or _STALE


def _byte_findings(ctx: Context, item: PlannedTensor, counts: Mapping[str, int], diagnose: bool) -> None:
    names = core_outputs(item)
    if counts.get("shared"):
        values = []
        for member in ctx.plan.members(item):
            glob = core_outputs(ctx.plan.item(member))[-1]
            if glob in ctx.exported:
                values.append(f"{member.rsplit('.', 2)[-2]} {ctx.exported[glob].float().reshape(-1)[0].item():.9g}")
        ctx.add(
            Finding(
                names[-1],
                "shared-scale",
                f"fused siblings carry different {names[-1].rsplit('.', 1)[1]} ({', '.join(values)})",
            )
        )
    if not diagnose:
        parts = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
        ctx.add(Finding(names[0], "bytes", f"differs from the reference ({parts}); not diagnosed (max_diagnosed)"))
        return
    actual = ctx.actual(item)
    expected = ctx.reference(item) if item.quantized else {item.info.name: ctx.master_piece(item).cpu()}
    where = difference(ctx, item, actual, expected)
    if where is not None:
        ctx.add(Finding(where[0], "bytes", where[1]))
    if item.quantized:
        cause = _quantized_cause(ctx, item, actual)
    else:
        cause = _other_expert_cause(ctx, item, actual) or _STALE_BF16
    ctx.set_cause(set(names), cause)


def _input_scale_finding(ctx: Context, item: PlannedTensor) -> None:
    name = item.outputs[3][0]
    if name not in ctx.exported:
        return
    expected = ctx.plan.dialect.input_scale(group_input_amax(ctx.plan.members(item), ctx.plan.calibration)).reshape(
        ctx.plan.dialect.global_shape
    )
    actual = ctx.exported[name].cpu()
    if not _same(actual.float(), expected):
        ctx.add(
            Finding(
                name,
                "input-scale",
                f"{actual.float().reshape(-1)[0].item():.9g}, expected {expected.float().reshape(-1)[0].item():.9g}",
            )
        )


# -- structure and extras -----------------------------------------------------------------------------


def _found_format(ctx: Context, module: str) -> str:
    leaves = {name.rsplit(".", 1)[1]: tensor_meta(ctx.exported, name)[0] for name in ctx.module_outputs(module)}
    return stored_format(leaves)


def _structure_cause(ctx: Context, item: PlannedTensor) -> str:
    expected = item.decision.format if item.quantized else "bf16"
    found = _found_format(ctx, item.module)
    if found in (expected, "absent"):
        return ""
    if expected == "bf16":
        return (
            f"the contract keeps it BF16 ({item.decision.reason}), but the export quantized it to {found}: "
            "the exporter ignores this BF16 exception"
        )
    if found == "bf16":
        return (
            f"the contract gives it {expected} ({item.decision.reason}), but the export sent BF16: "
            "the exporter skipped it"
        )
    return f"the contract gives it {expected} ({item.decision.reason}), but the export sent {found}"


def _owner(ctx: Context, name: str) -> PlannedTensor | None:
    return ctx.plan.items.get(name) or ctx.plan.items.get(name.rsplit(".", 1)[0] + ".weight")


def _extra_finding(ctx: Context, name: str) -> Finding:
    owner = _owner(ctx, name)
    if owner is None:
        return Finding(name, "extra", "not a tensor of this model in this dialect")
    input_suffix = ctx.plan.dialect.suffixes.get("nvfp4", {}).get("input")
    if input_suffix and name.endswith("." + input_suffix) and owner.quantized:
        if not ctx.plan.dialect.writes_input_scale(owner):
            why = (
                f"the contract forbids it: activations are scaled per token (per_token_activations: true), "
                f"and dialect {ctx.plan.dialect.name} stores no {input_suffix}"
            )
        else:
            why = (
                "live updates never re-send input_scale: the engine keeps the activation scale loaded with the "
                "converted checkpoint (pass include_input_scale=True if this exporter is meant to send it)"
            )
        return Finding(name, "input-scale", f"the update carries {input_suffix}", why)
    if not ctx.plan.on_rank(owner, ctx.ep_rank, ctx.ep_size):
        per_rank = ctx.plan.experts_per_rank(ctx.ep_size)
        rank = owner.info.expert // per_rank  # type: ignore[operator]
        return Finding(
            name,
            "extra",
            f"expert {owner.info.expert} belongs to EP rank {rank}, not rank {ctx.ep_rank} "
            f"(experts {ctx.ep_rank * per_rank}-{(ctx.ep_rank + 1) * per_rank - 1})",
        )
    return Finding(name, "extra", f"not an output of `{owner.info.name}` under the contract ({owner.decision.reason})")


def _ep_extra_cause(ctx: Context, owner: PlannedTensor) -> str:
    """For another rank's expert in the export: if it holds the bytes of this rank's expert with the
    same local id, that expert's missing tensors and these extra ones share one cause."""
    per_rank = ctx.plan.experts_per_rank(ctx.ep_size)
    holds = ctx.ep_rank * per_rank + owner.info.expert % per_rank  # type: ignore[operator]
    other = ctx.plan.items.get(_expert_name(owner.info.name, holds))
    if other is None or other.info.name not in ctx.sources or not all(n in ctx.exported for n in core_outputs(owner)):
        return ""
    if not _matches_other(ctx, owner, other, ctx.actual(owner)):
        return ""
    cause = _ep_words(ctx, owner.info.expert, holds, owner.info.layer)  # type: ignore[arg-type]
    ctx.set_cause({n for n, _, _ in other.outputs}, cause)
    return cause


def _explain_extras(ctx: Context, budget: int) -> int:
    ep_causes: dict[str, str] = {}
    for name in ctx.extras:
        finding = _extra_finding(ctx, name)
        owner = _owner(ctx, name)
        if (
            not finding.cause
            and owner is not None
            and owner.is_expert
            and not ctx.plan.on_rank(owner, ctx.ep_rank, ctx.ep_size)
        ):
            if owner.info.name not in ep_causes and budget > 0:
                budget -= 1
                ep_causes[owner.info.name] = _ep_extra_cause(ctx, owner)
            finding = replace(finding, cause=ep_causes.get(owner.info.name, ""))
        ctx.add(finding)
    return budget


def explain(ctx: Context, failing: list[tuple[PlannedTensor, dict[str, int]]], max_diagnosed: int) -> None:
    """Turn the fast path's verdicts into findings with details and causes (see the module docstring).

    Args:
        ctx: the run (its structural findings are already in the report).
        failing: items whose bytes failed, with the fast path's mismatch counts (``{"slow": 1}``
            for items of a group with a broken member, checked here one by one).
        max_diagnosed: modules diagnosed in full; later ones are reported with their counts only.
    """
    budget = _explain_extras(ctx, max_diagnosed)
    for item in ctx.structure_failed:
        cause = _structure_cause(ctx, item)
        if cause:
            ctx.set_cause({n for n, _, _ in item.outputs} | set(ctx.module_outputs(item.module)), cause)
    # The fast path flags a member whose global scale differs from its unit's first member's; the
    # finding belongs on the member(s) whose global scale is wrong, not on a right one.
    broken_groups = {item.decision.fused_group for item, counts in failing if counts.get("shared")}
    for item, counts in failing:
        if counts.get("shared"):
            if not any(counts.get(k) for k in ("data", "scale", "global")):
                continue  # itself right: its sibling is the one reported
        if item.decision.fused_group in broken_groups and counts.get("global"):
            counts = {**counts, "shared": 1}
        if "slow" in counts:
            if _all_same(ctx.actual(item), ctx.reference(item), {}):
                continue
            counts = {"bytes": 1}
        _byte_findings(ctx, item, counts, diagnose=budget > 0)
        budget -= 1
    if ctx.plan.include_input_scale:
        for item in dict.fromkeys(ctx.expected_names.values()):
            if item.quantized and len(item.outputs) > 3 and item not in ctx.structure_failed:
                _input_scale_finding(ctx, item)
