"""The CUDA path's Triton kernels on a machine without a GPU: Triton's interpreter runs them on CPU
tensors (tests/formats/_triton_interpreted.py, in a subprocess with ``TRITON_INTERPRET=1``), and
every byte equals the CPU reference. The same kernels compiled for the GPU are tested on the device
(tests/formats/test_cuda.py, tests/megatron/test_sync.py); this proves their arithmetic here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

SCRIPT = Path(__file__).with_name("_triton_interpreted.py")
TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("part", ["segments", "dense", "e2m1", "outer", "exporter", "validator"])
def test_cuda_kernels_interpreted_equal_the_cpu_reference(part):
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, str(SCRIPT), part], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert f"ok {part}" in done.stdout


def test_word_path_needs_aligned_bf16_the_instruction_a_te_chain_and_the_switch(monkeypatch):
    from fp4convert.formats import _triton_segments as ts
    from fp4convert.formats.kernels import PROFILE_CODES

    monkeypatch.setattr(ts, "_BF16_WORDS", True)
    assert ts.word_path(True, True, PROFILE_CODES["te"])
    assert ts.word_path(True, True, PROFILE_CODES["te-2.13"])
    for bf16_words, hw, chain in (
        (False, True, "te"),
        (True, False, "te"),
        (True, True, "modelopt"),
        (True, True, "4over6"),
    ):
        assert not ts.word_path(bf16_words, hw, PROFILE_CODES[chain])
    monkeypatch.setattr(ts, "_BF16_WORDS", False)  # FP4CONVERT_BF16_WORDS=0
    assert not ts.word_path(True, True, PROFILE_CODES["te"])
