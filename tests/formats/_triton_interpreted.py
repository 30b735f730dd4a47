"""Run by tests/formats/test_triton_interpreted.py in a subprocess with ``TRITON_INTERPRET=1``: the
CUDA path's Triton kernels (segments, dense NVFP4/MXFP8, MXFP8 columns, tensor amax) and the live
exporter's GPU path executed by Triton's interpreter on CPU tensors, byte for byte against the CPU
reference. Prints one ``ok ...`` line per check; any difference raises."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton.runtime.interpreter as interpreter  # noqa: E402

# Triton 3.6's interpreter turns a scalar argument into a 1-element array and reads it with
# int(array), which NumPy 2 refuses for 1-d arrays ("only 0-dimensional arrays can be converted");
# the same read through .reshape(-1)[0]. Test scaffolding only: the library never runs interpreted.
_patch_tensor = interpreter._patch_lang_tensor


def _patched(tensor, scope):  # type: ignore[no-untyped-def]
    _patch_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))


interpreter._patch_lang_tensor = _patched

from _helpers import (  # noqa: E402
    NVFP4_EXPERTS,
    NVFP4_LAUNCHES,
    adversarial,
    assert_bytes_equal,
    check_mxfp8_segments,
    check_nvfp4_segment_mismatches,
    check_nvfp4_segments,
    e2m1_risky_patterns,
    segment_group,
)

from fp4convert.formats import _triton_segments as ts  # noqa: E402
from fp4convert.formats import profiles, segments  # noqa: E402
from fp4convert.formats.kernels import PROFILE_CODES  # noqa: E402
from fp4convert.formats.mxfp8 import mxfp8_matrix_reference  # noqa: E402
from fp4convert.formats.nvfp4 import nvfp4_matrix_reference  # noqa: E402

KERNEL_PROFILES = ("te", "te-2.13", "modelopt")


def segment_kernels() -> None:
    segments._on_triton = lambda device: True  # CPU tensors through the CUDA path, interpreted
    for dtype in (torch.bfloat16, torch.float32):
        for profile in KERNEL_PROFILES:
            for tile in ("1x16", "16x16"):
                check_nvfp4_segments(*segment_group(dtype), profile, tile)
                check_nvfp4_segment_mismatches(*segment_group(dtype), profile, tile)
            # rows that are no multiple of the kernel's block rows: the masked compare
            odd = [adversarial((21, 96), dtype, seed=21), adversarial((5, 96), dtype, seed=22)]
            check_nvfp4_segment_mismatches(odd, [0, 1], profile, "1x16")
        check_mxfp8_segments(segment_group(dtype)[0])
        print("ok segments", dtype, flush=True)
    # rows of several column steps (800 = 3 x 256 + 32: the last step masked; 512: none masked), each
    # step's values read before the previous step is encoded (PREFETCH) or after
    for prefetch in (False, True):
        default = ts._PREFETCH
        ts._PREFETCH = prefetch
        try:
            for dtype, profile in ((torch.bfloat16, "te"), (torch.float32, "modelopt")):
                for cols, rows in ((800, (32, 21, 16)), (512, (32, 16, 16))):
                    wide = [adversarial((n, cols), dtype, seed=30 + i) for i, n in enumerate(rows)]
                    check_nvfp4_segments(wide, [0, 1, 1], profile, "1x16")
                    check_nvfp4_segment_mismatches(wide, [0, 1, 1], profile, "1x16")
        finally:
            ts._PREFETCH = default
        print("ok segments, several column steps, prefetch", prefetch, flush=True)


def outer_scale_kernel() -> None:
    """The outer-scale kernel (one launch for a group's units) against profiles.outer_scales: zeros of
    both signs, negative and subnormal amaxes (an imposed amax may be anything), inf, FLT_MAX."""
    tiny = torch.finfo(torch.float32).tiny
    spread = torch.ldexp(torch.rand(40, generator=torch.Generator().manual_seed(4)), torch.arange(-60, 60, 3))
    edges = torch.tensor(
        [0.0, -0.0, 1.0, 6.0, 448.0, 2688.0, 1e-30, tiny, tiny / 8, -tiny / 8, -1.0, 3e38, float("inf")]
    )
    amax = torch.cat([edges, spread])
    for profile in (*KERNEL_PROFILES, "te-4over6-mse-256"):
        spec = profiles.profile_spec(profile)
        s_dec, s_enc = ts.outer_scales(amax, PROFILE_CODES[spec.chain], spec.global_max)
        want = profiles.outer_scales(amax, profile)
        assert_bytes_equal(s_dec, want.s_dec)
        assert_bytes_equal(s_enc, want.s_enc)
    print("ok outer", flush=True)


def e2m1_rounding() -> None:
    """The kernels' one-add E2M1 rounding against the threshold comparisons (all 2^32 patterns on the GPU)."""
    from formats._e2m1_check import disagreements

    table = e2m1_risky_patterns()
    for signed_zero in (True, False):
        differing, first = disagreements(signed_zero, table=table, device="cpu")
        assert differing == 0, f"signed_zero={signed_zero}: {differing} of {table.numel()} differ, first {first:#010x}"
    print("ok e2m1", table.numel(), flush=True)


def _nvfp4_dense_launched(launch: str, *args):  # type: ignore[no-untyped-def]
    """``ts.nvfp4_dense(*args)`` by one of :data:`NVFP4_LAUNCHES`: the grid of column-step programs,
    or the persistent launch without or with its next step read ahead."""
    default = ts._PERSISTENT, ts._PREFETCH
    ts._PERSISTENT, ts._PREFETCH = NVFP4_LAUNCHES[launch]
    try:
        return ts.nvfp4_dense(*args)
    finally:
        ts._PERSISTENT, ts._PREFETCH = default


def dense_kernels() -> None:
    dense_cases = (
        ((16, 1040), torch.bfloat16),  # more column steps (5) than INTERPRETED_PROGRAMS, the last masked
        ((40, 288), torch.bfloat16),
        ((32, 512), torch.bfloat16),
        ((32, 512), torch.float16),
        ((48, 96), torch.float32),
    )
    for shape, dtype in dense_cases:
        x = adversarial(shape, dtype, seed=3)
        finite = torch.where(x.float().isnan(), 0.0, x.float().abs())
        assert_bytes_equal(ts.tensor_amax(x), finite.amax())
        for profile in KERNEL_PROFILES:
            spec = profiles.profile_spec(profile)
            code, gmax = PROFILE_CODES[spec.chain], spec.global_max
            for tile16 in (False, True) if shape[0] % 16 == 0 else (False,):
                want = nvfp4_matrix_reference(
                    x, finite.amax().expand(shape[0]), profile, tile="16x16" if tile16 else "1x16"
                )
                # the tensor scope by every launch (the persistent ones with INTERPRETED_PROGRAMS
                # programs: some take more steps than others)
                for launch in NVFP4_LAUNCHES:
                    got = _nvfp4_dense_launched(launch, x, finite.amax().reshape(1), shape[0], code, gmax, tile16)
                    assert_bytes_equal(got[0], want[0])
                    assert_bytes_equal(got[1], want[1])
            rows = finite.amax(1).contiguous()  # row scope: one outer amax per row
            got = ts.nvfp4_dense(x, rows, 1, code, gmax, False)
            want = nvfp4_matrix_reference(x, rows, profile, tile="1x16")
            assert_bytes_equal(got[0], want[0])
            assert_bytes_equal(got[1], want[1])
        if shape[1] % 32 == 0:
            got = ts.mxfp8_dense(x)
            want = mxfp8_matrix_reference(x)
            assert_bytes_equal(got[0], want[0])
            assert_bytes_equal(got[1], want[1])
        if shape[0] % 32 == 0:
            got = ts.mxfp8_col_dense(x)
            want = mxfp8_matrix_reference(x.t().contiguous())
            assert_bytes_equal(got[0], want[0].t().contiguous())
            assert_bytes_equal(got[1], want[1].t().contiguous())
        print("ok dense", shape, dtype, flush=True)
    # the amax + quantize pair's A/B knobs (FP4CONVERT_L2_KEEP_MB, the eviction policies; programmatic
    # dependent launches never run interpreted): the last two steps of the amax pass read by the
    # kept-in-L2 branch; the same bytes
    x = adversarial((48, 1040), torch.bfloat16, seed=5)
    finite = torch.where(x.float().isnan(), 0.0, x.float().abs())
    want = nvfp4_matrix_reference(x, finite.amax().expand(48), "te")
    knobs = ("_L2_KEEP", "_IN_POLICY", "_OUT_POLICY")
    default = tuple(getattr(ts, k) for k in knobs)
    two_steps = 2 * ts.BLOCK_ROWS * ts.launch_shape(1040, 16) * 2
    for values in ((two_steps, "", ""), (two_steps, "evict_first", "evict_first")):
        for k, v in zip(knobs, values, strict=True):
            setattr(ts, k, v)
        try:
            amax = ts.tensor_amax(x)
            assert_bytes_equal(amax, finite.amax())
            got = _nvfp4_dense_launched("persistent", x, amax.reshape(1), 48, 0, 2688.0, False)
        finally:
            for k, v in zip(knobs, default, strict=True):
                setattr(ts, k, v)
        assert_bytes_equal(got[0], want[0])
        assert_bytes_equal(got[1], want[1])
    print("ok dense, knobs", flush=True)
    # the large matrices' launch: four column steps per program, 800 columns (the last step partly
    # past the row; a program doing two steps would leave columns 512-799 unwritten)
    x = adversarial((32, 800), torch.bfloat16, seed=4)
    amax = torch.where(x.float().isnan(), 0.0, x.float().abs()).amax()
    default, ts.NVFP4_LARGE_GRID = ts.NVFP4_LARGE_GRID, 1
    try:
        assert ts.nvfp4_steps(32, 800, ts.launch_shape(800, 16)) == ts.NVFP4_LARGE_STEPS == 4
        got = _nvfp4_dense_launched("grid", x, amax.reshape(1), 32, 0, 2688.0, False)
    finally:
        ts.NVFP4_LARGE_GRID = default
    want = nvfp4_matrix_reference(x, amax.expand(32), "te")
    assert_bytes_equal(got[0], want[0])
    assert_bytes_equal(got[1], want[1])


def live_exporter() -> None:
    from conftest import build_tiny_checkpoint
    from safetensors.torch import load_file

    from fp4convert.families import hf_to_megatron, load_config
    from fp4convert.megatron import sync
    from fp4convert.megatron.sync import LiveExporter

    directory = build_tiny_checkpoint("qwen3_moe", Path(tempfile.mkdtemp()))
    hf: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        hf.update(load_file(str(path)))
    config = load_config(directory)
    # in place, the per-unit path of transposed experts, and every layer's experts of a role in one
    # set of launches (FP4CONVERT_MERGE_RUNS)
    for layout, merged in (("grouped", False), ("legacy_grouped", False), ("grouped", True)):
        megatron = hf_to_megatron(hf, "qwen3_moe", config, expert_layout=layout)
        default, sync._MERGE_RUNS = sync._MERGE_RUNS, False
        try:
            want = dict(LiveExporter(contract=NVFP4_EXPERTS, config=config)(megatron))  # CPU kernels, by group
            segments._on_triton = lambda device: True  # CPU tensors through the CUDA path, interpreted
            sync._MERGE_RUNS = merged
            exporter = LiveExporter(contract=NVFP4_EXPERTS, config=config)
            assert bool(exporter._runs) == merged
            for _ in range(2):
                got = dict(exporter(megatron))
                assert sorted(got) == sorted(want)
                for name, tensor in want.items():
                    assert_bytes_equal(got[name], tensor)
        finally:
            sync._MERGE_RUNS = default
            segments._on_triton = lambda device: False
        print("ok exporter", layout, "runs" if merged else "groups", flush=True)


def _flipped(tensor: torch.Tensor, bit: int) -> torch.Tensor:
    """A copy of ``tensor`` with ``bit`` flipped in its last byte."""
    copy = tensor.clone()
    copy.view(torch.uint8).view(-1)[-1] ^= bit
    return copy


def export_validator() -> None:
    """The validator's byte check through the one-pass NVFP4 compare kernel: an exporter's own
    buffers (one view per batch) pass; a copy with one data byte and one scale byte changed
    (concatenated per batch) fails on exactly those two tensors."""
    from conftest import build_tiny_checkpoint
    from safetensors.torch import load_file

    from fp4convert.families import hf_to_megatron, load_config
    from fp4convert.megatron.sync import LiveExporter
    from fp4convert.megatron.validate import ExportValidator

    directory = build_tiny_checkpoint("qwen3_moe", Path(tempfile.mkdtemp()))
    hf: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        hf.update(load_file(str(path)))
    config = load_config(directory)
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    segments._on_triton = lambda device: True  # CPU tensors through the CUDA path, interpreted
    exported = dict(LiveExporter(contract=NVFP4_EXPERTS, config=config)(megatron))
    validator = ExportValidator(contract=NVFP4_EXPERTS, config=config)
    report = validator(exported, megatron)
    assert report.ok, report.summary()
    data = next(n for n in exported if n.endswith(".experts.0.down_proj.weight"))
    scale = next(n for n in exported if n.endswith(".experts.1.gate_proj.weight_scale"))
    wrong = {**exported, data: _flipped(exported[data], 0x10), scale: _flipped(exported[scale], 0x01)}
    report = validator(wrong, megatron)
    failed = {f.tensor for f in report.findings if f.check == "bytes"}
    assert failed == {data, scale}, report.summary()
    segments._on_triton = lambda device: False
    print("ok validator", flush=True)


if __name__ == "__main__":
    parts = {
        "segments": segment_kernels,
        "dense": dense_kernels,
        "e2m1": e2m1_rounding,
        "outer": outer_scale_kernel,
        "exporter": live_exporter,
        "validator": export_validator,
    }
    parts[sys.argv[1]]()
