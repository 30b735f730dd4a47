"""Large tensors written as the source stores them stream from the source file to their shard
(``fp4convert.convert.parallel._Run.copy_through``): the bytes, hashes and NaN / inf counts are
those of a tensor read whole. The tests stream every eligible tensor of a tiny checkpoint (the
size from which a tensor streams set to one byte, the step to 1000 bytes)."""

from __future__ import annotations

import json
import shutil

import _sources
import pytest
from _helpers import MXFP8_ALL, NVFP4_EXPERTS
from safetensors.torch import load_file, save_file

from fp4convert.checkpoint.source import open_checkpoint
from fp4convert.convert import parallel
from fp4convert.convert.execute import convert_checkpoint
from fp4convert.errors import ConversionError

SOURCES = {
    "qwen3_moe": lambda tiny, tmp: tiny("qwen3_moe"),
    "deepseek_v3 fp8": lambda tiny, tmp: _sources.fp8_checkpoint(tiny("deepseek_v3"), tmp / "fp8"),
    "qwen3_moe fused experts": lambda tiny, tmp: _sources.fused_checkpoint(tiny("qwen3_moe"), tmp / "fused"),
}


def _stream_everything(monkeypatch) -> list[str]:
    """From now on, stream every eligible tensor; returns the list the names streamed go to."""
    streamed: list[str] = []
    real = parallel._Run.copy_through

    def spy(self, item):
        streamed.append(item.info.name)
        real(self, item)

    monkeypatch.setattr(parallel, "_OWN_BUFFER_FROM_BYTES", 1)
    monkeypatch.setattr(parallel, "_STREAM_STEP_BYTES", 1000)
    monkeypatch.setattr(parallel._Run, "copy_through", spy)
    return streamed


def _same_files(one, other):
    names = sorted(p.name for p in one.iterdir())
    assert names == sorted(p.name for p in other.iterdir())
    for name in names:
        if name == "fp4convert.json":
            a, b = (json.loads((d / name).read_text()) for d in (one, other))
            a.pop("created"), b.pop("created")
            assert json.dumps(a) == json.dumps(b)
        else:
            assert (one / name).read_bytes() == (other / name).read_bytes(), name


@pytest.mark.parametrize(
    ("source", "contract"),
    [(source, NVFP4_EXPERTS) for source in SOURCES] + [("qwen3_moe", MXFP8_ALL)],  # DeepSeek's tiny MLA: no MXFP8
)
def test_streamed_copies_write_the_bytes_of_whole_reads(tiny_checkpoint, tmp_path, monkeypatch, source, contract):
    src = SOURCES[source](tiny_checkpoint, tmp_path)
    convert_checkpoint(src, tmp_path / "whole", contract=contract, workers=4)  # tiny tensors: all read whole
    streamed = _stream_everything(monkeypatch)
    convert_checkpoint(src, tmp_path / "streamed", contract=contract, workers=4)
    _same_files(tmp_path / "whole", tmp_path / "streamed")
    assert "model.embed_tokens.weight" in streamed and "model.norm.weight" in streamed
    # FP8 weights are decoded, fused experts split, quantized ones quantized: read whole
    view = open_checkpoint(src).view()
    assert all(view.unit_of(n).encoding == "dense" and view.unit_of(n).split == "none" for n in streamed)
    assert len(streamed) < len(view.tensors)


def test_a_streamed_copy_counts_its_nan_and_inf_values(tiny_checkpoint, tmp_path, monkeypatch):
    src = tmp_path / "src"
    shutil.copytree(tiny_checkpoint("qwen3_moe"), src)
    norm = "model.layers.0.input_layernorm.weight"
    index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    tensors = load_file(src / index[norm])
    tensors[norm].view(-1)[-1] = float("nan")  # in the last step of its stream
    tensors[norm].view(-1)[0] = float("-inf")
    save_file(tensors, src / index[norm], metadata={"format": "pt"})
    streamed = _stream_everything(monkeypatch)
    with pytest.raises(ConversionError, match=rf"{norm}: 1 nan, 1 inf"):
        convert_checkpoint(src, tmp_path / "dst", contract=NVFP4_EXPERTS)
    assert norm in streamed
