"""``contract emit``: the contract in each consumer's own language.

Targets (``--target``):

``te-yaml``
    TransformerEngine's precision file for Megatron (``--te-precision-config-file``): ``configs``
    plus ``matchers``. TE tries matchers in file order, first match wins, each an ``fnmatch`` glob
    on the module path, so the contract's precedence is flattened into that order: Megatron name
    exceptions, then role exceptions, then Megatron rules from most to least specific, then the
    default. Role and MTP matchers are written only where the rest of the file would otherwise
    give those modules a low-precision format. Layer counts are not expressible in TE's matchers
    (under pipeline parallelism module paths carry local layer numbers); they go through
    ``--first-last-layers-bf16`` (the ``megatron-args`` target). Regex rules cannot be written
    (TE matchers are globs); HF-namespace rules do not apply to Megatron module paths.

``megatron-args``
    Megatron/Miles flags: ``--fp4-format e2m1 --fp4-recipe nvfp4`` and/or
    ``--fp8-format e4m3 --fp8-recipe mxfp8``, ``--first-last-layers-bf16`` with
    ``--num-layers-at-start-in-bf16`` / ``--num-layers-at-end-in-bf16``,
    ``--extra-high-precision-layers-hf`` / ``--extra-high-precision-layers-megatron`` (name
    exceptions, plus shared-expert and MTP substrings, because Miles' converters and exporters
    quantize those unless told not to), and ``--expert-tensor-parallel-size``.

``sglang-args``
    ``--quantization modelopt_fp4`` (NVFP4 checkpoints) or ``mxfp8``, and ``--kv-cache-dtype``.

``vllm-args``
    ``--kv-cache-dtype`` and, for per-token NVFP4 activations, vLLM's own switch
    ``--quantization-config '{"moe": {"activation": "nvfp4_per_token"}}'`` (vLLM's
    ``QuantizationConfigArgs``; it applies to the ModelOpt dialect's routed experts only and needs
    the FlashInfer TRT-LLM MoE backend). vLLM reads the checkpoint's own ``quant_method``, so no
    ``--quantization`` is written; which dialects vLLM loads, and what a per-token checkpoint's dense
    linears run as there, go to the notes.

``env``
    The environment of ``docs/recipe.md``: TransformerEngine's NVFP4 switches and backward override,
    TensorRT-LLM / FlashInfer fast-math FP4 quantization off, SGLang per-token activations.
    Switches are always written with an explicit value (``=0`` when off), never left out. A
    ``four_over_six`` contract adds TransformerEngine's and FlashInfer's 4over6 switches
    (docs/formats.md, "4over6"): mode, E4M3 bound (the two engines' defaults differ), exact error.

Every target prints one item per line (flags with their values, or ``KEY=VALUE``), so the output
can be spliced into a command line (``$(fp4convert contract emit ...)``) or sourced. What a target
cannot express is either an error (when the emitted text would contradict the contract) or a
note the CLI prints on stderr.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Literal, get_args

from fp4convert.contract.model import Contract, contract_hash
from fp4convert.contract.patterns import KIND_RANK, literal_length, matches
from fp4convert.contract.sections import Format
from fp4convert.errors import ContractError

__all__ = ["TARGETS", "Emitted", "Target", "emit"]

Target = Literal["te-yaml", "megatron-args", "sglang-args", "vllm-args", "env"]
TARGETS: tuple[str, ...] = get_args(Target)

_TE_RECIPES: dict[Format, str] = {
    "nvfp4": "{fp4_quantization_recipe: nvfp4}",
    "mxfp8": "{fp8_quantization_recipe: mxfp8}",
    "bf16": "{}",
}
_SGLANG_QUANTIZATION: dict[Format, str] = {"nvfp4": "modelopt_fp4", "mxfp8": "mxfp8"}


@dataclass(frozen=True)
class _RoleNames:
    """How one BF16 role exception is spelled for the engines (names: ``docs/live-export.md``)."""

    switch: str  # the bf16_exceptions field
    te_glob: str  # Megatron module-path glob for the TE matcher
    probe: str  # a module path of that role, to test whether the other matchers reach it
    hf_substrings: tuple[str, ...]  # Miles --extra-high-precision-layers-hf
    megatron_substrings: tuple[str, ...]  # Miles --extra-high-precision-layers-megatron


_ROLE_NAMES: tuple[_RoleNames, ...] = (
    # DeepSeek `mlp.shared_experts.*`, Qwen2-MoE `mlp.shared_expert.*`; Megatron `mlp.shared_experts`.
    _RoleNames(
        "shared_experts",
        "*.mlp.shared_experts.*",
        "decoder.layers.0.mlp.shared_experts.linear_fc1",
        (".shared_experts.", ".shared_expert."),
        (".shared_experts.",),
    ),
    _RoleNames("routers", "*.mlp.router", "decoder.layers.0.mlp.router", (), ()),
    _RoleNames("lm_head", "*output_layer", "output_layer", (), ()),
    # Megatron MTP layers live under `mtp.layers.<k>.`; HF numbers them after the decoder layers.
    _RoleNames("mtp_layers", "*mtp.layers.*", "mtp.layers.0.transformer_layer.mlp.experts.linear_fc1", (), ()),
)
_MTP_MEGATRON_SUBSTRING = "mtp.layers."


@dataclass(frozen=True)
class Emitted:
    """What ``emit`` produced.

    Attributes:
        text: the exact output (empty when the target needs nothing), newline-terminated.
        notes: facts the output cannot carry, for stderr.
    """

    text: str
    notes: tuple[str, ...] = ()


def _lines(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


def _low_precision(contract: Contract) -> list[Format]:
    return [fmt for fmt in ("nvfp4", "mxfp8") if fmt in contract.formats_used]


def _scope_notes(contract: Contract) -> tuple[str, ...]:
    if "nvfp4" in contract.formats_used and contract.formats.nvfp4.weight_scale_scope == "row":
        return (
            "weight_scale_scope 'row' is applied by fp4convert's converter; the engines have no switch "
            "for it, so check that the learner's weights use per-row outer scales too",
        )
    return ()


# te-yaml ------------------------------------------------------------------------------------


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def _key(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def _te_format(matchers: list[tuple[str, str, Format]], module_path: str) -> Format | None:
    """TransformerEngine's own resolution: the first matcher whose glob matches wins."""
    return next((fmt for _, glob, fmt in matchers if matches("glob", glob, module_path)), None)


