"""The bad inputs of the corpus, by family. Each is a small edit of a good input and the words the
refusal must contain (the file, tensor or field it names, and what is wrong).

* :data:`SOURCE_CASES` edit a copy of the tiny sharded Qwen3-MoE source (``ws.src``);
* :data:`OUTPUT_CASES` edit a copy of a good converted output (``ws.out``);
* :data:`CONTRACT_CASES` write a hostile contract file (``ws.contract``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from hostile.corpus import (
    INDEX,
    MANIFEST,
    Workspace,
    edit_header,
    edit_json,
    edit_tensors,
    raw_header,
    shard_of,
    write_raw,
)

#: tensors the source cases edit (a routed expert, quantized NVFP4 by the corpus contract; a norm;
#: an attention projection, kept BF16 by it)
EXPERT = "model.layers.0.mlp.experts.1.down_proj.weight"
UP = "model.layers.0.mlp.experts.1.up_proj.weight"  # an expert weight with a fused sibling (gate_proj)
NORM = "model.layers.0.post_attention_layernorm.weight"
ATTENTION = "model.layers.0.self_attn.o_proj.weight"
FIRST_SHARD = "model-00001-of-00008.safetensors"


@dataclass(frozen=True)
class Case:
    """One bad input: its family, its name, the edit, and what the refusal must say."""

    family: str
    name: str
    edit: Callable[[Workspace], None]
    says: str  # a regex the error (or the failure report) must match

    @property
    def id(self) -> str:
        return f"{self.family}/{self.name}"


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _set_config(**fields: object) -> Callable[[Workspace], None]:
    return lambda ws: edit_json(ws.src / "config.json", lambda c: c.update(fields))


def _retype(tensor: str, dtype: torch.dtype) -> Callable[[Workspace], None]:
    return lambda ws: edit_tensors(ws.src, tensor, lambda t: t.update({tensor: t[tensor].to(dtype)}))


def _index_entry(tensor: str, value: object) -> Callable[[Workspace], None]:
    return lambda ws: edit_json(ws.src / INDEX, lambda i: i["weight_map"].update({tensor: value}))


def _poke(tensor: str, *values: float) -> Callable[[Workspace], None]:
    def edit(tensors: dict[str, torch.Tensor]) -> None:
        flat = tensors[tensor].view(-1)
        for n, value in enumerate(values):
            flat[7 * n + 1] = value

    return lambda ws: edit_tensors(ws.src, tensor, edit)


def _lie(edit: Callable[[dict], object], tensor: str = EXPERT) -> Callable[[Workspace], None]:
    return lambda ws: edit_header(shard_of(ws.src, tensor), edit)


def _overlap(header: dict) -> None:
    second = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])[1]
    header[second]["data_offsets"] = [offset - 2 for offset in header[second]["data_offsets"]]


def _shift_offsets(header: dict) -> None:
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"] = [str(o) for o in header[name]["data_offsets"]]


def _duplicate_name(ws: Workspace) -> None:
    path = shard_of(ws.src, EXPERT)
    header, data = raw_header(path)
    text = json.dumps(header)
    name = next(k for k in header if k != "__metadata__")
    first = text.index(json.dumps(name))
    entry = text[first : text.index("}", first) + 1]
    write_raw(path, (text[:-1] + ", " + entry + "}").encode(), data)


def _append(path: Path, extra: bytes) -> None:
    path.write_bytes(path.read_bytes() + extra)


def _huge_length(ws: Workspace) -> None:
    path = shard_of(ws.src, EXPERT)
    header, data = raw_header(path)
    write_raw(path, header, data, length=2**63)


def _symlink_out(name: str) -> Callable[[Workspace], None]:
    def edit(ws: Workspace) -> None:
        target = ws.victim / name
        if (ws.src / name).is_file():
            os.replace(ws.src / name, target)
        else:
            target.write_text("{}")
        (ws.src / name).symlink_to(target)

    return edit


def _missing_gemm(ws: Workspace) -> None:
    edit_tensors(ws.src, EXPERT, lambda t: t.pop(EXPERT))


def _in_two_shards(ws: Workspace) -> None:
    copy = torch.ones(2, dtype=torch.bfloat16)
    other = shard_of(ws.src, "lm_head.weight")
    edit_tensors(ws.src, NORM, lambda t: t.update({"lm_head.weight": copy}))
    edit_json(ws.src / INDEX, lambda i: i["weight_map"].update({"lm_head.weight": other.name}))


def _absent_from_index(ws: Workspace) -> None:
    edit_json(ws.src / INDEX, lambda i: i["weight_map"].pop(NORM))


def _pickle_only(ws: Workspace) -> None:
    for path in ws.src.glob("*.safetensors"):
        path.unlink()
    (ws.src / INDEX).unlink()
    (ws.src / "pytorch_model.bin").write_bytes(b"\x80\x04\x95 not unpickled")


SOURCE_CASES: tuple[Case, ...] = (
    # truncated files
    Case("truncated", "shard-data", lambda ws: _truncate(shard_of(ws.src, EXPERT), -100), r"cover \d+ bytes of a"),
    Case(
        "truncated", "shard-header", lambda ws: _truncate(shard_of(ws.src, EXPERT), 40), r"header length \d+ exceeds"
    ),
    Case(
        "truncated", "empty-shard", lambda ws: _truncate(shard_of(ws.src, EXPERT), 0), r"too short to be a safetensors"
    ),
    Case(
        "truncated",
        "config",
        lambda ws: _truncate(ws.src / "config.json", 100),
        r"config\.json:? (is )?not (readable|valid) JSON",
    ),
    Case("truncated", "index", lambda ws: _truncate(ws.src / INDEX, 300), r"index\.json: not readable JSON"),
    # lying headers
    Case("lying-header", "length-prefix", _huge_length, r"header length 9223372036854775808 exceeds"),
    Case("lying-header", "shape", _lie(lambda h: h[EXPERT]["shape"].__setitem__(0, 65)), rf"'{EXPERT}' byte range"),
    Case("lying-header", "overlap", _lie(_overlap), r"overlaps the previous tensor"),
    Case("lying-header", "offsets-strings", _lie(_shift_offsets), r"not two non-negative integers"),
    Case("lying-header", "duplicate-name", _duplicate_name, r"is listed twice in the header"),
    Case("lying-header", "not-an-object", _lie(lambda h: [h]), r"the header is a JSON list, not an object"),
    Case("lying-header", "dtype", _lie(lambda h: h[EXPERT].update(dtype="Q4")), r"unsupported dtype 'Q4'"),
    Case(
        "lying-header", "metadata", _lie(lambda h: h.update(__metadata__={"n": 1})), r"__metadata__ is not an object"
    ),
    Case(
        "lying-header", "trailing-bytes", lambda ws: _append(shard_of(ws.src, EXPERT), bytes(16)), r"cover \d+ bytes"
    ),
    Case("lying-header", "index-wrong-shard", _index_entry(EXPERT, FIRST_SHARD), rf"maps '{EXPERT}' to .* not hold"),
    Case("lying-header", "index-no-map", lambda ws: (ws.src / INDEX).write_text('{"metadata": {}}'), r"no weight_map"),
    # traversal and symlinks
    Case("traversal", "index-parent", _index_entry(EXPERT, "../victim/evil.safetensors"), r"path separator"),
    Case("traversal", "index-absolute", _index_entry(EXPERT, "/etc/passwd"), r"'/etc/passwd', which is not a plain"),
    Case("traversal", "index-not-string", _index_entry(EXPERT, 3), r"is a JSON number, not a file name"),
    Case("traversal", "shard-symlink-out", _symlink_out(FIRST_SHARD), r"resolves to .*victim.*outside the source"),
    Case(
        "traversal", "side-file-symlink-out", _symlink_out("tokenizer.json"), r"tokenizer\.json resolves to .*outside"
    ),
    Case("traversal", "config-symlink-out", _symlink_out("config.json"), r"config\.json resolves to .*outside"),
    # configs that disagree with the tensors, and tensors that are not what their role needs
    Case("config", "more-layers", _set_config(num_hidden_layers=4), r"says 4 decoder layers \(num_hidden_layers=4\)"),
    Case("config", "fewer-layers", _set_config(num_hidden_layers=2), r"in layer 2, but the model has 2 layers"),
    Case("config", "hidden-size", _set_config(hidden_size=80), r"hidden_size=80"),
    Case("config", "more-experts", _set_config(num_experts=8), r"says 8 routed experts \(num_experts=8\)"),
    Case(
        "config", "vocab", _set_config(vocab_size=256), r"embed_tokens\.weight has shape \(128, 64\).*vocab_size=256"
    ),
    Case("config", "moe-intermediate", _set_config(moe_intermediate_size=48), r"moe_intermediate_size=48"),
    Case("config", "not-an-object", lambda ws: (ws.src / "config.json").write_text("[1]"), r"expected a JSON object"),
    Case("config", "unknown-model", _set_config(model_type="gpt9", architectures=["Gpt9"]), r"gpt9"),
    # found by feeding lying config.json values to convert: a trillion experts was listed (memory ran out);
    # a zero that divides was a ZeroDivisionError
    Case("config", "trillion-experts", _set_config(num_experts=10**12), r"describes up to [\d,]+ tensors"),
    Case("config", "layers-huge", _set_config(num_hidden_layers=10**9), r"describes up to [\d,]+ tensors"),
    Case(
        "config",
        "zero-kv-heads",
        _set_config(num_key_value_heads=0),
        r"num_key_value_heads` is 0, expected an integer of at least 1",
    ),
    Case("config", "zero-sparse-step", _set_config(decoder_sparse_step=0), r"decoder_sparse_step` is 0, expected"),
    Case("config", "negative-layers", _set_config(num_hidden_layers=-3), r"num_hidden_layers` is -3, expected"),
    Case("config", "gemm-missing", _missing_gemm, rf"{EXPERT} is missing \(config\.json implies it\)"),
    Case("config", "in-two-shards", _in_two_shards, r"'lm_head\.weight' is stored in both"),
    Case("config", "absent-from-index", _absent_from_index, rf"holds '{NORM}', which .*index\.json does not list"),
    Case("config", "int32-norm", _retype(NORM, torch.int32), rf"{NORM} is int32 where a norm tensor"),
    Case("config", "int8-weight", _retype(EXPERT, torch.int8), rf"{EXPERT} is int8 where a GEMM weight"),
    Case("config", "bool-weight", _retype(EXPERT, torch.bool), rf"{EXPERT} is bool where a GEMM weight"),
    Case(
        "config",
        "fp8-weight",
        _retype(EXPERT, torch.float8_e4m3fn),
        rf"{EXPERT}' is F8_E4M3, but config\.json declares no FP8 quantization_config",
    ),
    Case(
        "config",
        "1d-linear",
        lambda ws: edit_tensors(ws.src, EXPERT, lambda t: t.update({EXPERT: t[EXPERT].reshape(-1)})),
        rf"{EXPERT} is 1-D \(2048,\) where config\.json implies \(64, 32\)",
    ),
    Case(
        "config",
        "empty-tensor",
        lambda ws: edit_tensors(
            ws.src, EXPERT, lambda t: t.update({EXPERT: torch.zeros(0, 32, dtype=torch.bfloat16)})
        ),
        rf"{EXPERT} has shape \(0, 32\): no elements",
    ),
    Case("config", "pickle-only", _pickle_only, r"only pytorch_model\.bin.*never unpickles"),
    # non-finite data (the headers are fine: only what reads the data can tell)
    Case("nonfinite", "nan-expert", _poke(EXPERT, float("nan"), float("nan")), rf"{EXPERT}: 2 nan"),
    Case("nonfinite", "inf-norm", _poke(NORM, float("inf"), float("-inf")), rf"{NORM}: 2 inf"),
    Case("nonfinite", "nan-and-inf-bf16", _poke(ATTENTION, float("nan"), float("inf")), rf"{ATTENTION}: 1 nan, 1 inf"),
)


def _out_shard(ws: Workspace) -> Path:
    return ws.out / sorted(p.name for p in ws.out.glob("*.safetensors"))[1]


def _flip_data_byte(ws: Workspace) -> None:
    path = _out_shard(ws)
    blob = bytearray(path.read_bytes())
    blob[-3] ^= 0x40
    path.write_bytes(bytes(blob))


def _manifest(edit: Callable[[dict], object]) -> Callable[[Workspace], None]:
    return lambda ws: edit_json(ws.out / MANIFEST, edit)


def _first_output(manifest: dict) -> dict:
    return next(iter(next(iter(manifest["tensors"].values()))["outputs"].values()))


def _stray(name: str, content: bytes = b"x") -> Callable[[Workspace], None]:
    return lambda ws: (ws.out / name).write_bytes(content)


def _stray_shard(ws: Workspace) -> None:
    from safetensors.torch import save_file

    save_file({"model.layers.0.mlp.gate.weight": torch.zeros(4, 64)}, str(ws.out / "model-extra.safetensors"))


def _symlink_into_source(ws: Workspace) -> None:
    (ws.out / "tokenizer.json").symlink_to(ws.src / "config.json")


OUTPUT_CASES: tuple[Case, ...] = (
    Case(
        "stray-file", "python", _stray("modeling_evil.py", b"import os\nos.system('echo pwned')\n"), "modeling_evil.py"
    ),
    Case("stray-file", "safetensors", _stray_shard, r"model-extra\.safetensors"),
    Case(
        "stray-file", "tmp", _stray("model-00001-of-00008.safetensors.tmp"), r"model-00001-of-00008\.safetensors\.tmp"
    ),
    Case("stray-file", "folder", lambda ws: (ws.out / "extra").mkdir(), r"extra"),
    Case("traversal", "symlink-into-source", _symlink_into_source, r"tokenizer\.json"),
    Case(
        "traversal",
        "manifest-names-parent",
        _manifest(lambda m: _first_output(m).update(file="../evil.safetensors")),
        r"path separator|\.\./evil",
    ),
    Case(
        "tampered", "manifest-sha", _manifest(lambda m: _first_output(m).update(sha256="0" * 64)), r"sha256|manifest"
    ),
    Case(
        "tampered",
        "manifest-contract",
        _manifest(lambda m: m["contract"].update(default="nvfp4")),
        r"contract does not hash to contract_sha256",
    ),
    Case("tampered", "manifest-field", _manifest(lambda m: m.pop("tensors")), r"tensors is missing"),
    Case(
        "tampered",
        "manifest-shape-type",
        _manifest(lambda m: _first_output(m).update(shape="big")),
        r"shape is not a shape",
    ),
    Case(
        "truncated",
        "manifest",
        lambda ws: (ws.out / MANIFEST).write_text('{"manifest_version": 1, "dia'),
        r"not readable JSON",
    ),
    Case(
        "truncated",
        "output-shard",
        lambda ws: (_out_shard(ws)).write_bytes(_out_shard(ws).read_bytes()[:-64]),
        r"cover \d+ bytes|missing|differ",
    ),
    Case("tampered", "output-byte", _flip_data_byte, r"differ"),
    Case(  # found by fuzzing output headers: the shared-scale check read a [32, 4] block scale as the value
        "tampered",
        "scale-names-traded",
        lambda ws: edit_header(
            shard_of(ws.out, f"{UP}_scale"),
            lambda h: h.update({f"{UP}_scale": h[f"{UP}_scale_2"], f"{UP}_scale_2": h[f"{UP}_scale"]}),
        ),
        rf"{re.escape(UP)}_scale: .*F32 \[\], expected F8_E4M3",
    ),
    Case(  # no tensor's bytes change: verify reads the header's metadata too
        "tampered",
        "shard-metadata",
        lambda ws: edit_header(_out_shard(ws), lambda h: h.update({"__metadata__": {"format": "np"}})),
        r"metadata says format 'np', not 'pt'",
    ),
    Case(
        "tampered",
        "copied-file",
        lambda ws: (ws.out / "generation_config.json").write_text("{}"),
        r"generation_config\.json",
    ),
    Case("tampered", "config-json", lambda ws: (ws.out / "config.json").write_text("{nope"), r"config\.json"),
    Case(
        "tampered",
        "index",
        lambda ws: edit_json(ws.out / INDEX, lambda i: i["weight_map"].popitem()),
        r"weight_map|index",
    ),
    Case("missing", "manifest", lambda ws: (ws.out / MANIFEST).unlink(), r"has no fp4convert\.json"),
    Case("missing", "shard", lambda ws: _out_shard(ws).unlink(), r"missing"),
)

_GOOD = """version: 1
name: hostile
default: bf16
rules:
  - {kind: glob, namespace: hf, pattern: '*.mlp.experts.*', format: nvfp4}
