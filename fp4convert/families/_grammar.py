"""The name grammar shared by every family table: layer scopes, the ``{expert}`` wildcard, expert layouts.

Family tables (``llama.py``, ``deepseek_v3.py`` ...) never spell a layer prefix. Each entry is written
*relative to its scope*, and this module is the one place that knows how a scope is spelled on either
side:

==============  ==========================================  =================================
scope           Megatron-Core prefix                        HF prefix
==============  ==========================================  =================================
``GLOBAL``      (none: absolute names)                      (none: absolute names)
``DECODER``     ``decoder.layers.{n}.``                     ``model.layers.{n}.``
``MTP_LAYER``   ``mtp.layers.{k}.mtp_model_layer.``         ``model.layers.{L + k}.``
``MTP_GLUE``    ``mtp.layers.{k}.``                         ``model.layers.{L + k}.``
==============  ==========================================  =================================

``L`` is ``num_hidden_layers``: DeepSeek and GLM-4.5 number their multi-token-prediction (MTP) layers
after the decoder layers on the HF side, Megatron-Core counts them from 0 under ``mtp.layers``
(checkpoint-formats.md section 5.3). Qwen3-Next spells its MTP module apart (:class:`HfMtp`):
the inner layer is ``mtp.layers.{k}.`` and the glue (``fc``, ``norm``, ``pre_fc_norm_*``) sits
directly under ``mtp.`` (so it has one MTP layer only). Older Megatron-Core (and Miles) spell the MTP inner layer
``transformer_layer`` instead of ``mtp_model_layer`` (:class:`MtpInner`); both are read, the current
one is written unless the caller asks for the old one.

Inside a scope the only wildcard is ``{expert}``: a routed-expert id, matching a decimal integer
without leading zeros (so that a name formatted from a match is the name that was matched). Both
sides of an entry must use the same wildcards; :func:`compile_pattern` and :func:`check_same_wildcards`
enforce it when a table is built.

Routed experts have two Megatron-Core spellings (section 5.2); tables write the TEGroupedMLP one and
the SequentialMLP one is derived here:

- ``GROUPED`` (TEGroupedMLP): ``mlp.experts.linear_fc1.weight{expert}``
- ``SEQUENTIAL`` (SequentialMLP): ``mlp.experts.local_experts.{expert}.linear_fc1.weight``

Megatron names may carry DDP / Float16Module wrappers (``module.module.``, as Miles writes them);
:func:`strip_module_prefix` removes them before matching.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from fp4convert.errors import MappingError

__all__ = [
    "EXPERT",
    "ExpertLayout",
    "HfMtp",
    "MtpInner",
    "Pattern",
    "Scope",
    "check_same_wildcards",
    "compile_pattern",
    "hf_layer_prefix",
    "hf_scope_prefix",
    "megatron_layer_prefix",
    "sequential_expert_spelling",
    "split_hf_layer_name",
    "split_hf_mtp_module_name",
    "split_megatron_layer_name",
    "strip_module_prefix",
]

#: The only wildcard a layer-relative pattern may contain.
EXPERT = "{expert}"
_INDEX = r"(?:0|[1-9][0-9]*)"
_WILDCARD = re.compile(r"\{([a-z_]+)\}")
_KNOWN_WILDCARDS = frozenset({"expert"})


class Scope(str, enum.Enum):
    """Where an entry's names live (see the module docstring for the prefixes)."""

    GLOBAL = "global"
    DECODER = "decoder"
    MTP_LAYER = "mtp_layer"
    MTP_GLUE = "mtp_glue"


class ExpertLayout(str, enum.Enum):
    """How Megatron-Core stores routed-expert weights.

    ``GROUPED`` and ``SEQUENTIAL`` name one tensor per expert (the spellings above). The two stacked
    layouts hold every local expert of a layer in one tensor (:mod:`fp4convert.families._spelling`):
    ``SINGLE_GROUPED`` is TEGroupedMLP with ``moe_single_grouped_weight`` (Megatron-Core >= 0.18,
    ``experts.linear_fc1.weight`` ``[E, 2I, H]``), ``LEGACY_GROUPED`` the legacy GroupedMLP of
    Megatron-Core <= 0.16 (``experts.weight1`` ``[H, E * 2I]``, ``experts.weight2`` ``[E * I, H]``).
    """

    GROUPED = "grouped"
    SEQUENTIAL = "sequential"
    SINGLE_GROUPED = "single_grouped"
    LEGACY_GROUPED = "legacy_grouped"

    @property
    def per_expert(self) -> ExpertLayout:
        """The one-tensor-per-expert spelling names are built in (stacking comes after)."""
        return ExpertLayout.SEQUENTIAL if self is ExpertLayout.SEQUENTIAL else ExpertLayout.GROUPED


