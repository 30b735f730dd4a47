"""The model card (``README.md``) of a published checkpoint, generated from its manifest.

Everything in the card comes from ``fp4convert.json`` (the manifest every conversion writes) and the
contract embedded in it, so the card cannot drift from the bytes it describes:

* YAML front matter: ``base_model`` (when the source was a Hub repo id, or given), ``base_model_relation:
  quantized``, ``library_name``, ``pipeline_tag``, ``tags`` (``fp4convert``, each low-precision
  format, the dialect, the model family), and an ``fp4convert`` block with the quantization details
  (contract and its SHA-256, dialect, quantizer profile, activation mode, tensors per format);
* what was quantized: tensors, parameters and stored bytes per format, and per role and format;
* what stayed BF16 and why: the deciding rule of every BF16 tensor, with its reason and an example;
* for a quantized or fused source: its formats, their dequantizer, and which tensors are lossless
  (dequantized output == dequantized source) and why;
* how to serve it: the activation mode (per-token or calibrated), the environment and the SGLang
  flags the contract requires, rendered by :func:`fp4convert.contract.emit.emit` (fast math off);
* the verification result, the contract (YAML and SHA-256) and the source files' SHA-256.

Local paths are never written: a source that was a local folder is described by its files' hashes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from fp4convert.checkpoint.safetensors_io import tensor_nbytes
from fp4convert.contract import Contract
from fp4convert.contract.emit import emit
from fp4convert.contract.model import contract_hash
from fp4convert.errors import ContractError, HubError
from fp4convert.hub import is_repo_id
from fp4convert.plan import human_bytes

__all__ = ["base_model_of", "render_card"]

# Which library to name in the front matter. The three dialects are transformers-layout repos
# (config.json + safetensors), which is what the Hub's library_name describes; which engine loads
# which dialect is spelled out in the card's "Loading" section (docs/dialects.md, "How engines load it").
_LIBRARY = "transformers"
_LOADING = {
    "modelopt": "SGLang, vLLM and TensorRT-LLM detect this ModelOpt checkpoint from `config.json` "
    "(`quantization_config.quant_method: modelopt`). Plain transformers does not load ModelOpt weights; "
    "`fp4convert dequantize` turns them back into BF16 that it does.",
    "sglang-mxfp8": "SGLang only: SGLang loads this checkpoint with `--quantization mxfp8` "
    "(`weight` E4M3 + `weight_scale_inv` E8M0 per 1x32 block, the Miles layout). vLLM reads "
    "`quant_method: mxfp8` as its ModelOpt MXFP8 config (`weight_scale`, `ignored_layers`) and does not "
    "load it; convert with `--dialect modelopt` or `compressed-tensors` for vLLM.",
    "compressed-tensors": "vLLM and transformers load this compressed-tensors checkpoint from `config.json`; "
    "transformers decompresses dense models on CPU. For MoE experts use vLLM, or `fp4convert dequantize`.",
}
# The SGLang --quantization value `emit` writes, and the dialect whose config it matches.
_SGLANG_DIALECT = {"modelopt_fp4": "modelopt", "mxfp8": "sglang-mxfp8"}
_FORMAT_ORDER = ("nvfp4", "mxfp8", "bf16")


def base_model_of(manifest: Mapping[str, Any]) -> str | None:
    """The Hub repo the checkpoint was converted from, or None when it came from a local folder.

    The manifest records the source as it was given to ``convert``; a repo id is taken as such
    unless a folder of that name exists here (a relative local path looks like ``owner/name`` too).

    Example:
        >>> base_model_of({"source": {"location": "Qwen/Qwen3-30B-A3B"}})
        'Qwen/Qwen3-30B-A3B'
        >>> base_model_of({"source": {"location": "/data/ckpt"}}) is None
        True
    """
    if manifest["source"].get("repo_id"):  # recorded by convert when the source came from the Hub
        return str(manifest["source"]["repo_id"])
    location = str(manifest["source"].get("location") or "")
    return location if is_repo_id(location) and not Path(location).exists() else None


def _params(shape: Iterable[int]) -> int:
    return math.prod(shape)


def _stored(info: Mapping[str, Any]) -> int:
    return sum(tensor_nbytes(out["dtype"], out["shape"]) for out in info["outputs"].values())


def _table(header: tuple[str, ...], rows: Iterable[tuple[object, ...]]) -> list[str]:
    right = ["---:" if h in {"tensors", "parameters", "stored", "share"} else "---" for h in header]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(right) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def _ordered_formats(formats: Iterable[str]) -> list[str]:
    return sorted(set(formats), key=lambda f: (_FORMAT_ORDER.index(f) if f in _FORMAT_ORDER else 9, f))


def _front_matter(manifest: Mapping[str, Any], base_model: str | None) -> str:
    formats = [f for f in _ordered_formats(manifest["formats"]) if f != "bf16"]
    tags = ["fp4convert", *formats, manifest["dialect"], manifest["source"]["family"], "quantized"]
    meta: dict[str, Any] = {}
    if base_model:
        meta |= {"base_model": base_model, "base_model_relation": "quantized"}
    meta |= {"library_name": _LIBRARY, "pipeline_tag": "text-generation", "tags": list(dict.fromkeys(tags))}
    # Machine-readable quantization details, so a trainer or server can check the contract before loading.
    meta["fp4convert"] = {
        "version": manifest["producer"]["version"],
        "contract": manifest["contract"]["name"],
        "contract_sha256": manifest["contract_sha256"],
        "dialect": manifest["dialect"],
        "quantizer_profile": manifest["quantizer_profile"],
        "activation_mode": manifest["activation_mode"],
        "formats": {fmt: manifest["formats"][fmt] for fmt in _ordered_formats(manifest["formats"])},
    }
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, default_flow_style=False) + "---\n"


def _quantized_section(tensors: Mapping[str, Mapping[str, Any]]) -> list[str]:
    per_format: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    per_role: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for info in tensors.values():
        stored = _stored(info)
        totals = per_format[info["format"]]
        totals[0] += 1
        totals[1] += _params(info["shape"])
        totals[2] += stored
        role = per_role[(info["role"], info["format"])]
        role[0] += 1
        role[1] += stored
    everything = sum(t[2] for t in per_format.values()) or 1
    lines = ["## What was quantized", ""]
    lines += _table(
        ("format", "tensors", "parameters", "stored", "share"),
        (
            (f, f"{t[0]:,}", f"{t[1]:,}", human_bytes(t[2]), f"{100 * t[2] / everything:.1f}%")
            for f in _ordered_formats(per_format)
            for t in [per_format[f]]
        ),
    )
    lines += [
        "",
        "Stored bytes count every tensor a format writes (NVFP4: packed data, E4M3 block scales, "
        "FP32 outer and input scales; MXFP8: E4M3 data and E8M0 block scales).",
        "",
        "Per role:",
        "",
    ]
    order = {f: i for i, f in enumerate(_FORMAT_ORDER)}
    lines += _table(
        ("role", "format", "tensors", "stored"),
        (
            (role, fmt, f"{t[0]:,}", human_bytes(t[1]))
            for (role, fmt), t in sorted(per_role.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 9)))
        ),
    )
    return lines


def _decisions(tensors: Mapping[str, Mapping[str, Any]], want_bf16: bool) -> list[tuple[object, ...]]:
    """Rows ``(format, rule, tensors, example, reason)`` grouped by the deciding rule and its reason.

    A reason reads ``"<format> from <rule>: <why>"``; the row keeps only ``<why>``.
    """
    groups: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for name, info in tensors.items():
        if (info["format"] == "bf16") == want_bf16:
            groups[(info["format"], info["rule"], info["reason"])].append(name)
    rows = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return [
        (fmt, f"`{rule}`", f"{len(names):,}", f"`{names[0]}`", _why(reason, fmt, rule))
        for (fmt, rule, reason), names in rows
    ]


def _why(reason: str, fmt: str, rule: str) -> str:
    return reason.removeprefix(f"{fmt} from {rule}: ").replace("|", "\\|")


def _source_section(manifest: Mapping[str, Any]) -> list[str]:
    """How the source stored its tensors, the dequantizer of each quantized format, and which tensors
    come back exactly (dequantized output == dequantized source) and why; nothing for a plain source
    whose every tensor is quantized from its dense values or copied."""
    tensors = manifest["tensors"]
    groups: dict[tuple[str, str, str, str], list[str]] = defaultdict(list)
    for name, info in tensors.items():
        if "lossless" not in info:  # a manifest from before source formats were recorded
            return []
        verdict = {True: "lossless", False: "not lossless", None: "if its values allow"}[info["lossless"]]
        groups[(info["source_format"] or "dense", info["format"], verdict, info["lossless_why"])].append(name)
    dequantizers = manifest["source"].get("dequantizers") or {}
    if all(key[0] == "dense" for key in groups) and not dequantizers:
        return []
    lines = ["## Source formats, and what is lossless", ""]
    lines += [f"- `{enc}` is dequantized once, for every consumer: `{how}`" for enc, how in dequantizers.items()]
    lines += [
        *([""] if dequantizers else []),
        "Lossless: dequantizing the stored tensor gives the dequantized source bit for bit "
        "(`fp4convert verify --source` proves each such tensor).",
        "",
    ]
    rows = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    lines += _table(
        ("source format", "format", "lossless", "tensors", "example", "why"),
        (
            (f"`{src}`", fmt, verdict, f"{len(names):,}", f"`{names[0]}`", why.replace("|", "\\|"))
            for (src, fmt, verdict, why), names in rows
        ),
    )
    return [*lines, ""]


def _serving_section(contract: Contract, manifest: Mapping[str, Any], repo_id: str) -> list[str]:
    mode = manifest["activation_mode"]
    lines = ["## Serving", "", _LOADING.get(manifest["dialect"], ""), ""]
    if mode == "per-token":
        lines += [
            "**Activations: per-token NVFP4 scales.** `input_scale` is stored as 1.0 and is not a calibrated "
            "scale: the engine must compute activation scales per token (the "
            "`SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION=1` line below; in vLLM, ModelOpt MoE experts only: "
            '`--quantization-config \'{"moe": {"activation": "nvfp4_per_token"}}\'`). Without it, 1.0 is taken as a '
            "calibrated scale: activation blocks with an amax below about 0.09 fall into E4M3 subnormals "
            "and blocks above 2688 overflow.",
            "",
        ]
    elif mode == "calibrated":
        lines += [
            "**Activations: calibrated.** `input_scale` holds calibrated activation amaxes "
            "(`amax / (6 * 448)`), used as per-tensor activation scales.",
            "",
        ]
    else:
        lines += ["**Activations:** no NVFP4 tensor, so no activation scale is stored.", ""]
    env = emit(contract, "env")
    if "nvfp4" in manifest["formats"]:
        lines += [
            "The FP4 quantize kernels of TensorRT-LLM and FlashInfer must run without fast math "
            "(`*_DISABLE_FP4_QUANT_FAST_MATH=1`): fast math changes the rounding, and the sampler would "
            "no longer quantize activations the way the learner does.",
            "",
        ]
    lines += ["Environment the contract requires:", "", "```bash", env.text.rstrip() or "# none", "```", ""]
    try:
        sglang = emit(contract, "sglang-args")
    except ContractError as exc:
        lines += [f"SGLang: {exc.message}.", ""]
        sglang = None
    if sglang is not None:
        flags = sglang.text.splitlines()  # one flag with its value per line
        method = next((f.split()[1] for f in flags if f.startswith("--quantization ")), None)
        if method is not None and _SGLANG_DIALECT.get(method) != manifest["dialect"]:
            rest = " ".join(f for f in flags if not f.startswith("--quantization "))
            lines += [
                f"SGLang picks the loader from `config.json` for the {manifest['dialect']} dialect "
                f"(`--quantization {method}` is for the {_SGLANG_DIALECT.get(method)} dialect); "
                f"the other flags the contract requires: `{rest}`.",
                "",
            ]
        else:
            command = f"python -m sglang.launch_server --model-path {repo_id} {' '.join(flags)}"
            lines += ["```bash", command.rstrip(), "```", ""]
    notes = (*env.notes, *(sglang.notes if sglang is not None else ()))
    lines += [f"- {note}" for note in dict.fromkeys(notes)] + ([""] if notes else [])
    lines += [
        "The TransformerEngine precision file and the Megatron flags of the learner come from the same "
        "contract (below, saved as contract.yaml): "
        "`fp4convert contract emit contract.yaml --target te-yaml` (or `megatron-args`).",
        "",
    ]
    return lines


def render_card(
    manifest: Mapping[str, Any],
    *,
    repo_id: str,
    verification: str,
    compared_with_source: bool = False,
    base_model: str | None = None,
) -> str:
    """The README.md of a converted checkpoint (see the module docstring for its sections).

    Args:
        manifest: the parsed ``fp4convert.json``.
        repo_id: where it is published (named in the title and the serving command).
        verification: the one-line verify result (``VerifyReport.summary()``).
        compared_with_source: whether verification re-derived every byte from the BF16 source.
        base_model: the source repo id; default :func:`base_model_of` the manifest.

    Returns:
        The card text, YAML front matter first.

    Raises:
        HubError: the embedded contract is invalid or does not hash to the manifest's ``contract_sha256``.

    Example (not run: it needs a converted checkpoint in ``out``):
        >>> from fp4convert.checkpoint.manifest import read_manifest  # doctest: +SKIP
        >>> card = render_card(read_manifest("out"), repo_id="me/Qwen3-NVFP4",
        ...                    verification="OK: 120 checks passed")  # doctest: +SKIP
        >>> card.splitlines()[0]  # doctest: +SKIP
        '---'
    """
    from pydantic import ValidationError

    try:
        contract = Contract.model_validate(manifest["contract"])
    except ValidationError as exc:
        raise HubError(
            f"the manifest's embedded contract is not a valid contract ({exc.error_count()} errors, first: "
            f"{exc.errors()[0]['loc']}: {exc.errors()[0]['msg']})",
            hint="convert again; a card must describe the contract the bytes were made with",
        ) from exc
    if contract_hash(contract) != manifest["contract_sha256"]:
        raise HubError(
            "the manifest's embedded contract does not hash to its contract_sha256: the manifest was edited",
            hint="convert again; a card must describe the contract the bytes were made with",
        )
    base = base_model or base_model_of(manifest)
    source = manifest["source"]
    tensors = manifest["tensors"]
    formats = [f for f in _ordered_formats(manifest["formats"]) if f != "bf16"] or ["bf16"]
    producer = manifest["producer"]
    origin = f"[{base}](https://huggingface.co/{base})" if base else "a local checkpoint (its files' SHA-256 below)"
    lines = [
        f"# {repo_id}",
        "",
        f"{origin} converted to {' + '.join(f.upper() for f in formats)} (the rest BF16) by "
        f"fp4convert {producer['version']} under the precision contract `{contract.name}`, "
        f"in the **{manifest['dialect']}** dialect.",
        "",
        f"- contract SHA-256: `{manifest['contract_sha256']}`",
        f"- quantizer profile: `{manifest['quantizer_profile']}`; activation mode: `{manifest['activation_mode']}`",
        f"- model family: `{source['family']}`"
        + (f"; source revision `{source['revision']}`" if source.get("revision") else ""),
        "",
    ]
    if contract.description:
        lines += [f"> {contract.description.strip()}", ""]
    lines += _quantized_section(tensors)
    source_lines = _source_section(manifest)
    if source_lines:
        lines += ["", *source_lines]
    lines += ["", "## What stayed BF16, and why", ""]
    bf16 = [row[1:] for row in _decisions(tensors, want_bf16=True)]
    lines += _table(("deciding rule", "tensors", "example", "reason"), bf16) if bf16 else ["Nothing."]
    lines += ["", "Quantized tensors by deciding rule:", ""]
    low = _decisions(tensors, want_bf16=False)
    lines += _table(("format", "deciding rule", "tensors", "example", "reason"), low) if low else ["None."]
    lines += ["", *_serving_section(contract, manifest, repo_id)]
    reproduce = f"fp4convert verify <this folder> --source {base or '<the BF16 source>'}"
    again = (
        "was re-derived from the BF16 source before publishing; repeat it with"
        if compared_with_source
        else ("can be re-derived from the BF16 source and compared with")
    )
    lines += [
        "## Verification",
        "",
        f"`fp4convert verify` before publishing: **{verification}**",
        "",
        f"Every byte {again}: `{reproduce}`.",
        "",
    ]
    lines += [
        "## Contract",
        "",
        "<details><summary>the embedded contract</summary>",
        "",
        "```yaml",
        contract.to_yaml().rstrip(),
        "```",
        "",
        "</details>",
        "",
    ]
    lines += ["## Source files", "", "<details><summary>SHA-256 of the files read</summary>", ""]
    lines += _table(
        ("file", "sha256"), ((f"`{name}`", f"`{digest}`") for name, digest in sorted(source["files"].items()))
    )
    lines += ["", "</details>", ""]
    return _front_matter(manifest, base) + "\n" + "\n".join(lines)