def _te_yaml(contract: Contract) -> Emitted:
    megatron_rules = [(i, r) for i, r in enumerate(contract.rules) if r.namespace == "megatron"]
    hf_rules = [f"rules[{i}]" for i, r in enumerate(contract.rules) if r.namespace == "hf"]
    if not megatron_rules:
        raise ContractError(
            f"contract '{contract.name}' has no Megatron-namespace rule, and TransformerEngine only sees "
            "Megatron module paths",
            hint="add `namespace: megatron` rules mirroring the HF ones (e.g. '*.mlp.experts.linear_fc1')",
            field="rules",
        )
    regex = [f"rules[{i}]" for i, r in megatron_rules if r.kind == "regex"]
    if regex:
        raise ContractError(
            f"{', '.join(regex)}: TransformerEngine matchers are globs; a regex rule cannot be emitted",
            hint="write Megatron-namespace rules as glob or exact",
            field=regex[0],
        )
    ranked = sorted(
        megatron_rules,
        key=lambda ir: (-KIND_RANK[ir[1].kind], -literal_length(ir[1].kind, ir[1].pattern), ir[0]),
    )
    rule_matchers = [
        (
            r.name or f"rule_{i}_{r.format}",
            r.pattern if r.kind == "glob" else _glob_escape(r.pattern),
            r.format,
        )
        for i, r in ranked
    ]
    if contract.default is not None:
        rule_matchers.append((f"default_{contract.default}", "*", contract.default))
    first: list[tuple[str, str, Format]] = []
    used_keys: set[str] = set()
    for sub in contract.bf16_exceptions.names.megatron:
        key = f"{_key(sub)}_bf16"
        while key in used_keys:
            key += "_"
        used_keys.add(key)
        first.append((key, f"*{_glob_escape(sub)}*", "bf16"))
    for role in _ROLE_NAMES:
        # Only where the rest of the file would give the role a low-precision format.
        reached = _te_format(first + rule_matchers, role.probe)
        if getattr(contract.bf16_exceptions, role.switch) and reached not in (None, "bf16"):
            first.append((f"{role.switch}_bf16", role.te_glob, "bf16"))
    matchers = first + rule_matchers
    lines = [
        f"# TransformerEngine precision config from fp4convert contract '{contract.name}' "
        f"(sha256 {contract_hash(contract)[:16]}).",
        "# Matchers are tried in order and the first match wins: the contract's precedence, flattened.",
    ]
    first_count, last_count = contract.bf16_exceptions.first_layers, contract.bf16_exceptions.last_layers
    if first_count != 0 or last_count != 0:
        lines.append("# First/last-layer BF16 counts are not matchers: see `--target megatron-args`.")
    if hf_rules:
        lines.append(f"# HF-namespace rules ({', '.join(hf_rules)}) apply to checkpoint names, not here.")
    lines.append("configs:")
    used = {fmt for _, _, fmt in matchers}
    for fmt in ("nvfp4", "mxfp8", "bf16"):
        if fmt in used:
            config = f"transformer_engine_config_type: TEQuantizationParams, training_recipe: {_TE_RECIPES[fmt]}"
            lines.append(f"  {fmt}: {{{config}}}")
    lines.append("matchers:")
    for key, glob, fmt in matchers:
        # json.dumps gives a double-quoted scalar that YAML reads back unchanged.
        lines.append(f"  {key}: {{type: glob, enabled: true, pattern: {json.dumps(glob)}, config: {fmt}}}")
    return Emitted(_lines(lines))


