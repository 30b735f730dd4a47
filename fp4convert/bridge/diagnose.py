"""Why an export differs from the contract: structure findings, the first differing block, causes.

The fast path of :mod:`fp4convert.bridge.validate` only says *that* a tensor's bytes differ. Here,
per failing tensor, the difference is described (the first differing block, dequantized on both
sides, next to the master's values) and the exporter's likely mistake is replayed until one
reproduces the exported bytes exactly:

* the outer scale alone is off by a few ulp: an approximate reciprocal in the exporter;
* the tensor was quantized with its own amax: fused siblings quantized separately;
* another arithmetic profile (``te``, ``te-2.13``, ``modelopt``) gives these bytes;
* another expert of the same layer gives these bytes: local expert ids without the EP offset;
* nothing does: the values are another tensor's (a stale tensor from an older step).

A cause is reported only when a replay matches byte for byte, never as a guess.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from fp4convert.bridge._bytes import bits, same_bytes
from fp4convert.bridge.report import Finding, TensorResult
from fp4convert.bridge.tables import ModelTables
from fp4convert.convert.groups import group_input_amax, quantize_members, shared_amax
from fp4convert.dialects import CompressedTensorsDialect, Dialect, module_of
from fp4convert.formats.codecs import e2m1_decode, e4m3_decode, e8m0_decode, unpack_fp4
from fp4convert.formats.profiles import PROFILES, outer_scales

if TYPE_CHECKING:  # pragma: no cover - the validator imports this module
    from fp4convert.bridge.validate import Source, ValidationPlan

__all__ = ["Diagnoser"]

# Every tensor suffix a quantized module may carry in some dialect (to recognise what was exported).
_QUANTIZED_SUFFIXES = (
    "weight_packed",
    "weight_scale",
    "weight_scale_inv",
    "weight_scale_2",
    "weight_global_scale",
    "input_scale",
    "input_global_scale",
)
_INPUT_SUFFIXES = ("input_scale", "input_global_scale")
_KIND_LABEL = {"gate_up": "gate/up", "qkv": "q/k/v", "mla_qa_kva": "q_a/kv_a"}
#: master tensors the diagnosis keeps at once, and experts it replays per tensor
_HELD = 16
_PEERS = 64


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and same_bytes(a.cpu(), b.cpu())


def _short(name: str) -> str:
    """``model.layers.0.mlp.experts.3.gate_proj.weight`` -> ``gate_proj``."""
    return module_of(name).rsplit(".", 1)[-1]


def _values(values: torch.Tensor, limit: int = 16) -> str:
    shown = ", ".join(f"{v:.4g}" for v in values[:limit].tolist())
    return f"[{shown}{', ...' if values.numel() > limit else ''}]"


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Signed distance in float32 ulps between two scalars of the same sign."""
    return int(a.reshape(()).view(torch.int32)) - int(b.reshape(()).view(torch.int32))


def found_format(module: str, metas: Mapping[str, tuple[str, tuple[int, ...]]]) -> str | None:
    """The format an export holds for ``module``, from its tensor names and dtypes (None: absent)."""
    weight = metas.get(f"{module}.weight")
    if f"{module}.weight_packed" in metas or (weight is not None and weight[0] == "U8"):
        return "nvfp4"
    if weight is not None and weight[0].startswith("F8"):
        return "mxfp8"
    return "bf16" if weight is not None else None