class HfMtp(str, enum.Enum):
    """How a family's HF checkpoint names its MTP layers (see the module docstring)."""

    DECODER_LAYERS = "decoder_layers"  # model.layers.{L + k}. for inner layer and glue (DeepSeek, GLM)
    MTP_MODULE = "mtp_module"  # mtp.layers.{k}. inner layer, mtp. glue (Qwen3-Next)


class MtpInner(str, enum.Enum):
    """The name of an MTP layer's inner transformer layer: Megatron-Core <= 0.16 vs >= 0.17."""

    MTP_MODEL_LAYER = "mtp_model_layer"
    TRANSFORMER_LAYER = "transformer_layer"


@dataclass(frozen=True)
class Pattern:
    """A compiled name pattern: literal text plus optional ``{expert}`` wildcards.

    Attributes:
        text: the pattern as written in a family table.
        wildcards: the wildcard names it contains, in order (``()`` or ``("expert",)``).
    """

    text: str
    wildcards: tuple[str, ...]
    regex: re.Pattern[str]

    def match(self, name: str) -> dict[str, int] | None:
        """Return the wildcard values if ``name`` matches the whole pattern, else None."""
        found = self.regex.fullmatch(name)
        if found is None:
            return None
        return {key: int(value) for key, value in found.groupdict().items()}

    def format(self, **values: int) -> str:
        """Fill the wildcards, e.g. ``format(expert=7)``."""
        return self.text.format(**values) if self.wildcards else self.text


def compile_pattern(text: str) -> Pattern:
    """Compile a family-table pattern, refusing unknown wildcards.

    Args:
        text: literal name text with optional ``{expert}`` wildcards.

    Returns:
        The compiled :class:`Pattern`.

    Raises:
        MappingError: the text uses a wildcard other than ``{expert}``, or uses one twice.

    Example:
        >>> compile_pattern("mlp.experts.{expert}.down_proj.weight").match("mlp.experts.7.down_proj.weight")
        {'expert': 7}
    """
    wildcards = tuple(_WILDCARD.findall(text))
    unknown = sorted(set(wildcards) - _KNOWN_WILDCARDS)
    if unknown or len(set(wildcards)) != len(wildcards):
        raise MappingError(
            f"pattern {text!r} uses wildcards {list(wildcards)}; only one {EXPERT} is allowed",
            hint="layer indices come from the scope prefix, not from the pattern",
            pattern=text,
        )
    regex_text = _to_regex(text)
    return Pattern(text=text, wildcards=wildcards, regex=re.compile(regex_text))


def _to_regex(text: str) -> str:
    parts: list[str] = []
    position = 0
    for found in _WILDCARD.finditer(text):
        parts.append(re.escape(text[position : found.start()]))
        parts.append(f"(?P<{found.group(1)}>{_INDEX})")
        position = found.end()
    parts.append(re.escape(text[position:]))
    return "".join(parts)


def check_same_wildcards(megatron: Pattern, hf: Pattern) -> None:
    """Refuse an entry whose two sides do not carry the same wildcards (so one side cannot be filled).

    Raises:
        MappingError: naming both patterns.
    """
    if sorted(megatron.wildcards) != sorted(hf.wildcards):
        raise MappingError(
            f"Megatron pattern {megatron.text!r} has wildcards {list(megatron.wildcards)} but HF pattern "
            f"{hf.text!r} has {list(hf.wildcards)}",
            hint="both sides of a mapping must capture the same indices",
            pattern=megatron.text,
        )


_GROUPED_EXPERT = re.compile(r"^(?P<head>(?:.+\.)?experts)\.(?P<linear>[a-z0-9_]+)\.(?P<param>[a-z_]+)\{expert\}$")


def sequential_expert_spelling(grouped: str) -> str:
    """The SequentialMLP spelling of a TEGroupedMLP expert pattern.

    Args:
        grouped: e.g. ``mlp.experts.linear_fc1.weight{expert}``.

    Returns:
        e.g. ``mlp.experts.local_experts.{expert}.linear_fc1.weight``.

    Raises:
        MappingError: ``grouped`` is not in TEGroupedMLP form.

    Example:
        >>> sequential_expert_spelling("mlp.experts.linear_fc2.weight{expert}")
        'mlp.experts.local_experts.{expert}.linear_fc2.weight'
    """
    found = _GROUPED_EXPERT.match(grouped)
    if found is None:
        raise MappingError(
            f"Megatron expert pattern {grouped!r} is not in TEGroupedMLP form "
            "`<...>.experts.<linear>.weight{expert}`",
            hint="write expert entries in the grouped spelling; the SequentialMLP one is derived",
            pattern=grouped,
        )
    return f"{found['head']}.local_experts.{{expert}}.{found['linear']}.{found['param']}"


