"""Bad quantized and fused sources (docs/sources.md) for the corpus: FP8 block-scaled, UE8M0, MXFP4
and fused 3-D expert checkpoints whose headers or config.json lie. Each case turns the workspace's
tiny BF16 source into a good source of that format (tests/_sources.py, independent of fp4convert),
then breaks one thing; every source command must refuse it with one error naming the tensor (or
field) before anything is written, as for any other bad source (:mod:`hostile.table`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import _sources
import torch
from hostile.cases import EXPERT, Case
from hostile.corpus import Workspace, edit_json, edit_tensors

Tensors = dict[str, torch.Tensor]
#: a layer's fused expert tensors (fused and MXFP4 sources); EXPERT's scale (FP8 sources)
GATE_UP = "model.layers.0.mlp.experts.gate_up_proj"
DOWN = "model.layers.0.mlp.experts.down_proj"
SCALE = EXPERT + "_scale_inv"
_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
#: format -> builder of a good source of that format from the BF16 source (grids with edge blocks)
_BUILDERS: dict[str, Callable[[Path, Path], Path]] = {
    "fp8": lambda s, d: _sources.fp8_checkpoint(s, d, block=(32, 48)),
    "ue8m0": lambda s, d: _sources.fp8_checkpoint(s, d, block=(32, 64), ue8m0=True),
    "mxfp4": _sources.mxfp4_checkpoint,
    "fused": _sources.fused_checkpoint,
}


def _source(
    kind: str, tensor: str | None = None, edit: Callable[[Tensors], None] | None = None, config=None
) -> Callable[[Workspace], None]:
    """Make ``ws.src`` a good ``kind`` source, then let ``edit`` change the shard holding ``tensor``
    and ``config`` change config.json."""

    def build(ws: Workspace) -> None:
        built = _BUILDERS[kind](ws.src, ws.root / "built")
        shutil.rmtree(ws.src)
        built.rename(ws.src)
        if edit is not None:
            assert tensor is not None
            edit_tensors(ws.src, tensor, edit)
        if config is not None:
            edit_json(ws.src / "config.json", config)

    return build


def _set(name: str, value: Callable[[Tensors], torch.Tensor]) -> Callable[[Tensors], None]:
    return lambda t: t.update({name: value(t)})


def _poke_scale(value: float) -> Callable[[Tensors], None]:
    def edit(t: Tensors) -> None:
        t[SCALE][1, 0] = value

    return edit


def _quantization(**fields: object) -> Callable[[dict], None]:
    return lambda c: c["quantization_config"].update(fields)


SOURCE_FORMAT_CASES: tuple[Case, ...] = (
    # FP8 block-scaled: the weight_scale_inv grid, its dtype, its values
    Case("source-format", "fp8-no-scale", _source("fp8", SCALE, lambda t: t.pop(SCALE)), rf"'{EXPERT}' has no"),
    Case(
        "source-format",
        "fp8-scale-shape",
        _source("fp8", SCALE, _set(SCALE, lambda t: torch.ones(5, 5))),
        rf"'{SCALE}' is F32 \[5, 5\].*needs F32 \[2, 1\]",
    ),
    Case(
        "source-format",
        "fp8-scale-dtype",
        _source("fp8", SCALE, _set(SCALE, lambda t: t[SCALE].to(torch.int32))),
        rf"'{SCALE}' is I32 \[2, 1\]",
    ),
    Case(
        "source-format",
        "fp8-scale-3d",
        _source("fp8", SCALE, _set(SCALE, lambda t: t[SCALE][None])),
        rf"'{SCALE}' is F32 \[1, 2, 1\]",
    ),
    Case("source-format", "fp8-nan-scale", _source("fp8", SCALE, _poke_scale(float("nan"))), r"nan.*block 1, 0"),
    Case("source-format", "fp8-zero-scale", _source("fp8", SCALE, _poke_scale(0.0)), r"block 1, 0"),
    Case("source-format", "ue8m0-not-power-of-two", _source("ue8m0", SCALE, _poke_scale(0.3)), r"scale_fmt: ue8m0"),
    # a quantization_config that lies about the tensors
    Case(
        "source-format",
        "config-block-size-lies",
        _source("fp8", config=_quantization(weight_block_size=[16, 16])),
        r"weight_block_size \[16, 16\]",
    ),
    Case(
        "source-format",
        "config-says-mxfp4-of-fp8",
        _source("fp8", config=_quantization(quant_method="mxfp4")),
        r"F8_E4M3, but config\.json declares no FP8 quantization_config",
    ),
    Case(
        "source-format",
        "config-says-fp8-of-mxfp4",
        _source("mxfp4", config=lambda c: c.update(quantization_config={**_FP8, "weight_block_size": [32, 32]})),
        r"experts\.(gate_up|down)_proj_blocks' looks like MXFP4 blocks, but config\.json declares no mxfp4",
    ),
    Case(
        "source-format",
        "config-says-fp8-of-bf16",
        lambda ws: edit_json(ws.src / "config.json", lambda c: c.update(quantization_config=_FP8)),
        r"declares quant_method fp8, but the checkpoint holds no F8_E4M3 tensor",
    ),
    Case(
        "source-format",
        "config-says-mxfp4-of-bf16",
        lambda ws: edit_json(
            ws.src / "config.json", lambda c: c.update(quantization_config={"quant_method": "mxfp4"})
        ),
        r"declares quant_method mxfp4, but the checkpoint holds no U8 \*_blocks tensor",
    ),
    Case(
        "source-format",
        "config-unknown-method",
        _source("fp8", config=_quantization(quant_method="bitsandbytes")),
        r"quant_method",
    ),
    # MXFP4 blocks and scales that do not belong together
    Case(
        "source-format",
        "mxfp4-no-scales",
        _source("mxfp4", GATE_UP + "_blocks", lambda t: t.pop(GATE_UP + "_scales")),
        rf"'{GATE_UP}_blocks' have no",
    ),
    Case(
        "source-format",
        "mxfp4-scales-shape",
        _source(
            "mxfp4",
            GATE_UP + "_scales",
            _set(GATE_UP + "_scales", lambda t: t[GATE_UP + "_scales"][:, :, :1].contiguous()),
        ),
        rf"MXFP4 tensors '{GATE_UP}_blocks'.*are not U8 blocks",
    ),
    Case(
        "source-format",
        "mxfp4-scales-dtype",
        _source("mxfp4", GATE_UP + "_scales", _set(GATE_UP + "_scales", lambda t: t[GATE_UP + "_scales"].float())),
        rf"'{GATE_UP}_scales' F32",
    ),
    Case(
        "source-format",
        "mxfp4-blocks-width",
        _source(
            "mxfp4",
            GATE_UP + "_blocks",
            _set(GATE_UP + "_blocks", lambda t: t[GATE_UP + "_blocks"][..., :8].contiguous()),
        ),
        r"are not U8 blocks \[E, rows, G, 16\]",
    ),
    Case(  # found by tests/hostile/test_fuzz_headers.py: the shape was read before it was checked
        "source-format",
        "mxfp4-blocks-1d",
        _source("mxfp4", GATE_UP + "_blocks", _set(GATE_UP + "_blocks", lambda t: t[GATE_UP + "_blocks"].reshape(-1))),
        rf"MXFP4 tensors '{GATE_UP}_blocks' U8 \[\d+\].*are not U8 blocks \[E, rows, G, 16\]",
    ),
    # fused 3-D experts with wrong dimensions
    Case(
        "source-format",
        "fused-2d",
        _source("fused", GATE_UP, _set(GATE_UP, lambda t: t[GATE_UP].reshape(-1, t[GATE_UP].shape[-1]))),
        rf"{GATE_UP} \[\d+, \d+\] and its down_proj .* not two 3-D tensors",
    ),
    Case(
        "source-format",
        "fused-expert-counts-differ",
        _source("fused", DOWN, _set(DOWN, lambda t: t[DOWN][:-1].contiguous())),
        r"with the same number of experts",
    ),
    Case(
        "source-format",
        "fused-no-layout",
        _source("fused", DOWN, _set(DOWN, lambda t: t[DOWN][:, :, :16].contiguous())),
        r"fit neither",
    ),
    Case(
        "source-format",
        "fused-more-experts-than-config",
        _source("fused", config=lambda c: c.update(num_experts=2)),
        r"experts\.[23]\.\w+\.weight.? (names expert [23], but there are 2 experts|is not a qwen3_moe tensor)",
    ),
    Case(
        "source-format", "fused-no-down", _source("fused", DOWN, lambda t: t.pop(DOWN)), r"has no .*down_proj sibling"
    ),
)
