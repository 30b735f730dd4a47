"""The typed entries family tables are made of, and the :class:`Family` that holds them.

A family is data: a few tuples of entries, a function reading named dimensions from config.json and
a function naming the optional parts a layer has. Entries come in four kinds:

- :class:`Direct`: one Megatron tensor is one HF tensor (a rename).
- :class:`QKV`: Megatron's ``linear_qkv`` holds HF q/k/v, interleaved per query group (section 5.4).
- :class:`GatedMLP`: Megatron's ``linear_fc1`` holds ``cat([gate, up])``.
- :class:`SharedCopy`: an HF tensor that Megatron does not store again because it shares the weight
  (DeepSeek's MTP ``embed_tokens`` / ``shared_head.head`` are copies of the main ones).

:class:`ScaleGroup` names HF siblings that engines fuse although Megatron keeps them apart (DeepSeek's
``q_a_proj`` and ``kv_a_proj_with_mqa``), so they must share one outer scale.

Each HF piece carries its shape as a tuple of *dimension names*; the family's ``dims`` function turns
a config.json into the numbers. Entries may require *features* (``"moe"``, ``"qkv_bias"``,
``"lm_head"`` ...): the family's ``features`` function says which ones a layer (or, for layer
``None``, the model) has, and an entry exists only where all its features are present.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fp4convert.errors import MappingError
from fp4convert.families._grammar import (
    EXPERT,
    ExpertLayout,
    HfMtp,
    Pattern,
    check_same_wildcards,
    compile_pattern,
    sequential_expert_spelling,
)
from fp4convert.families._spelling import SEPARATE_NORMS
from fp4convert.inventory import FusedKind, Role

if TYPE_CHECKING:
    from fp4convert.families._config import ModelConfig

__all__ = [
    "QKV",
    "Dims",
    "Direct",
    "Entry",
    "Family",
    "FamilyKey",
    "Features",
    "GatedMLP",
    "HFTensor",
    "ScaleGroup",
    "SharedCopy",
    "Spelling",
    "embedding",
    "linear",
    "norm",
    "vector",
]


class FamilyKey(str, enum.Enum):
    """Registry keys of the supported model families."""

    LLAMA = "llama"
    QWEN2 = "qwen2"
    QWEN3 = "qwen3"
    QWEN3_MOE = "qwen3_moe"
    DEEPSEEK_V3 = "deepseek_v3"
    MIXTRAL = "mixtral"
    QWEN2_MOE = "qwen2_moe"
    MINIMAX_M2 = "minimax_m2"
    GLM4_MOE = "glm4_moe"
    GPT_OSS = "gpt_oss"
    QWEN3_NEXT = "qwen3_next"


@dataclass(frozen=True)
class HFTensor:
    """One HF tensor of an entry, named relative to its scope.

    Attributes:
        name: pattern such as ``mlp.experts.{expert}.gate_proj.weight``.
        shape: dimension names, resolved through the family's ``dims``.
        role: what the tensor does.
        gemm: a 2-D weight consumed by a GEMM (the only tensors a low-precision format applies to).
        dtype: fixed on-disk dtype when it differs from the model's (DeepSeek keeps the router's
            ``e_score_correction_bias`` in float32); None means the model's dtype.
    """

    name: str
    shape: tuple[str, ...]
    role: Role
    gemm: bool = False
    dtype: str | None = None
    pattern: Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", compile_pattern(self.name))


def linear(name: str, shape: tuple[str, str], role: Role) -> HFTensor:
    """A Linear weight ``[out, in]`` (``gemm=True``)."""
    return HFTensor(name, shape, role, gemm=True)


def norm(name: str, dim: str = "hidden", role: Role = Role.NORM) -> HFTensor:
    """An RMSNorm weight of size ``dim``."""
    return HFTensor(name, (dim,), role)


def vector(name: str, dim: str, role: Role = Role.OTHER, dtype: str | None = None) -> HFTensor:
    """A 1-D parameter that is neither a norm nor a GEMM operand (biases)."""
    return HFTensor(name, (dim,), role, dtype=dtype)


def embedding(name: str, role: Role = Role.EMBEDDING) -> HFTensor:
    """A token-embedding table ``[vocab, hidden]`` (a lookup, not a GEMM)."""
    return HFTensor(name, ("vocab", "hidden"), role)


@dataclass(frozen=True)
class Spelling:
    """One accepted Megatron spelling of an entry: its pattern and the expert layout it implies."""

    pattern: Pattern
    layout: ExpertLayout
    canonical: bool


def _spellings(canonical: str, aliases: tuple[str, ...], pieces: tuple[HFTensor, ...]) -> tuple[Spelling, ...]:
    """Compile an entry's Megatron spellings, checking each carries the same wildcards as the HF side.

    An expert entry is written in the TEGroupedMLP spelling; the SequentialMLP one is derived.
    """
    spellings = []
    for text, is_canonical in ((canonical, True), *((alias, False) for alias in aliases)):
        pattern = compile_pattern(text)
        for piece in pieces:
            check_same_wildcards(pattern, piece.pattern)
        spellings.append(Spelling(pattern, ExpertLayout.GROUPED, is_canonical))
        if EXPERT in text:
            sequential = compile_pattern(sequential_expert_spelling(text))
            spellings.append(Spelling(sequential, ExpertLayout.SEQUENTIAL, is_canonical))
    return tuple(spellings)


class _MegatronEntry:
    """Shared behaviour of entries that own a Megatron tensor (Direct, QKV, GatedMLP)."""

    megatron: str
    aliases: tuple[str, ...]
    spellings: tuple[Spelling, ...]

    @property
    def pieces(self) -> tuple[HFTensor, ...]:
        raise NotImplementedError

    def __post_init__(self) -> None:
        # The local / ModelOpt spec's name of a TE-fused norm is read everywhere and written on request.
        separate = SEPARATE_NORMS.get(self.megatron)
        aliases = self.aliases if separate is None or separate in self.aliases else (*self.aliases, separate)
        object.__setattr__(self, "spellings", _spellings(self.megatron, aliases, self.pieces))

    def spelling(self, layout: ExpertLayout, *, separate_norms: bool = False) -> Pattern:
        """The pattern fp4convert writes for ``layout`` (layout only matters for expert entries);
        ``separate_norms`` writes the local / ModelOpt spec's norm names."""
        separate = SEPARATE_NORMS.get(self.megatron) if separate_norms else None
        if separate is not None:
            return next(s.pattern for s in self.spellings if s.pattern.text == separate)
        layout = layout.per_expert
        for spelling in self.spellings:
            if spelling.canonical and (spelling.layout is layout or len(spelling.pattern.wildcards) == 0):
                return spelling.pattern
        raise AssertionError("unreachable: every entry has a canonical spelling")