# megatron-args -------------------------------------------------------------------------------


def _needs_layer_count(contract: Contract, why: str) -> ContractError:
    return ContractError(
        f"contract '{contract.name}': {why} depends on the model's layer count",
        hint="give the model: --model CONFIG_OR_DIR, or num_layers= (and num_mtp_layers=) in Python",
        field="bf16_exceptions",
    )


def _layer_count_args(contract: Contract, num_layers: int | None) -> list[list[str]]:
    exceptions = contract.bf16_exceptions
    if exceptions.counts_depend_on_model and num_layers is None:
        raise _needs_layer_count(contract, "a fractional first/last layer count")
    first, last = exceptions.layer_counts(num_layers or 0)
    if not (first or last):
        return []
    return [
        ["--first-last-layers-bf16"],
        ["--num-layers-at-start-in-bf16", str(first)],
        ["--num-layers-at-end-in-bf16", str(last)],
    ]


def _extra_high_precision_args(contract: Contract, num_layers: int | None, num_mtp_layers: int) -> list[list[str]]:
    exceptions = contract.bf16_exceptions
    hf = list(exceptions.names.hf)
    megatron = list(exceptions.names.megatron)
    if exceptions.shared_experts:
        hf += _ROLE_NAMES[0].hf_substrings
        megatron += _ROLE_NAMES[0].megatron_substrings
    if exceptions.mtp_layers:
        if num_layers is None:
            raise _needs_layer_count(contract, "keeping MTP layers bf16 (HF numbers them after the last layer)")
        hf += [f"model.layers.{num_layers + k}." for k in range(num_mtp_layers)]
        megatron += [_MTP_MEGATRON_SUBSTRING] if num_mtp_layers else []
    args = []
    if hf:  # dict.fromkeys: drop repeats, keep order
        args.append(["--extra-high-precision-layers-hf", *dict.fromkeys(hf)])
    if megatron:
        args.append(["--extra-high-precision-layers-megatron", *dict.fromkeys(megatron)])
    return args


