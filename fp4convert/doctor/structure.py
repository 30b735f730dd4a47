"""Structure from the headers alone: routing vs tensors, complete modules, dtypes, shapes, what the config implies.

* **routing**: config.json's ``quant_method`` names a dialect; the quantized modules must be
  spelled in it (``weight_scale_inv`` under a ModelOpt config is SGLang's MXFP8 spelling, which
  the ModelOpt loaders never read), and its loaders' required keys must be there.
* **complete modules**: a module holding a dialect's data tensor holds the block scale and (NVFP4)
  the global scale beside it, each with that dialect's dtype; a scale without its data tensor is
  an orphan.
* **shapes**: NVFP4 data ``[out, in/2]``, block scales ``[out, in/16]`` row-major and unswizzled
  (an engine-padded ``[round_up(out, 128), round_up(in/16, 4)]`` copy is named as such), MXFP8
  scales ``[out, in/32]``, global scales ``[]`` or ``[1]``; logical shapes equal what config.json
  implies, and every tensor config.json implies is stored (MTP layers included).
"""

from __future__ import annotations

from collections import Counter

from fp4convert.dialects import ConfigView, Dialect
from fp4convert.doctor.model import Model
from fp4convert.doctor.report import Finding, Severity
from fp4convert.doctor.scan import SCALE_LEAVES, Module
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK

__all__ = ["check_structure", "module_dialect", "partial_spelling"]

_PAD_ROWS, _PAD_COLS = 128, 4  # the engines' (and TE's) padded/swizzled scale layout


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def partial_spelling(module: Module, prefer: str | None) -> tuple[Dialect, str] | None:
    """:meth:`Module.partial`: the dialect and format whose data tensor ``module`` holds."""
    return module.partial(prefer)


def module_dialect(module: Module, prefer: str | None) -> str | None:
    """The dialect a quantized module is spelled in (``prefer`` when it fits)."""
    spelled = [d for d, _ in module.spellings]
    return prefer if prefer in spelled else (spelled[0] if spelled else None)


def _shape_findings(module: Module, dialect: Dialect, fmt: str, out: dict[str, list[str]]) -> None:
    data = module.leaves[dialect.suffixes[fmt]["data"]]
    scale_name = dialect.suffixes[fmt]["scale"]
    scale = module.leaves.get(scale_name)
    if len(data.shape) != 2 or scale is None or len(scale.shape) != 2:
        out["shape-mismatch"].append(data.name)
        return
    rows, cols = data.shape
    blocks = cols * 2 // NVFP4_BLOCK if fmt == "nvfp4" else -(-cols // MXFP8_BLOCK)
    if scale.shape != (rows, blocks):
        padded = (_round_up(rows, _PAD_ROWS), _round_up(blocks, _PAD_COLS))
        out["scale-swizzled" if scale.shape == padded else "shape-mismatch"].append(scale.name)
    global_leaf = dialect.suffixes[fmt].get("global")
    if global_leaf and global_leaf in module.leaves and module.leaves[global_leaf].shape not in ((), (1,)):
        out["shape-mismatch"].append(module.leaves[global_leaf].name)


def _module_findings(module: Module, prefer: str | None, out: dict[str, list[str]]) -> None:
    found = partial_spelling(module, prefer)
    if found is None:
        if module.format == "absent" and set(module.leaves) & SCALE_LEAVES:
            out["orphan-scale"] += [e.name for e in module.leaves.values()]
        return
    dialect, fmt = found
    dtypes = {entry.name: entry.dtype for entry in module.leaves.values()}
    for _, name, stored in dialect.tensor_problems(module.name, fmt, dtypes):
        out["incomplete-module" if stored is None else "dtype-mismatch"].append(name)
    _shape_findings(module, dialect, fmt, out)