@dataclass(frozen=True)
class Direct(_MegatronEntry):
    """One Megatron tensor is one HF tensor.

    Attributes:
        megatron: Megatron pattern (written; the canonical spelling).
        hf: the HF tensor.
        requires: features the layer (or model) must have for the tensor to exist.
        aliases: other Megatron spellings accepted when reading (e.g. the local spec's
            ``q_layernorm.weight`` for TE's ``linear_q_up_proj.layer_norm_weight``); never written.
    """

    megatron: str
    hf: HFTensor
    requires: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    spellings: tuple[Spelling, ...] = field(init=False, repr=False, compare=False)

    fused_kind = None

    @property
    def pieces(self) -> tuple[HFTensor, ...]:
        return (self.hf,)


@dataclass(frozen=True)
class QKV(_MegatronEntry):
    """Megatron ``linear_qkv`` (weight or bias) holding HF q/k/v, interleaved per query group."""

    megatron: str
    q: HFTensor
    k: HFTensor
    v: HFTensor
    requires: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    spellings: tuple[Spelling, ...] = field(init=False, repr=False, compare=False)

    fused_kind = FusedKind.QKV

    @property
    def pieces(self) -> tuple[HFTensor, ...]:
        return (self.q, self.k, self.v)


@dataclass(frozen=True)
class GatedMLP(_MegatronEntry):
    """Megatron ``linear_fc1`` holding ``cat([gate, up], dim=0)``."""

    megatron: str
    gate: HFTensor
    up: HFTensor
    requires: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    spellings: tuple[Spelling, ...] = field(init=False, repr=False, compare=False)

    fused_kind = FusedKind.GATE_UP

    @property
    def pieces(self) -> tuple[HFTensor, ...]:
        return (self.gate, self.up)


@dataclass(frozen=True)
class SharedCopy:
    """An HF tensor that duplicates a Megatron tensor stored once under an absolute (global) name.

    HF -> Megatron checks the copy is byte-identical to the original and drops it; Megatron -> HF
    writes the copy again.
    """

    hf: HFTensor
    megatron: str
    requires: tuple[str, ...] = ()

    fused_kind = None

    @property
    def pieces(self) -> tuple[HFTensor, ...]:
        return (self.hf,)