def _megatron_args(contract: Contract, num_layers: int | None, num_mtp_layers: int) -> Emitted:
    for switch in ("routers", "lm_head"):
        if not getattr(contract.bf16_exceptions, switch):
            raise ContractError(
                f"bf16_exceptions.{switch} is false, but Miles' converters and exporters never quantize it",
                hint=f"keep bf16_exceptions.{switch}: true for contracts emitted to Megatron/Miles",
                field=f"bf16_exceptions.{switch}",
            )
    low = _low_precision(contract)
    args: list[list[str]] = []
    if "nvfp4" in low:
        args += [["--fp4-format", "e2m1"], ["--fp4-recipe", "nvfp4"]]
    if "mxfp8" in low:
        args += [["--fp8-format", "e4m3"], ["--fp8-recipe", "mxfp8"]]
    if low:
        args += _layer_count_args(contract, num_layers)
        args += _extra_high_precision_args(contract, num_layers, num_mtp_layers)
    if contract.expert_tensor_parallel_size is not None:
        args.append(["--expert-tensor-parallel-size", str(contract.expert_tensor_parallel_size)])
    notes = _scope_notes(contract)
    if low:
        notes += (
            "Miles chooses which tensors to quantize itself (NVFP4: MoE experts; MXFP8: every linear "
            "outside its skip list); these flags only add the contract's BF16 exceptions. "
            "`fp4convert contract check --model` shows the contract's own per-tensor decisions.",
        )
    return Emitted(_lines([shlex.join(arg) for arg in args]), notes)


# sglang-args / env ---------------------------------------------------------------------------


def _sglang_args(contract: Contract) -> Emitted:
    low = _low_precision(contract)
    if len(low) > 1:
        raise ContractError(
            f"contract '{contract.name}' mixes NVFP4 and MXFP8; no single SGLang --quantization method loads both",
            hint="serve one low-precision format per checkpoint",
            field="rules",
        )
    args = [["--quantization", _SGLANG_QUANTIZATION[low[0]]]] if low else []
    args.append(["--kv-cache-dtype", contract.kv_cache])
    notes: tuple[str, ...] = ()
    if contract.expert_tensor_parallel_size is not None:
        notes += (
            f"SGLang has no flag for the expert-tensor-parallel size: launch it so that its expert TP "
            f"is {contract.expert_tensor_parallel_size}, like the learner's",
        )
    if "nvfp4" in low and contract.formats.nvfp4.per_token_activations:
        notes += ("per-token NVFP4 activations are switched on by the environment (`--target env`)",)
    return Emitted(_lines([shlex.join(arg) for arg in args]), notes)


#: vLLM's name of its per-token NVFP4 activation quantization (vllm/config/quantization.py QUANT_KEY_NAMES)
VLLM_PER_TOKEN_ACTIVATION = "nvfp4_per_token"
_VLLM_KV_CACHE = {"bf16": "bfloat16", "fp8_e4m3": "fp8_e4m3"}


def _vllm_args(contract: Contract) -> Emitted:
    low = _low_precision(contract)
    args = [["--kv-cache-dtype", _VLLM_KV_CACHE[contract.kv_cache]]]
    notes: tuple[str, ...] = ()
    if "mxfp8" in low:
        notes += (
            "vLLM loads MXFP8 from the modelopt and compressed-tensors dialects; it reads an sglang-mxfp8 "
            "checkpoint's `quant_method: mxfp8` as ModelOpt MXFP8 (`weight_scale`, `ignored_layers`) and fails",
        )
    if "nvfp4" in low and contract.formats.nvfp4.per_token_activations:
        switch = json.dumps({"moe": {"activation": VLLM_PER_TOKEN_ACTIVATION}})
        args.append(["--quantization-config", switch])
        notes += (
            "vLLM quantizes activations per token only in ModelOpt-dialect NVFP4 MoE layers on the FlashInfer "
            "TRT-LLM backend (Blackwell); dense NVFP4 linears of a per-token checkpoint run W4A4 with the 1.0 "
            "input_scale placeholder (modelopt) or weight-only (compressed-tensors), not per token",
        )
    return Emitted(_lines([shlex.join(arg) for arg in args]), notes)


