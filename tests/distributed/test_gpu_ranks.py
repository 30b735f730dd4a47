"""On CUDA: one process on the GPU, and ranks sharing the GPUs there are, write the CPU output byte for byte."""

from __future__ import annotations

import pytest
import torch
from _helpers import NVFP4_EXPERTS
from _ranks import ALL_LINEAR, assert_same_output

from fp4convert.convert.execute import convert_checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("model", ["qwen3_moe", "deepseek_v3"])
def test_cuda_one_process_and_three_ranks_write_the_cpu_bytes(model, clusters, tiny_checkpoint, tmp_path):
    src = tiny_checkpoint(model)
    contract = tmp_path / "all-linear.yaml"
    contract.write_text(ALL_LINEAR)
    convert_checkpoint(src, tmp_path / "cpu", contract=contract, max_shard_size=40_000)
    convert_checkpoint(src, tmp_path / "cuda", contract=contract, max_shard_size=40_000, device="cuda")
    assert_same_output(tmp_path / "cpu", tmp_path / "cuda", also_differs=("device",))
    out = clusters(3).run(
        "convert", str(src), str(tmp_path / "ranks"), contract=str(contract), max_shard_size=40_000, device="cuda"
    )
    assert all(r["ok"] for r in out.values()), out
    assert_same_output(tmp_path / "cpu", tmp_path / "ranks", also_differs=("device",))


def test_nvfp4_experts_on_cuda_match_the_cpu(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("qwen3_moe")
    convert_checkpoint(src, tmp_path / "cpu", contract=NVFP4_EXPERTS)
    convert_checkpoint(src, tmp_path / "cuda", contract=NVFP4_EXPERTS, device="cuda", workers=8)
    assert_same_output(tmp_path / "cpu", tmp_path / "cuda", also_differs=("device",))