Entry = Direct | QKV | GatedMLP | SharedCopy


@dataclass(frozen=True)
class ScaleGroup:
    """HF siblings that engines fuse into one GEMM although Megatron keeps them apart.

    Attributes:
        kind: the fused kind reported in the inventory.
        members: HF names (relative to the layer) of the siblings.
        requires: features the layer must have.
    """

    kind: FusedKind
    members: tuple[str, ...]
    requires: tuple[str, ...] = ()


#: The suffix a fused group's key gets after the members' common parent module.
FUSED_GROUP_SUFFIX: Mapping[FusedKind, str] = {
    FusedKind.QKV: "qkv",
    FusedKind.GATE_UP: "gate_up",
    FusedKind.MLA_QA_KVA: "qa_kva",
}


Dims = Callable[["ModelConfig"], Mapping[str, int]]
Features = Callable[["ModelConfig", "int | None"], frozenset[str]]


@dataclass(frozen=True)
class Family:
    """Everything fp4convert knows about one model family, as data.

    Attributes:
        key: registry key.
        architectures: config.json ``architectures`` values that select the family.
        model_types: config.json ``model_type`` values that select it.
        global_entries: absolute names outside any layer (embedding, final norm, lm_head).
        layer_entries: entries relative to a decoder layer (also used for MTP inner layers).
        dims: config -> named dimensions used by the entries' shapes.
        features: (config, HF layer index or None) -> features present there.
        mtp_glue_entries: entries relative to an MTP layer, outside its inner transformer layer.
        scale_groups: HF siblings that must share an outer scale although Megatron keeps them apart.
        mtp_layers_key: config.json key giving the number of MTP layers, if the family has them.
        mtp_layers_default: the MTP layer count when config.json lacks that key (Qwen3-Next's configs
            do not say; its checkpoints hold one MTP module).
        hf_mtp: how the HF checkpoint names MTP layers (:class:`~fp4convert.families._grammar.HfMtp`).
        num_experts_dim: the dimension name giving the routed-expert count.
        megatron_unsupported: why fp4convert cannot convert this family to / from Megatron-Core, for a
            family it converts HF -> HF only; None when the Megatron side is mapped. Tensors still
            carry the Megatron-Core names (so contracts decide, and emit TE matchers, in both
            namespaces), but no Megatron name is read and no tensor is converted either way.
    """

    key: FamilyKey
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    global_entries: tuple[Entry, ...]
    layer_entries: tuple[Entry, ...]
    dims: Dims
    features: Features
    mtp_glue_entries: tuple[Entry, ...] = ()
    scale_groups: tuple[ScaleGroup, ...] = ()
    mtp_layers_key: str | None = None
    mtp_layers_default: int = 0
    hf_mtp: HfMtp = HfMtp.DECODER_LAYERS
    num_experts_dim: str = "num_experts"
    megatron_unsupported: str | None = None

    def __post_init__(self) -> None:
        for entry in self.global_entries:
            if any(piece.pattern.wildcards for piece in entry.pieces):
                raise MappingError(
                    f"family {self.key.value}: global entry {entry.megatron!r} has a wildcard",
                    hint="wildcards belong to layer entries",
                )
        for entry in (*self.global_entries, *self.layer_entries):
            if isinstance(entry, SharedCopy):
                raise MappingError(
                    f"family {self.key.value}: SharedCopy {entry.hf.name!r} outside the MTP glue entries",
                    hint="only MTP layers hold copies of global tensors",
                )

    def describe(self) -> str:
        """A readable table of every entry: ``scope | megatron | kind | hf pieces | requires``.

        Example:
            >>> from fp4convert.families import get_family
            >>> print(get_family("qwen3").describe().splitlines()[0])
            scope   megatron                                     kind      hf  [requires]
        """
        rows = [("scope", "megatron", "kind", "hf  [requires]")]
        for scope, entries in (
            ("global", self.global_entries),
            ("layer", self.layer_entries),
            ("mtp", self.mtp_glue_entries),
        ):
            for entry in entries:
                requires = f"  [{', '.join(entry.requires)}]" if entry.requires else ""
                hf = ", ".join(piece.name for piece in entry.pieces)
                rows.append((scope, entry.megatron, type(entry).__name__, hf + requires))
        widths = [max(len(row[column]) for row in rows) for column in range(3)]
        return "\n".join(
            "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)) + "  " + row[3]
            for row in rows
        )
