"""Source checkpoints made once per session from the tiny models (tests/_sources.py builds them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import _sources
import pytest

#: kind -> (builder of the source from the BF16 checkpoint, builder of its independent dequantization)
KINDS: dict[str, tuple[Callable[[Path, Path], Path], Callable[[Path, Path], Path] | None]] = {
    # edges not multiples of the block in every tiny tensor (64, 96, 32 ... against 48 and 32)
    "fp8": (lambda s, d: _sources.fp8_checkpoint(s, d, block=(32, 48)), _sources.fp8_dequantized),
    "fp8-128": (lambda s, d: _sources.fp8_checkpoint(s, d), _sources.fp8_dequantized),
    "ue8m0": (lambda s, d: _sources.fp8_checkpoint(s, d, block=(32, 64), ue8m0=True), _sources.fp8_dequantized),
    "mxfp4": (_sources.mxfp4_checkpoint, _sources.mxfp4_dequantized),
    "fused": (_sources.fused_checkpoint, None),
    "fused-transposed": (lambda s, d: _sources.fused_checkpoint(s, d, transposed=True), None),
}


@pytest.fixture(scope="session")
def source(tiny_checkpoint: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``source(kind, model="qwen3_moe", dequantized=False) -> Path``: a source checkpoint of ``kind``
    (:data:`KINDS`) made from tiny model ``model``, or its independent dequantization."""
    cache: dict[tuple[str, str, bool], Path] = {}

    def get(kind: str, model: str = "qwen3_moe", dequantized: bool = False) -> Path:
        key = (kind, model, dequantized)
        if key not in cache:
            make, dequantize = KINDS[kind]
            if dequantized:
                assert dequantize is not None, f"{kind} has no dequantized form"
                cache[key] = dequantize(get(kind, model), tmp_path_factory.mktemp(f"{kind}-{model}-deq") / "ckpt")
            else:
                cache[key] = make(tiny_checkpoint(model), tmp_path_factory.mktemp(f"{kind}-{model}") / "ckpt")
        return cache[key]

    return get
