"""Name resolution for one family, both ways: HF name <-> entry <-> Megatron name. Strings only.

:class:`NameMapper` matches a name against a family's table and turns the match into names on the
other side or into a :class:`~fp4convert.inventory.TensorInfo`. With a config it knows the layer
count, the MTP layers and which optional parts each layer has, and a name must match exactly one
entry. Without a config every entry is a candidate; callers (``describe_name``) merge what the
candidates agree on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from fp4convert.errors import MappingError
from fp4convert.families._config import ModelConfig
from fp4convert.families._grammar import (
    ExpertLayout,
    HfMtp,
    Scope,
    hf_scope_prefix,
    megatron_layer_prefix,
    split_hf_layer_name,
    split_hf_mtp_module_name,
    split_megatron_layer_name,
    strip_module_prefix,
)
from fp4convert.families._spelling import MegatronSpelling
from fp4convert.families._tables import FUSED_GROUP_SUFFIX, Entry, Family, HFTensor, SharedCopy
from fp4convert.inventory import FusedKind, Role, TensorInfo

__all__ = ["Location", "Match", "NameMapper"]


@dataclass(frozen=True)
class Location:
    """Where a name sits.

    Attributes:
        scope: global, decoder layer, MTP inner layer or MTP glue.
        index: scope-local layer index (decoder layer ``n`` or MTP layer ``k``); None for globals and
            for an MTP name whose index needs a config that was not given.
        hf_layer: layer index in HF numbering (``num_layers + k`` for MTP), or None.
    """

    scope: Scope
    index: int | None = None
    hf_layer: int | None = None

    @property
    def is_mtp(self) -> bool:
        return self.scope in (Scope.MTP_LAYER, Scope.MTP_GLUE)


_GLOBAL = Location(Scope.GLOBAL)
#: the most tensors a config.json may describe: the largest models are far below it (DeepSeek-V3
#: 46,183; Kimi-K2 about 70,000), and listing them is memory and time, so a config claiming more (a
#: lie, or a number typed wrong) is refused before anything is listed
MAX_TENSORS = 500_000


@dataclass(frozen=True)
class Match:
    """A name matched to one entry of a family.

    Attributes:
        family: the family whose table matched.
        entry: the matching entry.
        location: where the name sits.
        expert: the captured ``{expert}`` value (HF: global id; Megatron: id local to the EP rank).
        piece: index into ``entry.pieces`` for an HF name; 0 for a Megatron name (the first piece
            stands for a fused tensor).
        layout: the Megatron expert spelling that matched (GROUPED for HF names and non-experts).
    """

    family: Family
    entry: Entry
    location: Location
    expert: int | None
    piece: int
    layout: ExpertLayout = ExpertLayout.GROUPED

    @property
    def hf_tensor(self) -> HFTensor:
        return self.entry.pieces[self.piece]

    def with_expert(self, expert: int | None) -> Match:
        """The same match for another expert id (EP local -> global)."""
        return replace(self, expert=expert)


class NameMapper:
    """Resolve names of one family, optionally knowing the model's config.

    Args:
        family: the family whose tables are used.
        config: the model's config.json; None resolves names without knowing layer counts or which
            optional parts exist (every entry is a candidate).

    Example:
        >>> from fp4convert.families import get_family
        >>> mapper = NameMapper(get_family("qwen3"), None)
        >>> [mapper.megatron_name(m) for m in mapper.match_hf("model.layers.2.self_attn.k_proj.weight")]
        ['decoder.layers.2.self_attention.linear_qkv.weight']
    """

    def __init__(self, family: Family, config: Mapping[str, Any] | None) -> None:
        self.family = family
        self.config = None if config is None else ModelConfig(config)
        self.num_layers: int | None = None
        self.num_mtp_layers = 0
        self._features: dict[int | None, frozenset[str]] = {}
        self.dims: Mapping[str, int] = {}
        if self.config is not None:
            self.num_layers = self.config.get_int("num_hidden_layers")
            if family.mtp_layers_key is not None:
                self.num_mtp_layers = self.config.get_int(family.mtp_layers_key, default=family.mtp_layers_default)
            if family.hf_mtp is HfMtp.MTP_MODULE and self.num_mtp_layers > 1:
                raise MappingError(
                    f"config.json asks for {self.num_mtp_layers} MTP layers, but a {family.key.value} checkpoint "
                    "names one MTP module (`mtp.*`)",
                    hint=f"set {family.mtp_layers_key} to 0 or 1",
                    field=family.mtp_layers_key,
                )
            self.dims = family.dims(self.config)

    # -- which entries exist where ----------------------------------------------------------------

    def features(self, hf_layer: int | None) -> frozenset[str] | None:
        """Features of a layer (None: the model), or None when no config was given."""
        if self.config is None:
            return None
        if hf_layer not in self._features:
            self._features[hf_layer] = self.family.features(self.config, hf_layer)
        return self._features[hf_layer]

    def is_active(self, requires: tuple[str, ...], hf_layer: int | None) -> bool:
        """Whether an entry requiring ``requires`` exists at ``hf_layer`` (always, without a config)."""
        features = self.features(hf_layer)
        return features is None or set(requires) <= features

    def _scoped_entries(self, location: Location) -> tuple[Entry, ...]:
        match location.scope:
            case Scope.GLOBAL:
                return self.family.global_entries
            case Scope.DECODER | Scope.MTP_LAYER:
                return self.family.layer_entries
            case Scope.MTP_GLUE:
                return self.family.mtp_glue_entries

    def _hf_locations(self, hf_layer: int, name: str) -> list[Location]:
        mtp_here = self.family.hf_mtp is HfMtp.DECODER_LAYERS
        if self.num_layers is None:
            # Without a config an MTP inner layer looks like a decoder layer; only glue names tell.
            decoder = Location(Scope.DECODER, hf_layer, hf_layer)
            return [decoder, Location(Scope.MTP_GLUE, None, hf_layer)] if mtp_here else [decoder]
        if hf_layer < self.num_layers:
            return [Location(Scope.DECODER, hf_layer, hf_layer)]
        if mtp_here and hf_layer < self.num_layers + self.num_mtp_layers:
            k = hf_layer - self.num_layers
            return [Location(Scope.MTP_LAYER, k, hf_layer), Location(Scope.MTP_GLUE, k, hf_layer)]
        raise MappingError(
            f"tensor `{name}` is in layer {hf_layer}, but the model has {self.num_layers} layers"
            + (f" and {self.num_mtp_layers} MTP layers" if self.num_mtp_layers and mtp_here else ""),
            hint="check the checkpoint against its config.json (num_hidden_layers)",
            tensor=name,
        )

    def _check_expert(self, expert: int | None, name: str, limit: int | None = None) -> None:
        if expert is None or self.config is None:
            return
        limit = self.dims[self.family.num_experts_dim] if limit is None else limit
        if expert >= limit:
            raise MappingError(
                f"tensor `{name}` names expert {expert}, but there are {limit} experts here",
                hint="check the checkpoint against its config.json (expert count, EP size)",
                tensor=name,
            )

    # -- HF names -----------------------------------------------------------------------------------

    def _hf_mtp_module_location(self, scope: Scope, k: int, name: str) -> Location:
        if self.num_layers is None:
            return Location(scope, k, None)
        if k >= self.num_mtp_layers:
            raise MappingError(
                f"tensor `{name}` is in MTP layer {k}, but the model has {self.num_mtp_layers} MTP layers",
                hint=f"check the checkpoint against its config.json ({self.family.mtp_layers_key})",
                tensor=name,
            )
        return Location(scope, k, self.num_layers + k)

    def match_hf(self, name: str) -> list[Match]:
        """Every entry piece an HF name matches (one with a config, unless the table is ambiguous)."""
        split = split_hf_layer_name(name)
        mtp_module = split_hf_mtp_module_name(name) if self.family.hf_mtp is HfMtp.MTP_MODULE else None
        if mtp_module is not None:
            scope, k, rest = mtp_module
            locations = [self._hf_mtp_module_location(scope, k, name)]
        elif split is None:
            locations, rest = [_GLOBAL], name
        else:
            hf_layer, rest = split
            locations = self._hf_locations(hf_layer, name)
        found = []
        for location in locations:
            for entry in self._scoped_entries(location):
                if not self.is_active(entry.requires, location.hf_layer):
                    continue
                for index, piece in enumerate(entry.pieces):
                    values = piece.pattern.match(rest)
                    if values is not None:
                        self._check_expert(values.get("expert"), name)
                        found.append(Match(self.family, entry, location, values.get("expert"), index))
        return found

    # -- Megatron names -----------------------------------------------------------------------------

    def match_megatron(self, name: str, *, num_local_experts: int | None = None) -> list[Match]:
        """Every entry a Megatron name matches (``module.`` wrappers are ignored).

        Args:
            name: a Megatron-Core parameter name.
            num_local_experts: experts per EP rank, to range-check local expert ids (None: all).
        """
        if self.family.megatron_unsupported is not None:
            return []
        stripped = strip_module_prefix(name)
        split = split_megatron_layer_name(stripped)
        if split is None:
            location, rest = _GLOBAL, stripped
        else:
            scope, index, rest = split
            location = self._megatron_location(scope, index, name)
        found = []
        for entry in self._scoped_entries(location):
            if isinstance(entry, SharedCopy) or not self.is_active(entry.requires, location.hf_layer):
                continue
            for spelling in entry.spellings:
                values = spelling.pattern.match(rest)
                if values is not None:
                    self._check_expert(values.get("expert"), name, num_local_experts)
                    found.append(Match(self.family, entry, location, values.get("expert"), 0, spelling.layout))
                    break
        return found

    def _megatron_location(self, scope: Scope, index: int, name: str) -> Location:
        if scope is Scope.DECODER:
            if self.num_layers is not None and index >= self.num_layers:
                raise MappingError(
                    f"tensor `{name}` is in decoder layer {index}, but the model has {self.num_layers}",
                    hint="check the checkpoint against its config.json (num_hidden_layers)",
                    tensor=name,
                )
            return Location(scope, index, index)
        if self.num_layers is None:
            raise MappingError(
                f"tensor `{name}` is in MTP layer {index}, whose HF layer number depends on the model",
                hint="pass the model's config.json (HF numbers MTP layers after num_hidden_layers)",
                tensor=name,
            )
        if index >= self.num_mtp_layers:
            raise MappingError(
                f"tensor `{name}` is in MTP layer {index}, but the model has {self.num_mtp_layers} MTP layers",
                hint=f"check the checkpoint against its config.json ({self.family.mtp_layers_key})",
                tensor=name,
            )
        return Location(scope, index, self.num_layers + index)

    # -- building names and descriptions ------------------------------------------------------------

    def hf_name(self, match: Match, piece: int | None = None) -> str:
        """The full HF name of one piece of a match (default: the matched piece)."""
        tensor = match.entry.pieces[match.piece if piece is None else piece]
        relative = tensor.pattern.format(**_wildcards(match))
        location = match.location
        return hf_scope_prefix(location.scope, location.index, location.hf_layer, self.family.hf_mtp) + relative

    def megatron_name(
        self, match: Match, layout: ExpertLayout | None = None, spelling: MegatronSpelling | None = None
    ) -> str | None:
        """The Megatron name holding a match's tensor, in ``layout`` (default: the matched one).

        ``spelling`` chooses the norm and MTP spellings (default: TE spec, current MTP name); stacked
        expert layouts and MLA's fused down projection are applied afterwards (``_spelling.pack``),
        so this is always a one-tensor-per-expert name. None when it cannot be known: an MTP glue
        name resolved without a config.
        """
        entry = match.entry
        if isinstance(entry, SharedCopy):
            return entry.megatron
        index = match.location.index
        if match.location.scope is not Scope.GLOBAL and index is None:
            return None
        spelling = spelling or MegatronSpelling()
        prefix = "" if index is None else megatron_layer_prefix(match.location.scope, index, spelling.mtp_inner)
        pattern = entry.spelling(match.layout if layout is None else layout, separate_norms=spelling.separate_norms)
        return prefix + pattern.format(**_wildcards(match))

    def fused(self, match: Match, piece: int | None = None) -> tuple[str | None, FusedKind | None]:
        """The fused group key and kind of one HF piece of a match (None for unfused tensors)."""
        index = match.piece if piece is None else piece
        tensor = match.entry.pieces[index]
        if not tensor.gemm:
            return None, None
        if match.entry.fused_kind is not None:
            return _group_key(self.hf_name(match, 0), match.entry.fused_kind), match.entry.fused_kind
        for group in self.family.scale_groups:
            if tensor.name in group.members and self.is_active(group.requires, match.location.hf_layer):
                first = self.hf_name(match, index).removesuffix(tensor.name) + group.members[0]
                return _group_key(first, group.kind), group.kind
        return None, None

    def describe(self, match: Match, piece: int | None = None) -> TensorInfo:
        """A shape-less :class:`TensorInfo` for one HF piece of a match."""
        index = match.piece if piece is None else piece
        tensor = match.entry.pieces[index]
        fused_group, fused_kind = self.fused(match, index)
        return TensorInfo(
            name=self.hf_name(match, index),
            role=tensor.role,
            layer=match.location.hf_layer,
            is_mtp=match.location.is_mtp,
            expert=match.expert,
            megatron_name=self.megatron_name(match),
            fused_group=fused_group,
            fused_kind=fused_kind,
            gemm_weight=tensor.gemm,
        )

    def shape(self, tensor: HFTensor) -> tuple[int, ...]:
        """A piece's shape from the config's dimensions."""
        try:
            return tuple(self.dims[dim] for dim in tensor.shape)
        except KeyError as missing:
            raise MappingError(
                f"family {self.family.key.value}: tensor `{tensor.name}` needs dimension {missing}, "
                "which its config reader does not provide",
                hint="this is a bug in the family table",
                tensor=tensor.name,
            ) from None

    # -- tensors Megatron shares with the MTP layers ---------------------------------------------------

    def shared_copy_source(self, match: Match) -> str:
        """The HF name of the tensor a :class:`SharedCopy` match copies (``model.embed_tokens.weight``)."""
        entry = match.entry
        if not isinstance(entry, SharedCopy):
            raise MappingError(f"`{self.hf_name(match)}` is not a shared copy", tensor=self.hf_name(match))
        for owner in self.family.global_entries:
            if not isinstance(owner, SharedCopy) and owner.megatron == entry.megatron:
                return owner.pieces[0].name
        raise MappingError(
            f"family {self.family.key.value}: no global entry holds `{entry.megatron}`",
            hint="this is a bug in the family table",
        )

    def shared_copy_names(self, megatron_name: str) -> list[str]:
        """HF names of the MTP copies of a global Megatron tensor (``[]`` for any other name)."""
        if self.num_layers is None:
            return []
        names = []
        for k in range(self.num_mtp_layers):
            hf_layer = self.num_layers + k
            for entry in self.family.mtp_glue_entries:
                if (
                    isinstance(entry, SharedCopy)
                    and entry.megatron == megatron_name
                    and self.is_active(entry.requires, hf_layer)
                ):
                    prefix = hf_scope_prefix(Scope.MTP_GLUE, k, hf_layer, self.family.hf_mtp)
                    names.append(prefix + entry.hf.name)
        return names

    # -- every tensor of the model --------------------------------------------------------------------

    def iter_hf(self) -> Iterator[tuple[Match, int]]:
        """Every HF tensor of the configured model as (match, piece): embedding first, then layers in
        order (MTP layers last among them), then the remaining globals.

        Raises:
            MappingError: no config was given.
        """
        if self.num_layers is None:
            raise MappingError("listing a model's tensors needs its config.json", hint="pass config=")
        self._check_size()
        # HF order: the embedding before the layers, the final norm and lm_head after them.
        globals_first = [e for e in self.family.global_entries if e.pieces[0].role is Role.EMBEDDING]
        globals_last = [e for e in self.family.global_entries if e not in globals_first]
        yield from self._iter_entries(globals_first, _GLOBAL)
        for layer in range(self.num_layers):
            yield from self._iter_entries(self.family.layer_entries, Location(Scope.DECODER, layer, layer))
        for k in range(self.num_mtp_layers):
            hf_layer = self.num_layers + k
            yield from self._iter_entries(self.family.layer_entries, Location(Scope.MTP_LAYER, k, hf_layer))
            yield from self._iter_entries(self.family.mtp_glue_entries, Location(Scope.MTP_GLUE, k, hf_layer))
        yield from self._iter_entries(globals_last, _GLOBAL)

    def _check_size(self) -> None:
        """Refuse a config describing more than :data:`MAX_TENSORS` tensors (counted, not listed: an
        upper bound, every layer entry taken as present)."""
        assert self.num_layers is not None
        experts = max(self.dims.get(self.family.num_experts_dim, 0), 1)
        per_layer = sum(
            len(e.pieces) * (experts if any(p.pattern.wildcards for p in e.pieces) else 1)
            for e in (*self.family.layer_entries, *self.family.mtp_glue_entries)
        )
        count = len(self.family.global_entries) + max(self.num_layers + self.num_mtp_layers, 0) * per_layer
        if count > MAX_TENSORS:
            raise MappingError(
                f"config.json describes up to {count:,} tensors ({self.num_layers} layers"
                + (f", {self.num_mtp_layers} MTP layers" if self.num_mtp_layers else "")
                + (f", {experts} experts" if experts > 1 else "")
                + f"), over {MAX_TENSORS:,} (the largest real models have under 100,000)",
                hint="the config.json does not describe a real model: check num_hidden_layers and the expert count",
            )

    def _iter_entries(self, entries: Any, location: Location) -> Iterator[tuple[Match, int]]:
        for entry in entries:
            if not self.is_active(entry.requires, location.hf_layer):
                continue
            has_experts = any(piece.pattern.wildcards for piece in entry.pieces)
            experts: range | list[None] = range(self.dims[self.family.num_experts_dim]) if has_experts else [None]
            for expert in experts:
                match = Match(self.family, entry, location, expert, 0)
                for piece in range(len(entry.pieces)):
                    yield match, piece


def _wildcards(match: Match) -> dict[str, int]:
    return {} if match.expert is None else {"expert": match.expert}


def _group_key(first_member: str, kind: FusedKind) -> str:
    # model.layers.3.mlp.experts.7.gate_proj.weight -> model.layers.3.mlp.experts.7.gate_up
    parent = first_member.rsplit(".", 2)[0]
    return f"{parent}.{FUSED_GROUP_SUFFIX[kind]}"
