"""``--model CONFIG_OR_DIR``: the model a contract is checked, diffed or emitted against.

Three sources, tried in this order:

* a checkpoint directory -> ``fp4convert.families.inventory_from_checkpoint(dir)``;
* a ``config.json`` (a JSON/YAML mapping with ``model_type`` or ``architectures``), or the name of
  a config shipped with fp4convert (``DeepSeek-V3``, ``Qwen3-30B-A3B``...) ->
  ``fp4convert.families.inventory_from_config``;
* a tensor list file, JSON or YAML: either a list ``[{name, shape, dtype?, role?, layer?, ...}]``
  or a mapping ``{num_layers?, num_mtp_layers?, family?, tensors: [...]}``.

The first two need the model families (a separate part of fp4convert); until they exist, a tensor
list works on its own. Each entry may give any :class:`~fp4convert.inventory.TensorInfo` field.
What an entry leaves out comes from ``fp4convert.families.describe_name`` when a family knows the
name, else: ``role`` is ``other``, ``layer`` is read from ``layers.<i>.`` in the name, and
``gemm_weight`` is true for 2-D tensors that are not norms or embeddings. ``num_layers`` defaults to
one more than the highest decoder layer listed, so a list that omits the last layers must say it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from yaml.nodes import MappingNode, Node, ScalarNode

from fp4convert.contract.loader import read_document, validate_document
from fp4convert.contract.names import family_function, layer_from_name
from fp4convert.errors import MappingError
from fp4convert.inventory import FusedKind, ModelInventory, Role, TensorInfo

__all__ = ["inventory_from_tensor_list", "load_model_inventory"]

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


def _entry_to_tensor(entry: _TensorEntry) -> TensorInfo:
    # Only what the entry wrote overrides the family (an explicit null included).
    given = entry.model_dump(exclude_unset=True, exclude={"name"})
    given["shape"] = tuple(entry.shape)
    describe = family_function("describe_name")
    if describe is not None:
        try:
            return dataclasses.replace(describe(entry.name), **given)
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


def _from_families(function_name: str, path: Path, what: str) -> ModelInventory:
    function = family_function(function_name)
    if function is None:
        raise MappingError(
            f"{path}: reading a {what} needs fp4convert.families.{function_name}, which is not available yet",
            hint="pass a tensor list file instead: a JSON/YAML list of {name, shape, role?, layer?}",
            file=str(path),
        )
    inventory: ModelInventory = function(path if path.exists() else str(path))
    return inventory


def load_model_inventory(path: str | os.PathLike[str]) -> ModelInventory:
    """Load ``--model``: a checkpoint directory, a config.json, or a tensor list file.

    Args:
        path: the directory or file, or the name of a config shipped with fp4convert.

    Returns:
        The model inventory.

    Raises:
        MappingError: the path is missing, the families needed for it are not available, or a
            tensor list entry is malformed.

    Example:
        >>> inventory = load_model_inventory("tests/contract/data/toy_qwen3_moe.yaml")
        >>> inventory.family, inventory.num_layers, len(inventory)
        ('toy_qwen3_moe', 4, 87)
    """
    file = Path(path)
    if file.is_dir():
        if family_function("inventory_from_tensors") is None:
            return _from_families("inventory_from_checkpoint", file, "checkpoint directory")
        from fp4convert.checkpoint import inventory_from_checkpoint  # the one header reader

        return inventory_from_checkpoint(file)
    if not file.exists():
        if family_function("inventory_from_config") is not None:
            return _from_families("inventory_from_config", file, "shipped config")  # e.g. "DeepSeek-V3"
        raise MappingError(f"{file}: no such file or directory", hint="check the --model path", file=str(file))
    data, root, source = read_document(file, error_cls=MappingError)
    if isinstance(data, dict) and "tensors" not in data and ("model_type" in data or "architectures" in data):
        return _from_families("inventory_from_config", file, "config.json")
    return inventory_from_tensor_list(data, source=source, root=root)
