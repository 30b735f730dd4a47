"""A bare tensor name -> the :class:`TensorInfo` a contract needs, for ``explain`` without a model.

Model families own name classification: ``fp4convert.families.describe_name(name, config=None)``
returns the role, layer, fused group and both names of an HF or Megatron name. This module only
calls it, and falls back to the name alone when families are not available or do not know the
name. The fallback knows nothing but the layer index (``layers.<i>.``); it assumes a GEMM weight of
role ``other`` and says so in the notes, so ``explain`` never presents a guess as a fact.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

from fp4convert.contract.model import Namespace
from fp4convert.errors import MappingError
from fp4convert.inventory import TensorInfo

__all__ = ["describe_tensor_name", "family_function", "layer_from_name"]

# The decoder layer index in both schemes: HF "model.layers.3.", Megatron "decoder.layers.3.".
_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def family_function(name: str) -> Callable[..., Any] | None:
    """``fp4convert.families.<name>`` if the families package provides it yet, else None.

    Example:
        >>> family_function("no_such_function") is None
        True
    """
    families = importlib.import_module("fp4convert.families")
    function = getattr(families, name, None)
    return function if callable(function) else None


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
) -> tuple[TensorInfo, frozenset[Namespace], tuple[str, ...]]:
    """Describe a tensor from its name alone.

    Args:
        name: an HF or Megatron tensor name.
        namespace: ``"hf"`` or ``"megatron"`` when the caller knows which scheme the name is in;
            it only matters for the fallback (families recognise both schemes).

    Returns:
        (tensor, namespaces the name can be matched in, notes on what is assumed).

    Example:
        >>> tensor, namespaces, notes = describe_tensor_name(
        ...     "decoder.layers.4.mlp.linear_fc2.weight", namespace="megatron")
        >>> tensor.layer, "megatron" in namespaces
        (4, True)
    """
    describe = family_function("describe_name")
    reason = "fp4convert.families.describe_name is not available yet"
    if describe is not None:
        try:
            tensor = describe(name)
        except MappingError as exc:
            reason = f"no model family recognises it ({exc.message})"
        else:
            spaces: frozenset[Namespace] = frozenset({"hf", "megatron"}) if tensor.megatron_name else frozenset({"hf"})
            return tensor, spaces, ()
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
    return tensor, frozenset({scheme}), notes
