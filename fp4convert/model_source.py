"""The model a command works on: ``--model CONFIG_OR_DIR``, or a bare tensor name, as described tensors.

Contracts decide over described tensors (:class:`~fp4convert.inventory.TensorInfo`) and know no
model family; this module, above the families, turns what a user names into them.

``--model`` is tried in this order:

* a checkpoint directory -> :func:`fp4convert.checkpoint.inventory_from_checkpoint`;
* a ``config.json`` (a JSON/YAML mapping with ``model_type`` or ``architectures``), or the name of
  a config shipped with fp4convert (``DeepSeek-V3``, ``Qwen3-30B-A3B``...) ->
  :func:`fp4convert.families.inventory_from_config`;
* a tensor list file, JSON or YAML: either a list ``[{name, shape, dtype?, role?, layer?, ...}]``
  or a mapping ``{num_layers?, num_mtp_layers?, family?, tensors: [...]}``.

Each tensor list entry may give any :class:`~fp4convert.inventory.TensorInfo` field. What an entry
leaves out comes from :func:`fp4convert.families.describe_name` when a family knows the name, else:
``role`` is ``other``, ``layer`` is read from ``layers.<i>.`` in the name, and ``gemm_weight`` is
true for 2-D tensors that are not norms or embeddings. ``num_layers`` defaults to one more than the
highest decoder layer listed, so a list that omits the last layers must say it.

A bare tensor name (``explain`` without a model) is described the same way: by the families, else
from the name alone, with a note saying what was assumed (:func:`describe_tensor_name`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from yaml.nodes import MappingNode, Node, ScalarNode

from fp4convert.checkpoint import inventory_from_checkpoint
from fp4convert.contract.decision import Explanation
from fp4convert.contract.loader import read_document, validate_document
from fp4convert.contract.model import Contract
from fp4convert.contract.sections import Namespace
from fp4convert.errors import MappingError
from fp4convert.families import describe_name, inventory_from_config
from fp4convert.inventory import FusedKind, ModelInventory, Role, TensorInfo

__all__ = [
    "describe_tensor_name",
    "explain_name",
    "inventory_from_tensor_list",
    "layer_from_name",
    "load_model_inventory",
]

# The decoder layer index in both schemes: HF "model.layers.3.", Megatron "decoder.layers.3.".
_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")

_NOT_QUANTIZABLE_ROLES = frozenset({Role.NORM, Role.EMBEDDING})
_Count = Annotated[StrictInt, Field(ge=0)]


class _TensorEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[StrictStr, Field(min_length=1)]
    shape: tuple[_Count, ...]
    # Defaults here only document the fallback; what an entry does not write is filled in by
    # _entry_to_tensor (from a family, else the fallback rules), never by these defaults.
    dtype: StrictStr = "bfloat16"
    role: Role = Role.OTHER
    layer: _Count | None = None
    is_mtp: StrictBool = False
    expert: _Count | None = None
    megatron_name: StrictStr | None = None
    fused_group: StrictStr | None = None
    fused_kind: FusedKind | None = None
    gemm_weight: StrictBool = False


class _TensorList(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    family: StrictStr = "tensor-list"
    num_layers: _Count | None = None
    num_mtp_layers: _Count = 0
    tensors: tuple[_TensorEntry, ...]


def layer_from_name(name: str) -> int | None:
    """The decoder layer index in ``...layers.<i>....`` (HF or Megatron), None outside decoder layers.

    Megatron MTP names (``mtp.layers.<k>.``) number MTP layers, not decoder layers: None.

    Example:
        >>> layer_from_name("model.layers.12.mlp.gate.weight"), layer_from_name("mtp.layers.0.eh_proj.weight")
        (12, None)
    """
    found = _LAYER_INDEX.search(name)
    if found is None or name[: found.start()].endswith("mtp"):
        return None
    return int(found.group(1))


def describe_tensor_name(
    name: str, *, namespace: Namespace | None = None
) -> tuple[TensorInfo, Namespace | None, tuple[str, ...]]:
    """Describe a tensor from its name alone, for explaining it without a model.

    The model families describe every name they know (HF or Megatron). A name no family knows is
    taken as a GEMM weight of role ``other`` in the layer its name says, and a note says so, so an
    explanation never presents a guess as a fact.

    Args:
        name: an HF or Megatron tensor name.
        namespace: ``"hf"`` or ``"megatron"`` when the caller knows which scheme the name is in; it
            only matters for a name no family knows (default ``"hf"``).

    Returns:
        (tensor, the namespace its rules are matched in, or None for both, notes on what is assumed):
        pass the namespace and the notes on to :func:`fp4convert.contract.explain.explain`.

    Example:
        >>> tensor, namespace, notes = describe_tensor_name("decoder.layers.4.self_attention.linear_kv_up_proj.weight")
        >>> tensor.name, tensor.role.value, namespace, notes
        ('model.layers.4.self_attn.kv_b_proj.weight', 'mla_projection', None, ())
        >>> tensor, namespace, notes = describe_tensor_name("decoder.layers.4.custom.weight", namespace="megatron")
        >>> tensor.layer, tensor.megatron_name, namespace, notes[0][:46]
        (4, 'decoder.layers.4.custom.weight', 'megatron', "'decoder.layers.4.custom.weight' was described")
    """
    try:
        tensor = describe_name(name)
    except MappingError as exc:
        reason = f"no model family recognises it ({exc.message})"
    else:
        return tensor, (None if tensor.megatron_name else "hf"), ()
    scheme: Namespace = namespace or "hf"
    tensor = TensorInfo(
        name=name,
        layer=layer_from_name(name),
        megatron_name=name if scheme == "megatron" else None,
        gemm_weight=True,
    )
    notes = (
        f"'{name}' was described from its name alone: {reason}; it is treated as a GEMM weight "
        f"of unknown role, matched as a{'n HF' if scheme == 'hf' else ' Megatron'} name only "
        "(pass a model for the full picture)",
    )
    return tensor, scheme, notes


def explain_name(
    contract: Contract, name: str, inventory: ModelInventory | None = None, *, namespace: Namespace | None = None
) -> Explanation:
    """Explain the tensor ``name`` under ``contract``: found in the model when given, else described by name.

    Args:
        contract: the contract.
        name: an HF or Megatron tensor name.
        inventory: the model; without it the name is described by :func:`describe_tensor_name`.
        namespace: evaluate only this namespace's rules and name exceptions; for a name no family
            knows, also the scheme the name is in (default HF).

    Returns:
        The explanation (see :func:`fp4convert.contract.explain.explain`).

    Example:
        >>> from fp4convert.contract import load_contract
        >>> contract = load_contract("contracts/deepseek-v3-mxfp8-mla-bf16.yaml")
        >>> explanation = explain_name(contract, "model.layers.2.self_attn.kv_b_proj.weight")
        >>> explanation.decision.format, explanation.winner.rule
        ('bf16', 'bf16_exceptions.names.hf[0]')
    """
    if inventory is not None:
        return contract.explain(name, inventory, namespace=namespace)
    tensor, described_in, notes = describe_tensor_name(name, namespace=namespace)
    return contract.explain(tensor, namespace=namespace or described_in, notes=notes)


def _entry_to_tensor(entry: _TensorEntry) -> TensorInfo:
    # Only what the entry wrote overrides the family (an explicit null included).
    given = entry.model_dump(exclude_unset=True, exclude={"name"})
    given["shape"] = tuple(entry.shape)
    try:
        return dataclasses.replace(describe_name(entry.name), **given)
    except MappingError:
        pass  # a name no family knows: fall through to the plain defaults below
    role = given.setdefault("role", Role.OTHER)
    given.setdefault("layer", layer_from_name(entry.name))
    given.setdefault("gemm_weight", len(entry.shape) == 2 and role not in _NOT_QUANTIZABLE_ROLES)
    return TensorInfo(name=entry.name, **given)


def inventory_from_tensor_list(
    data: Any, *, source: str = "<tensor list>", root: Node | None = None
) -> ModelInventory:
    """Build an inventory from tensor-list data (already parsed from JSON/YAML).

    Args:
        data: a list of entries or a ``{num_layers?, num_mtp_layers?, family?, tensors}`` mapping.
        source: file name for error messages.
        root: the YAML node tree of the file, for line numbers in errors.

    Returns:
        The inventory.

    Raises:
        MappingError: an entry is malformed (file, line and field named).

    Example:
        >>> inv = inventory_from_tensor_list([
        ...     {"name": "model.layers.0.mlp.down_proj.weight", "shape": [64, 128]},
        ...     {"name": "model.layers.1.input_layernorm.weight", "shape": [64], "role": "norm"}])
        >>> inv.num_layers, [t.gemm_weight for t in inv]
        (2, [True, False])
    """
    if isinstance(data, list):
        data = {"tensors": data}
        if root is not None:  # wrap the node the same way, so error lines still resolve
            key = ScalarNode("tag:yaml.org,2002:str", "tensors", root.start_mark, root.end_mark)
            root = MappingNode("tag:yaml.org,2002:map", [(key, root)], root.start_mark, root.end_mark)
    listing: _TensorList = validate_document(_TensorList, data, root, source, error_cls=MappingError)
    tensors = tuple(_entry_to_tensor(entry) for entry in listing.tensors)
    num_layers = listing.num_layers
    if num_layers is None:
        decoder_layers = [t.layer for t in tensors if t.layer is not None and not t.is_mtp]
        num_layers = max(decoder_layers) + 1 if decoder_layers else 0
    return ModelInventory(
        family=listing.family,
        num_layers=num_layers,
        tensors=tensors,
        num_mtp_layers=listing.num_mtp_layers,
    )


def load_model_inventory(path: str | os.PathLike[str]) -> ModelInventory:
    """Load ``--model``: a checkpoint directory, a config.json or shipped config name, or a tensor list.

    Args:
        path: the directory or file, or the name of a config shipped with fp4convert.

    Returns:
        The model inventory.

    Raises:
        MappingError: a tensor list entry is malformed, or the model is not one a family supports.
        CheckpointError: the path is neither a file, a directory nor a shipped config name, or the
            checkpoint cannot be read.

    Example:
        >>> inventory = load_model_inventory("tests/contract/data/toy_qwen3_moe.yaml")
        >>> inventory.family, inventory.num_layers, len(inventory)
        ('toy_qwen3_moe', 4, 87)
        >>> load_model_inventory("Qwen3-8B").num_layers  # a config shipped with fp4convert
        36
    """
    file = Path(path)
    if file.is_dir():
        return inventory_from_checkpoint(file)
    if not file.exists():
        return inventory_from_config(str(file))  # a shipped config name, e.g. "DeepSeek-V3"
    data, root, source = read_document(file, error_cls=MappingError)
    if isinstance(data, dict) and "tensors" not in data and ("model_type" in data or "architectures" in data):
        return inventory_from_config(file)
    return inventory_from_tensor_list(data, source=source, root=root)
