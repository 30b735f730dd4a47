"""``diff A B --model M``: which tensors of one model change format (or recipe) between two contracts.

A tensor changes when its format differs, or when it keeps a low-precision format whose recipe
differs (its bytes would differ even so). Changes are grouped by decoder layer; each layer with a
change reports its total weight bytes under both contracts (:mod:`~fp4convert.contract.footprint`),
and the report ends with the whole model's totals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fp4convert.contract.decision import Decision
from fp4convert.contract.footprint import storage_bytes
from fp4convert.contract.model import Contract
from fp4convert.contract.resolve import decide_all
from fp4convert.contract.sections import Format
from fp4convert.inventory import ModelInventory

__all__ = ["ContractDiff", "LayerDiff", "TensorChange", "diff_contracts"]


@dataclass(frozen=True)
class TensorChange:
    """One tensor whose decision differs.

    Attributes:
        tensor: HF name.
        layer: decoder (or MTP) layer index, None outside layers.
        before / after: the formats under contract A and B.
        rule_before / rule_after: the winning entries.
        recipe_change: for a tensor that stays NVFP4/MXFP8, what changed in the recipe
            (``tile: 1x16 -> 16x16``); empty otherwise.
        bytes_before / bytes_after: the tensor's storage under A and B.
    """

    tensor: str
    layer: int | None
    before: Format
    after: Format
    rule_before: str
    rule_after: str
    recipe_change: str
    bytes_before: int
    bytes_after: int


@dataclass(frozen=True)
class LayerDiff:
    """The changes in one layer, and the layer's total weight bytes under A and B."""

    layer: int | None
    changes: tuple[TensorChange, ...]
    bytes_before: int
    bytes_after: int


@dataclass(frozen=True)
class ContractDiff:
    """The result of :func:`diff_contracts`; layers without changes are left out."""

    before: str
    after: str
    family: str
    num_layers: int
    num_tensors: int
    layers: tuple[LayerDiff, ...]
    total_before: int
    total_after: int

    @property
    def changes(self) -> tuple[TensorChange, ...]:
        """Every change, layer by layer."""
        return tuple(change for layer in self.layers for change in layer.changes)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types (what ``diff --json`` prints)."""
        return {
            "before": self.before,
            "after": self.after,
            "model": {"family": self.family, "num_layers": self.num_layers, "num_tensors": self.num_tensors},
            "changed_tensors": len(self.changes),
            "bytes_before": self.total_before,
            "bytes_after": self.total_after,
            "layers": [
                {
                    "layer": layer.layer,
                    "bytes_before": layer.bytes_before,
                    "bytes_after": layer.bytes_after,
                    "changes": [
                        {
                            "tensor": c.tensor,
                            "before": c.before,
                            "after": c.after,
                            "rule_before": c.rule_before,
                            "rule_after": c.rule_after,
                            "recipe_change": c.recipe_change,
                            "bytes_before": c.bytes_before,
                            "bytes_after": c.bytes_after,
                        }
                        for c in layer.changes
                    ],
                }
                for layer in self.layers
            ],
        }


def _recipe_change(before: Decision, after: Decision) -> str:
    if before.format != after.format or before.recipe is None or after.recipe is None:
        return ""
    old, new = before.recipe.model_dump(), after.recipe.model_dump()
    return ", ".join(f"{key}: {old[key]} -> {new[key]}" for key in old if old[key] != new[key])


def diff_contracts(before: Contract, after: Contract, inventory: ModelInventory) -> ContractDiff:
    """Compare two contracts on one model.

    Args:
        before: contract A.
        after: contract B.
        inventory: the model (shapes are needed for bytes).

    Returns:
        The per-layer changes and byte totals.

    Raises:
        ContractError: either contract cannot be applied to the model (see ``decide_all``).
        MappingError: a tensor has no shape.

    Example:
        >>> from fp4convert.inventory import TensorInfo
        >>> rule = {"kind": "glob", "namespace": "hf", "pattern": "*", "format": "mxfp8"}
        >>> a = Contract.model_validate({"version": 1, "name": "a", "default": "bf16", "rules": [rule]})
        >>> b = Contract.model_validate({"version": 1, "name": "b", "default": "bf16", "rules": [rule],
        ...                              "bf16_exceptions": {"last_layers": 1}})
        >>> inv = ModelInventory("toy", 2, tuple(TensorInfo(f"model.layers.{i}.mlp.down_proj.weight",
        ...     (64, 64), layer=i, gemm_weight=True) for i in range(2)))
        >>> d = diff_contracts(a, b, inv)
        >>> [(c.tensor, c.before, c.after, c.bytes_before, c.bytes_after) for c in d.changes]
        [('model.layers.1.mlp.down_proj.weight', 'mxfp8', 'bf16', 4224, 8192)]
    """
    decisions_a = decide_all(before, inventory)
    decisions_b = decide_all(after, inventory)
    per_layer: dict[int | None, list[TensorChange]] = {}
    layer_bytes: dict[int | None, list[int]] = {}
    for tensor in inventory:
        a, b = decisions_a[tensor.name], decisions_b[tensor.name]
        size_a, size_b = storage_bytes(tensor, a), storage_bytes(tensor, b)
        totals = layer_bytes.setdefault(tensor.layer, [0, 0])
        totals[0] += size_a
        totals[1] += size_b
        recipe_change = _recipe_change(a, b)
        if a.format != b.format or recipe_change:
            change = TensorChange(
                tensor.name, tensor.layer, a.format, b.format, a.rule, b.rule, recipe_change, size_a, size_b
            )
            per_layer.setdefault(tensor.layer, []).append(change)
    # Decoder layers in order, then tensors outside any layer (embeddings, final norm, lm_head).
    order = sorted(per_layer, key=lambda layer: (layer is None, layer or 0))
    layers = tuple(
        LayerDiff(layer, tuple(per_layer[layer]), layer_bytes[layer][0], layer_bytes[layer][1]) for layer in order
    )
    return ContractDiff(
        before=before.name,
        after=after.name,
        family=inventory.family,
        num_layers=inventory.num_layers,
        num_tensors=len(inventory),
        layers=layers,
        total_before=sum(v[0] for v in layer_bytes.values()),
        total_after=sum(v[1] for v in layer_bytes.values()),
    )
