"""``explain``: one tensor's decision with every contract entry that matched it and the one that won.

The tensor is either described already (a :class:`~fp4convert.inventory.TensorInfo`: from a
model, from a family, or built by hand) or named and looked up in the model's inventory, by its HF
or its Megatron name. The contract never guesses what a bare name is: describing a name without a
model is the model families' job (:func:`fp4convert.model_source.describe_tensor_name`), done by
whoever calls this.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from fp4convert.contract.decision import Explanation
from fp4convert.contract.lossless import source_notes
from fp4convert.contract.resolve import ALL_NAMESPACES, resolve
from fp4convert.contract.sections import Namespace
from fp4convert.errors import MappingError
from fp4convert.inventory import ModelInventory, TensorInfo

if TYPE_CHECKING:  # the contract model calls into this module; at run time it only passes itself in
    from fp4convert.contract.model import Contract

__all__ = ["explain", "find_tensor"]


def find_tensor(name: str, inventory: ModelInventory) -> tuple[TensorInfo, tuple[str, ...]]:
    """The tensor of ``inventory`` named ``name`` (HF or Megatron name), and notes on the lookup.

    A fused Megatron tensor (``linear_qkv.weight``) holds several HF tensors: the first is
    returned and a note lists them all.

    Raises:
        MappingError: no tensor has that name; the hint lists the closest names.

    Example:
        >>> fc1 = "decoder.layers.0.mlp.linear_fc1.weight"
        >>> inventory = ModelInventory("toy", 1, (
        ...     TensorInfo("model.layers.0.mlp.gate_proj.weight", megatron_name=fc1),
        ...     TensorInfo("model.layers.0.mlp.up_proj.weight", megatron_name=fc1)))
        >>> tensor, notes = find_tensor(fc1, inventory)
        >>> tensor.name, notes[0].endswith("holds 2 HF tensors (model.layers.0.mlp.gate_proj.weight, "
        ...                                "model.layers.0.mlp.up_proj.weight); explained the first")
        ('model.layers.0.mlp.gate_proj.weight', True)
    """
    by_hf = inventory.by_name()
    if name in by_hf:
        return by_hf[name], ()
    pieces = [t for t in inventory if t.megatron_name == name]
    if pieces:
        notes: tuple[str, ...] = ()
        if len(pieces) > 1:
            listed = ", ".join(t.name for t in pieces)
            notes = (f"Megatron tensor '{name}' holds {len(pieces)} HF tensors ({listed}); explained the first",)
        return pieces[0], notes
    candidates = list(by_hf) + [t.megatron_name for t in inventory if t.megatron_name]
    close = difflib.get_close_matches(name, candidates, n=3)
    raise MappingError(
        f"tensor '{name}' is not in the model ({len(inventory)} tensors, family {inventory.family})",
        hint=f"did you mean {', '.join(repr(c) for c in close)}?" if close else "check the name and the model",
        tensor=name,
    )


def explain(
    contract: Contract,
    tensor: str | TensorInfo,
    inventory: ModelInventory | None = None,
    *,
    namespace: Namespace | None = None,
    notes: tuple[str, ...] = (),
) -> Explanation:
    """Explain one tensor: its decision, every entry that matched, and which one won.

    Args:
        contract: the contract.
        tensor: a described tensor, or the HF or Megatron name of a tensor of ``inventory``.
        inventory: the model. Without it, layer-count exceptions that need the layer count are
            skipped, with a note saying so.
        namespace: evaluate only this namespace's rules and name exceptions (the view one engine
            has); None evaluates both.
        notes: what the caller assumed when describing ``tensor`` (shown before the contract's own
            notes), e.g. that a bare name was described from the name alone.

    Returns:
        The explanation.

    Raises:
        MappingError: ``tensor`` is a name and the model is not given or does not hold it.
        ContractError: see :func:`fp4convert.contract.resolve.resolve`.

    Example:
        >>> from fp4convert.contract.model import Contract
        >>> c = Contract.model_validate({"version": 1, "name": "x", "default": "bf16",
        ...     "rules": [{"kind": "glob", "namespace": "hf", "pattern": "*.mlp.experts.*",
        ...                "format": "nvfp4"}]})
        >>> t = TensorInfo("model.layers.0.mlp.experts.3.up_proj.weight", layer=0, gemm_weight=True)
        >>> e = c.explain(t)
        >>> e.winner.rule, [m.rule for m in e.decision.matched]
        ('rules[0]', ['rules[0]', 'default'])
    """
    if isinstance(tensor, str):
        if inventory is None:
            raise MappingError(
                f"tensor '{tensor}' is only a name: without the model it belongs to, the contract cannot "
                "tell its role, layer or Megatron name",
                hint="give the model it belongs to, or a TensorInfo describing it "
                "(fp4convert.model_source.describe_tensor_name describes a bare name)",
                tensor=tensor,
            )
        tensor, found_notes = find_tensor(tensor, inventory)
        notes += found_notes
    namespaces = ALL_NAMESPACES if namespace is None else frozenset({namespace})
    num_layers = inventory.num_layers if inventory is not None else None
    num_mtp = inventory.num_mtp_layers if inventory is not None else 0
    decision, resolve_notes = resolve(
        contract, tensor, num_layers=num_layers, num_mtp_layers=num_mtp, namespaces=namespaces
    )
    sources = source_notes(tensor, decision, contract.nvfp4_profile)
    return Explanation(tensor, decision, num_layers, namespaces, notes + resolve_notes + sources)
