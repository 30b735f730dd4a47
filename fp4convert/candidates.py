"""Which 4over6 candidate each block of a checkpoint tensor takes (what ``explain --model DIR`` counts).

Under a 4over6 contract (docs/formats.md, "4over6") every NVFP4 block is quantized twice, with a
block scale for a maximum of 4 and of 6, and keeps the one with the lower error. Counting the
choices needs the tensor's data and its fused siblings' (they share the outer scale), so this reads
them from the checkpoint folder; everything else ``explain`` says comes from names alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fp4convert.contract import Contract, Explanation
from fp4convert.inventory import ModelInventory

__all__ = ["four_over_six_counts"]


def four_over_six_counts(
    contract: Contract, explanation: Explanation, inventory: ModelInventory | None, model: str | None
) -> dict[str, Any] | None:
    """Which 4over6 candidate each block of the explained tensor takes (None when not 4over6 NVFP4).

    Args:
        contract: the contract.
        explanation: the explained tensor and its decision.
        inventory: the model, for the tensor's fused siblings.
        model: what ``--model`` named; only a checkpoint directory gives counts.

    Returns ``{"profile", "tile", "blocks", "map4", "map6"}``, or ``{"profile", "note"}`` when
    ``model`` is not a checkpoint directory holding the tensor in bf16/fp16/fp32.
    """
    recipe = contract.formats.nvfp4
    if explanation.decision.format != "nvfp4" or recipe.four_over_six is None or not explanation.tensor.gemm_weight:
        return None
    profile = contract.nvfp4_profile
    if model is None or not Path(model).is_dir():
        return {"profile": profile, "note": "pass --model CHECKPOINT_DIR to count the candidates its blocks take"}
    import torch

    from fp4convert.checkpoint import open_checkpoint
    from fp4convert.checkpoint.decode import DecodedSource
    from fp4convert.formats.nvfp4 import four_over_six_choices, row_amax

    group = explanation.decision.fused_group
    members = [explanation.tensor.name]
    if group is not None and inventory is not None:
        members = [t.name for t in inventory if t.fused_group == group]
    tensors = {}
    with DecodedSource(open_checkpoint(model)) as checkpoint:  # FP8 / MXFP4 / fused sources decoded
        for name in members:
            if name not in checkpoint:
                return {"profile": profile, "note": f"{name} is not in {model}"}
            tensors[name] = checkpoint[name]
    x = tensors[explanation.tensor.name]
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32) or x.ndim < 2:
        return {
            "profile": profile,
            "note": f"stored as {x.dtype} {tuple(x.shape)}: counts need a bf16/fp16/fp32 matrix",
        }
    amax = torch.stack([row_amax(t.reshape(-1, t.shape[-1])).amax() for t in tensors.values()]).amax()
    map4 = four_over_six_choices(x, profile=profile, tile=recipe.tile, amax=amax)  # type: ignore[arg-type]
    took_four = int(map4.sum())
    return {
        "profile": profile,
        "tile": recipe.tile,
        "blocks": map4.numel(),
        "map4": took_four,
        "map6": map4.numel() - took_four,
    }
