"""Host tables moved to a device: the same values, dtypes and shapes (the CUDA case: test_cuda.py)."""

from __future__ import annotations

import torch

from fp4convert.formats.uploads import upload


def test_on_the_cpu_the_tables_are_returned_as_they_are():
    tables = [torch.arange(4), torch.ones(2, 3, dtype=torch.int32)]
    got = upload(tables, "cpu")
    assert all(a is b for a, b in zip(tables, got, strict=True))