class Diagnoser:
    """Findings and causes for one validation (see the module docstring).

    Args:
        tables: the model under the contract.
        dialect: the dialect the export is in.
        plan: the validator's plan for this master (sources, candidates, groups).
        exported: the exported tensors.
        master: the master tensors.
        metas: ``{name: (dtype, shape)}`` of the exported tensors.
        ep_rank / ep_size: the EP position the export was checked for.
        budget: how many failing tensors to analyse (replays cost a quantization each).
        calibration: activation amaxes, for expected activation scales.
    """

    def __init__(
        self,
        tables: ModelTables,
        dialect: Dialect,
        plan: ValidationPlan,
        exported: Mapping[str, torch.Tensor],
        master: Mapping[str, torch.Tensor],
        metas: Mapping[str, tuple[str, tuple[int, ...]]],
        *,
        ep_rank: int,
        ep_size: int,
        budget: int,
        calibration: Mapping[str, float] | None,
    ) -> None:
        self.tables = tables
        self.dialect = dialect
        self.plan = plan
        self.exported = exported
        self.master = master
        self.metas = metas
        self.ep_rank, self.ep_size = ep_rank, ep_size
        self.budget = budget
        self.calibration = calibration
        self.profile = tables.contract.quantizer
        self._used = 0
        self._claimed: set[str] = set()
        self._held: OrderedDict[str, torch.Tensor] = OrderedDict()  # a few recent master tensors
        self._ep_matches: dict[str, str] = {}  # expected tensor -> unexpected name holding its bytes

    # -- structure ------------------------------------------------------------------------------------

    def structure(self, results: list[TensorResult]) -> list[bool]:
        """Presence, format, dtype, shape and input-scale findings; returns which sources may be
        compared byte for byte (all expected outputs present with the right dtype and shape)."""
        eligible = []
        for index, src in enumerate(self.plan.sources):
            findings = self._structure(src)
            results[index].findings.extend(findings)
            eligible.append(all(f.check == "input-scale" for f in findings))
        return eligible

    def _structure(self, src: Source) -> list[Finding]:
        module = src.item.module
        expected = {name: (dtype, shape) for name, dtype, shape in src.outputs}
        findings: list[Finding] = []
        is_module_weight = src.item.info.gemm_weight and src.name == f"{module}.weight"
        leftovers = []
        if is_module_weight:
            leftovers = [
                f"{module}.{s}"
                for s in _QUANTIZED_SUFFIXES
                if f"{module}.{s}" in self.metas and f"{module}.{s}" not in expected
            ]
        for name in [n for n in leftovers if n.rsplit(".", 1)[1] in _INPUT_SUFFIXES and src.format != "bf16"]:
            self._claimed.add(name)
            leftovers.remove(name)
            findings.append(
                Finding(
                    "input-scale",
                    f"`{name}` is in the export, but a live update must not carry an activation scale "
                    "(validate a checkpoint with include_input_scale / --include-input-scale)",
                    "the exporter re-sends input_scale, which overwrites the activation scale the engine "
                    "loaded from disk (Miles never sends it)",
                )
            )
        found = found_format(module, self.metas) if is_module_weight else None
        present = [name for name in expected if name in self.metas]
        if is_module_weight and found is not None and found != src.format:
            self._claimed.update(leftovers)
            return [*findings, self._format_finding(src, found, [*present, *leftovers])]
        if not present:
            shown = ", ".join(f"`{n}`" for n in expected)
            return [*findings, Finding("missing", f"not in the export (expected {shown})")]
        missing = [name for name in expected if name not in self.metas]
        if missing:
            shown = ", ".join(n.rsplit(".", 1)[1] for n in missing)
            findings.append(Finding("missing", f"lacks {shown} ({len(present)} of {len(expected)} tensors present)"))
        for name in present:
            (dtype, shape), (found_dtype, found_shape) = expected[name], self.metas[name]
            if found_dtype != dtype:
                findings.append(Finding("dtype", f"`{name}` is {found_dtype}, expected {dtype}"))
            elif tuple(found_shape) != tuple(shape):
                findings.append(Finding("shape", f"`{name}` has shape {tuple(found_shape)}, expected {tuple(shape)}"))
        if leftovers:
            self._claimed.update(leftovers)
            shown = ", ".join(f"`{n}`" for n in leftovers)
            findings.append(Finding("extra", f"also carries {shown}, which {self.dialect.name} does not write here"))
        return findings

    def _format_finding(self, src: Source, found: str, names: list[str]) -> Finding:
        listing = ", ".join(f"{n.rsplit('.', 1)[1]} {self.metas[n][0]}" for n in names)
        decision = src.item.decision
        won = decision.matched[0]
        if src.format == "bf16":
            return Finding(
                "format",
                f"exported as {found} ({listing}), but the contract keeps it BF16: {decision.reason}",
                f"the exporter quantized a tensor the contract keeps in BF16: it ignores {won.rule} ({won.detail})",
            )
        return Finding(
            "format",
            f"exported as {found} ({listing}), but the contract makes it {src.format}: {decision.reason}",
            f"the exporter does not apply {won.rule} ({won.detail})",
        )

    # -- tensors the contract does not produce from this master ------------------------------------------

    def unexpected(self) -> list[TensorResult]:
        """One result per unexpected HF tensor (its exported names grouped), EP offsets diagnosed."""
        owners: dict[str, list[str]] = {}
        for name in self.metas:
            if name in self.plan.expected_outputs or name in self._claimed:
                continue
            weight = f"{module_of(name)}.weight"
            owner = name if name in self.tables.infos else (weight if weight in self.tables.infos else name)
            owners.setdefault(owner, []).append(name)
        results = []
        for owner, names in owners.items():
            info = self.tables.infos.get(owner)
            shown = ", ".join(f"`{n}`" for n in names)
            if info is None:
                detail = f"not a tensor of this {self.tables.family} model in dialect {self.dialect.name}: {shown}"
                results.append(TensorResult(owner, "unexpected", findings=[Finding("extra", detail)]))
                continue
            where = self._placement(info.expert)
            cause = self._ep_cause_of_unexpected(owner, names) if info.expert is not None else None
            detail = f"{shown}: {where}"
            results.append(TensorResult(owner, "unexpected", findings=[Finding("extra", detail, cause)]))
        return results

    def _placement(self, expert: int | None) -> str:
        experts = self.tables.experts_on_rank(self.ep_rank, self.ep_size)
        if expert is not None and experts is not None and expert not in experts:
            return (
                f"expert {expert} is not on EP rank {self.ep_rank} of {self.ep_size}, which holds experts "
                f"{experts.start}-{experts.stop - 1}"
            )
        return "the master holds no tensor it comes from"

    def _ep_cause_of_unexpected(self, owner: str, names: list[str]) -> str | None:
        """Does an unexpected expert carry the bytes of an expected expert of the same layer?"""
        if self._used >= self.budget:
            return None
        self._used += 1
        exported = self._exported_roles(owner, names)
        for peer in self._peers(owner, expected_only=True):
            if self._matches(peer, exported):
                self._ep_matches[peer] = owner
                return self._ep_message(owner, peer, expected=False)
        return None

    def annotate_missing(self, results: list[TensorResult]) -> None:
        """Give missing tensors whose bytes were exported under another expert's name that cause."""
        for index, src in enumerate(self.plan.sources):
            owner = self._ep_matches.get(src.name)
            if owner is None:
                continue
            findings = results[index].findings
            for n, finding in enumerate(findings):
                if finding.check == "missing":
                    cause = f"its bytes were exported as `{owner}`: EP offset missing? ({self._ep_where()})"
                    findings[n] = Finding("missing", finding.detail, cause)

    # -- differing bytes -------------------------------------------------------------------------------

    def bytes_finding(self, index: int) -> Finding:
        """Describe and explain a source whose bytes differ from the reference."""
        src = self.plan.sources[index]
        if self._used >= self.budget:
            return Finding(
                "bytes",
                f"bytes differ from the reference (not analysed: the diagnosis limit of "
                f"{self.budget} tensors was reached)",
            )
        self._used += 1
        if src.format == "bf16":
            return self._bf16_finding(src)
        exported = {role: self.exported[name].cpu() for role, name in src.roles.items()}
        reference = self.reference(src.name)
        detail = self._describe(src, exported, reference)
        return Finding("bytes", detail, self._cause(src, exported, reference))

    def _cause(self, src: Source, exported: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> str | None:
        # Replays first: a replay reproducing every byte is the most specific explanation.
        members = self.tables.members(src.name)
        fused = len(members) > 1
        replays: list[tuple[str, bool]] = [(self.profile, True)] if fused else []
        if src.format == "nvfp4":
            replays += [
                (p, own) for p in PROFILES if p != self.profile for own in ((False, True) if fused else (False,))
            ]
        differing = {role for role in exported if not _same(exported[role], reference[role])}
        global_name = self.dialect.suffixes["nvfp4"].get("global", "") if src.format == "nvfp4" else ""
        ulps = _ulps(exported["global"], reference["global"]) if differing == {"global"} else None
        for profile, own in replays:
            if self._same_roles(exported, self.reference(src.name, profile=profile, own_amax=own)):
                message = self._replay_message(src, members, profile, own)
                return message + (f" (only {global_name} differs, by {ulps:+d} ulp)" if ulps is not None else "")
        if ulps is not None and abs(ulps) <= 4:
            return (
                f"{global_name} is {ulps:+d} ulp from the reference while every block scale and element "
                "matches: the exporter computes the outer scale with an approximate reciprocal (e.g. "
                "rcp.approx or fast-math 1/x) instead of a correctly rounded division"
            )
        if src.item.info.expert is not None:
            for peer in self._peers(src.name, expected_only=False):
                if self._matches(peer, exported):
                    return self._ep_message(src.name, peer)
        return self._stale_message(src, exported, reference)

    def _replay_message(self, src: Source, members: tuple[str, ...], profile: str, own: bool) -> str:
        parts = []
        if own:
            kind = _KIND_LABEL.get(src.item.info.fused_kind.value, "fused") if src.item.info.fused_kind else "fused"
            names = " and ".join(_short(m) for m in members)
            parts.append(
                f"the exporter quantized {names} separately: these bytes use {_short(src.name)}'s own "
                f"amax instead of the {kind} group's shared amax"
            )
        if profile != self.profile:
            parts.append(
                f"bytes match the {profile} profile, not {self.profile} (the contract's quantizer): the "
                f"exporter uses {profile}'s scale arithmetic"
            )
        return "; ".join(parts)

    def _stale_message(
        self, src: Source, exported: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]
    ) -> str:
        """No replay matched: say what the bytes still tell (the amax the outer scale encodes)."""
        x = self.tensor(src.name).float().cpu()
        scale = x.pow(2).mean().sqrt().item() or 1.0
        ours = (self._dequantize(src.format, exported) - x).pow(2).mean().sqrt().item() / scale
        ref = (self._dequantize(src.format, reference) - x).pow(2).mean().sqrt().item() / scale
        tried = f"profiles {', '.join(PROFILES)}, shared or own amax" if src.format == "nvfp4" else "MXFP8"
        facts = (
            f"the exported values are {ours:.3g} (relative RMS) from the master, the reference's "
            f"quantization error is {ref:.3g}"
        )
        if src.format == "nvfp4" and not _same(exported["global"], reference["global"]):
            members = self.tables.members(src.name)
            amax = float(shared_amax([self.tensor(m) for m in members]))
            implied = self._implied_amax(exported["global"])
            return (
                f"no replay reproduces these bytes ({tried}, other experts); the outer scale encodes an amax "
                f"of {implied:.6g} where the master's is {amax:.6g}: quantized from other weights (a stale "
                f"tensor from an older step, or another master); {facts}"
            )
        differ = self._differing_blocks(exported, reference)
        total = differ.numel()
        if src.format == "mxfp8" and int(differ.sum()) * 2 > total:
            return (
                f"no replay reproduces these bytes ({tried}, other experts); {int(differ.sum())} of {total} "
                f"blocks differ: quantized from other weights (a stale tensor from an older step, or another "
                f"master); {facts}"
            )
        return (
            f"no replay reproduces these bytes ({tried}, other experts); the outer scale matches and "
            f"{int(differ.sum())} of {total} blocks differ: values inside the tensor differ from the master "
            f"(stale values under an unchanged amax, or corrupted bytes) or the exporter's block arithmetic "
            f"matches no known profile; {facts}"
        )

    def _implied_amax(self, global_scale: torch.Tensor) -> float:
        """The amax an NVFP4 outer scale was made from (``A = 2688 x decode scale``), for display."""
        return self._decode_scale(global_scale) * 2688.0

    @staticmethod
    def _differing_blocks(exported: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> torch.Tensor:
        data_e, data_r = exported["data"].view(torch.uint8), reference["data"].view(torch.uint8)
        scale_e = exported["scale"].contiguous().view(torch.uint8)
        scale_r = reference["scale"].contiguous().view(torch.uint8)
        rows, blocks = scale_r.shape
        return (data_e != data_r).reshape(rows, blocks, -1).any(-1) | (scale_e != scale_r)

    def _bf16_finding(self, src: Source) -> Finding:
        found = self.exported[src.name].cpu()
        want = self.tensor(src.name).cpu()
        differ = (bits(found) != bits(want)).reshape(want.shape)
        first = tuple(int(i) for i in differ.nonzero()[0])
        delta = (found.float() - want.float()).abs().nan_to_num(nan=float("inf")).max().item()
        detail = (
            f"{int(differ.sum())} of {want.numel()} values differ; first at {list(first)}: exported "
            f"{found[first].item():.6g}, master {want[first].item():.6g}; max |difference| {delta:.3g}"
        )
        cause = None
        if src.item.info.expert is not None:
            for peer in self._peers(src.name, expected_only=False):
                if _same(found, self.tensor(peer).cpu()):
                    cause = self._ep_message(src.name, peer)
                    break
        if cause is None:
            cause = "not the master's values: a stale tensor from an older step, or another master"
        return Finding("bytes", detail, cause)

    # -- fused groups ----------------------------------------------------------------------------------

    def group_results(self, sibling_ok: Mapping[int, bool], eligible: list[bool]) -> list[TensorResult]:
        """A result per fused group whose exported siblings carry different outer scales."""
        results = []
        global_role = "global"
        for group, members in self.plan.groups.items():
            if not all(eligible[i] for i in members) or all(sibling_ok.get(i, True) for i in members):
                continue
            sources = [self.plan.sources[i] for i in members]
            scales = {src.name: self.exported[src.roles[global_role]].cpu().reshape(()) for src in sources}
            kind = sources[0].item.info.fused_kind
            label = _KIND_LABEL.get(kind.value, "fused") if kind else "fused"
            listing = ", ".join(
                f"{_short(n)} {s.item():.9g} ({int(s.view(torch.int32)):#010x})" for n, s in scales.items()
            )
            own = all(_same(scales[n], self.reference(n, own_amax=True)[global_role].reshape(())) for n in scales)
            names = " and ".join(_short(n) for n in scales)
            global_name = self.dialect.suffixes["nvfp4"]["global"]
            cause = (
                (
                    f"exporter quantized {names} separately: each {global_name} is its own tensor's amax "
                    "scale, "
                    "not the group's shared one"
                )
                if own
                else None
            )
            finding = Finding("shared-scale", f"{label} global scales differ: {listing}", cause)
            results.append(
                TensorResult(
                    group,
                    "group",
                    "nvfp4",
                    sources[0].item.decision.rule,
                    tuple(src.roles[global_role] for src in sources),
                    [finding],
                )
            )
        return results

    # -- references and replays ------------------------------------------------------------------------

    def tensor(self, name: str) -> torch.Tensor:
        """The master's BF16 values of HF tensor ``name`` (any tensor the master holds)."""
        held = self._held.get(name)
        if held is None:
            piece = self.plan.candidates[name]
            held = self._held[name] = piece.take(self.master[piece.source])
            while len(self._held) > _HELD:  # replays read whole expert groups: keep memory bounded
                self._held.popitem(last=False)
        self._held.move_to_end(name)
        return held

    def reference(self, name: str, *, profile: str | None = None, own_amax: bool = False) -> dict[str, torch.Tensor]:
        """What the contract makes of HF tensor ``name``, by role (data/scale/global/input), on CPU.

        ``profile`` replays another arithmetic profile; ``own_amax`` quantizes the tensor alone.
        """
        item = self.tables.planned(name)
        members = (name,) if own_amax else self.tables.members(name)
        items = [self.tables.planned(m) for m in members]
        out = quantize_members(
            items,
            [self.tensor(m) for m in members],
            dialect=self.dialect,
            profile=profile or self.profile,
            input_amax=group_input_amax(members, self.calibration),
        )
        suffixes = self.dialect.suffixes[item.decision.format]
        return {role: out[f"{item.module}.{s}"].cpu() for role, s in suffixes.items() if f"{item.module}.{s}" in out}

    def _same_roles(self, exported: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> bool:
        return all(role in reference and _same(t, reference[role]) for role, t in exported.items())

    def _exported_roles(self, owner: str, names: list[str]) -> dict[str, torch.Tensor]:
        item = self.tables.planned(owner)
        if not item.quantized:
            return {"value": self.exported[owner].cpu()} if owner in names else {}
        by_suffix = {n.rsplit(".", 1)[1]: n for n in names}
        suffixes = self.dialect.suffixes[item.decision.format]
        return {role: self.exported[by_suffix[s]].cpu() for role, s in suffixes.items() if s in by_suffix}

    def _matches(self, peer: str, exported: dict[str, torch.Tensor]) -> bool:
        if not exported:
            return False
        if "value" in exported:
            return _same(exported["value"], self.tensor(peer).cpu())
        if "global" in exported:  # cheap filter: the peer's outer scale, before quantizing it
            members = self.tables.members(peer)
            amax = shared_amax([self.tensor(m) for m in members]).reshape(1).cpu()
            scales = outer_scales(amax, self.profile)
            expected = scales.s_enc if isinstance(self.dialect, CompressedTensorsDialect) else scales.s_dec
            if not _same(exported["global"].reshape(-1).float(), expected.float()):
                return False
        return self._same_roles(exported, self.reference(peer))

    def _peers(self, name: str, *, expected_only: bool) -> list[str]:
        """Other experts of the same layer and projection that the master holds, likeliest first.

        A missing EP offset puts expert ``local + rank x per_rank`` under the name of expert
        ``local``: higher ids first, then lower ones, at most :data:`_PEERS` of them.
        """
        info = self.tables.infos[name]
        expert = info.expert or 0
        marker = f".experts.{expert}."
        count = self.tables.num_experts or 0
        order = [*range(expert + 1, count), *range(expert - 1, -1, -1)]
        peers = []
        for other in order:
            peer = name.replace(marker, f".experts.{other}.", 1)
            if peer in self.plan.candidates and (not expected_only or peer in self.plan.index):
                peers.append(peer)
        return peers[:_PEERS]

    def _ep_where(self) -> str:
        experts = self.tables.experts_on_rank(self.ep_rank, self.ep_size)
        if self.ep_size > 1 and experts is not None:
            return (
                f"EP rank {self.ep_rank} of {self.ep_size} holds experts {experts.start}-{experts.stop - 1}; "
                f"global id = local id + {self.ep_rank} x {len(experts)}"
            )
        return "global id = local id + ep_rank x experts per rank"

    def _ep_message(self, exported_as: str, peer: str, *, expected: bool = True) -> str:
        got = self.tables.infos[exported_as].expert
        real = self.tables.infos[peer].expert
        named = f"expected expert {got}" if expected else f"exported as expert {got}"
        return f"bytes match expert {real} of the master, {named}: EP offset missing? ({self._ep_where()})"

    # -- describing a difference -----------------------------------------------------------------------

    def _decode_scale(self, global_scale: torch.Tensor) -> float:
        value = float(global_scale.reshape(-1)[0])
        if isinstance(self.dialect, CompressedTensorsDialect):  # stores the encode scale (reciprocal)
            return 1.0 / value if value else 0.0
        return value

    def _dequantize(self, fmt: str, roles: dict[str, torch.Tensor]) -> torch.Tensor:
        scale = roles["scale"].contiguous().view(torch.uint8)
        if fmt == "nvfp4":
            values = e2m1_decode(unpack_fp4(roles["data"].view(torch.uint8)))
            factor = e4m3_decode(scale) * self._decode_scale(roles["global"])
            rows = values.shape[0]
            return (values.reshape(rows, -1, 16) * factor.unsqueeze(-1)).reshape(rows, -1)
        values = e4m3_decode(roles["data"].contiguous().view(torch.uint8))
        rows = values.shape[0]
        return (values.reshape(rows, -1, 32) * e8m0_decode(scale).unsqueeze(-1)).reshape(rows, -1)

    def _describe(self, src: Source, exported: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> str:
        fmt = src.format
        block = 16 if fmt == "nvfp4" else 32
        scale_e = exported["scale"].contiguous().view(torch.uint8)
        scale_r = reference["scale"].contiguous().view(torch.uint8)
        differ = self._differing_blocks(exported, reference)
        rows, blocks = differ.shape
        notes = []
        if fmt == "nvfp4" and not _same(exported["global"], reference["global"]):
            e, r = exported["global"].reshape(()), reference["global"].reshape(())
            name = self.dialect.suffixes["nvfp4"]["global"]
            notes.append(
                f"{name} {e.item():.9g} ({int(e.view(torch.int32)):#010x}) != expected {r.item():.9g} "
                f"({int(r.view(torch.int32)):#010x}), {_ulps(e, r):+d} ulp"
            )
        if "input" in exported and not _same(exported["input"], reference["input"]):
            notes.append(f"input scale {exported['input'].item():.9g} != expected {reference['input'].item():.9g}")
        count = int(differ.sum())
        if count == 0:
            return "; ".join(notes) + "; every block scale and element matches"
        row, col = (int(i) for i in differ.nonzero()[0])
        values_e = self._dequantize(fmt, exported)[row, col * block : (col + 1) * block]
        values_r = self._dequantize(fmt, reference)[row, col * block : (col + 1) * block]
        master = self.tensor(src.name)[row, col * block : (col + 1) * block].float().cpu()
        text = (
            f"{count} of {rows * blocks} blocks differ; first: row {row}, block {col} (cols {col * block}-"
            f"{(col + 1) * block - 1}): scale {int(scale_e[row, col]):#04x} vs expected "
            f"{int(scale_r[row, col]):#04x}, values {_values(values_e)} vs expected {_values(values_r)} "
            f"(master {_values(master)})"
        )
        return "; ".join([text, *notes])
