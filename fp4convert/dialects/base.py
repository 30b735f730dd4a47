"""What every on-disk dialect provides, and the pieces they share.

A dialect maps one planned tensor (its :class:`~fp4convert.inventory.TensorInfo` and contract
:class:`~fp4convert.contract.Decision`) to the tensors an engine expects on disk, and writes the
``quantization_config`` and side files that route the engine to its loader
(docs/dialects.md). It never reads or writes files itself.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fp4convert.contract import Contract, Decision
from fp4convert.dialects.config_view import ConfigView
from fp4convert.errors import ConversionError
from fp4convert.formats.mxfp8 import MXFP8Tensor
from fp4convert.formats.nvfp4 import NVFP4Tensor
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK, NVFP4_GLOBAL_MAX
from fp4convert.inventory import Role, TensorInfo
from fp4convert.inventory.dtypes import SAFETENSORS_DTYPES, safetensors_code, torch_dtype
from fp4convert.version import __version__

__all__ = [
    "FUSED_ENGINE_NAMES",
    "LM_HEAD",
    "Dialect",
    "OutputSpec",
    "Planned",
    "exclude_list",
    "module_of",
    "producer",
]

#: (name, safetensors dtype, shape) of one output tensor
OutputSpec = tuple[str, str, tuple[int, ...]]


PER_TOKEN_NOTE = (
    "per-token NVFP4 activations: input_scale is a 1.0 placeholder; the serving engine must quantize "
    "activations per token (SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION=1, fast-math off)"
)


def activation_mode_note(contract: Contract, items: Iterable[Planned]) -> dict[str, str]:
    """The config entry recording that per-token activation mode is required (empty otherwise)."""
    uses_nvfp4 = any(p.quantized and p.decision.format == "nvfp4" for p in items)
    if uses_nvfp4 and contract.formats.nvfp4.per_token_activations:
        return {"fp4convert_activation_mode": PER_TOKEN_NOTE}
    return {}


def producer() -> dict[str, str]:
    return {"name": "fp4convert", "version": __version__}


def module_of(tensor_name: str) -> str:
    """``model.layers.0.mlp.down_proj.weight`` -> ``model.layers.0.mlp.down_proj``."""
    return tensor_name.rsplit(".", 1)[0]


@dataclass(frozen=True)
class Planned:
    """One source tensor with its decision, as a dialect sees it."""

    info: TensorInfo
    decision: Decision

    @property
    def module(self) -> str:
        return module_of(self.info.name)

    @property
    def quantized(self) -> bool:
        return self.decision.format != "bf16" and self.info.gemm_weight


class Dialect(abc.ABC):
    """An on-disk checkpoint dialect (ModelOpt, SGLang MXFP8, compressed-tensors).

    A dialect owns its on-disk spelling, and every reader and writer asks it rather than spelling
    it again: the ``quant_method`` engines route on, the tensor names (:attr:`suffixes`) and
    dtypes (:attr:`output_dtypes`) of each format's outputs, the side files it writes, which
    global scale it stores and how that turns back into the decode scale (:meth:`decode_scale`).
    """

    name: ClassVar[str]
    #: ``quantization_config.quant_method`` in config.json: what engines pick their loader by
    quant_method: ClassVar[str]
    #: the formats this dialect can store
    formats: ClassVar[frozenset[str]]
    #: per format, role (``data``, ``scale``, ``global``, ``input``) -> the tensor's leaf name
    suffixes: ClassVar[Mapping[str, Mapping[str, str]]]
    #: per format, role -> the safetensors dtype the tensor is stored in
    output_dtypes: ClassVar[Mapping[str, Mapping[str, str]]] = {
        "nvfp4": {"data": "U8", "scale": "F8_E4M3", "global": "F32", "input": "F32"},
        "mxfp8": {"data": "F8_E4M3", "scale": "U8"},
    }
    #: JSON files written next to config.json (:meth:`side_files` gives their content)
    side_file_names: ClassVar[tuple[str, ...]] = ()
    #: shape of FP32 global scales: ``()`` (ModelOpt) or ``(1,)`` (compressed-tensors)
    global_shape: ClassVar[tuple[int, ...]] = ()
    #: True when the stored NVFP4 global scale is the encode scale ``S_enc`` (compressed-tensors),
    #: False when it is the decode scale the blocks were encoded with (ModelOpt's ``weight_scale_2``)
    stores_encode_scale: ClassVar[bool] = False
    #: leaf names of tensors that scale activations or the KV cache, as any engine spells them:
    #: never weights (``dequantize`` drops them)
    activation_scale_names: ClassVar[tuple[str, ...]] = ("input_scale", "input_global_scale", "k_scale", "v_scale")
    #: whether the engines' matcher for this dialect's exclude list expands ``*`` (fnmatch)
    exclude_wildcards: ClassVar[bool] = True

    def exclude_patterns(self, items: Iterable[Planned]) -> list[str]:
        """The exclude list in this dialect's spelling (:func:`exclude_list`)."""
        return exclude_list(items, wildcards=self.exclude_wildcards)

    def output_name(self, module: str, fmt: str, role: str) -> str | None:
        """The tensor name of ``role`` for a ``fmt`` module, None when the dialect has no such tensor.

        Example:
            >>> from fp4convert.dialects import get_dialect
            >>> get_dialect("compressed-tensors").output_name("m.up_proj", "nvfp4", "data")
            'm.up_proj.weight_packed'
        """
        leaf = self.suffixes.get(fmt, {}).get(role)
        return None if leaf is None else f"{module}.{leaf}"

    def tensor_problems(self, module: str, fmt: str, dtypes: Mapping[str, str]) -> list[tuple[str, str, str | None]]:
        """The tensors a ``fmt`` module lacks or stores with another dtype than this dialect's.

        Args:
            module: the module name.
            fmt: ``nvfp4`` or ``mxfp8``.
            dtypes: tensor name -> safetensors dtype of what is stored (other modules' names may be there).

        Returns:
            ``(role, tensor name, stored dtype or None when missing)`` per problem. The activation
            scale is never required here: whether one is needed depends on the activation mode.

        Example:
            >>> from fp4convert.dialects import get_dialect
            >>> get_dialect("modelopt").tensor_problems("m", "nvfp4", {"m.weight": "U8", "m.weight_scale": "U8"})
            [('scale', 'm.weight_scale', 'U8'), ('global', 'm.weight_scale_2', None)]
        """
        problems: list[tuple[str, str, str | None]] = []
        for role, dtype in self.output_dtypes[fmt].items():
            name = self.output_name(module, fmt, role)
            if name is None or role == "input":
                continue
            if name not in dtypes:
                problems.append((role, name, None))
            elif dtypes[name] != dtype:
                problems.append((role, name, dtypes[name]))
        return problems

    def decode_scale(self, stored: torch.Tensor) -> torch.Tensor:
        """The float32 decode scale (``e2m1 * weight_scale * it`` = the weight) from the stored global scale.

        Example:
            >>> from fp4convert.dialects import get_dialect
            >>> get_dialect("compressed-tensors").decode_scale(torch.tensor([4.0])).item()
            0.25
        """
        g = stored.float().reshape(())
        return torch.div(torch.ones((), dtype=torch.float32, device=g.device), g) if self.stores_encode_scale else g

    def refusals(self, contract: Contract, items: Iterable[Planned]) -> list[str]:
        """Why this dialect cannot express the contract on this model (empty: it can)."""
        problems: list[str] = []
        used = {p.decision.format for p in items if p.quantized}
        for fmt in sorted(used - self.formats):
            problems.append(
                f"dialect {self.name!r} cannot store {fmt} tensors (it stores {', '.join(sorted(self.formats))})"
            )
        if "nvfp4" in used and contract.formats.nvfp4.weight_scale_scope == "row":
            problems.append(
                f"dialect {self.name!r} stores one FP32 outer scale per weight tensor; the contract's "
                "weight_scale_scope 'row' (one per row) cannot be written"
            )
        return problems

    def layout(self, item: Planned) -> list[OutputSpec]:
        """The output tensors for one source tensor, in write order."""
        if not item.quantized:
            return [(item.info.name, _safetensors_code(item.info.dtype), item.info.shape)]
        fmt = item.decision.format
        if fmt not in self.formats or len(item.info.shape) != 2:
            return []  # unstorable here: validation refuses the plan before anything is written
        rows, cols = item.info.shape
        if fmt == "nvfp4":
            shapes = {"data": (rows, cols // 2), "scale": (rows, cols // NVFP4_BLOCK), "global": self.global_shape}
            if self.writes_input_scale(item):
                shapes["input"] = self.global_shape
        else:
            shapes = {"data": (rows, cols), "scale": (rows, cols // MXFP8_BLOCK)}
        dtypes = self.output_dtypes[fmt]
        return [(f"{item.module}.{self.suffixes[fmt][role]}", dtypes[role], shape) for role, shape in shapes.items()]

    def writes_input_scale(self, item: Planned) -> bool:
        return item.decision.format == "nvfp4"

    def encode(
        self, item: Planned, q: NVFP4Tensor | MXFP8Tensor | None, source: torch.Tensor, input_amax: float | None
    ) -> dict[str, torch.Tensor]:
        """The output tensors for one source tensor (``q`` is None when it stays high precision)."""
        if q is None:
            return {item.info.name: source}
        fmt = item.decision.format
        dtypes = {role: SAFETENSORS_DTYPES[code] for role, code in self.output_dtypes[fmt].items()}
        if isinstance(q, MXFP8Tensor):
            values = {"data": q.data, "scale": q.scale}
        else:
            assert q.data is not None and q.scale is not None  # rowwise copies are always requested
            values = {"data": q.data, "scale": q.scale, "global": self.global_scale(q).reshape(self.global_shape)}
            if self.writes_input_scale(item):
                values["input"] = self.input_scale(input_amax).reshape(self.global_shape)
        return {f"{item.module}.{self.suffixes[fmt][role]}": t.view(dtypes[role]) for role, t in values.items()}

    @abc.abstractmethod
    def global_scale(self, q: NVFP4Tensor) -> torch.Tensor:
        """The FP32 per-tensor scale this dialect stores for an NVFP4 weight."""

    @abc.abstractmethod
    def input_scale(self, input_amax: float | None) -> torch.Tensor:
        """The FP32 activation scale for a calibrated amax (None: per-token mode placeholder)."""

    @abc.abstractmethod
    def quantization_config(self, contract: Contract, items: Sequence[Planned]) -> dict[str, Any]:
        """The ``quantization_config`` block merged into config.json."""

    def side_files(self, contract: Contract, items: Sequence[Planned]) -> dict[str, Any]:
        """Extra JSON files (name -> content), e.g. ModelOpt's hf_quant_config.json."""
        return {}

    @abc.abstractmethod
    def read_config(self, quantization: Mapping[str, Any]) -> ConfigView:
        """Read a ``quantization_config`` of this dialect back, whoever wrote it (or, for a
        dialect with a side file, that file's content): see :class:`ConfigView`."""


def _safetensors_code(name: str) -> str:
    """The safetensors code a tensor of torch dtype ``name`` is stored with."""
    dtype = torch_dtype(name)
    code = None if dtype is None else safetensors_code(dtype)
    if code is None:
        raise ConversionError(f"dtype {name!r} has no safetensors spelling", hint="cast the tensor first")
    return code


def calibrated_decode_scale(input_amax: float | None) -> torch.Tensor:
    """ModelOpt's activation decode scale ``amax / (6 * 448)``; 1.0 is the per-token placeholder."""
    if input_amax is None:
        return torch.tensor(1.0, dtype=torch.float32)
    return torch.div(torch.tensor(input_amax, dtype=torch.float32), torch.tensor(NVFP4_GLOBAL_MAX))


#: Fused siblings engines load into one Linear, and the name the engine gives the fused layer: when
#: every listed HF module is excluded, the fused engine-side name is excluded too (Miles
#: ``_augment_ignore_list``; SGLang's ModelOpt matcher sees only the fused name).
FUSED_ENGINE_NAMES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("q_proj", "k_proj", "v_proj"), "qkv_proj"),
    (("gate_proj", "up_proj"), "gate_up_proj"),
)
#: The module a causal LM's output projection has in every engine. A tied-embedding model stores no
#: ``lm_head`` tensor, but engines still build the layer (vLLM a ``ParallelLMHead``, quantized unless
#: excluded), so a BF16 lm_head is excluded whether it is stored or tied.
LM_HEAD = "lm_head"


def exclude_list(items: Iterable[Planned], *, wildcards: bool = True) -> list[str]:
    """HF module names engines must load in high precision: every BF16 GEMM module.

    A layer whose routed experts stay BF16 is excluded as its ``...mlp.experts`` container
    (engines decide per FusedMoE). The tied lm_head of a model with an embedding and no lm_head
    tensor is excluded as :data:`LM_HEAD`. With ``wildcards`` a module excluded in every decoder
    layer is written once with ``*`` for the layer index (fnmatch, as the ModelOpt loaders of
    SGLang, vLLM and TensorRT-LLM match it); without, every module is named (matchers that take
    exact names only: compressed-tensors' ``ignore``, SGLang's ``modules_to_not_convert``).

    Example:
        >>> from fp4convert.contract import load_contract
        >>> from fp4convert.inventory import TensorInfo
        >>> contract = load_contract("nvfp4-experts-per-token")
        >>> tensors = [TensorInfo("model.embed_tokens.weight", (8, 16), role=Role.EMBEDDING),
        ...            TensorInfo("model.layers.0.self_attn.o_proj.weight", (16, 16), role=Role.ATTENTION,
        ...                       layer=0, gemm_weight=True)]
        >>> exclude_list([Planned(t, contract.decide(t, num_layers=1)) for t in tensors])
        ['lm_head', 'model.layers.*.self_attn.o_proj']
    """
    excluded: set[str] = set()
    per_layer: dict[str, set[int]] = {}
    layers: set[int] = set()
    roles: set[Role] = set()
    for item in items:
        info = item.info
        roles.add(info.role)
        if info.layer is not None:
            layers.add(info.layer)
        if not info.gemm_weight or item.quantized:
            continue
        module = item.module
        if info.role is Role.ROUTED_EXPERT and info.layer is not None:
            module = module.split(".experts.", 1)[0] + ".experts"
        excluded.add(module)
    if Role.EMBEDDING in roles and Role.LM_HEAD not in roles:
        excluded.add(LM_HEAD)  # tied to the embedding: no tensor, but the engine builds the layer
    for module in list(excluded):
        for parts, fused in FUSED_ENGINE_NAMES:
            head, _, last = module.rpartition(".")
            if last == parts[0] and all(f"{head}.{p}" in excluded for p in parts):
                excluded.add(f"{head}.{fused}")
    if not wildcards:
        return sorted(excluded)
    # Collapse "model.layers.N.<rest>" when <rest> is excluded for every layer index.
    result: set[str] = set()
    for module in excluded:
        pieces = module.split(".")
        if len(pieces) > 3 and pieces[1] == "layers" and pieces[2].isdigit():
            rest = ".".join(pieces[3:])
            per_layer.setdefault(f"{pieces[0]}.layers.*.{rest}", set()).add(int(pieces[2]))
        else:
            result.add(module)
    for pattern, seen in per_layer.items():
        if layers and seen == layers:
            result.add(pattern)
        else:
            result.update(pattern.replace("*", str(i), 1) for i in seen)
    return sorted(result)
