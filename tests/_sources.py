"""Source checkpoints for tests/sources, made and decoded by code independent of fp4convert.

Builders turn a tiny BF16 checkpoint (``tiny_checkpoint`` in conftest.py, written by transformers'
own classes) into the formats the field ships: FP8 block-scaled (optionally with power-of-two
``ue8m0`` scales), MXFP4 experts in gpt-oss's ``*_blocks`` / ``*_scales`` layout, and fused 3-D
experts. The reference decoders are written from the formats' definitions, bit by bit in numpy
(E4M3 fields, BF16 round-to-nearest-even on the float32 bits), never through fp4convert or
torch's float8 casts, so a test comparing fp4convert's bytes with them compares two
implementations. Nothing here imports fp4convert.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

INDEX = "model.safetensors.index.json"
E2M1_TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
_KEEP_HIGH = ("embed_tokens", "lm_head", "norm", "mlp.gate.weight", "shared_head.head")
_EXPERT = re.compile(r"^(?P<prefix>.+\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")


# -- reference decoders -------------------------------------------------------------------------
def e4m3_values(codes: np.ndarray) -> np.ndarray:
    """float32 values of E4M3 ("fn") codes from their bit fields; NaN for 0x7F/0xFF."""
    codes = codes.astype(np.int64)
    sign = np.where(codes >> 7, -1.0, 1.0)
    exponent, mantissa = (codes >> 3) & 0xF, codes & 0x7
    normal = (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0)
    subnormal = (mantissa / 8.0) * 2.0**-6
    values = sign * np.where(exponent == 0, subnormal, normal)
    values = np.where((exponent == 15) & (mantissa == 7), np.nan, values)
    return values.astype(np.float32)


def bf16_from_float32(values: np.ndarray) -> torch.Tensor:
    """float32 -> bfloat16 by round-to-nearest-even on the bits (NaN -> 0x7FC0)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = np.where(np.isnan(values), 0x7FC0, rounded).astype(np.uint16)
    return torch.from_numpy(out.view(np.int16).copy()).view(torch.bfloat16)


