"""Careless arguments: a device that does not exist, a shard size of zero, a destination that is the
source or lies inside it, an unwritable plot path... Each is refused before any work, with the
option named, under the same guarantees as the rest of the corpus."""

from __future__ import annotations

import re

import pytest
import torch
from _helpers import NVFP4_EXPERTS
from hostile.cases import EXPERT
from hostile.corpus import ERROR, USAGE, Expect, judge, run_cli


def _written(ws, name: str, text: str):
    """A file of the workspace holding ``text`` (written outside every folder a command may write)."""
    path = ws.root / name
    path.write_text(text)
    return path


# name -> (argv builder over the workspace, expectation)
ARGUMENTS = {
    "convert-device-bogus": (
        lambda ws: ["convert", ws.src, ws.dst, "--contract", NVFP4_EXPERTS, "--device", "bogus"],
        Expect(ERROR, r"device 'bogus' \(--device bogus\) is not cpu, cuda or cuda:N"),
    ),
    "convert-device-absent-gpu": (
        lambda ws: ["convert", ws.src, ws.dst, "--contract", NVFP4_EXPERTS, "--device", "cuda:7"],
        Expect(ERROR, r"device 'cuda:7' \(--device cuda:7\) was asked for, but this machine has"),
    ),
    "verify-device-bogus": (
        lambda ws: ["verify", ws.out, "--source", ws.src, "--device", "tpu"],
        Expect(ERROR, r"device 'tpu' \(--device tpu\) is not cpu, cuda or cuda:N"),
    ),
    "validate-export-device-bogus": (
        lambda ws: ["validate-export", ws.out, "--master", ws.src, "--contract", NVFP4_EXPERTS, "--device", "gpu0"],
        Expect(ERROR, r"device 'gpu0'"),
    ),
    "publish-device-bogus": (
        lambda ws: ["publish", ws.out, "me/x", "--dry-run", "--device", "cuda:x"],
        Expect(ERROR, r"device 'cuda:x'"),
    ),
    "max-shard-size-zero": (
        lambda ws: ["convert", ws.src, ws.dst, "--contract", NVFP4_EXPERTS, "--max-shard-size", "0"],
        Expect(ERROR, r"max_shard_size 0 \(--max-shard-size\) is not a positive number of bytes"),
    ),
    "max-shard-size-words": (
        lambda ws: ["convert", ws.src, ws.dst, "--contract", NVFP4_EXPERTS, "--max-shard-size", "big"],
        Expect(ERROR, r"--max-shard-size 'big' is not a size"),
    ),
    "workers-zero": (
        lambda ws: ["convert", ws.src, ws.dst, "--contract", NVFP4_EXPERTS, "--workers", "0"],
        Expect(USAGE, r"--workers"),
    ),
    "destination-is-source": (
        lambda ws: ["convert", ws.src, ws.src, "--contract", NVFP4_EXPERTS, "--overwrite"],
        Expect(ERROR, r"overlaps the source"),
    ),
    "destination-inside-source": (
        lambda ws: ["convert", ws.src, ws.src / "out", "--contract", NVFP4_EXPERTS],
        Expect(ERROR, r"overlaps the source"),
    ),
    "destination-around-source": (
        lambda ws: ["to-megatron", ws.src, ws.root, "--overwrite"],
        Expect(ERROR, r"overlaps the source"),
    ),
    "destination-exists": (
        lambda ws: ["dequantize", ws.out, ws.victim],
        Expect(ERROR, r"destination .*victim already exists"),
    ),
    "source-missing": (
        lambda ws: ["convert", ws.root / "nowhere", ws.dst, "--contract", NVFP4_EXPERTS],
        Expect(ERROR, r"nowhere"),
    ),
    "source-is-a-file": (
        lambda ws: ["convert", ws.src / "config.json", ws.dst, "--contract", NVFP4_EXPERTS],
        Expect(ERROR, r"config\.json"),
    ),
    "calibration-not-json": (
        lambda ws: ["convert", ws.src, ws.dst, "--contract", NVFP4_EXPERTS, "--calibration", ws.victim / "secret.txt"],
        Expect(ERROR, r"secret\.txt: calibration file is not readable JSON"),
    ),
    **{  # JSON's Infinity, and numbers past float32: an infinite input scale makes the engine's activations NaN
        f"calibration-{name}": (
            lambda ws, text=text: [
                "convert",
                ws.src,
                ws.dst,
                "--contract",
                NVFP4_EXPERTS,
                "--calibration",
                _written(ws, "c.json", text),
            ],
            Expect(ERROR, rf"c\.json: the activation amax of 'm' is {re.escape(shown)}; expected a positive number"),
        )
        for name, text, shown in (
            ("infinite", '{"m": Infinity}', "inf"),
            ("past-float32", '{"m": 1e39}', "1e+39"),
            ("nan", '{"m": NaN}', "nan"),
            ("zero", '{"m": 0}', "0"),
        )
    },
    "plot-unwritable": (
        lambda ws: ["plan", NVFP4_EXPERTS, "--model", ws.src, "--plot", ws.root / "no" / "such" / "plan.png"],
        Expect(ERROR, r"plan\.png: no such file or directory \(ENOENT\)"),
    ),
    "explain-model-missing": (
        lambda ws: ["explain", NVFP4_EXPERTS, EXPERT, "--model", ws.root / "nowhere"],
        Expect(ERROR, r"nowhere"),
    ),
    "verify-not-an-output": (
        lambda ws: ["verify", ws.src],
        Expect(ERROR, r"has no fp4convert\.json: it is not a finished fp4convert output"),
    ),
    "dequantize-not-quantized": (
        lambda ws: ["dequantize", ws.src, ws.dst],
        Expect(ERROR, r"no quantization_config of a known dialect"),
    ),
    "publish-bad-repo-id": (
        lambda ws: ["publish", ws.out, "not a repo", "--dry-run"],
        Expect(ERROR, r"repo id 'not a repo' is not a Hub repo id"),
    ),
}


@pytest.mark.parametrize("name", sorted(ARGUMENTS))
def test_careless_argument(name, workspace):
    build, expect = ARGUMENTS[name]
    if name == "convert-device-absent-gpu" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    argv = build(workspace)
    before = workspace.tree()
    judge(run_cli(argv), workspace, before, expect)


_SPLITS_SIBLINGS = """version: 1
name: splits-siblings
default: bf16
rules:
  - {kind: glob, namespace: hf, pattern: '*.mlp.experts.*', format: nvfp4}
bf16_exceptions: {names: {hf: ['.gate_proj.']}}
"""


@pytest.mark.parametrize("command", ["convert", "contract-check"])
def test_a_contract_splitting_fused_siblings_says_they_share_an_outer_scale(workspace, command):
    workspace.contract.write_text(_SPLITS_SIBLINGS)
    argv = {
        "convert": ["convert", workspace.src, workspace.dst, "--contract", workspace.contract, "-q"],
        "contract-check": ["contract", "check", workspace.contract, "--model", workspace.src],
    }[command]
    before = workspace.tree()
    outcome = run_cli(argv)
    said = outcome.stdout + outcome.stderr
    assert outcome.code == 1 and "Traceback" not in said and workspace.tree() == before, outcome.text()
    assert not workspace.dst.exists() and not workspace.staging.exists()
    assert re.search(r"fused group '[\w.]+\.gate_up' splits into different formats", said), outcome.text()
    assert "one GEMM whose outer scale they must share" in said, outcome.text()
