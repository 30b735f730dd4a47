"""What SGLang, vLLM and TensorRT-LLM do with a checkpoint, as read from their loaders.

Three facts per engine, each from the engine's source as docs/dialects.md records it:

* **routing** (:func:`loader`): which loader ``quantization_config`` selects, or why none can
  load it (SGLang sends ModelOpt ``MXFP8`` to its per-tensor FP8 path because ``"FP8" in
  "MXFP8"``, SGLang #32538; ``MIXED_PRECISION`` without ``quantized_layers`` in config.json to
  its legacy ``w4afp8``; vLLM sends ``quant_method: mxfp8`` to ModelOpt MXFP8, which expects
  ``weight_scale``).
* **matching** (:func:`excluded`): how an exclude entry meets a layer name. SGLang's ModelOpt
  loader full-matches ``*`` globs against the layer's own name (a fused ``qkv_proj`` is not
  excluded by ``q_proj``/``k_proj``/``v_proj``, SGLang #36596; an entry without the ``model.``
  prefix matches nothing); vLLM's tries the fused layer's pieces, substrings and fnmatch;
  compressed-tensors takes exact names and ``re:`` regexes; SGLang's block-FP8 (MXFP8) loader
  matches dotted module paths, no wildcards. A fused layer whose pieces disagree is refused.
* **building** (:func:`built_scheme`): the scheme each layer is instantiated with: excluded
  layers in BF16, else what the config assigns (its single algorithm, ``quantized_layers``,
  targets).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from fp4convert.dialects import ConfigView, Scheme
from fp4convert.doctor.model import Layer
from fp4convert.doctor.report import ENGINES

__all__ = ["ENGINES", "Inconsistent", "Loader", "built_scheme", "excluded", "loader"]

# SGLang's ModelOpt matcher also excludes a fused MLA layer by the pieces' names (substring).
_SGLANG_MLA_PIECES = frozenset({"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"})


@dataclass(frozen=True)
class Loader:
    """The loader one engine picks for a checkpoint: ``method``, or ``refusal`` saying why none loads it."""

    engine: str
    method: str | None
    refusal: str | None = None

    def describe(self) -> str:
        return f"refused: {self.refusal}" if self.refusal is not None else str(self.method)


class Inconsistent(Exception):
    """A fused layer whose pieces an engine would give different schemes (the engines raise)."""


def loader(engine: str, view: ConfigView | None, method: str | None) -> Loader:
    """The loader ``engine`` routes a checkpoint to.

    Args:
        engine: ``sglang``, ``vllm`` or ``trtllm``.
        view: the config as its dialect reads it (None: no quantization_config of a known dialect).
        method: ``quantization_config.quant_method`` as written (None when there is none).
    """
    if view is None:
        if method is None:
            return Loader(engine, "unquantized")
        return Loader(engine, None, f"quant_method {method!r} is not one of the dialects doctor knows")
    algo = view.algo
    if view.dialect == "modelopt":
        return _modelopt_loader(engine, view, algo)
    if view.dialect == "compressed-tensors":
        if engine == "trtllm":
            return Loader(engine, None, "compressed-tensors is not a TensorRT-LLM checkpoint format")
        return Loader(engine, "compressed-tensors")
    if engine == "sglang":
        return Loader(engine, "mxfp8 (block-FP8 loader, 1x32 UE8M0 scales, compute capability >= 10.0)")
    if engine == "vllm":
        return Loader(
            engine,
            None,
            "vLLM maps quant_method mxfp8 to its ModelOpt MXFP8 loader, which expects weight_scale, not "
            "weight_scale_inv: write the modelopt or compressed-tensors dialect for vLLM",
        )
    return Loader(engine, None, "TensorRT-LLM's tensor names for quant_method mxfp8 are not verified")


def _modelopt_loader(engine: str, view: ConfigView, algo: str) -> Loader:
    listed = {s.algo for s in view.listed.values()}
    if engine == "sglang":
        if algo == "MIXED_PRECISION":
            if not view.listed:
                return Loader(engine, None, "MIXED_PRECISION without quantized_layers in config.json: legacy w4afp8")
            if listed - {"NVFP4", "FP8"}:
                return Loader(
                    engine,
                    None,
                    f"SGLang's modelopt_mixed takes FP8 and NVFP4 layers only; {', '.join(sorted(listed))} layers "
                    "would load unquantized",
                )
            return Loader(engine, "modelopt_mixed")
        if algo == "NVFP4":
            return Loader(engine, "modelopt_fp4")
        if "FP8" in algo:
            if algo == "MXFP8":
                return Loader(
                    engine,
                    None,
                    'SGLang routes quant_algo MXFP8 to its per-tensor FP8 loader ("FP8" in "MXFP8", SGLang #32538), '
                    "which cannot load E8M0 block scales: write the sglang-mxfp8 dialect for SGLang",
                )
            return Loader(engine, "modelopt_fp8")
        return Loader(
            engine, None, f"SGLang's ModelOpt loaders take quant_algo NVFP4, FP8 or MIXED_PRECISION, not {algo!r}"
        )
    if engine == "vllm":
        methods = {"FP8": "modelopt", "MXFP8": "modelopt_mxfp8", "MIXED_PRECISION": "modelopt_mixed"}
        if "FP4" in algo:
            return Loader(engine, "modelopt_fp4")
        if algo in methods:
            return Loader(engine, methods[algo])
        return Loader(engine, None, f"vLLM's ModelOpt loaders do not take quant_algo {algo!r}")
    if algo in ("NVFP4", "MXFP8", "MIXED_PRECISION", "FP8"):
        return Loader(engine, f"QuantAlgo.{algo}")
    return Loader(engine, None, f"TensorRT-LLM has no QuantAlgo {algo!r}")


def _glob_regex(pattern: str) -> str:
    return pattern.replace(".", r"\.").replace("*", ".*")


def _sglang_modelopt(entries: Sequence[str], name: str) -> bool:
    """SGLang ModelOpt's ``is_layer_excluded``: full match of the glob on the name or on one of its
    dotted parts, also without a ``language_model.`` prefix; MLA pieces by substring of the last part."""
    names = [name] + ([name.removeprefix("language_model.")] if name.startswith("language_model.") else [])
    for pattern in entries:
        regex = _glob_regex(pattern)
        for candidate in names:
            if re.fullmatch(regex, candidate) or any(re.fullmatch(regex, part) for part in candidate.split(".")):
                return True
        tail = pattern.rsplit(".", 1)[-1]
        if tail in _SGLANG_MLA_PIECES and any(tail in c.rsplit(".", 1)[-1] for c in names):
            return True
    return False


def _vllm_modelopt(entries: Sequence[str], name: str) -> bool:
    """vLLM ModelOpt's ``is_layer_excluded`` on one name (after its ``x*`` -> ``x``, ``x.*``
    rewrite): exact, substring, fnmatch."""
    expanded = []
    for entry in entries:
        if len(entry) >= 2 and entry.endswith("*") and entry[-2] != ".":
            expanded += [entry[:-1], entry[:-1] + ".*"]
        else:
            expanded.append(entry)
    return any(e == name or e in name or fnmatchcase(name, e) for e in expanded)


def _compressed_tensors(entries: Sequence[str], name: str) -> bool:
    """compressed-tensors' matcher in vLLM and SGLang: the exact name, or a ``re:`` regex (re.match)."""
    return any(re.match(e[3:], name) is not None if e.startswith("re:") else e == name for e in entries)


