"""quantize_tensor throughput from 1 to 16 threads: what a conversion's workers lose to each other.

Each thread quantizes the same Qwen3-30B-A3B expert tensor (NVFP4, modelopt dialect) over and
over; the aggregate tensors per second against the thread count shows the hand-offs (GIL,
wake-ups) per tensor. Usage: python bench/device/gil_probe.py ROWSxCOLS CALLS
"""

from __future__ import annotations

import sys
import threading
import time

import torch

from fp4convert.contract import load_contract
from fp4convert.dialects import get_dialect
from fp4convert.families import describe_name, load_config
from fp4convert.formats import kernels
from fp4convert.plan import PlannedTensor
from fp4convert.plan.quantize import quantize_tensor

config = load_config("Qwen3-30B-A3B")
info = describe_name("model.layers.0.mlp.experts.0.gate_proj.weight", config)
item = PlannedTensor(info, load_contract("nvfp4-experts-per-token").decide(info, num_layers=48))
dialect = get_dialect("modelopt")
shape = tuple(int(d) for d in sys.argv[1].split("x"))
calls = int(sys.argv[2])
x = torch.randn(shape).bfloat16()


def work(n: int) -> None:
    kernels.set_split_threshold(64 << 20)  # as a conversion worker: one tensor, one thread
    for _ in range(n):
        quantize_tensor(item, x, dialect=dialect, profile="te")


work(3)
for count in (1, 2, 4, 8, 16):
    threads = [threading.Thread(target=work, args=(calls // count,)) for _ in range(count)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"{shape} threads {count}: {calls / (time.perf_counter() - started):.0f} tensors/s")
