"""The sections of a contract file: format recipes, rules, BF16 exceptions and fused groups.

Each section is a strict, frozen pydantic model (unknown fields are errors, numbers and booleans
are never coerced from strings); :class:`~fp4convert.contract.model.Contract` puts them together.
The value types shared by every section (:data:`Format`, :data:`Namespace`, the quantizer
profiles) are spelled here once.

Example:
    >>> BF16Exceptions(last_layers={"fraction": 0.15, "rounding": "ceil"}).layer_counts(48)
    (0, 8)
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from fp4convert.contract.patterns import MatchKind, check_pattern
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK

__all__ = [
    "FORMATS",
    "UNION_TAGS",
    "BF16Exceptions",
    "BackwardMode",
    "Format",
    "FormatRecipes",
    "FourOverSix",
    "FusedGroups",
    "Identifier",
    "KVCachePrecision",
    "LayerCount",
    "LayerFraction",
    "MXFP8Recipe",
    "NVFP4Recipe",
    "NameExceptions",
    "Namespace",
    "QuantizerProfile",
    "Rule",
    "StrictModel",
    "exact_type",
    "layer_count",
]

Format = Literal["nvfp4", "mxfp8", "bf16"]
FORMATS: tuple[Format, ...] = ("nvfp4", "mxfp8", "bf16")
Namespace = Literal["hf", "megatron"]
# Same names as fp4convert.formats.profiles.Profile (a test guards the two lists); repeated here so
# that loading a contract does not import torch.
QuantizerProfile = Literal["te", "te-2.13", "modelopt", "mxfp4-cast"]
#: TransformerEngine's 4over6 candidate error (``nvfp4_4over6_err_mode``), lower case.
FourOverSix = Literal["mae", "mse"]
BackwardMode = Literal["high_precision", "dequantized"]
KVCachePrecision = Literal["bf16", "fp8_e4m3"]


def exact_type(expected: type, type_name: str) -> BeforeValidator:
    """Reject values whose Python type is not ``expected`` before a Literal compares them.

    pydantic's Literal check is an equality test, so ``Literal[1]`` accepts ``True`` and ``1.0``;
    a contract must not.
    """

    def check(value: Any) -> Any:
        if type(value) is not expected:
            raise PydanticCustomError(
                "exact_type",
                "expected {type_name}, found {found}",
                {"type_name": type_name, "found": repr(value)},
            )
        return value

    return BeforeValidator(check)


# A name: letters, digits and "._-", starting with a letter, so it is also a YAML key and a
# TransformerEngine matcher name without quoting.
Identifier = Annotated[StrictStr, Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$", max_length=120)]
# A substring of a tensor name; never empty, never whitespace (tensor names contain none).
NameSubstring = Annotated[StrictStr, Field(min_length=1, pattern=r"^\S+$")]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class NVFP4Recipe(StrictModel):
    """How NVFP4 tensors are quantized (the arithmetic: ``docs/formats.md``; why: ``docs/recipe.md``).

    Attributes:
        tile: weight block shape. ``1x16`` (16 consecutive values of a row share an E4M3 scale)
            or ``16x16`` (2-D tiles, TE's default for weights). Activations always use 1x16.
        weight_scale_scope: what one FP32 outer scale covers: the whole ``tensor``, one MoE
            ``expert`` (w1/w3 of one expert still share one), or each ``row``.
        per_token_activations: activations get one outer scale per token, computed online, so a
            token's bytes never depend on its neighbours in the batch.
        four_over_six: TransformerEngine's 4over6 (docs/formats.md, "4over6"): each block keeps the
            map-to-4 or map-to-6 scale, whichever has the lower ``mae`` or ``mse``; ``null`` (the
            default) is plain NVFP4.
        four_over_six_e4m3_max: the E4M3 bound of the global scale under 4over6, ``256`` or
            ``448``; required with ``four_over_six``, because the engines' defaults disagree
            (TransformerEngine's recipe uses 256, FlashInfer 448).
    """

    tile: Literal["1x16", "16x16"] = "1x16"
    weight_scale_scope: Literal["tensor", "expert", "row"] = "tensor"
    per_token_activations: StrictBool = False
    four_over_six: FourOverSix | None = None
    four_over_six_e4m3_max: Annotated[Literal[256, 448], exact_type(int, "256 or 448")] | None = None

    @model_validator(mode="after")
    def _four_over_six_bound(self) -> NVFP4Recipe:
        if self.four_over_six is not None and self.four_over_six_e4m3_max is None:
            raise PydanticCustomError(
                "four_over_six_bound",
                "four_over_six needs four_over_six_e4m3_max: 256 (TransformerEngine's recipe default) or "
                "448 (FlashInfer's default)",
            )
        if self.four_over_six is None and self.four_over_six_e4m3_max is not None:
            raise PydanticCustomError(
                "four_over_six_bound", "four_over_six_e4m3_max is set but four_over_six is not: set both or neither"
            )
        return self

    @property
    def block_shape(self) -> tuple[int, int]:
        """(rows, columns) of one weight scale block, e.g. ``(1, 16)``."""
        return (1, NVFP4_BLOCK) if self.tile == "1x16" else (NVFP4_BLOCK, NVFP4_BLOCK)


class MXFP8Recipe(StrictModel):
    """How MXFP8 tensors are quantized: E4M3 values, one E8M0 scale per 32 values of a row.

    Attributes:
        tile: the scale block; ``1x32`` is the only layout the engines load (the column-wise
            32x1 copy is made by the learner from full precision, never from the checkpoint).
    """

    tile: Literal["1x32"] = "1x32"

    @property
    def block_shape(self) -> tuple[int, int]:
        """(rows, columns) of one scale block: ``(1, 32)``."""
        return (1, MXFP8_BLOCK)


class FormatRecipes(StrictModel):
    """The recipe each low-precision format uses in this contract (``bf16`` has none)."""

    nvfp4: NVFP4Recipe = NVFP4Recipe()
    mxfp8: MXFP8Recipe = MXFP8Recipe()


class Rule(StrictModel):
    """One matcher: tensors whose name matches ``pattern`` get ``format``.

    Attributes:
        name: optional label, shown by ``explain`` and used as the TransformerEngine matcher key.
        kind: ``glob`` | ``regex`` | ``exact`` (see :mod:`fp4convert.contract.patterns`).
        namespace: ``hf`` matches the checkpoint name (``model.layers.3.mlp.experts.7.up_proj.weight``);
            ``megatron`` matches the Megatron *module path*, the parameter name without its last
            component (``decoder.layers.3.mlp.experts.linear_fc1`` for ``...linear_fc1.weight7``),
            which is exactly what TransformerEngine's precision matchers see.
        pattern: the pattern; checked when the contract is loaded.
        format: the format matching tensors get.
    """

    name: Identifier | None = None
    kind: MatchKind
    namespace: Namespace
    pattern: StrictStr
    format: Format

    @field_validator("pattern")
    @classmethod
    def _pattern_is_valid(cls, pattern: str, info: ValidationInfo) -> str:
        kind = info.data.get("kind")
        if kind is None:  # kind itself was invalid; that error is reported on its own
            return pattern
        problem = check_pattern(kind, pattern)
        if problem is not None:
            raise PydanticCustomError("invalid_pattern", "{problem}", {"problem": problem})
        return pattern

    @property
    def label(self) -> str:
        """How ``explain`` describes the matcher, e.g. ``hf glob '*.mlp.experts.*'``."""
        named = f"'{self.name}': " if self.name else ""
        return f"{named}{self.namespace} {self.kind} '{self.pattern}'"


class LayerFraction(StrictModel):
    """A share of the decoder layers, turned into a count with a rounding rule written down.

    ``count = ceil(fraction * num_layers)`` or ``floor(...)``, computed on the decimal value as
    written (``0.15`` is exactly 15/100, so 20 layers give 3, not 4 from binary rounding error).

    Example:
        >>> LayerFraction(fraction=0.15, rounding="ceil").count(48)
        8
        >>> LayerFraction(fraction=0.15, rounding="floor").count(20)
        3
    """

    fraction: Annotated[float, Field(gt=0, le=1, strict=True)]
    rounding: Literal["ceil", "floor"]

    def count(self, num_layers: int) -> int:
        """The number of layers this fraction of ``num_layers`` stands for."""
        exact = Fraction(repr(self.fraction)) * num_layers
        return math.ceil(exact) if self.rounding == "ceil" else math.floor(exact)

    def describe(self) -> str:
        """How reports show it, e.g. ``last 15% (ceil)`` reads ``15% (ceil)``."""
        return f"{self.fraction * 100:g}% ({self.rounding})"


def _layer_count_form(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return "layer-count"
    if isinstance(value, (dict, LayerFraction)):
        return "layer-fraction"
    return None


#: Either a number of layers or a :class:`LayerFraction`. The union tags ("layer-count",
#: "layer-fraction") appear in pydantic error locations; the loader drops them.
LayerCount = Annotated[
    Annotated[Annotated[StrictInt, Field(ge=0)], Tag("layer-count")] | Annotated[LayerFraction, Tag("layer-fraction")],
    Discriminator(
        _layer_count_form,
        custom_error_type="layer_count",
        custom_error_message="expected a number of layers or {fraction: ..., rounding: ceil|floor}",
    ),
]
UNION_TAGS = frozenset({"layer-count", "layer-fraction"})


def layer_count(value: int | LayerFraction, num_layers: int) -> int:
    """Resolve a :data:`LayerCount` against the model's decoder layer count.

    Example:
        >>> layer_count(2, 61), layer_count(LayerFraction(fraction=0.15, rounding="ceil"), 61)
        (2, 10)
    """
    return value if isinstance(value, int) else value.count(num_layers)


class NameExceptions(StrictModel):
    """Name substrings kept BF16, in each naming scheme.

    Plain substrings, exactly the semantics of Miles' ``--extra-high-precision-layers-hf`` /
    ``--extra-high-precision-layers-megatron`` flags, so the emitted flags mean what the contract
    means. Write them with dots on both sides where possible (``.kv_b_proj.``) so they cannot hit a
    longer name by accident. HF substrings are searched in the checkpoint name, Megatron ones in
    the full Megatron parameter name.
    """

    hf: tuple[NameSubstring, ...] = ()
    megatron: tuple[NameSubstring, ...] = ()


class BF16Exceptions(StrictModel):
    """Tensors kept BF16 whatever the rules say (every field here beats every rule).

    Attributes:
        first_layers: the first N decoder layers, or a fraction of them.
        last_layers: the last N decoder layers, or a fraction (e.g. ``{fraction: 0.15, rounding: ceil}``).
            MTP layers are not decoder layers and never count here.
        mtp_layers: every tensor of the multi-token-prediction layers.
        names: name substrings, per namespace (MLA ``kv_b_proj`` belongs here).
        shared_experts: always-active shared experts (their error hits every token).
        routers: MoE router / gate weights.
        lm_head: the output projection.
        embeddings: always true: an embedding is a lookup, not a GEMM, and is never quantized.
        norms: always true: norm weights are never quantized.
    """

    first_layers: LayerCount = 0
    last_layers: LayerCount = 0
    mtp_layers: StrictBool = False
    names: NameExceptions = NameExceptions()
    shared_experts: StrictBool = True
    routers: StrictBool = True
    lm_head: StrictBool = True
    embeddings: Annotated[Literal[True], exact_type(bool, "true")] = True
    norms: Annotated[Literal[True], exact_type(bool, "true")] = True

    def layer_counts(self, num_layers: int) -> tuple[int, int]:
        """(first, last) BF16 layer counts for a model with ``num_layers`` decoder layers.

        Example:
            >>> BF16Exceptions(last_layers={"fraction": 0.15, "rounding": "ceil"}).layer_counts(61)
            (0, 10)
        """
        return layer_count(self.first_layers, num_layers), layer_count(self.last_layers, num_layers)

    @property
    def counts_depend_on_model(self) -> bool:
        """True when a layer count is a fraction, so it needs the model's layer count."""
        return isinstance(self.first_layers, LayerFraction) or isinstance(self.last_layers, LayerFraction)


class FusedGroups(StrictModel):
    """Sibling tensors the engines fuse into one GEMM share one FP32 outer scale (on by default).

    Field names are the :class:`fp4convert.inventory.FusedKind` values. Siblings must always get
    the same format; these switches only say whether they also share the outer scale.
    """

    gate_up: StrictBool = True
    qkv: StrictBool = True
    mla_qa_kva: StrictBool = True

    def shares_scale(self, kind: str) -> bool:
        """Whether siblings of fused kind ``kind`` (a ``FusedKind`` value) share the outer scale."""
        return bool(getattr(self, kind))
