"""Does a checkpoint hold what its config.json says? Checked before anything reads or writes a tensor.

A careless or hostile source converts "successfully" into nonsense when its config.json and its
tensors disagree (more layers, another hidden size, more experts, another vocabulary or expert
width), when a GEMM weight is missing, or when a tensor is not what its role needs (an integer norm,
a 1-D tensor where a Linear weight belongs, an empty tensor, an FP8 or int8 weight where a BF16
master is read). :func:`source_problems` compares the tensors' inventory with the inventory the
family derives from config.json alone (names and shapes) and checks every dtype; each problem is a
short line naming the tensor and, where one can be told, the config.json field.

Decided, not refused:

* a checkpoint without its multi-token-prediction layers (``num_nextn_predict_layers`` > 0, no
  MTP tensor at all) is converted without them: transformers' own ``save_pretrained`` drops them;
  an MTP layer that is present must be complete;
* a tensor's dtype may differ from ``torch_dtype`` (FP32 norms or routers in a BF16 model are
  common); it must be a floating-point dtype fp4convert reads: BF16, FP16 or FP32. No family lists
  an integer buffer, so an integer or bool tensor is always refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fp4convert.families import inventory_from_config
from fp4convert.inventory import ModelInventory, TensorInfo

__all__ = ["SOURCE_DTYPES", "SourceProblems", "source_problems"]

#: torch dtype names a source tensor may have (what the quantizers and the BF16 copy read)
SOURCE_DTYPES = ("bfloat16", "float16", "float32")
_SHOWN = 6  # missing / unexpected tensors listed; the count says how many more
# config.json fields a tensor dimension is derived from (others that happen to be equal are not named)
_SHAPE_WORDS = ("size", "dim", "experts", "heads", "rank", "vocab")


@dataclass
class SourceProblems:
    """What :func:`source_problems` found: problem lines, and whether any is a dtype or a layout one."""

    dtypes: list[str]
    layout: list[str]

    @property
    def lines(self) -> list[str]:
        return [*self.dtypes, *self.layout]

    @property
    def hint(self) -> str:
        hints = []
        if self.layout:
            hints.append(
                "the weights are incomplete or config.json belongs to another model: re-download the checkpoint"
            )
        if self.dtypes:
            hints.append(
                "fp4convert reads BF16/FP16/FP32 weights: convert from the original high-precision checkpoint"
            )
        return "; ".join(hints)

    def __bool__(self) -> bool:
        return bool(self.dtypes or self.layout)


def _dtype_problem(info: TensorInfo) -> str | None:
    if info.dtype in SOURCE_DTYPES:
        return None
    what = "a GEMM weight" if info.gemm_weight else f"a {info.role.value} tensor"
    if info.dtype.startswith("float8"):
        return f"{info.name} is {info.dtype} where {what} is read in BF16/FP16/FP32 (an FP8 checkpoint is no master)"
    return f"{info.name} is {info.dtype} where {what} must be floating point (BF16, FP16 or FP32)"


def _fields(config: Mapping[str, Any], value: int, words: tuple[str, ...] = _SHAPE_WORDS) -> list[str]:
    """The config.json fields equal to ``value`` whose names hold one of ``words`` (what a shape
    dimension or a count was derived from)."""
    return [
        f"{k}={value}"
        for k, v in config.items()
        if isinstance(v, int) and not isinstance(v, bool) and v == value and any(w in k for w in words)
    ][:3]


def _shape_problems(
    present: Mapping[str, TensorInfo], wanted: Mapping[str, TensorInfo], config: Mapping[str, Any]
) -> list[str]:
    """Shape disagreements, one line per config.json field involved (with the first tensor as example)."""
    by_cause: dict[str, list[str]] = {}
    for name, info in present.items():
        expected = wanted.get(name)
        if expected is None or info.shape == expected.shape or info.numel == 0:
            continue
        if len(info.shape) != len(expected.shape):
            cause = f"{len(expected.shape)}-D"
            line = f"{name} is {len(info.shape)}-D {info.shape} where config.json implies {expected.shape}"
        else:
            wants = [want for got, want in zip(info.shape, expected.shape, strict=True) if got != want]
            cause = ", ".join(dict.fromkeys(f for want in wants for f in _fields(config, want)))
            line = f"{name} has shape {info.shape}, config.json implies {expected.shape}"
        by_cause.setdefault(cause, []).append(line)
    out = []
    for cause, lines in by_cause.items():
        if len(lines) <= 2:
            out += [f"{line} ({cause})" if cause else line for line in lines]
        else:
            out.append(f"{len(lines)} tensors disagree with config.json ({cause or 'shapes'}); first: {lines[0]}")
    return out


def _count_problem(what: str, count: int, held: set[int], config: Mapping[str, Any], word: str) -> str | None:
    """config.json implies ``count`` layers / experts; the tensors hold the indices ``held``."""
    if not held or held == set(range(count)):
        return None
    ordered = sorted(held)
    contiguous = ordered == list(range(ordered[0], ordered[-1] + 1))
    shown = f"{ordered[0]}..{ordered[-1]}" if contiguous else ", ".join(map(str, ordered[:8]))
    fields = ", ".join(_fields(config, count, (word,)))
    return f"config.json says {count} {what}{f' ({fields})' if fields else ''}, the tensors hold {what} {shown}"


def _listed(lines: list[str], kind: str) -> list[str]:
    return lines if len(lines) <= _SHOWN else [*lines[:_SHOWN], f"... and {len(lines) - _SHOWN} more {kind}"]


def source_problems(inventory: ModelInventory) -> SourceProblems:
    """What is wrong with a checkpoint's tensors (``inventory``, read from its headers) against its
    config.json (``inventory.config``) and their roles; falsy when nothing is.

    Example:
        >>> from fp4convert.families import inventory_from_tensors, load_config
        >>> inv = inventory_from_tensors(load_config("Qwen3-8B"), [("model.norm.weight", (4096,), "int32")])
        >>> source_problems(inv).dtypes
        ['model.norm.weight is int32 where a norm tensor must be floating point (BF16, FP16 or FP32)']
    """
    dtypes = [p for info in inventory if (p := _dtype_problem(info))]
    layout = [f"{i.name} has shape {i.shape}: no elements" for i in inventory if i.numel == 0]
    config = inventory.config or {}
    expected = inventory_from_config(config)
    wanted, present = expected.by_name(), inventory.by_name()
    layers = {t.layer for t in inventory if t.layer is not None and not t.is_mtp}
    experts = {t.expert for t in inventory if t.expert is not None}
    layout.append(_count_problem("decoder layers", expected.num_layers, layers, config, "layers") or "")
    experts_wanted = {t.expert for t in expected if t.expert is not None}
    if experts_wanted:
        layout.append(_count_problem("routed experts", len(experts_wanted), experts, config, "experts") or "")
    layout = [line for line in layout if line]
    has_mtp = any(t.is_mtp for t in inventory)
    missing = [
        name
        for name, info in wanted.items()
        if name not in present
        and (has_mtp if info.is_mtp else info.layer is None or info.layer in layers)  # counts report the rest
        and (info.expert is None or info.expert in experts)
    ]
    layout += _listed([f"{name} is missing (config.json implies it)" for name in missing], "missing tensors")
    extra = [name for name in present if name not in wanted]
    layout += _listed([f"{name} is not a tensor config.json implies" for name in extra], "such tensors")
    layout += _shape_problems(present, wanted, config)
    return SourceProblems(dtypes, layout)
