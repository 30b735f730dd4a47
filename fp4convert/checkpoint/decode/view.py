"""The logical view of a source checkpoint: every tensor of the model, where its bytes are, how to decode them.

A source checkpoint stores a model's tensors in one of several encodings (docs/sources.md). This
module reads only headers and config.json and turns the stored entries into *logical tensors*:
the model's tensors under their per-tensor HF names, with their decoded shape and dtype, their
source format, the bytes read for them, and the :class:`ReadUnit` that yields them:

* a dense tensor is its own unit (read as is);
* an FP8 block-scaled ``X.weight`` is read with ``X.weight_scale_inv`` and dequantized to BF16;
* a fused 3-D ``experts.gate_up_proj`` / ``down_proj`` (dense, FP8, or MXFP4 ``*_blocks`` with
  ``*_scales``) is one unit per expert: that expert's contiguous byte range (and its scales), split
  into ``experts.{e}.gate_proj.weight`` and ``up_proj.weight`` (or the family's ``w1`` / ``w3``),
  or ``down_proj.weight``; fused biases likewise.

Everything wrong with a source's structure is found here, before a byte of data is read: an FP8
weight without its ``weight_scale_inv``, a scale grid whose shape does not match its weight, a
scale or block tensor without its partner, FP8 tensors in a source whose config declares none, a
fused tensor without its sibling. Each error names the tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fp4convert.checkpoint.decode.declared import source_quantization
from fp4convert.checkpoint.decode.dequant import MXFP4_BLOCK
from fp4convert.checkpoint.decode.fused import FUSED_NAME, INTERLEAVED_MODEL_TYPES, FusedLayout, fused_layout
from fp4convert.checkpoint.decode.units import Encoding, LogicalTensor, RawPart, ReadUnit, SourceView, Split
from fp4convert.checkpoint.safetensors_io import TensorEntry
from fp4convert.errors import CheckpointError, MappingError
from fp4convert.families import describe_name, family_for_config
from fp4convert.inventory import Role
from fp4convert.inventory.dtypes import torch_dtype, torch_name

__all__ = ["source_view"]

_SCALE_INV = "_scale_inv"
_CHANNEL_SCALE = "_scale"  # compressed-tensors' weight_scale, one per output row
_SCALE_DTYPES = ("F32", "BF16", "F8_E8M0")
# Per-expert spellings a family may use for one fused gate_up / down pair, tried in order.
_EXPERT_LEAVES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))
_CONTAINERS = ((".mlp.experts", ".mlp.experts"), (".mlp.experts", ".block_sparse_moe.experts"))


def _torch_name(code: str) -> str:
    dtype = torch_dtype(code)
    assert dtype is not None  # read_header accepts table dtypes only
    return torch_name(dtype)


def _error(message: str, hint: str, tensor: str) -> CheckpointError:
    return CheckpointError(message, hint=hint, tensor=tensor)


class _Builder:
    def __init__(self, config: Mapping[str, Any], shards: Mapping[str, Mapping[str, TensorEntry]]) -> None:
        self.config = config
        self.q = source_quantization(config)
        self.files = list(shards)
        self.where = {name: (f, e) for f, entries in shards.items() for name, e in entries.items()}
        self.consumed: set[str] = set()
        self.units: dict[str, ReadUnit] = {}
        self.tensors: list[LogicalTensor] = []
        # layer module prefix as stored -> as the family names it, where a fused layer's experts
        # live in another container (transformers 5 holds Mixtral's block_sparse_moe as mlp)
        self.renamed: dict[str, str] = {}

    # -- helpers --------------------------------------------------------------------------------
    def entry(self, name: str) -> TensorEntry:
        return self.where[name][1]

    def part(self, name: str, expert: int | None = None) -> RawPart:
        """The whole stored tensor ``name``, or expert ``expert``'s slice of it (dim 0)."""
        file, e = self.where[name]
        self.consumed.add(name)
        if expert is None:
            return RawPart(file, name, e.dtype, e.shape, e.start, e.end)
        step = e.nbytes // e.shape[0]
        return RawPart(file, name, e.dtype, e.shape[1:], e.start + expert * step, e.start + (expert + 1) * step)

    def fp8_name(self) -> str:
        if self.q.method == "fp8-channel":
            return "fp8-channel"
        return "fp8-block-ue8m0" if self.q.ue8m0 else "fp8-block"

    def fp8_encoding(self) -> Encoding:
        return "fp8-channel" if self.q.method == "fp8-channel" else "fp8-block"

    def is_channel_scale(self, name: str) -> bool:
        """``name`` is the row scale of an FP8 weight of a per-channel (compressed-tensors) source."""
        base = name[: -len(_CHANNEL_SCALE)]
        return (
            self.q.method == "fp8-channel"
            and name.endswith(_CHANNEL_SCALE)
            and base in self.where
            and self.entry(base).dtype == "F8_E4M3"
        )

    def add(
        self,
        key: str,
        encoding: Encoding,
        parts: tuple[RawPart, ...],
        outputs: Sequence[tuple[str, tuple[int, ...], str]],
        source_format: str,
        split: Split = "none",
        layout: FusedLayout | None = None,
    ) -> None:
        names = tuple(name for name, _, _ in outputs)
        self.units[key] = ReadUnit(key, encoding, parts, names, split, layout)
        total = sum(p.nbytes for p in parts)
        share, rest = divmod(total, len(outputs))
        file_index = self.files.index(parts[0].file)
        for index, (name, shape, dtype) in enumerate(outputs):
            nbytes = share + (rest if index == 0 else 0)
            position = (file_index, parts[0].start, index)
            self.tensors.append(LogicalTensor(name, shape, dtype, source_format, key, nbytes, position))

    # -- FP8 ------------------------------------------------------------------------------------
    def fp8_scale(self, name: str, decoded_shape: tuple[int, ...]) -> str:
        """The ``_scale_inv`` (per-channel sources: ``_scale``) of FP8 tensor ``name``, its grid checked
        against ``decoded_shape``."""
        channel = self.q.method == "fp8-channel"
        scale = name + (_CHANNEL_SCALE if channel else _SCALE_INV)
        if scale not in self.where:
            raise _error(
                f"FP8 tensor {name!r} has no {scale!r}",
                f"an FP8 weight needs its {scale.rsplit('.', 1)[-1]}; the checkpoint is incomplete: re-download it",
                name,
            )
        *lead, rows, cols = decoded_shape
        if channel:
            expected, grid = (*lead, rows, 1), "one scale per output row"
        else:
            assert self.q.block is not None
            bm, bn = self.q.block
            expected = (*lead, math.ceil(rows / bm), math.ceil(cols / bn))
            grid = f"with weight_block_size [{bm}, {bn}]: one scale per block, edge blocks included"
        entry = self.entry(scale)
        if entry.shape != expected or entry.dtype not in _SCALE_DTYPES:
            raise _error(
                f"tensor {scale!r} is {entry.dtype} {list(entry.shape)}; its weight {name!r} {list(decoded_shape)} "
                f"needs F32 {list(expected)} ({grid})",
                "the scale grid does not match its weight: the checkpoint or its config.json's weight_block_size is "
                "wrong",
                scale,
            )
        return scale

    def check_stored_encodings(self) -> None:
        """FP8 / MXFP4 tensors only where config.json declares them, and some where it does; every
        scale has its tensor."""
        for name, (_, e) in self.where.items():
            if e.dtype in ("F8_E4M3", "F8_E5M2") and not name.endswith(_SCALE_INV):
                if self.q.method not in ("fp8", "fp8-channel"):
                    raise _error(
                        f"tensor {name!r} is {e.dtype}, but config.json declares no FP8 quantization_config",
                        "add the release's quantization_config (quant_method fp8, weight_block_size) to config.json",
                        name,
                    )
                if e.dtype == "F8_E5M2":
                    raise _error(
                        f"tensor {name!r} is F8_E5M2; FP8 sources are read as E4M3 (fmt e4m3)",
                        "convert from a release with E4M3 weights",
                        name,
                    )
            if name.endswith(_SCALE_INV) and self.q.method == "fp8":  # elsewhere: a tensor the family judges
                base = name[: -len(_SCALE_INV)]
                if base not in self.where or self.entry(base).dtype != "F8_E4M3":
                    raise _error(
                        f"tensor {name!r} scales {base!r}, which is not an F8_E4M3 tensor of this checkpoint",
                        "the checkpoint is incomplete or mixes formats: re-download it",
                        name,
                    )
            if name.endswith("_scales") and (name[: -len("_scales")] + "_blocks") not in self.where:
                if self.q.method == "mxfp4":
                    raise _error(
                        f"MXFP4 scales {name!r} have no {name[: -len('_scales')] + '_blocks'!r}",
                        "the checkpoint is incomplete: re-download it",
                        name,
                    )
            if name.endswith("_blocks") and e.dtype == "U8":
                scales = name[: -len("_blocks")] + "_scales"
                if self.q.method != "mxfp4":
                    raise _error(
                        f"tensor {name!r} looks like MXFP4 blocks, but config.json declares no mxfp4 "
                        "quantization_config",
                        "add the release's quantization_config (quant_method mxfp4) to config.json",
                        name,
                    )
                if scales not in self.where:
                    raise _error(
                        f"MXFP4 blocks {name!r} have no {scales!r}",
                        "the checkpoint is incomplete: re-download it",
                        name,
                    )
        stored = {"fp8": "F8_E4M3 tensor", "mxfp4": "U8 *_blocks tensor"}.get(self.q.method)
        if stored is not None and not any(
            e.dtype == "F8_E4M3" if self.q.method == "fp8" else (n.endswith("_blocks") and e.dtype == "U8")
            for n, (_, e) in self.where.items()
        ):  # a config that lies: engines would load these weights as quantized
            raise CheckpointError(
                f"config.json declares quant_method {self.q.method}, but the checkpoint holds no {stored}",
                hint="the weights are not quantized (a dequantized copy?): drop quantization_config from config.json",
                field="quantization_config.quant_method",
            )

    # -- fused experts --------------------------------------------------------------------------
    def expert_names(self, prefix: str, gate_up: str) -> tuple[str, str, str]:
        """Per-expert name templates (``{e}`` for the expert id) the family uses for ``prefix``."""
        family_for_config(self.config)  # an unsupported model is that error, not this one
        tried = []
        for old, new in _CONTAINERS:
            if old not in prefix:
                continue
            container = prefix.replace(old, new)
            for gate, up, down in _EXPERT_LEAVES:
                names = (f"{container}.{{e}}.{gate}", f"{container}.{{e}}.{up}", f"{container}.{{e}}.{down}")
                probe = names[0].format(e=0) + ".weight"
                tried.append(probe)
                try:
                    info = describe_name(probe, self.config)
                except MappingError:
                    continue
                if info.role is Role.ROUTED_EXPERT:
                    if old != new:
                        self.renamed[prefix.removesuffix(".experts") + "."] = container.removesuffix(".experts") + "."
                    return names
        raise MappingError(
            f"fused expert tensor {gate_up!r}: the model family names none of the per-expert tensors tried "
            f"({', '.join(tried) or 'no .mlp.experts container'})",
            hint="the family tables (fp4convert/families) must name this model's experts",
            tensor=gate_up,
        )

    def decoded(self, name: str, encoding: Encoding) -> tuple[int, ...]:
        shape = self.entry(name).shape
        if encoding == "mxfp4":
            self.mxfp4_scales(name)  # the blocks' layout checked before their shape is read: a header may lie
            return (*shape[:-2], shape[-2] * MXFP4_BLOCK)
        return shape

    def encoding_of(self, name: str) -> Encoding:
        if name.endswith("_blocks"):
            return "mxfp4"
        return self.fp8_encoding() if self.entry(name).dtype == "F8_E4M3" else "dense"

    def mxfp4_scales(self, blocks: str) -> str:
        scales = blocks[: -len("_blocks")] + "_scales"
        b, s = self.entry(blocks), self.entry(scales)
        if len(b.shape) != 4 or b.shape[-1] != MXFP4_BLOCK // 2 or s.shape != b.shape[:-1] or s.dtype != "U8":
            raise _error(
                f"MXFP4 tensors {blocks!r} {b.dtype} {list(b.shape)} and {scales!r} {s.dtype} {list(s.shape)} are not "
                "U8 blocks [E, rows, G, 16] with U8 scales [E, rows, G]",
                "the checkpoint is not gpt-oss's MXFP4 layout; dequantize it with its own tools first",
                scales,
            )
        return scales

    def fused(self) -> None:
        layers: dict[str, dict[str, str]] = {}
        for name in self.where:
            found = FUSED_NAME.match(name)
            if found is None or (found["suffix"] == "_blocks" and self.q.method != "mxfp4"):
                continue
            role = found["proj"] + ("_bias" if found["suffix"] == "_bias" else "")
            layers.setdefault(found["prefix"], {})[role] = name
        for prefix, members in layers.items():
            self.fused_layer(prefix, members)

    def fused_layer(self, prefix: str, members: dict[str, str]) -> None:
        for needed, other in (("gate_up_proj", "down_proj"), ("down_proj", "gate_up_proj")):
            if needed not in members:
                present = members.get(other) or next(iter(members.values()))
                raise _error(
                    f"fused expert tensor {present!r} has no {prefix}.{needed} sibling",
                    "the checkpoint is incomplete: re-download it",
                    present,
                )
        gate_up, down = members["gate_up_proj"], members["down_proj"]
        enc_gu, enc_dn = self.encoding_of(gate_up), self.encoding_of(down)
        gu_shape, dn_shape = self.decoded(gate_up, enc_gu), self.decoded(down, enc_dn)
        interleaved = self.config.get("model_type") in INTERLEAVED_MODEL_TYPES
        layout = fused_layout(gate_up, gu_shape, dn_shape, interleaved=interleaved)
        experts = gu_shape[0]
        inter = dn_shape[2] if not layout.transposed else dn_shape[1]
        hidden = dn_shape[1] if not layout.transposed else dn_shape[2]
        gate_t, up_t, down_t = self.expert_names(prefix, gate_up)
        for name, encoding, shape in ((gate_up, enc_gu, gu_shape), (down, enc_dn, dn_shape)):
            extra = (
                (self.mxfp4_scales(name),)
                if encoding == "mxfp4"
                else (self.fp8_scale(name, shape),)
                if encoding in ("fp8-block", "fp8-channel")
                else ()
            )
            fmt = {"dense": "dense", "fp8-block": self.fp8_name(), "fp8-channel": self.fp8_name(), "mxfp4": "mxfp4"}[
                encoding
            ]
            dtype = _torch_name(self.entry(name).dtype) if encoding == "dense" else "bfloat16"
            is_gate_up = name == gate_up
            for e in range(experts):
                parts = (self.part(name, e), *(self.part(x, e) for x in extra))
                outputs: list[tuple[str, tuple[int, ...], str]]
                if is_gate_up:
                    outputs = [(t.format(e=e) + ".weight", (inter, hidden), dtype) for t in (gate_t, up_t)]
                else:
                    outputs = [(down_t.format(e=e) + ".weight", (hidden, inter), dtype)]
                split: Split = "gate_up" if is_gate_up else "down"
                self.add(f"{name}[{e}]", encoding, parts, outputs, f"{fmt}+{layout.name}", split, layout)
        biases: tuple[tuple[str, Split, tuple[str, ...], int], ...] = (
            ("gate_up_proj_bias", "bias_gate_up", (gate_t, up_t), inter),
            ("down_proj_bias", "bias_down", (down_t,), hidden),
        )
        for role, split_kind, templates, width in biases:
            bias = members.get(role)
            if bias is None:
                continue
            entry = self.entry(bias)
            if entry.shape != (experts, width * len(templates)):
                raise _error(
                    f"fused bias {bias!r} is {list(entry.shape)}, expected [{experts}, {width * len(templates)}]",
                    "the checkpoint's fused expert tensors disagree: re-download it",
                    bias,
                )
            dtype = _torch_name(entry.dtype)
            for e in range(experts):
                bias_outputs = [(t.format(e=e) + ".bias", (width,), dtype) for t in templates]
                self.add(
                    f"{bias}[{e}]",
                    "dense",
                    (self.part(bias, e),),
                    bias_outputs,
                    f"dense+{layout.name}",
                    split_kind,
                    layout,
                )

    # -- everything else ------------------------------------------------------------------------
    def logical_name(self, name: str) -> str:
        """``name`` as the family spells it: a sibling of renamed fused experts moves with them
        (transformers 5 saves Mixtral's ``block_sparse_moe.gate`` as ``mlp.gate``)."""
        for stored, family in self.renamed.items():
            if name.startswith(stored):
                return family + name[len(stored) :]
        return name

    def rest(self) -> None:
        for name, (_, e) in self.where.items():
            if name in self.consumed or (self.q.method == "fp8" and name.endswith(_SCALE_INV)):
                continue  # a scale is read with its FP8 weight (checked to be there)
            if self.is_channel_scale(name):
                continue
            if e.dtype == "F8_E4M3":
                if len(e.shape) != 2:
                    raise _error(
                        f"FP8 tensor {name!r} is {list(e.shape)}; FP8 block-scaled weights are 2-D [out, in] (or "
                        "fused experts.gate_up_proj / down_proj)",
                        "the checkpoint is not a block-scaled FP8 release",
                        name,
                    )
                scale = self.fp8_scale(name, e.shape)
                parts = (self.part(name), self.part(scale))
                outputs = [(self.logical_name(name), e.shape, "bfloat16")]
                self.add(name, self.fp8_encoding(), parts, outputs, self.fp8_name())
                continue
            output = (self.logical_name(name), e.shape, _torch_name(e.dtype))
            self.add(name, "dense", (self.part(name),), [output], "dense")

    def view(self) -> SourceView:
        ordered = sorted(self.tensors, key=lambda t: t.position)
        first: dict[str, LogicalTensor] = {}
        for tensor in ordered:
            other = first.setdefault(tensor.name, tensor)
            if other is not tensor:  # e.g. fused experts next to per-expert copies, or mlp.gate and its renamed twin
                raise _error(
                    f"tensor {tensor.name!r} is stored twice in this checkpoint: read from {other.unit!r} and from "
                    f"{tensor.unit!r}",
                    "the checkpoint mixes two layouts of the same weights; keep one save (re-download or re-save it)",
                    tensor.name,
                )
        return SourceView(self.config, self.q, self.units, {t.name: t for t in ordered}, self.files)


def source_view(config: Mapping[str, Any], shards: Mapping[str, Mapping[str, TensorEntry]]) -> SourceView:
    """The logical view of a checkpoint from its config.json and shard headers (no data read).

    Args:
        config: the parsed config.json.
        shards: shard file -> its entries, in file order (:class:`~fp4convert.checkpoint.SourceCheckpoint`).

    Raises:
        CheckpointError: an unreadable declaration or an inconsistent source (see the module docstring).
        MappingError: fused experts the model's family has no per-expert names for.
    """
    builder = _Builder(config, shards)
    builder.check_stored_encodings()
    builder.fused()
    builder.rest()
    return builder.view()
