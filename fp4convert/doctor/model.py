"""The model behind a scanned checkpoint: each module's logical weight, described, and the layers engines build.

Stored tensors are turned back into the logical tensors the model families describe: a quantized
module's data becomes ``module.weight`` with its logical shape (``[out, in]``: NVFP4 stores
``[out, in/2]``), scale tensors are dropped, every other tensor is kept as it is. The family of
``config.json`` then describes them (role, layer, MTP, expert, fused group), exactly as for a
conversion source. A checkpoint whose family fp4convert does not know, or whose tensors it
cannot all place, is described from the names (a note says so).

The engine-side view: engines build one layer per Linear, one fused layer per q/k/v or gate/up
group (``qkv_proj``, ``gate_up_proj``; MLA's ``q_a_proj`` + ``kv_a_proj_with_mqa``), one FusedMoE
per layer's routed experts (``...mlp.experts``) and an ``lm_head`` even where the model ties it to
the embedding and stores no tensor. Each :class:`Layer` lists the HF modules loaded into it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

from fp4convert.dialects import FUSED_ENGINE_NAMES, LM_HEAD
from fp4convert.doctor.scan import DATA_LEAVES, SCALE_LEAVES, Module, Scan
from fp4convert.errors import MappingError
from fp4convert.families import describe_name, inventory_from_config, inventory_from_tensors
from fp4convert.inventory import FusedKind, ModelInventory, Role, TensorInfo
from fp4convert.inventory.dtypes import torch_dtype, torch_name

__all__ = ["Layer", "Model", "describe_model"]

LayerKind = Literal["linear", "fused", "moe", "lm_head"]
_FUSED_NAME = {FusedKind.QKV: FUSED_ENGINE_NAMES[0][1], FusedKind.GATE_UP: FUSED_ENGINE_NAMES[1][1]}
# SGLang's name for MLA's fused down projections (vLLM's is fused_qkv_a_proj; both load the two pieces).
_MLA_FUSED = "fused_qkv_a_proj_with_mqa"
_LAYER = re.compile(r"\.layers\.(\d+)\.")
# Names fused siblings carry when no family describes them: (pieces, kind).
_SIBLING_NAMES = (
    (("q_proj", "k_proj", "v_proj"), FusedKind.QKV),
    (("gate_proj", "up_proj"), FusedKind.GATE_UP),
    (("w1", "w3"), FusedKind.GATE_UP),
    (("q_a_proj", "kv_a_proj_with_mqa"), FusedKind.MLA_QA_KVA),
)


@dataclass(frozen=True)
class Layer:
    """One layer an engine instantiates: its prefix (the name its quantization is decided by),
    the HF modules loaded into it, and its kind."""

    name: str
    pieces: tuple[str, ...]
    kind: LayerKind


@dataclass
class Model:
    """The logical model of a scan (see the module docstring).

    Attributes:
        modules: stored modules by name.
        infos: logical tensor name -> its description (logical shape and dtype).
        family: the family key, or None when the names were described without one.
        num_layers: decoder layers.
        expected: what config.json alone implies (None without a known family).
        notes: what was guessed.
    """

    modules: dict[str, Module]
    infos: dict[str, TensorInfo]
    family: str | None
    num_layers: int
    num_mtp_layers: int = 0
    expected: ModelInventory | None = None
    notes: list[str] = field(default_factory=list)

    def weight(self, module: str) -> TensorInfo | None:
        """The description of a module's (logical) weight."""
        return self.infos.get(f"{module}.weight")

    def gemm_modules(self) -> list[str]:
        """Modules whose weight a GEMM consumes (Linear weights, routers, lm_head), in name order."""
        return sorted(m for m in self.modules if (w := self.weight(m)) is not None and w.gemm_weight)

    def inventory(self) -> ModelInventory:
        return ModelInventory(
            self.family or "unknown", self.num_layers, tuple(self.infos.values()), self.num_mtp_layers
        )

    def fused_groups(self) -> dict[str, list[str]]:
        """Fused group -> its member modules (two or more, GEMM weights only)."""
        groups: dict[str, list[str]] = {}
        for module in self.gemm_modules():
            info = self.weight(module)
            if info is not None and info.fused_group:
                groups.setdefault(info.fused_group, []).append(module)
        return {g: members for g, members in groups.items() if len(members) > 1}

    def layers(self) -> list[Layer]:
        """The layers engines build from this checkpoint (see the module docstring)."""
        out: list[Layer] = []
        experts: dict[str, list[str]] = {}
        grouped: set[str] = set()
        for members in self.fused_groups().values():
            info = self.weight(members[0])
            assert info is not None
            if info.role is Role.ROUTED_EXPERT or info.fused_kind is None:
                continue
            head = members[0].rpartition(".")[0]
            fused = _FUSED_NAME.get(info.fused_kind, _MLA_FUSED)
            out.append(Layer(f"{head}.{fused}", tuple(members), "fused"))
            grouped.update(members)
        for module in self.gemm_modules():
            info = self.weight(module)
            assert info is not None
            if info.role is Role.ROUTED_EXPERT and ".experts." in module:
                experts.setdefault(module.split(".experts.", 1)[0] + ".experts", []).append(module)
            elif module not in grouped:
                out.append(Layer(module, (module,), "lm_head" if info.role is Role.LM_HEAD else "linear"))
        out += [Layer(container, tuple(members), "moe") for container, members in experts.items()]
        roles = {info.role for info in self.infos.values()}
        if Role.EMBEDDING in roles and Role.LM_HEAD not in roles:
            out.append(Layer(LM_HEAD, (), "lm_head"))  # tied: the engine builds it from the embedding
        return sorted(out, key=lambda layer: layer.name)


