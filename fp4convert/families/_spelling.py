"""Megatron-Core's other spellings of one model, and the stacking / fusing that two of them need.

Family tables name every tensor once, in the TransformerEngine-spec spelling with one tensor per
expert (:mod:`fp4convert.families._grammar`). A live Megatron-Core model may spell the same weights
differently, depending on its layer spec, its version and two opt-in flags:

===================  ===============================================  ================================================
choice               TE spec (the tables' spelling)                   other spelling
===================  ===============================================  ================================================
norms                fused into the next Linear:                      local and ModelOpt specs keep them apart
                     ``self_attention.linear_qkv.layer_norm_weight``  ``input_layernorm.weight``
                     ``mlp.linear_fc1.layer_norm_weight``             ``pre_mlp_layernorm.weight``
                     ``self_attention.linear_q_up_proj.layer_norm_…``  ``self_attention.q_layernorm.weight``
                     ``self_attention.linear_kv_up_proj.layer_norm_…`` ``self_attention.kv_layernorm.weight``
MTP inner layer      ``mtp.layers.k.mtp_model_layer.`` (>= 0.17)      ``mtp.layers.k.transformer_layer.`` (<= 0.16)
routed experts       ``experts.linear_fc1.weight{e}`` (TEGroupedMLP)  ``experts.local_experts.{e}.linear_fc1.weight``
                                                                      (SequentialMLP; the ModelOpt spec's experts);
                                                                      ``experts.linear_fc1.weight`` ``[E, 2I, H]``
                                                                      (``moe_single_grouped_weight``, >= 0.18);
                                                                      ``experts.weight1`` ``[H, E*2I]`` and
                                                                      ``experts.weight2`` ``[E*I, H]`` (legacy
                                                                      GroupedMLP, <= 0.16)
MLA down projection  ``linear_q_down_proj`` + ``linear_kv_down_proj``  ``linear_qkv_down_proj`` = cat(q, kv) rows
                     (``input_layernorm.weight`` apart)               (``mla_down_proj_fusion``, >= 0.17; with TE
                                                                      the input norm is its ``layer_norm_weight``)
===================  ===============================================  ================================================

Every spelling is read without being told (:func:`unpack` turns a stacked or fused tensor into the
tables' tensors, as views); :class:`MegatronSpelling` says which one to write (:func:`packed_name`
and :func:`pack`). Legacy GroupedMLP stores each expert's ``fc1`` transposed, ``[H, 2I]``, and reads
``weight1.view(E, H, -1)``: the bytes of expert ``e`` are the ``e``-th slice of that view, not a
column block of ``weight1``; ``weight2.view(E, -1, H)`` likewise (Megatron-Core 0.16
``moe/experts.py``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from fp4convert.errors import MappingError
from fp4convert.families._grammar import ExpertLayout, MtpInner, strip_module_prefix

__all__ = [
    "SEPARATE_NORMS",
    "SPECS",
    "MegatronSpelling",
    "pack",
    "packed_name",
    "parse_megatron_version",
    "unpack",
]

#: TE-spec norm name -> the local / ModelOpt spec's name, relative to a layer. The one table of
#: these facts: family entries take the right-hand names as aliases and write them on request.
SEPARATE_NORMS: Mapping[str, str] = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
    "self_attention.linear_q_up_proj.layer_norm_weight": "self_attention.q_layernorm.weight",
    "self_attention.linear_kv_up_proj.layer_norm_weight": "self_attention.kv_layernorm.weight",
}

#: layer spec -> (norms kept apart, expert layout it builds by default)
SPECS: Mapping[str, tuple[bool, ExpertLayout]] = {
    "te": (False, ExpertLayout.GROUPED),
    "local": (True, ExpertLayout.SEQUENTIAL),
    "modelopt": (True, ExpertLayout.SEQUENTIAL),
}


def parse_megatron_version(text: str) -> tuple[int, int]:
    """``"0.16.1"`` -> ``(0, 16)``.

    Raises:
        MappingError: not a ``MAJOR.MINOR[.PATCH...]`` version.
    """
    found = re.fullmatch(r"\s*(\d+)\.(\d+)(?:[.+\-].*)?\s*", text)
    if found is None:
        raise MappingError(
            f"Megatron-Core version {text!r} is not MAJOR.MINOR[.PATCH]",
            hint="pass e.g. 0.16.1 or 0.19",
            field="megatron_version",
        )
    return int(found[1]), int(found[2])


#: (feature, first version that has it, last version that has it)
_VERSIONS = {
    ExpertLayout.SINGLE_GROUPED: ((0, 18), None),
    ExpertLayout.LEGACY_GROUPED: (None, (0, 16)),
    "mla_down_proj_fusion": ((0, 17), None),
}


@dataclass(frozen=True)
class MegatronSpelling:
    """How one Megatron-Core model names its weights (the choices of the module docstring).

    Attributes:
        separate_norms: local / ModelOpt spec norms (``input_layernorm.weight`` ...) instead of TE's
            fused ``layer_norm_weight``.
        experts: how routed experts are stored.
        mtp_inner: the MTP inner layer's name.
        mla_down_proj_fusion: MLA's q/kv down projections as one ``linear_qkv_down_proj``.

    Example:
        >>> MegatronSpelling.parse("local", megatron_version="0.16.1").mtp_inner.value
        'transformer_layer'
    """

    separate_norms: bool = False
    experts: ExpertLayout = ExpertLayout.GROUPED
    mtp_inner: MtpInner = MtpInner.MTP_MODEL_LAYER
    mla_down_proj_fusion: bool = False

    @classmethod
    def parse(
        cls,
        spec: str = "te",
        *,
        megatron_version: str | None = None,
        experts: ExpertLayout | str | None = None,
        mla_down_proj_fusion: bool = False,
    ) -> MegatronSpelling:
        """The spelling of a model built with ``spec`` by Megatron-Core ``megatron_version``.

        Args:
            spec: ``te``, ``local`` or ``modelopt`` (the layer spec).
            megatron_version: decides the MTP inner name (``transformer_layer`` before 0.17) and
                checks the version has the chosen expert layout and fusion; None: the current one.
            experts: expert layout; None takes the spec's (TEGroupedMLP for TE, SequentialMLP else).
            mla_down_proj_fusion: fuse MLA's down projections.

        Raises:
            MappingError: an unknown spec, or a layout / fusion this version does not have.
        """
        if spec not in SPECS:
            raise MappingError(
                f"unknown Megatron-Core layer spec {spec!r}",
                hint=f"valid specs: {', '.join(SPECS)}",
                field="spec",
            )
        separate, default_layout = SPECS[spec]
        layout = default_layout if experts is None else ExpertLayout(experts)
        mtp_inner = MtpInner.MTP_MODEL_LAYER
        if megatron_version is not None:
            version = parse_megatron_version(megatron_version)
            if version < (0, 17):
                mtp_inner = MtpInner.TRANSFORMER_LAYER
            for feature, wanted in ((layout, True), ("mla_down_proj_fusion", mla_down_proj_fusion)):
                if not wanted or feature not in _VERSIONS:
                    continue
                first, last = _VERSIONS[feature]
                if (first is not None and version < first) or (last is not None and version > last):
                    label = feature.value if isinstance(feature, ExpertLayout) else feature
                    since = f"from {first[0]}.{first[1]}" if first else f"up to {last[0]}.{last[1]}"  # type: ignore[index]
                    raise MappingError(
                        f"Megatron-Core {megatron_version} has no `{label}` (it exists {since})",
                        hint="pick an expert layout / fusion that this Megatron-Core version builds",
                        field="megatron_version",
                    )
        return cls(separate, layout, mtp_inner, mla_down_proj_fusion)


_INDEX = r"(?:0|[1-9][0-9]*)"
_PER_EXPERT = re.compile(rf"^(?P<head>(?:.+\.)?experts)\.linear_fc(?P<fc>[12])\.weight(?P<expert>{_INDEX})$")
_SINGLE = re.compile(r"^(?P<head>(?:.+\.)?experts)\.linear_fc(?P<fc>[12])\.weight$")
_LEGACY = re.compile(r"^(?P<head>(?:.+\.)?experts)\.weight(?P<fc>[12])$")
_DOWN = re.compile(r"^(?P<head>(?:.+\.)?)self_attention\.linear_(?P<part>q|kv)_down_proj\.weight$")
_FUSED_DOWN = re.compile(
    r"^(?P<head>(?:.+\.)?)self_attention\.linear_qkv_down_proj\.(?P<param>weight|layer_norm_weight)$"
)
_INPUT_NORM = re.compile(r"^(?P<head>(?:.+\.)?)input_layernorm\.weight$")


def packed_name(name: str, spelling: MegatronSpelling) -> str:
    """The Megatron name that holds the table-spelled tensor ``name`` under ``spelling``.

    Many names map to one for stacked experts and MLA's fused down projection; every other name is
    its own. Norm and MTP spellings are chosen when names are built, not here.

    Example:
        >>> packed_name("decoder.layers.0.mlp.experts.linear_fc1.weight3",
        ...             MegatronSpelling(experts=ExpertLayout.LEGACY_GROUPED))
        'decoder.layers.0.mlp.experts.weight1'
    """
    found = _PER_EXPERT.match(name)
    if found is not None:
        if spelling.experts is ExpertLayout.SINGLE_GROUPED:
            return f"{found['head']}.linear_fc{found['fc']}.weight"
        if spelling.experts is ExpertLayout.LEGACY_GROUPED:
            return f"{found['head']}.weight{found['fc']}"
        return name
    if not spelling.mla_down_proj_fusion:
        return name
    found = _DOWN.match(name)
    if found is not None:
        return f"{found['head']}self_attention.linear_qkv_down_proj.weight"
    found = _INPUT_NORM.match(name)
    if found is not None and not spelling.separate_norms:
        return f"{found['head']}self_attention.linear_qkv_down_proj.layer_norm_weight"
    return name


def pack(
    tensors: Mapping[str, torch.Tensor], spelling: MegatronSpelling, *, experts_per_rank: int | None
) -> dict[str, torch.Tensor]:
    """Stack / fuse table-spelled tensors into ``spelling``'s tensors (:func:`packed_name` decides).

    Args:
        tensors: table-spelled Megatron name -> tensor (complete groups).
        spelling: what to write.
        experts_per_rank: local experts per layer (a stacked tensor must hold all of them).

    Raises:
        MappingError: a stacked tensor missing experts, or an MLA down projection without its
            partner (``linear_q_proj`` models: fusion needs ``q_lora_rank``).
    """
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        groups.setdefault(packed_name(name, spelling), {})[name] = tensor
    out: dict[str, torch.Tensor] = {}
    for target, members in groups.items():
        if list(members) == [target]:
            out[target] = members[target]
        elif _SINGLE.match(target) or _LEGACY.match(target):
            out[target] = _stack(target, members, spelling.experts, experts_per_rank)
        elif target.endswith("linear_qkv_down_proj.weight"):
            head = target.removesuffix("self_attention.linear_qkv_down_proj.weight") + "self_attention."
            q, kv = (members.get(f"{head}linear_{part}_down_proj.weight") for part in ("q", "kv"))
            if q is None or kv is None:
                raise MappingError(
                    f"`{target}` needs both `{head}linear_q_down_proj.weight` and `{head}linear_kv_down_proj.weight`",
                    hint="mla_down_proj_fusion needs q_lora_rank; pass both down projections together",
                    tensor=target,
                )
            out[target] = torch.cat([q, kv], dim=0)
        else:  # the input norm renamed into the fused down projection
            [out[target]] = members.values()
    return out


def _stack(
    target: str, members: Mapping[str, torch.Tensor], layout: ExpertLayout, experts_per_rank: int | None
) -> torch.Tensor:
    by_expert = {}
    for name, tensor in members.items():
        found = _PER_EXPERT.match(name)
        assert found is not None
        by_expert[int(found["expert"])] = tensor
    if experts_per_rank is None or sorted(by_expert) != list(range(experts_per_rank)):
        raise MappingError(
            f"`{target}` stacks every local expert, but got experts {sorted(by_expert)} of {experts_per_rank}",
            hint="convert all experts of a layer together for a stacked expert layout",
            tensor=target,
        )
    ordered = [by_expert[e] for e in range(experts_per_rank)]
    if layout is ExpertLayout.SINGLE_GROUPED:
        return torch.stack(ordered)
    transposed = torch.stack([w.t() for w in ordered])  # [E, in, out]: GroupedMLP's per-expert view
    return transposed.reshape(transposed.shape[1], -1) if target.endswith("weight1") else transposed.flatten(0, 1)


def unpack(
    name: str, tensor: torch.Tensor, *, experts_per_rank: int | None, q_lora_rank: int | None
) -> list[tuple[str, torch.Tensor]] | None:
    """The table-spelled tensors a stacked or fused Megatron tensor holds, as views; None for others.

    Args:
        name: a Megatron name (``module.`` wrappers allowed; the names returned have none).
        tensor: its value (a meta tensor gives the names and shapes without data).
        experts_per_rank: local experts per layer, for stacked experts.
        q_lora_rank: MLA's q down-projection width, for ``linear_qkv_down_proj``.

    Raises:
        MappingError: a stacked or fused tensor whose shape does not split as the config says.

    Example:
        >>> pieces = unpack("decoder.layers.0.mlp.experts.weight2", torch.zeros(6, 4), experts_per_rank=2,
        ...                 q_lora_rank=None)
        >>> [(name.rsplit(".", 1)[1], tuple(t.shape)) for name, t in pieces]
        [('weight0', (4, 3)), ('weight1', (4, 3))]
    """
    name = strip_module_prefix(name)
    legacy = _LEGACY.match(name)
    found = legacy or _SINGLE.match(name)
    if found is not None:
        experts = _split_experts(name, tensor, legacy is not None, experts_per_rank)
        return [(f"{found['head']}.linear_fc{found['fc']}.weight{e}", w) for e, w in enumerate(experts)]
    found = _FUSED_DOWN.match(name)
    if found is None:
        return None
    if found["param"] == "layer_norm_weight":
        return [(f"{found['head']}input_layernorm.weight", tensor)]
    if q_lora_rank is None or tensor.dim() < 1 or tensor.shape[0] <= q_lora_rank:
        raise MappingError(
            f"`{name}` has shape {list(tensor.shape)}; it should hold q_lora_rank ({q_lora_rank}) rows of the q "
            "down projection and then the kv down projection",
            hint="mla_down_proj_fusion needs q_lora_rank in config.json",
            tensor=name,
        )
    head = f"{found['head']}self_attention."
    return [
        (f"{head}linear_q_down_proj.weight", tensor[:q_lora_rank]),
        (f"{head}linear_kv_down_proj.weight", tensor[q_lora_rank:]),
    ]


def _split_experts(name: str, tensor: torch.Tensor, legacy: bool, experts_per_rank: int | None) -> list[torch.Tensor]:
    count = experts_per_rank or 0
    if legacy and tensor.dim() == 2 and count and tensor.numel() % count == 0:
        if name.endswith("weight1"):  # [H, E*2I] read as view(E, H, 2I): expert e's fc1 is [H, 2I]
            per_expert = tensor.view(count, tensor.shape[0], -1)
        elif tensor.shape[0] % count == 0:  # [E*I, H] read as view(E, I, H)
            per_expert = tensor.view(count, -1, tensor.shape[1])
        else:
            per_expert = None
        if per_expert is not None:
            return [w.t() for w in per_expert.unbind(0)]
    if not legacy and count:
        if tensor.dim() == 3 and tensor.shape[0] == count:
            return list(tensor.unbind(0))
        if tensor.dim() == 2 and tensor.shape[0] % count == 0:
            return list(tensor.chunk(count, dim=0))
    raise MappingError(
        f"`{name}` has shape {list(tensor.shape)}, which does not hold {experts_per_rank} local experts",
        hint="pass the whole stacked expert tensor of one EP rank (tensor-parallel gathered)",
        tensor=name,
    )
