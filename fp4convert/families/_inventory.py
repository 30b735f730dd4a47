"""Model inventories (from a config.json, or from a checkpoint's headers) and single-name descriptions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from fp4convert.errors import MappingError
from fp4convert.families._config import load_config
from fp4convert.families._headers import read_checkpoint_headers
from fp4convert.families._mapper import Match, NameMapper
from fp4convert.families._registry import FamilyRegistry
from fp4convert.families._tables import Family, FamilyKey
from fp4convert.inventory import ModelInventory, TensorInfo

__all__ = ["describe_with", "inventory_from_checkpoint_with", "inventory_from_config_with"]


def model_dtype(config: Mapping[str, Any]) -> str:
    """The checkpoint dtype config.json declares (``torch_dtype``, or transformers 5's ``dtype``)."""
    value = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    return str(value).removeprefix("torch.")


def inventory_from_config_with(
    registry: FamilyRegistry, source: str | Path | Mapping[str, Any]
) -> ModelInventory:
    """Implementation of :func:`fp4convert.families.inventory_from_config`."""
    config = load_config(source)
    family = registry.for_config(config)
    mapper = NameMapper(family, config)
    dtype = model_dtype(config)
    tensors = []
    for match, piece in mapper.iter_hf():
        tensor = match.entry.pieces[piece]
        info = mapper.describe(match, piece)
        tensors.append(replace(info, shape=mapper.shape(tensor), dtype=tensor.dtype or dtype))
    return ModelInventory(
        family=family.key.value,
        num_layers=mapper.num_layers or 0,
        tensors=tuple(tensors),
        num_mtp_layers=mapper.num_mtp_layers,
        config=config,
    )


def inventory_from_checkpoint_with(registry: FamilyRegistry, directory: str | Path) -> ModelInventory:
    """Implementation of :func:`fp4convert.families.inventory_from_checkpoint`."""
    config = load_config(Path(directory))
    family = registry.for_config(config)
    mapper = NameMapper(family, config)
    tensors = []
    for name, (shape, dtype) in read_checkpoint_headers(directory).items():
        info = _describe_unique(mapper, name)
        tensors.append(replace(info, shape=shape, dtype=dtype))
    mtp_layers = {t.layer for t in tensors if t.is_mtp}
    return ModelInventory(
        family=family.key.value,
        num_layers=mapper.num_layers or 0,
        tensors=tuple(tensors),
        num_mtp_layers=len(mtp_layers),
        config=config,
    )


def _matches(mapper: NameMapper, name: str) -> list[Match]:
    return [*mapper.match_hf(name), *mapper.match_megatron(name)]


def _describe_unique(mapper: NameMapper, name: str) -> TensorInfo:
    """Describe a name that must match exactly one entry of a configured family."""
    found = _matches(mapper, name)
    if len(found) == 1:
        return mapper.describe(found[0])
    family = mapper.family.key.value
    if found:
        entries = ", ".join(f"{type(m.entry).__name__}({m.entry.megatron})" for m in found)
        raise MappingError(
            f"tensor `{name}` matches {len(found)} entries of family {family}: {entries}",
            hint="the family table is ambiguous; make the entries' `requires` exclusive",
            tensor=name,
        )
    raise MappingError(
        f"tensor `{name}` is not a {family} tensor", hint=_unmapped_hint(mapper, name), tensor=name
    )


def _unmapped_hint(mapper: NameMapper, name: str) -> str:
    if name.endswith("_scale_inv") or name.endswith("_scale") or name.endswith("input_scale"):
        return (
            "this looks like a quantized source checkpoint; convert from a BF16 checkpoint (dequantize first)"
        )
    unconstrained = NameMapper(mapper.family, None)
    try:
        known = _matches(unconstrained, name)
    except MappingError:
        known = []
    if known:
        requires = sorted({feature for m in known for feature in m.entry.requires})
        return (
            f"the family names this tensor only where {requires} apply, which this config.json does not "
            "give here (check tie_word_embeddings, layer counts, dense/MoE layers)"
        )
    return f"see `get_family({mapper.family.key.value!r}).describe()` for the names this family maps"


def describe_with(
    registry: FamilyRegistry,
    name: str,
    config: Mapping[str, Any] | None,
    family: str | FamilyKey | Family | None,
) -> TensorInfo:
    """Implementation of :func:`fp4convert.families.describe_name`."""
    if config is not None:
        chosen = registry.get(family) if family is not None else registry.for_config(config)
        return _describe_unique(NameMapper(chosen, config), name)
    families = [registry.get(family)] if family is not None else list(registry)
    infos: list[TensorInfo] = []
    for candidate in families:
        mapper = NameMapper(candidate, None)
        infos.extend(mapper.describe(match) for match in _matches(mapper, name))
    if not infos:
        raise MappingError(
            f"tensor `{name}` is not a tensor of any supported family ({', '.join(registry.keys())})",
            hint="pass config= (or family=) to check it against one model",
            tensor=name,
        )
    return _merge(name, infos)


def _merge(name: str, infos: list[TensorInfo]) -> TensorInfo:
    """One description from the candidates of a config-free lookup.

    Role, layer, expert, MTP-ness and GEMM-ness must agree (else the name is ambiguous); the Megatron
    name and fused group are kept only where every candidate agrees (e.g. HF ``q_proj`` is fused
    into ``linear_qkv`` for Llama but is its own ``linear_q_proj`` for DeepSeek without q-LoRA).
    """
    first = infos[0]
    for field in ("name", "role", "layer", "is_mtp", "expert", "gemm_weight"):
        values = {getattr(info, field) for info in infos}
        if len(values) > 1:
            raise MappingError(
                f"tensor `{name}` is ambiguous without a model: its {field} could be any of "
                f"{sorted(map(str, values))}",
                hint="pass config= (or family=) to resolve it",
                tensor=name,
            )

    def agreed(field: str) -> Any:
        values = {getattr(info, field) for info in infos}
        return values.pop() if len(values) == 1 else None

    return replace(
        first,
        megatron_name=agreed("megatron_name"),
        fused_group=agreed("fused_group"),
        fused_kind=agreed("fused_kind"),
    )