def _logical(module: Module, dtype: str) -> list[tuple[str, tuple[int, ...], str]]:
    """The logical tensors of one stored module."""
    out = []
    partial = module.partial()
    fmt = partial[1] if partial is not None else module.format
    for leaf, entry in module.leaves.items():
        if leaf in SCALE_LEAVES:
            continue  # weight, activation and KV-cache scales are not the model's tensors
        if leaf in DATA_LEAVES and fmt in ("nvfp4", "mxfp8"):
            shape = entry.shape
            if fmt == "nvfp4" and len(shape) == 2:
                shape = (shape[0], shape[1] * 2)
            out.append((f"{module.name}.weight", shape, dtype))
            continue
        torch_type = torch_dtype(entry.dtype)
        out.append((f"{module.name}.{leaf}", entry.shape, torch_name(torch_type) if torch_type else entry.dtype))
    return out


def _high_precision_dtype(modules: Iterable[Module]) -> str:
    """The dtype quantized weights stand for: the checkpoint's high-precision weights' (bfloat16 if none)."""
    for module in modules:
        weight = module.leaves.get("weight")
        dtype = torch_dtype(weight.dtype) if weight is not None and module.format == "bf16" else None
        if dtype is not None:
            return torch_name(dtype)
    return "bfloat16"


def _guess(name: str, shape: tuple[int, ...], dtype: str) -> TensorInfo:
    """A description from the name alone (no family knows it)."""
    layer = _LAYER.search(name)
    leaf = name.rsplit(".", 1)[-1]
    role = Role.OTHER
    if "embed" in name:
        role = Role.EMBEDDING
    elif name.startswith("lm_head"):
        role = Role.LM_HEAD
    elif "norm" in name:
        role = Role.NORM
    elif ".experts." in name:
        role = Role.ROUTED_EXPERT
    elif name.endswith((".mlp.gate.weight", ".router.weight")):
        role = Role.ROUTER
    group, kind = None, None
    module = name.rsplit(".", 1)[0]
    head, _, last = module.rpartition(".")
    for pieces, fused_kind in _SIBLING_NAMES:
        if last in pieces:
            group, kind = f"{head}.{'_'.join(pieces)}", fused_kind
    gemm = len(shape) == 2 and leaf == "weight" and role not in (Role.EMBEDDING, Role.NORM)
    return TensorInfo(
        name,
        shape,
        dtype,
        role=role,
        layer=int(layer.group(1)) if layer else None,
        fused_group=group if gemm else None,
        fused_kind=kind if gemm else None,
        gemm_weight=gemm,
    )


def describe_model(scan: Scan) -> Model:
    """Describe a scan's tensors with the config's family (see the module docstring)."""
    modules = scan.modules
    dtype = _high_precision_dtype(modules.values())
    tensors = [t for module in modules.values() for t in _logical(module, dtype)]
    notes: list[str] = []
    expected: ModelInventory | None = None
    try:
        inventory = inventory_from_tensors(scan.config, tensors)
        infos = {t.name: t for t in inventory}
        family, num_layers, num_mtp = inventory.family, inventory.num_layers, inventory.num_mtp_layers
    except MappingError as exc:
        infos = {}
        for name, shape, tensor_dtype in tensors:
            try:
                infos[name] = replace(describe_name(name, scan.config), shape=shape, dtype=tensor_dtype)
            except MappingError:
                infos[name] = _guess(name, shape, tensor_dtype)
        family = None
        layers = [i.layer for i in infos.values() if i.layer is not None]
        num_layers, num_mtp = int(scan.config.get("num_hidden_layers") or (max(layers) + 1 if layers else 0)), 0
        notes.append(f"roles and fused groups were read from the tensor names: {exc.message}")
    if family is not None:
        try:
            expected = inventory_from_config(scan.config)
        except MappingError as exc:
            notes.append(f"config.json alone does not describe the model, expected tensors not checked: {exc.message}")
    return Model(modules, infos, family, num_layers, num_mtp, expected, notes)