def _env(contract: Contract) -> Emitted:
    low = _low_precision(contract)
    nvfp4 = contract.formats.nvfp4
    lines: list[str] = []
    if "nvfp4" in low:
        per_token = int(nvfp4.per_token_activations)
        lines += [
            f"NVTE_NVFP4_ROW_SCALED_ACTIVATION={per_token}",
            f"NVTE_BACKWARD_OVERRIDE={contract.backward}",
            f"NVTE_NVFP4_DISABLE_2D_QUANTIZATION={int(nvfp4.tile == '1x16')}",
            # fp4convert's quantizer has no random Hadamard transform and rounds to nearest; the
            # learner must do the same for the bytes to agree.
            "NVTE_NVFP4_DISABLE_RHT=1",
            "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING=1",
            "TRTLLM_DISABLE_FP4_QUANT_FAST_MATH=1",
            "FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH=1",
            f"SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION={per_token}",
        ]
        lines += _four_over_six_env(contract)
    elif low:
        lines.append(f"NVTE_BACKWARD_OVERRIDE={contract.backward}")
    return Emitted(_lines(lines), _scope_notes(contract) + _four_over_six_notes(contract))


def _four_over_six_env(contract: Contract) -> list[str]:
    nvfp4 = contract.formats.nvfp4
    if nvfp4.four_over_six is None:
        return []
    mode, use_256 = nvfp4.four_over_six.upper(), nvfp4.four_over_six_e4m3_max == 256
    return [
        # Weights and activations (TE never applies 4over6 to gradients); RHT is off above, as TE requires.
        "NVTE_NVFP4_4OVER6=all",
        f"NVTE_NVFP4_4OVER6_ERR_MODE={mode}",
        f"NVTE_NVFP4_4OVER6_E4M3_USE_256={'all' if use_256 else 'none'}",
        "NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH=0",
        "FLASHINFER_NVFP4_4OVER6=1",
        f"FLASHINFER_NVFP4_4OVER6_ERR_MODE={mode}",
        f"FLASHINFER_NVFP4_4OVER6_E4M3_USE_256={int(use_256)}",
        "FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH=0",
    ]


def _four_over_six_notes(contract: Contract) -> tuple[str, ...]:
    nvfp4 = contract.formats.nvfp4
    if nvfp4.four_over_six is None or "nvfp4" not in contract.formats_used:
        return ()
    if nvfp4.per_token_activations:
        return (
            "4over6 with per-token activations: TransformerEngine refuses a row-scaled 4over6 tensor that "
            "needs a column-wise copy; not confirmed that the learner's backward never asks for one. Not "
            "confirmed either that SGLang hands FlashInfer the per-token global scale 1/(6*B) of the chosen "
            "bound (FlashInfer's own helper does)",
        )
    return (
        "4over6 with per-tensor activations: FlashInfer scores a per-tensor block's candidates with the "
        "decode scale instead of TransformerEngine's amax/(6*B), so its activation bytes can differ from TE's "
        "(docs/formats.md, '4over6'); the weights in the checkpoint are TE's",
    )


def emit(contract: Contract, target: Target, *, num_layers: int | None = None, num_mtp_layers: int = 0) -> Emitted:
    """Render the contract for one consumer.

    Args:
        contract: the contract.
        target: ``te-yaml``, ``megatron-args``, ``sglang-args``, ``vllm-args`` or ``env``.
        num_layers: decoder layers of the model, needed by ``megatron-args`` when a layer count is
            a fraction or MTP layers are kept BF16.
        num_mtp_layers: MTP layers of the model.

    Returns:
        The text and the notes.

    Raises:
        ContractError: the target cannot express the contract, or needs the layer count.

    Example:
        >>> c = Contract.model_validate({"version": 1, "name": "x", "default": "bf16",
        ...     "rules": [{"kind": "glob", "namespace": "hf", "pattern": "*", "format": "mxfp8"}]})
        >>> print(emit(c, "env").text, end="")
        NVTE_BACKWARD_OVERRIDE=high_precision
    """
    if target == "te-yaml":
        return _te_yaml(contract)
    if target == "megatron-args":
        return _megatron_args(contract, num_layers, num_mtp_layers)
    if target == "sglang-args":
        return _sglang_args(contract)
    if target == "vllm-args":
        return _vllm_args(contract)
    if target == "env":
        return _env(contract)
    raise ContractError(f"unknown emit target '{target}'", hint=f"use one of {', '.join(TARGETS)}", field="target")