"""
_BOMB = "".join(f"  {chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9))


def _contract(text: str | bytes, suffix: str = ".yaml") -> Callable[[Workspace], None]:
    def edit(ws: Workspace) -> None:
        ws.contract.unlink()
        ws.contract = ws.contract.with_suffix(suffix)
        if isinstance(text, bytes):
            ws.contract.write_bytes(text)
        else:
            ws.contract.write_text(text)

    return edit


def _misspelled(ws: Workspace) -> None:
    ws.contract.unlink()
    ws.contract = Path("nvfp4-experts-per-tokn")  # a shipped name, misspelled


def _directory(ws: Workspace) -> None:
    ws.contract.unlink()
    ws.contract = ws.root / "contracts.d"
    ws.contract.mkdir()


CONTRACT_CASES: tuple[Case, ...] = (
    Case(
        "contract",
        "alias-bomb",
        _contract(_GOOD + "description: &a [x, x, x, x, x, x, x, x, x]\nextra:\n" + _BOMB),
        r"aliases expand",
    ),
    Case(
        "contract",
        "recursive-alias",
        _contract(_GOOD.replace("name: hostile", "name: &n [*n]")),
        r"refers to a node that contains it",
    ),
    Case("contract", "too-large", _contract(_GOOD + "#" * (1 << 20)), r"larger than 1048576 bytes"),
    Case(
        "contract",
        "python-tag",
        _contract(_GOOD + "description: !!python/object/apply:os.system [echo pwned]\n"),
        r"invalid YAML",
    ),
    Case(
        "contract",
        "deep-nesting",
        _contract(_GOOD + "description: " + "[" * 200 + "]" * 200 + "\n"),
        r"nests deeper than 64 levels",
    ),
    Case(
        "contract",
        "backreference",
        _contract(_GOOD + "  - {kind: regex, namespace: hf, pattern: '(a)\\1', format: mxfp8}\n"),
        r"backreference",
    ),
    Case(
        "contract",
        "lookahead",
        _contract(_GOOD + "  - {kind: regex, namespace: hf, pattern: '(?=.*gate).*', format: mxfp8}\n"),
        r"lookahead",
    ),
    Case("contract", "misspelled-shipped-name", _misspelled, r"did you mean 'nvfp4-experts-per-token'\?"),
    Case("contract", "control-character", _contract(_GOOD + "description: \x01\n"), r"invalid YAML"),
    Case(
        "contract",
        "json-duplicate-key",
        _contract('{"version": 1, "version": 1}', ".json"),
        r"duplicate key 'version'",
    ),
    Case("contract", "not-utf8", _contract(b"version: 1\nname: \xff\xfe\n"), r"cannot read the file"),
    Case("contract", "empty", _contract(""), r"the file is empty"),
    Case("contract", "directory", _directory, r"unsupported file extension|contracts\.d"),
    Case("contract", "unknown-field", _contract(_GOOD + "precisoin: high\n"), r"unknown field 'precisoin'"),
)
