"""A header that claims huge sizes, or a config.json that describes a huge model, is refused from its
numbers alone: in bounded time and memory, before any byte of data is read, any buffer of the claimed
size is allocated or any of the claimed tensors is listed."""

from __future__ import annotations

import json
import re
import struct
import time
import tracemalloc
from pathlib import Path

import pytest

from fp4convert.checkpoint.safetensors_io import SafetensorsFile, read_header
from fp4convert.errors import CheckpointError, Fp4ConvertError, MappingError
from fp4convert.families import inventory_from_config, load_config

#: what refusing one crafted header may cost at most (a real 2**81-byte claim would need ~2 ZiB)
SECONDS = 2.0
PEAK_BYTES = 8 * 2**20


def _file(path: Path, header: dict, data: bytes = bytes(64), *, length: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


_CLAIMS = {
    # shape and offsets both claim 2**80 BF16 values
    "offsets-past-the-file": {"w": {"dtype": "BF16", "shape": [2**40, 2**40], "data_offsets": [0, 2**81]}},
    # offsets honest, the shape's product far past int64
    "shape-product-past-int64": {"w": {"dtype": "BF16", "shape": [2**62, 2**62], "data_offsets": [0, 64]}},
    # a million-dimension shape
    "many-dimensions": {"w": {"dtype": "U8", "shape": [1] * 100_000, "data_offsets": [0, 64]}},
    # offsets that are not even machine integers
    "offsets-of-a-thousand-digits": {"w": {"dtype": "U8", "shape": [64], "data_offsets": [0, 10**1000]}},
}


def _bounded(action, error: type[Fp4ConvertError] = CheckpointError) -> Fp4ConvertError:
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(error) as err:
            action()
        seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seconds < SECONDS, f"refusing took {seconds:.2f} s"
    assert peak < PEAK_BYTES, f"refusing allocated {peak / 2**20:.1f} MiB at peak"
    return err.value


@pytest.mark.parametrize("claim", sorted(_CLAIMS))
def test_a_header_claiming_huge_sizes_is_refused_cheaply(tmp_path, claim):
    path = _file(tmp_path / "x.safetensors", _CLAIMS[claim])
    for read in (lambda: read_header(path), lambda: SafetensorsFile(path)):
        assert str(path) in str(_bounded(read))  # the error names the file


@pytest.mark.parametrize("length", [2**63, 2**64 - 1, 100 * 2**20 + 1])
def test_a_length_prefix_claiming_huge_headers_is_refused_cheaply(tmp_path, length):
    path = _file(
        tmp_path / "x.safetensors", {"w": {"dtype": "U8", "shape": [64], "data_offsets": [0, 64]}}, length=length
    )
    error = _bounded(lambda: read_header(path))
    assert f"header length {length} exceeds" in str(error)


@pytest.mark.parametrize(
    "claim", [{"num_experts": 10**12}, {"num_hidden_layers": 10**9}, {"num_hidden_layers": 2000, "num_experts": 512}]
)
def test_a_config_describing_huge_models_is_refused_before_listing_them(claim):
    # a config.json is listed tensor by tensor (plan, explain, convert's consistency check): one
    # claiming far more tensors than any model has is refused from its numbers
    config = {**load_config("Qwen3-30B-A3B"), **claim}
    error = _bounded(lambda: inventory_from_config(config), MappingError)
    assert re.search(r"describes up to [\d,]+ tensors", str(error))