def reference_fp8_dequant(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """DeepSeek's cast from its definition: bf16(fp32(e4m3) * fp32 scale of the element's block);
    a 3-D (fused experts) tensor expert by expert."""
    if weight.dim() == 3:
        return torch.stack([reference_fp8_dequant(w, s, block) for w, s in zip(weight, scale, strict=True)])
    codes = weight.contiguous().view(torch.uint8).numpy()
    rows, cols = codes.shape
    s = scale.float().numpy()
    grid = np.repeat(np.repeat(s, block[0], axis=0), block[1], axis=1)[:rows, :cols]
    return bf16_from_float32(e4m3_values(codes) * grid).reshape(rows, cols)


def reference_mxfp4_dequant(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 from its definition: low nibble first, value = table[code] * 2**(scale - 127), to bf16."""
    b = blocks.numpy().astype(np.int64)
    codes = np.stack([b & 0xF, b >> 4], axis=-1).reshape(*b.shape[:-1], b.shape[-1] * 2)
    values = np.asarray(E2M1_TABLE, dtype=np.float32)[codes]
    factor = np.ldexp(np.float32(1.0), scales.numpy().astype(np.int32) - 127).astype(np.float32)
    with np.errstate(over="ignore"):  # codes 253/254 times 4 or 6 overflow: +-inf, as IEEE says
        out = values * factor[..., None]
    return bf16_from_float32(out).reshape(*b.shape[:-2], b.shape[-2] * 32)


# -- quantizers (building sources only) ---------------------------------------------------------
def quantize_fp8_block(
    w: torch.Tensor, block: tuple[int, int], *, ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """One weight to E4M3 codes and float32 block scales (amax / 448; a power of two with ue8m0); a
    3-D (fused experts) tensor expert by expert."""
    if w.dim() == 3:
        pairs = [quantize_fp8_block(expert, block, ue8m0=ue8m0) for expert in w]
        return torch.stack([c for c, _ in pairs]), torch.stack([s for _, s in pairs])
    x = w.float().numpy()
    rows, cols = x.shape
    bm, bn = block
    scales = np.ones((math.ceil(rows / bm), math.ceil(cols / bn)), dtype=np.float32)
    q = np.zeros_like(x)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            tile = x[i * bm : (i + 1) * bm, j * bn : (j + 1) * bn]
            amax = float(np.abs(tile).max())
            s = amax / 448.0 if amax > 0 else 1.0
            if ue8m0:
                s = 2.0 ** math.ceil(math.log2(s))
            scales[i, j] = s
            q[i * bm : (i + 1) * bm, j * bn : (j + 1) * bn] = np.clip(tile / np.float32(s), -448, 448)
    codes = torch.from_numpy(q).to(torch.float8_e4m3fn)
    return codes, torch.from_numpy(scales)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of 32-value blocks to (blocks [..., G, 16] uint8, scales [..., G] uint8): OCP's shared
    exponent floor(log2(amax)) - 2, nearest magnitude code, saturating at 6."""
    x = w.float().numpy()
    lead, cols = x.shape[:-1], x.shape[-1]
    g = x.reshape(*lead, cols // 32, 32)
    amax = np.abs(g).max(axis=-1)
    k = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 2, -127).astype(np.int32)
    scaled = g / np.ldexp(np.float32(1.0), k)[..., None]
    magnitudes = np.asarray(E2M1_TABLE[:8], dtype=np.float32)
    index = np.abs(np.abs(scaled)[..., None] - magnitudes).argmin(axis=-1)
    codes = index + 8 * (scaled < 0)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return torch.from_numpy(packed), torch.from_numpy((k + 127).astype(np.uint8))


# -- checkpoint transforms ----------------------------------------------------------------------
def _copy_side_files(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != INDEX:
            shutil.copy2(f, dst / f.name)


def _config(dst: Path, update: Callable[[dict], None]) -> None:
    config = json.loads((dst / "config.json").read_text())
    update(config)
    (dst / "config.json").write_text(json.dumps(config, indent=2))


def _shards(src: Path) -> list[Path]:
    return sorted(src.glob("*.safetensors"))


def _save(dst: Path, shards: dict[str, dict[str, torch.Tensor]]) -> None:
    weight_map = {}
    for name, tensors in shards.items():
        save_file(tensors, str(dst / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    if len(shards) > 1:
        (dst / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def is_fp8_linear(name: str, tensor: torch.Tensor) -> bool:
    """Which tensors an FP8 release stores in FP8: 2-D Linear weights but embeddings, norms, the router."""
    return tensor.dim() == 2 and name.endswith(".weight") and not any(k in name for k in _KEEP_HIGH)


def fp8_checkpoint(
    src: Path,
    dst: Path,
    *,
    block: tuple[int, int] = (128, 128),
    ue8m0: bool = False,
    which: Callable[[str, torch.Tensor], bool] = is_fp8_linear,
) -> Path:
    """``src`` with its Linear weights as FP8 E4M3 + ``weight_scale_inv`` (the shards kept)."""
    _copy_side_files(src, dst)
    out = {}
    for path in _shards(src):
        tensors = {}
        for name, t in load_file(str(path)).items():
            if which(name, t):
                tensors[name], tensors[name + "_scale_inv"] = quantize_fp8_block(t, block, ue8m0=ue8m0)
            else:
                tensors[name] = t
        out[path.name] = tensors
    _save(dst, out)
    q = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(block)}
    _config(dst, lambda c: c.update(quantization_config={**q, **({"scale_fmt": "ue8m0"} if ue8m0 else {})}))
    return dst


def fp8_dequantized(src: Path, dst: Path) -> Path:
    """The BF16 checkpoint of an FP8 one, by :func:`reference_fp8_dequant` (scales dropped)."""
    _copy_side_files(src, dst)
    block = tuple(json.loads((src / "config.json").read_text())["quantization_config"]["weight_block_size"])
    out = {}
    for path in _shards(src):
        stored = load_file(str(path))
        tensors = {}
        for name, t in stored.items():
            if name.endswith("_scale_inv"):
                continue
            tensors[name] = (
                reference_fp8_dequant(t, stored[name + "_scale_inv"], block) if t.dtype == torch.float8_e4m3fn else t
            )
        out[path.name] = tensors
    _save(dst, out)
    _config(dst, lambda c: c.pop("quantization_config"))
    return dst


def _experts(tensors: dict[str, torch.Tensor]) -> dict[str, dict[int, dict[str, torch.Tensor]]]:
    """prefix -> expert -> projection -> weight, for every per-expert tensor."""
    found: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name, t in tensors.items():
        m = _EXPERT.match(name)
        if m:
            found.setdefault(m["prefix"], {}).setdefault(int(m["e"]), {})[m["proj"]] = t
    return found


def _gate_up(expert: dict[str, torch.Tensor], interleaved: bool) -> torch.Tensor:
    gate, up = expert["gate"], expert["up"]
    if interleaved:
        return torch.stack([gate, up], dim=1).reshape(-1, gate.shape[1])  # rows g0, u0, g1, u1 ...
    return torch.cat([gate, up])


def _load_all(src: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in _shards(src):
        tensors.update(load_file(str(path)))
    return tensors


def fused_checkpoint(src: Path, dst: Path, *, transposed: bool = False, interleaved: bool = False) -> Path:
    """``src`` with each MoE layer's experts as 3-D ``gate_up_proj`` / ``down_proj`` (one shard)."""
    _copy_side_files(src, dst)
    tensors = _load_all(src)
    experts = _experts(tensors)
    out = {n: t for n, t in tensors.items() if not _EXPERT.match(n)}
    for prefix, by_id in experts.items():
        ids = sorted(by_id)
        gate_up = torch.stack([_gate_up(by_id[e], interleaved) for e in ids])
        down = torch.stack([by_id[e]["down"] for e in ids])
        if transposed:
            gate_up, down = gate_up.transpose(1, 2).contiguous(), down.transpose(1, 2).contiguous()
        out[f"{prefix}.gate_up_proj"], out[f"{prefix}.down_proj"] = gate_up, down
    _save(dst, {"model.safetensors": out})
    return dst


def mxfp4_checkpoint(src: Path, dst: Path, *, interleaved: bool = False) -> Path:
    """``src`` with its experts as gpt-oss-style MXFP4 ``*_blocks`` / ``*_scales`` (one shard)."""
    _copy_side_files(src, dst)
    tensors = _load_all(src)
    out = {n: t for n, t in tensors.items() if not _EXPERT.match(n)}
    for prefix, by_id in _experts(tensors).items():
        ids = sorted(by_id)
        for proj, stacked in (
            ("gate_up_proj", torch.stack([_gate_up(by_id[e], interleaved) for e in ids])),
            ("down_proj", torch.stack([by_id[e]["down"] for e in ids])),
        ):
            blocks, scales = quantize_mxfp4(stacked)
            out[f"{prefix}.{proj}_blocks"], out[f"{prefix}.{proj}_scales"] = blocks, scales
    _save(dst, {"model.safetensors": out})
    _config(dst, lambda c: c.update(quantization_config={"quant_method": "mxfp4"}))
    return dst


def mxfp4_dequantized(
    src: Path, dst: Path, *, interleaved: bool = False, leaves: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")
) -> Path:
    """The per-expert BF16 checkpoint of an MXFP4 one, by :func:`reference_mxfp4_dequant`."""
    _copy_side_files(src, dst)
    tensors = _load_all(src)
    out = {}
    for name, t in tensors.items():
        if name.endswith("_scales"):
            continue
        if not name.endswith("_blocks"):
            out[name] = t
            continue
        base = name.removesuffix("_blocks")
        prefix, proj = base.rsplit(".", 1)
        values = reference_mxfp4_dequant(t, tensors[base + "_scales"])
        for e in range(values.shape[0]):
            if proj == "down_proj":
                out[f"{prefix}.{e}.{leaves[2]}.weight"] = values[e].clone()
                continue
            rows = values[e]
            gate, up = (rows[0::2], rows[1::2]) if interleaved else rows.chunk(2)
            out[f"{prefix}.{e}.{leaves[0]}.weight"] = gate.clone()
            out[f"{prefix}.{e}.{leaves[1]}.weight"] = up.clone()
    _save(dst, {"model.safetensors": out})
    _config(dst, lambda c: c.pop("quantization_config"))
    return dst


def all_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every shard of a checkpoint folder."""
    return _load_all(directory)


def assert_same_tensors(actual_dir: Path, expected_dir: Path) -> int:
    """Same tensor names, dtypes, shapes and bytes in two checkpoint folders; returns the count."""
    actual, expected = _load_all(actual_dir), _load_all(expected_dir)
    assert sorted(actual) == sorted(expected), sorted(set(actual) ^ set(expected))[:5]
    for name, e in expected.items():
        a = actual[name]
        assert (a.dtype, a.shape) == (e.dtype, e.shape), name
        assert torch.equal(a.reshape(-1).view(torch.uint8), e.reshape(-1).view(torch.uint8)), name
    return len(expected)
