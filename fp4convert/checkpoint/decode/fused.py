"""Fused 3-D expert tensors: which layout a checkpoint uses, and the exact per-expert split.

transformers 5 holds a MoE layer's experts as two 3-D tensors and can save them so
(``save_pretrained(save_original_format=False)``; Qwen3.5-style releases ship it):

* default: ``experts.gate_up_proj [E, 2I, H]`` (gate rows, then up rows) and ``experts.down_proj
  [E, H, I]``: each expert's slice is its Linear weight ``[out, in]``;
* transposed (Llama 4, Qwen3-VL-MoE releases, gpt-oss BF16): ``gate_up_proj [E, H, 2I]`` and
  ``down_proj [E, I, H]``: each slice is ``[in, out]``;
* interleaved (gpt-oss, also its MXFP4 ``*_blocks``): gate and up alternate (even rows gate).

The orientation is read from the two shapes of one layer (``[E, a, b]`` and ``[E, c, d]`` are the
default layout when ``a == 2d`` and ``b == c``, transposed when ``b == 2c`` and ``a == d``; both at
once is impossible), never guessed from the config. Interleaving cannot be seen in shapes: it is a
property of the model (:data:`INTERLEAVED_MODEL_TYPES`). Splitting is slicing and transposing,
so the per-expert tensors are bit-identical to the per-expert save of the same model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from fp4convert.errors import CheckpointError

__all__ = [
    "FUSED_NAME",
    "INTERLEAVED_MODEL_TYPES",
    "FusedLayout",
    "fused_layout",
    "split_bias",
    "split_down",
    "split_gate_up",
]

#: ``<prefix>.experts.gate_up_proj`` / ``.down_proj``, with an optional MXFP4 / bias suffix
FUSED_NAME = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<proj>gate_up_proj|down_proj)(?P<suffix>_blocks|_bias)?$")

#: model_type values whose fused gate/up rows alternate (gate even, up odd)
INTERLEAVED_MODEL_TYPES = frozenset({"gpt_oss"})


@dataclass(frozen=True)
class FusedLayout:
    """How one MoE layer's fused expert tensors are laid out.

    Attributes:
        transposed: each expert's slice is ``[in, out]`` (else ``[out, in]``).
        interleaved: gate and up rows (or bias entries) alternate, gate first.
    """

    transposed: bool = False
    interleaved: bool = False

    @property
    def name(self) -> str:
        """``fused-3d``, with ``-transposed`` / ``-interleaved`` as they apply."""
        return "fused-3d" + ("-transposed" if self.transposed else "") + ("-interleaved" if self.interleaved else "")


def fused_layout(
    gate_up: str, gate_up_shape: tuple[int, ...], down_shape: tuple[int, ...], *, interleaved: bool
) -> FusedLayout:
    """The layout of one layer's fused ``gate_up_proj`` / ``down_proj`` (decoded shapes ``[E, rows, cols]``).

    Raises:
        CheckpointError: the shapes fit neither layout, or the expert counts differ.

    Example:
        >>> fused_layout("m.experts.gate_up_proj", (4, 64, 32), (4, 32, 32), interleaved=False)
        FusedLayout(transposed=False, interleaved=False)
        >>> fused_layout("m.experts.gate_up_proj", (4, 32, 64), (4, 32, 32), interleaved=True).name
        'fused-3d-transposed-interleaved'
    """
    if len(gate_up_shape) != 3 or len(down_shape) != 3 or gate_up_shape[0] != down_shape[0]:
        raise CheckpointError(
            f"fused expert tensors {gate_up} {list(gate_up_shape)} and its down_proj {list(down_shape)} are not "
            "two 3-D tensors [experts, rows, cols] with the same number of experts",
            hint="the checkpoint is not a transformers fused-expert save; re-save it per expert",
            tensor=gate_up,
        )
    _, a, b = gate_up_shape
    _, c, d = down_shape
    if a == 2 * d and b == c:
        return FusedLayout(False, interleaved)
    if b == 2 * c and a == d:
        return FusedLayout(True, interleaved)
    raise CheckpointError(
        f"fused expert tensors {gate_up} {list(gate_up_shape)} and its down_proj {list(down_shape)} fit neither "
        "[E, 2I, H] + [E, H, I] nor the transposed [E, H, 2I] + [E, I, H]",
        hint="the checkpoint is not a transformers fused-expert save; re-save it per expert",
        tensor=gate_up,
    )


def _as_out_in(matrix: torch.Tensor, layout: FusedLayout) -> torch.Tensor:
    return matrix.transpose(0, 1) if layout.transposed else matrix


def split_gate_up(matrix: torch.Tensor, layout: FusedLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert's stored gate/up slice -> ``(gate [I, H], up [I, H])``, contiguous.

    Example:
        >>> m = torch.arange(8).reshape(4, 2)
        >>> [t.tolist() for t in split_gate_up(m, FusedLayout(interleaved=True))]
        [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    """
    rows = _as_out_in(matrix, layout)
    if layout.interleaved:
        return rows[0::2].contiguous(), rows[1::2].contiguous()
    half = rows.shape[0] // 2
    return rows[:half].contiguous(), rows[half:].contiguous()


def split_down(matrix: torch.Tensor, layout: FusedLayout) -> torch.Tensor:
    """One expert's stored down slice -> ``down [H, I]``, contiguous."""
    return _as_out_in(matrix, layout).contiguous()


def split_bias(vector: torch.Tensor, layout: FusedLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert's fused gate/up bias ``[2I]`` -> ``(gate [I], up [I])``."""
    if layout.interleaved:
        return vector[0::2].contiguous(), vector[1::2].contiguous()
    half = vector.shape[0] // 2
    return vector[:half].contiguous(), vector[half:].contiguous()