_MODULE_PREFIX = re.compile(r"^(?:module\.)+")


def strip_module_prefix(name: str) -> str:
    """Drop DDP / Float16Module wrappers: ``module.module.decoder...`` -> ``decoder...``."""
    return _MODULE_PREFIX.sub("", name)


_HF_LAYER = re.compile(rf"^model\.layers\.(?P<index>{_INDEX})\.(?P<rest>.+)$")
_MEGATRON_DECODER = re.compile(rf"^decoder\.layers\.(?P<index>{_INDEX})\.(?P<rest>.+)$")
_MEGATRON_MTP = re.compile(
    rf"^mtp\.layers\.(?P<index>{_INDEX})\.(?:(?P<inner>mtp_model_layer|transformer_layer)\.)?(?P<rest>.+)$"
)


def split_hf_layer_name(name: str) -> tuple[int, str] | None:
    """``model.layers.3.mlp.gate.weight`` -> ``(3, "mlp.gate.weight")``; None for a non-layer name."""
    found = _HF_LAYER.match(name)
    return None if found is None else (int(found["index"]), found["rest"])


def split_megatron_layer_name(name: str) -> tuple[Scope, int, str] | None:
    """Split a (prefix-stripped) Megatron name into its scope, scope-local index and relative rest.

    Example:
        >>> split_megatron_layer_name("mtp.layers.0.mtp_model_layer.mlp.router.weight")
        (<Scope.MTP_LAYER: 'mtp_layer'>, 0, 'mlp.router.weight')
    """
    found = _MEGATRON_DECODER.match(name)
    if found is not None:
        return Scope.DECODER, int(found["index"]), found["rest"]
    found = _MEGATRON_MTP.match(name)
    if found is not None:
        scope = Scope.MTP_LAYER if found["inner"] else Scope.MTP_GLUE
        return scope, int(found["index"]), found["rest"]
    return None


def hf_layer_prefix(hf_layer: int) -> str:
    """The HF prefix of a decoder or MTP layer, in HF numbering."""
    return f"model.layers.{hf_layer}."


_HF_MTP_LAYER = re.compile(rf"^mtp\.layers\.(?P<index>{_INDEX})\.(?P<rest>.+)$")


def split_hf_mtp_module_name(name: str) -> tuple[Scope, int, str] | None:
    """Split a Qwen3-Next-style MTP name (:attr:`HfMtp.MTP_MODULE`); None for any other name.

    Example:
        >>> split_hf_mtp_module_name("mtp.layers.0.mlp.gate.weight"), split_hf_mtp_module_name("mtp.fc.weight")
        ((<Scope.MTP_LAYER: 'mtp_layer'>, 0, 'mlp.gate.weight'), (<Scope.MTP_GLUE: 'mtp_glue'>, 0, 'fc.weight'))
    """
    found = _HF_MTP_LAYER.match(name)
    if found is not None:
        return Scope.MTP_LAYER, int(found["index"]), found["rest"]
    if name.startswith("mtp.") and len(name) > len("mtp."):
        return Scope.MTP_GLUE, 0, name[len("mtp.") :]
    return None


def hf_scope_prefix(scope: Scope, index: int | None, hf_layer: int | None, hf_mtp: HfMtp) -> str:
    """The HF prefix of a name in ``scope`` (``index`` is scope-local, ``hf_layer`` in HF numbering).

    Raises:
        MappingError: a decoder-numbered MTP name whose HF layer is unknown (no config).
    """
    if scope is Scope.GLOBAL:
        return ""
    if scope is Scope.DECODER:
        return hf_layer_prefix(hf_layer if hf_layer is not None else index)  # type: ignore[arg-type]
    if hf_mtp is HfMtp.MTP_MODULE:
        return "mtp." if scope is Scope.MTP_GLUE else f"mtp.layers.{index}."
    if hf_layer is None:
        raise MappingError(
            "an MTP layer's HF name depends on num_hidden_layers",
            hint="pass the model's config.json (HF numbers MTP layers after num_hidden_layers)",
        )
    return hf_layer_prefix(hf_layer)


def megatron_layer_prefix(scope: Scope, index: int, mtp_inner: MtpInner = MtpInner.MTP_MODEL_LAYER) -> str:
    """The Megatron-Core prefix of a layer-scoped name (MTP inner layers: the current spelling
    unless ``mtp_inner`` says otherwise)."""
    match scope:
        case Scope.DECODER:
            return f"decoder.layers.{index}."
        case Scope.MTP_LAYER:
            return f"mtp.layers.{index}.{MtpInner(mtp_inner).value}."
        case Scope.MTP_GLUE:
            return f"mtp.layers.{index}."
        case Scope.GLOBAL:
            return ""
