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