def _dotted_path(entries: Sequence[str], name: str) -> bool:
    """SGLang block-FP8 ``is_layer_skipped``: an entry matches a whole dotted module path, no wildcards."""
    return any(e == name or name.startswith(e + ".") or f".{e}." in f".{name}." for e in entries)


def _match(engine: str, dialect: str, entries: Sequence[str], name: str) -> bool:
    if dialect == "compressed-tensors":
        return _compressed_tensors(entries, name)
    if dialect == "sglang-mxfp8":
        return _dotted_path(entries, name)
    if engine == "sglang":
        return _sglang_modelopt(entries, name)
    if engine == "vllm":
        return _vllm_modelopt(entries, name)
    return any(fnmatchcase(name, e) for e in entries)  # TensorRT-LLM: fnmatch on module names


def excluded(engine: str, view: ConfigView, layer: Layer) -> bool:
    """Whether ``engine`` builds ``layer`` unquantized because of the config's exclude list.

    Raises:
        Inconsistent: a fused layer some of whose pieces are excluded and others not, where the
            engine decides by pieces (it raises too).
    """
    entries = view.excluded
    if _match(engine, view.dialect, entries, layer.name):
        return True
    # SGLang's ModelOpt loader decides on the fused name alone; the others look at the pieces.
    if layer.kind != "fused" or (engine == "sglang" and view.dialect == "modelopt"):
        return False
    pieces = [_match(engine, view.dialect, entries, piece) for piece in layer.pieces]
    if any(pieces) and not all(pieces):
        raise Inconsistent(f"some but not all pieces of {layer.name} are excluded")
    return all(pieces)


def _listed(view: ConfigView, name: str) -> Scheme | None:
    if name in view.listed:
        return view.listed[name]
    for regex, scheme in view.patterns:
        if re.match(regex, name):
            return scheme
    return None


def built_scheme(engine: str, view: ConfigView, layer: Layer) -> Scheme | None:
    """The scheme ``engine`` instantiates ``layer`` with (None: high precision).

    Raises:
        Inconsistent: the layer's pieces are given different schemes.
    """
    if excluded(engine, view, layer):
        return None
    scheme = _listed(view, layer.name)
    if layer.kind == "lm_head" and scheme is None and (engine, view.dialect) != ("vllm", "modelopt"):
        # Only vLLM's ModelOpt loaders quantize the output embedding (ParallelLMHead) unless it is
        # excluded; SGLang's take LinearBase and FusedMoE only; compressed-tensors' class targets
        # (Linear) do not reach it; TensorRT-LLM's is not modelled (it is not checked).
        return None
    if scheme is None and layer.kind == "moe":
        # FusedMoE: the first listed expert module under the container decides (SGLang, vLLM)
        scheme = next((s for p in layer.pieces if (s := _listed(view, p)) is not None), None)
    elif scheme is None and layer.kind == "fused":
        pieces = [_listed(view, p) for p in layer.pieces]
        if any(p != pieces[0] for p in pieces):
            raise Inconsistent(f"the pieces of {layer.name} are listed with different schemes")
        scheme = pieces[0]
    return scheme if scheme is not None else view.default
