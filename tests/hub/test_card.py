"""The model card: front matter, counts and bytes checked against the files on disk, reasons, serving."""

from __future__ import annotations

import copy
import math
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml
from _helpers import MXFP8_ALL, NVFP4_EXPERTS

from fp4convert import __version__
from fp4convert.checkpoint.manifest import read_manifest
from fp4convert.checkpoint.safetensors_io import read_header
from fp4convert.contract import Contract
from fp4convert.contract.emit import emit
from fp4convert.errors import HubError
from fp4convert.plan import human_bytes
from fp4convert.publish import base_model_of, render_card

REPO = "alice/tiny-moe-nvfp4"
OK = "OK: 172 checks passed (structure and hashes)"


def _front_matter(card: str) -> dict:
    match = re.match(r"^---\n(.*?)\n---\n", card, re.DOTALL)
    assert match, card[:200]
    return yaml.safe_load(match.group(1))


def _section(card: str, title: str) -> str:
    """The text of ``## title`` up to the next ``## ``."""
    start = card.index(f"\n## {title}\n")
    end = card.find("\n## ", start + 1)
    return card[start : end if end != -1 else None]


def _stored_bytes_on_disk(out: Path, manifest: dict) -> dict[str, int]:
    """Bytes per format, from the safetensors headers of the written shards (not from the manifest)."""
    fmt_of = {o: info["format"] for info in manifest["tensors"].values() for o in info["outputs"]}
    totals: Counter[str] = Counter()
    for shard in sorted(out.glob("*.safetensors")):
        for name, entry in read_header(shard)[0].items():
            totals[fmt_of[name]] += entry.nbytes
    return dict(totals)


def test_front_matter_without_a_hub_source(converted):
    out = converted()
    manifest = read_manifest(out)
    card = render_card(manifest, repo_id=REPO, verification=OK)
    assert _front_matter(card) == {
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "tags": ["fp4convert", "nvfp4", "modelopt", "qwen3_moe", "quantized"],
        "fp4convert": {
            "version": __version__,
            "contract": "nvfp4-experts-per-token",
            "contract_sha256": manifest["contract_sha256"],
            "dialect": "modelopt",
            "quantizer_profile": "te",
            "activation_mode": "per-token",
            "formats": {"nvfp4": 24, "bf16": 32},
        },
    }
    assert manifest["source"]["location"] not in card  # a local path is never published
    assert "a local checkpoint (its files' SHA-256 below)" in card
    for name, digest in manifest["source"]["files"].items():
        assert f"| `{name}` | `{digest}` |" in card


def test_base_model_from_a_repo_id_source(converted, tmp_path, monkeypatch):
    manifest = copy.deepcopy(read_manifest(converted()))
    manifest["source"] |= {"location": "Qwen/Qwen3-30B-A3B", "revision": "main"}
    card = render_card(manifest, repo_id=REPO, verification=OK)
    meta = _front_matter(card)
    assert (meta["base_model"], meta["base_model_relation"]) == ("Qwen/Qwen3-30B-A3B", "quantized")
    assert "[Qwen/Qwen3-30B-A3B](https://huggingface.co/Qwen/Qwen3-30B-A3B) converted to NVFP4" in card
    assert "; source revision `main`" in card
    assert "`fp4convert verify <this folder> --source Qwen/Qwen3-30B-A3B`" in card
    (tmp_path / "Qwen" / "Qwen3-30B-A3B").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # now it is also a relative local folder: not taken as a repo id
    assert base_model_of(manifest) is None
    assert (
        _front_matter(render_card(manifest, repo_id=REPO, verification=OK, base_model="Qwen/Other"))["base_model"]
        == "Qwen/Other"
    )


def test_format_and_role_tables_match_the_files(converted):
    out = converted()
    manifest = read_manifest(out)
    card = render_card(manifest, repo_id=REPO, verification=OK)
    on_disk = _stored_bytes_on_disk(out, manifest)
    total = sum(on_disk.values())
    params = defaultdict(int)
    for info in manifest["tensors"].values():
        params[info["format"]] += math.prod(info["shape"])
    section = _section(card, "What was quantized")
    for fmt, count in (("nvfp4", 24), ("bf16", 32)):
        row = (
            f"| {fmt} | {count} | {params[fmt]:,} | {human_bytes(on_disk[fmt])} | {100 * on_disk[fmt] / total:.1f}% |"
        )
        assert row in section
    assert "| routed_expert | nvfp4 | 24 | 27.188 KiB |" in section  # 24 x (data + scales) of 32x64 / 64x32
    assert "| router | bf16 | 2 | 1.000 KiB |" in section  # two [4, 64] BF16 routers


