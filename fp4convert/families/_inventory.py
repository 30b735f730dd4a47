"""Model inventories (from a config.json, or from the tensors a checkpoint holds) and single-name descriptions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from fp4convert.errors import MappingError
from fp4convert.families._builtin import REGISTRY, family_for_config, get_family
from fp4convert.families._config import load_config
from fp4convert.families._mapper import Match, NameMapper
from fp4convert.families._tables import Family, FamilyKey
from fp4convert.inventory import ModelInventory, TensorInfo

__all__ = ["describe_name", "inventory_from_config", "inventory_from_tensors", "model_dtype"]


def model_dtype(config: Mapping[str, Any]) -> str:
    """The checkpoint dtype config.json declares (``torch_dtype``, or transformers 5's ``dtype``)."""
    value = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    return str(value).removeprefix("torch.")


def inventory_from_config(source: str | Path | Mapping[str, Any]) -> ModelInventory:
    """Every tensor of a model, from its config.json alone (no weights).

    Args:
        source: a parsed config, a config.json path, a checkpoint directory, or a shipped config name
            (:func:`shipped_config_names`).

    Returns:
        The inventory: embedding, then each decoder layer, then MTP layers, then the final norm and
        lm_head; experts expanded; shapes from the config; dtype from ``torch_dtype`` (or the fixed
        dtype a family declares, e.g. DeepSeek's float32 ``e_score_correction_bias``).

    Raises:
        MappingError: unsupported model, or a field the family needs is missing.
        CheckpointError: the config file cannot be read.

    Example:
        >>> inv = inventory_from_config("Qwen3-30B-A3B")
        >>> inv.family, inv.num_layers, len(inv)
        ('qwen3_moe', 48, 18867)
    """
    config = load_config(source)
    family = family_for_config(config)
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


def inventory_from_tensors(
    config: Mapping[str, Any], tensors: Iterable[tuple[str, tuple[int, ...], str]]
) -> ModelInventory:
    """Every tensor a checkpoint holds, classified: the family's view of what a header reader read.

    Families never read weight files: :func:`fp4convert.checkpoint.inventory_from_checkpoint` reads
    the safetensors headers (the one reader) and hands the names, shapes and dtypes here.

    Args:
        config: the checkpoint's parsed config.json.
        tensors: ``(name, shape, torch dtype name)`` of every tensor, in checkpoint order.

    Returns:
        The inventory in that order with those shapes and dtypes; ``num_mtp_layers`` counts the
        MTP layers actually present.

    Raises:
        MappingError: a tensor is not part of the family, or is ambiguous.

    Example:
        >>> config = load_config("Qwen3-30B-A3B")
        >>> inv = inventory_from_tensors(config, [("model.norm.weight", (2048,), "bfloat16")])
        >>> inv.family, [(t.name, t.role.value) for t in inv]
        ('qwen3_moe', [('model.norm.weight', 'norm')])
    """
    family = family_for_config(config)
    mapper = NameMapper(family, config)
    found = []
    for name, shape, dtype in tensors:
        info = _describe_unique(mapper, name)
        found.append(replace(info, shape=tuple(shape), dtype=dtype))
    mtp_layers = {t.layer for t in found if t.is_mtp}
    return ModelInventory(
        family=family.key.value,
        num_layers=mapper.num_layers or 0,
        tensors=tuple(found),
        num_mtp_layers=len(mtp_layers),
        config=dict(config),
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
    raise MappingError(f"tensor `{name}` is not a {family} tensor", hint=_unmapped_hint(mapper, name), tensor=name)


_FUSED_EXPERTS = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")
_QUANTIZED_SUFFIXES = ("_scale_inv", "_scale", "input_scale", "_scale_2", "_blocks", "_scales")


def _unmapped_hint(mapper: NameMapper, name: str) -> str:
    if name.removesuffix("_bias").endswith(
        tuple(f"{head}{tail}" for head in _FUSED_EXPERTS for tail in ("", "_blocks", "_scales"))
    ):
        return (
            "this is a fused 3-D expert tensor (transformers 5, gpt-oss, Qwen3.5-style releases; BF16, FP8 or "
            "MXFP4): the checkpoint readers (`convert`, `verify --source`, `dequantize`, `to-megatron`, `plan "
            "--model DIR`) split it into the family's per-expert tensors (docs/sources.md); pass the tensors of "
            "`open_checkpoint(DIR).view()`, not the stored names, to inventory_from_tensors"
        )
    if name.endswith(_QUANTIZED_SUFFIXES):
        return (
            "this looks like a quantized tensor. FP8 block-scaled sources (`weight_scale_inv`) and MXFP4 experts "
            "(`_blocks` / `_scales`) are read directly when config.json's quantization_config declares them "
            "(quant_method fp8 with weight_block_size, or mxfp4): restore the release's config.json; an fp4convert "
            "output (ModelOpt, compressed-tensors, SGLang MXFP8) needs `fp4convert dequantize` first; other "
            "formats: convert from the BF16 release (docs/sources.md)"
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


def describe_name(
    name: str,
    config: Mapping[str, Any] | None = None,
    *,
    family: str | FamilyKey | Family | None = None,
) -> TensorInfo:
    """Classify one HF or Megatron-Core name without loading a model.

    With ``config`` the name is checked against that model (layer range, dense/MoE layers, MTP
    layers, tied embeddings) and must match exactly one entry. Without it every family is tried
    (or only ``family``): role, layer, expert and MTP-ness must agree across the candidates, and the
    Megatron name / fused group are given only where they agree (HF ``q_proj`` is fused into
    ``linear_qkv`` for Llama but not for DeepSeek); a Megatron name that families spell differently
    in HF takes the first registered family's HF name (``mlp.experts.5.down_proj``, not Mixtral's
    ``block_sparse_moe.experts.5.w2``). Without a config an HF layer past the decoder is taken as a
    decoder layer unless the name is MTP glue (``enorm``, ``eh_proj`` ...), and Megatron MTP names
    cannot be resolved.

    For a fused Megatron tensor (``linear_qkv``, ``linear_fc1``) the description is that of its first
    HF piece (q, gate); siblings share role, layer, expert and fused group. Megatron expert ids are
    taken as global (EP rank 0). The shape is ``()``.

    Args:
        name: an HF name (``model.layers.3.self_attn.q_proj.weight``) or a Megatron-Core name
            (``decoder.layers.3.self_attention.linear_qkv.weight``, ``module.`` wrappers allowed).
        config: the model's parsed config.json, if known.
        family: restrict a config-free lookup to one family (or override the config's family).

    Returns:
        The :class:`TensorInfo` (name = HF name).

    Raises:
        MappingError: unmapped or ambiguous name.

    Example:
        >>> describe_name("decoder.layers.0.mlp.experts.linear_fc2.weight5").name
        'model.layers.0.mlp.experts.5.down_proj.weight'
        >>> describe_name("model.layers.2.self_attn.kv_b_proj.weight").role.value
        'mla_projection'
    """
    if config is not None:
        chosen = get_family(family) if family is not None else family_for_config(config)
        return _describe_unique(NameMapper(chosen, config), name)
    families = [get_family(family)] if family is not None else list(REGISTRY)
    infos: list[TensorInfo] = []
    for candidate in families:
        mapper = NameMapper(candidate, None)
        infos.extend(mapper.describe(match) for match in _matches(mapper, name))
    if not infos:
        raise MappingError(
            f"tensor `{name}` is not a tensor of any supported family ({', '.join(REGISTRY.keys())})",
            hint="pass config= (or family=) to check it against one model",
            tensor=name,
        )
    return _merge(name, infos)


def _merge(name: str, infos: list[TensorInfo]) -> TensorInfo:
    """One description from the candidates of a config-free lookup.

    Role, layer, expert, MTP-ness and GEMM-ness must agree (else the name is ambiguous); the Megatron
    name and fused group are kept only where every candidate agrees (e.g. HF ``q_proj`` is fused
    into ``linear_qkv`` for Llama but is its own ``linear_q_proj`` for DeepSeek without q-LoRA).
    A Megatron name that families spell differently on the HF side (``linear_fc2.weight5`` is
    ``mlp.experts.5.down_proj`` for Qwen3-MoE, ``block_sparse_moe.experts.5.w2`` for Mixtral) takes
    the HF name of the first registered family that has it; the rest must still agree.
    """
    infos = [info for info in infos if info.name == infos[0].name]
    first = infos[0]
    for field in ("role", "layer", "is_mtp", "expert", "gemm_weight"):
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