_MESSAGES: dict[str, tuple[str, Severity]] = {
    "incomplete-module": ("quantized modules lack tensors their format needs (named: the missing ones)", "error"),
    "dtype-mismatch": ("tensors stored with another dtype than their dialect's", "error"),
    "scale-swizzled": (
        "block scales stored padded to [round_up(out, 128), round_up(in/16, 4)]: the engines' swizzled kernel "
        "layout, not the [out, in/16] row-major layout every loader reads",
        "error",
    ),
    "shape-mismatch": (
        "tensors whose shape does not fit their format ([out, in/2] data, [out, in/16] scales)",
        "error",
    ),
    "orphan-scale": ("scale tensors without the data tensor they scale", "error"),
}
_EFFECTS = {
    "incomplete-module": "fails to load the module, or runs it with an uninitialised scale parameter",
    "dtype-mismatch": "fails to load the tensor into its parameter, or reinterprets its bytes",
    "scale-swizzled": "fails on the shape, or swizzles the already swizzled scales and decodes garbage",
    "shape-mismatch": "fails to load the tensor into its parameter",
    "orphan-scale": "fails on an unexpected tensor, or ignores it while the data it scales is missing",
}
_FIXES = {
    "scale-swizzled": "unswizzle the block scales (fp4convert.formats.from_layout) or re-export",
    "orphan-scale": "re-export the module, or remove the stray scales",
}


def check_structure(view: ConfigView | None, model: Model, engines: tuple[str, ...]) -> list[Finding]:
    """Routing vs tensors, module completeness, dtypes, shapes, expected tensors (module docstring);
    config keys only the judged ``engines`` need."""
    prefer = view.dialect if view is not None else None
    out: dict[str, list[str]] = {code: [] for code in _MESSAGES}
    spellings: Counter[str] = Counter()
    for module in model.modules.values():
        _module_findings(module, prefer, out)
        if module.format in ("nvfp4", "mxfp8"):
            spellings[module_dialect(module, prefer) or "?"] += 1
    findings = [
        Finding(
            "structure",
            code,
            _MESSAGES[code][1],
            _MESSAGES[code][0],
            tuple(sorted(names)),
            {"all": _EFFECTS[code]},
            _FIXES.get(code, "re-export these modules"),
        )
        for code, names in out.items()
        if names
    ]
    findings += _routing(view, model, spellings, engines)
    findings += _expected(model)
    return findings


def _routing(
    view: ConfigView | None, model: Model, spellings: Counter[str], engines: tuple[str, ...]
) -> list[Finding]:
    quantized = sorted(m for m, mod in model.modules.items() if mod.format in ("nvfp4", "mxfp8"))
    if view is None:
        if not quantized:
            return []
        return [
            Finding(
                "routing",
                "no-quantization-config",
                "error",
                "quantized tensors, but config.json has no quantization_config of a known dialect: engines build "
                "every layer in BF16",
                tuple(quantized),
                fix="write the quantization_config of the dialect the tensors are spelled in",
                repair="config",
            )
        ]
    findings = []
    foreign = sorted(
        m for m in quantized if module_dialect(model.modules[m], view.dialect) not in (view.dialect, None)
    )
    if foreign:
        spelled = ", ".join(f"{n} {d}" for d, n in spellings.items() if d != view.dialect)
        findings.append(
            Finding(
                "routing",
                "spelling-mismatch",
                "error",
                f"config.json routes to the {view.dialect} loaders, but these modules are spelled in another dialect "
                f"({spelled}): the loader looks for tensor names that are not there",
                tuple(foreign),
                fix="write the config of the dialect the tensors are spelled in (or re-export in this dialect)",
                repair="config" if len(spellings) == 1 else None,
            )
        )
    for engine, problem in view.problems:
        if engine != "all" and engine not in engines:
            continue
        findings.append(
            Finding(
                "routing",
                "config-key",
                "error",
                problem,
                (),
                {} if engine == "all" else {engine: problem},
                "rewrite the quantization_config",
                "config",
            )
        )
    return findings


def _expected(model: Model) -> list[Finding]:
    if model.expected is None:
        return []
    present = model.infos
    missing = [t for t in model.expected if t.name not in present]
    wrong = [t.name for t in model.expected if t.name in present and t.shape and present[t.name].shape != t.shape]
    findings = []
    if missing:
        mtp = any(t.is_mtp for t in missing)
        findings.append(
            Finding(
                "structure",
                "tensor-missing",
                "error",
                "tensors config.json implies are not stored"
                + (" (MTP layers among them: speculative decoding cannot load them, vLLM #49187)" if mtp else ""),
                tuple(t.name for t in missing),
                fix="re-export with every tensor, or fix config.json (layer counts, num_nextn_predict_layers)",
            )
        )
    if wrong:
        findings.append(
            Finding(
                "structure",
                "shape-mismatch",
                "error",
                "logical weight shapes differ from config.json's (packed along the wrong axis, transposed, or another "
                "model)",
                tuple(wrong),
                fix="re-export: NVFP4 packs two values per byte along the input dimension, [out, in/2]",
            )
        )
    return findings