def test_every_bf16_tensor_is_explained_by_its_rule(converted):
    manifest = read_manifest(converted())
    card = render_card(manifest, repo_id=REPO, verification=OK)
    section = _section(card, "What stayed BF16, and why")
    per_rule = Counter(info["rule"] for info in manifest["tensors"].values() if info["format"] == "bf16")
    listed = Counter()
    for rule, count in re.findall(r"^\| `([^`]+)` \| (\d+) \|", section.split("Quantized tensors")[0], re.M):
        listed[rule] += int(count)
    assert listed == per_rule
    assert "| `bf16_exceptions.lm_head` | 1 | `lm_head.weight` | role lm_head is kept bf16 |" in section
    assert "| `default` | 15 | `model.layers.0.self_attn.k_proj.weight` | the contract default |" in section
    assert "| nvfp4 | `rules[1]` | 16 | `model.layers.0.mlp.experts.0.gate_proj.weight` |" in section


def test_serving_section_is_what_emit_renders(converted):
    manifest = read_manifest(converted())
    contract = Contract.model_validate(manifest["contract"])
    card = render_card(manifest, repo_id=REPO, verification=OK)
    serving = _section(card, "Serving")
    assert f"```bash\n{emit(contract, 'env').text}```" in serving
    assert "SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION=1" in serving
    assert "FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH=1" in serving and "without fast math" in serving
    assert "**Activations: per-token NVFP4 scales.** `input_scale` is stored as 1.0" in serving
    assert (
        f"```bash\npython -m sglang.launch_server --model-path {REPO} --quantization modelopt_fp4 "
        "--kv-cache-dtype bf16\n```"
    ) in serving
    assert "- SGLang has no flag for the expert-tensor-parallel size" in serving  # emit's note
    verification = _section(card, "Verification")
    assert f"`fp4convert verify` before publishing: **{OK}**" in verification
    assert f"by fp4convert {__version__} under the precision contract `nvfp4-experts-per-token`" in card
    assert f"- contract SHA-256: `{manifest['contract_sha256']}`" in card
    assert contract.to_yaml().rstrip() in _section(card, "Contract")


def test_mxfp8_card(converted):
    manifest = read_manifest(converted("qwen3_moe", "sglang-mxfp8", MXFP8_ALL))
    card = render_card(manifest, repo_id=REPO, verification=OK)
    assert _front_matter(card)["tags"] == ["fp4convert", "mxfp8", "sglang-mxfp8", "qwen3_moe", "quantized"]
    serving = _section(card, "Serving")
    assert "**Activations:** no NVFP4 tensor, so no activation scale is stored." in serving
    assert "fast math" not in serving
    assert "```bash\nNVTE_BACKWARD_OVERRIDE=high_precision\n```" in serving
    assert f"--model-path {REPO} --quantization mxfp8 --kv-cache-dtype bf16" in serving
    assert "SGLang loads this checkpoint with `--quantization mxfp8`" in serving


def test_a_dialect_other_than_emits_gets_no_wrong_quantization_flag(converted):
    manifest = read_manifest(converted("qwen3_moe", "compressed-tensors", NVFP4_EXPERTS))
    serving = _section(render_card(manifest, repo_id=REPO, verification=OK), "Serving")
    assert "--quantization modelopt_fp4 " not in serving and "launch_server" not in serving
    assert (
        "SGLang picks the loader from `config.json` for the compressed-tensors dialect "
        "(`--quantization modelopt_fp4` is for the modelopt dialect); the other flags the contract "
        "requires: `--kv-cache-dtype bf16`."
    ) in serving


def test_calibrated_activation_mode(converted):
    manifest = copy.deepcopy(read_manifest(converted()))
    manifest["activation_mode"] = "calibrated"
    serving = _section(render_card(manifest, repo_id=REPO, verification=OK), "Serving")
    assert "**Activations: calibrated.** `input_scale` holds calibrated activation amaxes" in serving


def test_an_edited_manifest_contract_is_refused(converted):
    manifest = copy.deepcopy(read_manifest(converted()))
    manifest["contract"]["kv_cache"] = "fp8_e4m3"
    with pytest.raises(HubError, match=r"^the manifest's embedded contract does not hash to its contract_sha256"):
        render_card(manifest, repo_id=REPO, verification=OK)
    manifest["contract"]["kv_cache"] = "fp8"
    with pytest.raises(
        HubError,
        match=r"^the manifest's embedded contract is not a valid contract \(1 errors, "
        r"first: \('kv_cache',\): Input should be",
    ):
        render_card(manifest, repo_id=REPO, verification=OK)
