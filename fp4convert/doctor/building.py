"""The exclude list (and ``quantized_layers``, targets) against reality: what each engine builds vs what is stored.

For every layer an engine instantiates (:meth:`fp4convert.doctor.model.Model.layers`) the scheme
the engine gives it (:func:`fp4convert.doctor.engines.built_scheme`) is compared with the format
its tensors are stored in. A BF16 weight in a layer built quantized is a missing exclusion
(named more precisely where it is the lm_head, tied or not; an MTP layer; a fused engine name
such as ``qkv_proj`` whose pieces are listed but not the name SGLang decides by; an entry that
lacks the ``model.`` prefix), a quantized weight built BF16 is a wrong exclusion or a module the
config does not route, two quantized formats disagreeing is a routing mismatch, and a fused
layer whose pieces disagree is refused by the engines. One finding per problem and set of
engines it affects, the tensors grouped; all are repaired from the stored formats (``--fix``).
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

from fp4convert.dialects import ConfigView
from fp4convert.doctor.engines import Inconsistent, built_scheme, excluded
from fp4convert.doctor.model import Layer, Model
from fp4convert.doctor.report import Finding
from fp4convert.inventory import Role

__all__ = ["check_building"]

_REBUILD = "rewrite the exclude list (and quantized_layers / targets) from the stored tensors"
#: code -> (message, what the engine does, fix)
_CODES: dict[str, tuple[str, str, str]] = {
    "bf16-not-excluded": (
        "BF16 GEMM modules the exclude list does not cover",
        "builds them quantized and fails to load the BF16 weight ([out, in] where it expects packed data and "
        "scales) or runs with uninitialised scales",
        _REBUILD,
    ),
    "lm-head-not-excluded": (
        "lm_head is BF16 (stored, or tied to the embedding) but not excluded",
        "builds a quantized lm_head (ParallelLMHead) whose weight_scale is never loaded: the load fails (seen "
        "on vLLM's CPU build with a tied Qwen3)",
        "add lm_head to the exclude list",
    ),
    "mtp-not-excluded": (
        "BF16 MTP (multi-token prediction) modules not excluded",
        "builds the MTP layer quantized: the draft model fails to load its BF16 weights (vLLM #38832, SGLang #17166)",
        "exclude the MTP layer's modules",
    ),
    "fused-name-not-excluded": (
        "the exclude list names the pieces of fused layers but not the fused name the engine builds",
        "decides by the fused name (qkv_proj, gate_up_proj), so it builds the layer quantized and fails on the "
        "BF16 pieces (SGLang #36596)",
        "add the fused engine names to the exclude list",
    ),
    "exclude-prefix": (
        "exclude entries written without the model's `model.` prefix (or another prefix) match nothing here",
        "full-matches module names, so these BF16 modules are built quantized and fail to load",
        "write exclude entries with the full module names",
    ),
    "quantized-excluded": (
        "quantized modules the exclude list covers",
        "builds them in BF16 and loads packed data and scales into a BF16 layer: the load fails or computes garbage",
        _REBUILD,
    ),
    "quantized-not-routed": (
        "quantized modules the config does not route to a quantized scheme (not listed in quantized_layers / no "
        "target matches)",
        "builds them in BF16 and fails to load their packed data and scales",
        _REBUILD,
    ),
    "format-mismatch": (
        "modules stored in one format while the config routes them to another",
        "builds a layer of the config's format and misreads the stored bytes",
        "rewrite the config's algorithm from the stored tensors",
    ),
    "fused-inconsistent": (
        "fused layers whose pieces are stored or routed in different precisions",
        "refuses the checkpoint: all pieces of a fused layer must have one precision",
        "give every piece of a fused layer one format (re-quantize, or keep all pieces BF16)",
    ),
}


def _stored(model: Model, layer: Layer) -> set[str]:
    return {model.modules[p].format for p in layer.pieces if p in model.modules} or {"bf16"}


def _bf16_code(engine: str, view: ConfigView, model: Model, layer: Layer) -> str:
    """Which kind of missing exclusion a BF16 layer built quantized is."""
    if layer.kind == "lm_head":
        return "lm-head-not-excluded"
    infos = [model.weight(p) for p in layer.pieces]
    if any(i is not None and (i.is_mtp or i.role is Role.MTP) for i in infos):
        return "mtp-not-excluded"
    if layer.kind == "fused":
        pieces = [excluded(engine, view, Layer(p, (p,), "linear")) for p in layer.pieces]
        if all(pieces):
            return "fused-name-not-excluded"
    # An entry that matches once a prefix is put in front of it (``layers.0.mlp.gate`` for
    # ``model.layers.0.mlp.gate``): written for another module root.
    names = (layer.name, *layer.pieces)
    if any(fnmatchcase(name, "*." + entry) for entry in view.excluded for name in names):
        return "exclude-prefix"
    return "bf16-not-excluded"


def _judge(engine: str, view: ConfigView, model: Model, layer: Layer) -> str | None:
    """The problem ``engine`` has with ``layer`` (a code of :data:`_CODES`), None when there is none."""
    stored = _stored(model, layer)
    if stored & {"other", "absent"}:
        return None  # not a format doctor checks here (structure findings name it)
    if len(stored) > 1:
        return "fused-inconsistent"
    fmt = stored.pop()
    try:
        scheme = built_scheme(engine, view, layer)
    except Inconsistent:
        return "fused-inconsistent"
    if scheme is None:
        if fmt == "bf16":
            return None
        return "quantized-excluded" if excluded(engine, view, layer) else "quantized-not-routed"
    if fmt == "bf16":
        return _bf16_code(engine, view, model, layer)
    return "format-mismatch" if scheme.format != fmt else None


def check_building(view: ConfigView, model: Model, engines: Iterable[str]) -> list[Finding]:
    """Findings for every layer some engine builds in another format than stored (module docstring)."""
    bad: dict[tuple[str, str], list[str]] = {}  # (code, layer) -> engines
    judged = tuple(engines)
    layers = model.layers()
    for engine in judged:
        for layer in layers:
            code = _judge(engine, view, model, layer)
            if code is not None:
                bad.setdefault((code, layer.name), []).append(engine)
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (code, name), engines_hit in bad.items():
        grouped.setdefault((code, tuple(engines_hit)), []).append(name)
    findings = []
    for (code, affected), names in grouped.items():
        message, effect, fix = _CODES[code]
        repair = None if code == "fused-inconsistent" else "config"
        findings.append(
            Finding(
                "exclude",
                code,
                "error",
                f"{message} ({view.exclude_key})",
                tuple(sorted(names)),
                {e: effect for e in affected},
                fix,
                repair,
            )
        )
    findings += _dead_entries(view, layers, judged)
    return findings


def _dead_entries(view: ConfigView, layers: list[Layer], engines: tuple[str, ...]) -> list[Finding]:
    """Exact exclude entries that match no layer for any engine (typos, other models' names);
    wildcards and ``re:`` patterns are generic rules (``*vision_tower*``) and are not reported."""
    dead = []
    for entry in view.excluded:
        if "*" in entry or entry.startswith("re:"):
            continue
        single = ConfigView(view.dialect, view.algo, excluded=(entry,))
        if not any(_matches_any(engine, single, layer) for engine in engines for layer in layers):
            dead.append(entry)
    if not dead:
        return []
    return [
        Finding(
            "exclude",
            "exclude-dead-entry",
            "warning",
            f"{view.exclude_key} entries that match no layer of this checkpoint",
            tuple(dead),
            fix="drop them (or spell the module names this checkpoint has)",
            repair="config",
        )
    ]


def _matches_any(engine: str, view: ConfigView, layer: Layer) -> bool:
    try:
        return excluded(engine, view, layer) or any(
            excluded(engine, view, Layer(p, (p,), "linear")) for p in layer.pieces
        )
    except Inconsistent:
        return True
