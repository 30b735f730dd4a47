"""A dialect's ``quantization_config`` read back: which scheme it gives each module, what it excludes.

Writers produce a config from a plan (:meth:`~fp4convert.dialects.Dialect.quantization_config`);
readers of checkpoints fp4convert did not write need the inverse: for a module name, the scheme
the config assigns it (format and how its activations are quantized), the exclude list as
written, and the keys a loader needs that are missing. Each dialect reads its own spelling
(:meth:`~fp4convert.dialects.Dialect.read_config`); how an engine *matches* the names is not
here (each engine matches differently; :mod:`fp4convert.doctor.engines`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Activations", "ConfigView", "Scheme"]

#: how a scheme quantizes a module's activations: ``static`` from a stored global scale
#: (``input_scale`` / ``input_global_scale``), ``dynamic`` at run time, ``none`` (weight-only)
Activations = Literal["static", "dynamic", "none"]


@dataclass(frozen=True)
class Scheme:
    """What a config says one module is.

    Attributes:
        format: ``nvfp4``, ``mxfp8``, or ``other`` (an algorithm fp4convert does not store, e.g.
            ModelOpt ``FP8``; ``algo`` names it).
        activations: see :data:`Activations`.
        algo: the config's own word for it (``NVFP4``, ``W4A16_NVFP4``, ``nvfp4-pack-quantized``...).
    """

    format: str
    activations: Activations
    algo: str


@dataclass(frozen=True)
class ConfigView:
    """One checkpoint's ``quantization_config`` as its dialect reads it.

    Attributes:
        dialect: the dialect name.
        algo: the top-level algorithm (ModelOpt ``quant_algo``, compressed-tensors ``format``).
        default: the scheme of every module no exclude entry and no listing covers (ModelOpt's
            single algorithm, compressed-tensors class targets such as ``Linear``, SGLang MXFP8);
            None when only listed modules are quantized (ModelOpt mixed precision, exact targets).
        listed: module name -> scheme, for configs that name modules (ModelOpt
            ``quantized_layers``, compressed-tensors exact targets).
        patterns: ``(regex, scheme)`` for compressed-tensors ``re:`` targets.
        excluded: the exclude list exactly as written.
        exclude_key: the key it is written under (``ignore``, ``modules_to_not_convert``...).
        per_token_note: the config records that activations must be quantized per token.
        problems: ``(engine, sentence)`` for each key a loader needs that is missing or malformed;
            ``engine`` is the loader that needs it (``sglang``, ``vllm``, ``trtllm``) or ``all``.
    """

    dialect: str
    algo: str
    default: Scheme | None = None
    listed: Mapping[str, Scheme] = field(default_factory=dict)
    patterns: tuple[tuple[str, Scheme], ...] = ()
    excluded: tuple[str, ...] = ()
    exclude_key: str = "ignore"
    per_token_note: bool = False
    problems: tuple[tuple[str, str], ...] = ()

    def schemes(self) -> list[Scheme]:
        """Every scheme the config can assign."""
        found = [] if self.default is None else [self.default]
        return found + list(self.listed.values()) + [s for _, s in self.patterns]


def string_list(value: Any) -> tuple[str, ...] | None:
    """``value`` as a tuple of strings, or None when it is not a list of strings."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a JSON object, else an empty one."""
    return value if isinstance(value, Mapping) else {}
