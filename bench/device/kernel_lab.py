# ruff: noqa: E501  (a device lab: wide tables of launch shapes)
"""Kernel lab (issue 15): candidate NVFP4 / MXFP8 / amax kernel shapes against today's, on one weight.

Each candidate's bytes are compared with today's kernel (torch.equal on uint8); GPU time is taken
from CUDA-graph replays of 20 launches (no host overhead), then the end-to-end Python call.

    python bench/device/kernel_lab.py [--rows 4096 --cols 14336]
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from fp4convert.formats import _triton_segments, kernels
from fp4convert.formats._triton_segments import FLT_MAX, _e2m1, _e4m3_nonneg, _e4m3_value, _outer


@triton.jit
def nv_words(x_ptr, ld, amax_ptr, data_ptr, scale_ptr, cols, BR: tl.constexpr, NB: tl.constexpr, CH: tl.constexpr):
    """bf16 read as 32-bit words (two values each): [BR rows, NB blocks, 8 words], CH column chunks per program."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    k = tl.arange(0, 8)
    h = tl.arange(0, 2)
    a = tl.load(amax_ptr)
    sdec, mult = _outer(a, 0, 2688.0)
    nblocks = cols // 16
    wp = x_ptr.to(tl.pointer_type(tl.uint32))
    for c in tl.static_range(CH):
        blk = (tl.program_id(1) * CH + c) * NB + tl.arange(0, NB)
        w = tl.load(wp + r.to(tl.int64)[:, None, None] * (ld // 2) + blk[None, :, None] * 8 + k[None, None, :])
        lo = (w << 16).to(tl.float32, bitcast=True)
        hi = (w & 0xFFFF0000).to(tl.float32, bitcast=True)
        m = tl.max(tl.maximum(tl.abs(lo), tl.abs(hi)), axis=2)
        amax = tl.where(m == m, m, 0.0)
        sf = _e4m3_nonneg(amax * mult)
        enc = tl.minimum(tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), _e4m3_value(sf) * sdec), FLT_MAX)
        byte = (_e2m1(lo * enc[:, :, None], True) | (_e2m1(hi * enc[:, :, None], True) << 4)).to(tl.uint32)
        sh = (tl.arange(0, 4) * 8).to(tl.uint32)
        word = tl.sum(tl.reshape(byte, (BR, NB, 2, 4)) << sh[None, None, None, :], axis=3)
        dp = data_ptr.to(tl.pointer_type(tl.uint32)) + r.to(tl.int64)[:, None, None] * (cols // 8)
        tl.store(dp + blk[None, :, None] * 2 + h[None, None, :], word)
        tl.store(scale_ptr + r.to(tl.int64)[:, None] * nblocks + blk[None, :], sf.to(tl.uint8))


@triton.jit
def amax_2d(x_ptr, ld, out_ptr, cols, BR: tl.constexpr, BC: tl.constexpr, CH: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    acc = tl.zeros((BR, BC), dtype=tl.float32)
    for c in tl.static_range(CH):
        col = (tl.program_id(1) * CH + c) * BC + tl.arange(0, BC)
        acc = tl.maximum(acc, tl.abs(tl.load(x_ptr + r.to(tl.int64)[:, None] * ld + col[None, :]).to(tl.float32)))
    tl.atomic_max(out_ptr, tl.max(tl.max(acc, axis=1), axis=0).to(tl.int32, bitcast=True))


def nan_free_amax(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x.float().isnan(), 0.0, x.float().abs()).amax()


def graph_time(fn, reps: int = 20) -> float:
    """Seconds per call of ``fn`` replayed from a CUDA graph of ``reps`` calls."""
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(reps):
                fn()
    torch.cuda.synchronize()
    g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        best = min(best, e0.elapsed_time(e1) / 1e3 / reps)
    return best


def wall_time(fn, reps: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / 1e3 / reps


def lab_weight() -> torch.Tensor:
    """The weight the labs time: ``--rows`` x ``--cols`` (4096x14336) bf16 N(0, 0.02) on the GPU,
    seeded, its first values edge cases (NaN, -0, a subnormal-scale value)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=14336)
    args = ap.parse_args()
    x = torch.randn(args.rows, args.cols, device="cuda", generator=torch.Generator("cuda").manual_seed(0)) * 0.02
    x = x.bfloat16()
    x[0, :7] = torch.tensor([float("nan"), 0.07, -0.0, 1e-30, -0.3, 0.1, 0.0])
    return x


def main() -> None:
    x = lab_weight()
    rows, cols = x.shape
    gb = x.numel() * 2 / 1e9
    out_bytes = {"nvfp4": x.numel() // 2 + x.numel() // 16, "mxfp8": x.numel() + x.numel() // 32}
    y = torch.empty_like(x)
    copy = graph_time(lambda: y.copy_(x))
    roof = 2 * gb / copy
    print(f"{rows}x{cols} bf16 {gb:.3f} GB; copy {copy * 1e6:.1f} us = {roof:.0f} GB/s (read + write)")

    def report(name: str, seconds: float, fmt: str, read_passes: int = 1, note: str = "") -> None:
        moved = read_passes * gb + out_bytes.get(fmt, 0) / 1e9
        print(
            f"{name:58} {seconds * 1e6:8.1f} us {gb / seconds:8.0f} GB/s in  {moved / seconds / roof * 100:5.1f}% roof {note}"
        )

    # amax
    amax_ref = _triton_segments.tensor_amax(x)
    report(
        "amax: tensor_amax (the package's)",
        graph_time(lambda: _triton_segments.tensor_amax(x)),
        "",
        1,
        "bytes == cpu" if torch.equal(amax_ref.cpu(), nan_free_amax(x.cpu())) else "BYTES DIFFER",
    )
    for br, bc, ch, w in [
        (16, 256, 4, 4),
        (16, 512, 4, 8),
        (32, 256, 8, 8),
        (8, 1024, 4, 4),
        (16, 1024, 7, 8),
        (64, 256, 4, 8),
    ]:
        if cols % (bc * ch) or rows % br:
            continue
        out = torch.zeros(1, dtype=torch.int32, device="cuda")

        def run(br=br, bc=bc, ch=ch, w=w, out=out):
            out.zero_()
            amax_2d[(rows // br, cols // (bc * ch))](x, x.stride(0), out, cols, BR=br, BC=bc, CH=ch, num_warps=w)

        t = graph_time(run)
        ok = torch.equal(out.view(torch.float32).reshape(()), amax_ref)
        report(f"amax: 2d BR={br} BC={bc} CH={ch} warps={w}", t, "", 1, "bytes ==" if ok else "BYTES DIFFER")

    # NVFP4 te, tensor scope, amax given; reference bytes: the CPU kernel on the same values
    d0, s0 = (t.cuda() for t in kernels.nvfp4_units(x.cpu(), amax_ref.cpu().reshape(1), rows, "te"))
    dense = lambda: _triton_segments.nvfp4_dense(x, amax_ref.reshape(1), rows, 0, 2688.0, False)  # noqa: E731
    got = dense()
    ok = torch.equal(got[0], d0) and torch.equal(got[1], s0)
    report(
        "nvfp4: dense kernel (the package's)", graph_time(dense), "nvfp4", 1, "bytes == cpu" if ok else "BYTES DIFFER"
    )
    for br, nb, ch, w in [
        (16, 16, 1, 4),
        (8, 16, 1, 4),
        (16, 8, 1, 4),
        (32, 16, 1, 8),
        (16, 32, 1, 8),
        (8, 32, 1, 4),
        (16, 16, 2, 4),
        (16, 16, 4, 4),
        (8, 16, 4, 4),
        (32, 8, 1, 4),
        (4, 32, 1, 4),
        (16, 16, 1, 8),
    ]:
        if (cols // 16) % (nb * ch) or rows % br:
            continue
        data = torch.empty(rows, cols // 2, dtype=torch.uint8, device="cuda")
        scale = torch.empty(rows, cols // 16, dtype=torch.uint8, device="cuda")

        def run(br=br, nb=nb, ch=ch, w=w, data=data, scale=scale):
            nv_words[(rows // br, cols // 16 // (nb * ch))](
                x, x.stride(0), amax_ref, data, scale, cols, BR=br, NB=nb, CH=ch, num_warps=w, enable_fp_fusion=False
            )

        t = graph_time(run)
        ok = torch.equal(data, d0) and torch.equal(scale, s0)
        report(f"nvfp4: words BR={br} NB={nb} CH={ch} warps={w}", t, "nvfp4", 1, "bytes ==" if ok else "BYTES DIFFER")

    # MXFP8
    m0, ms0 = (t.cuda() for t in kernels.mxfp8_matrix(x.cpu()))
    got = _triton_segments.mxfp8_dense(x)
    ok = torch.equal(got[0], m0) and torch.equal(got[1], ms0)
    report(
        "mxfp8: dense kernel (the package's)",
        graph_time(lambda: _triton_segments.mxfp8_dense(x)),
        "mxfp8",
        1,
        "bytes == cpu" if ok else "BYTES DIFFER",
    )
    # (the word-load candidate once measured here, bench/results/kernel-lab-h200-candidates.txt, is now
    # the package's bf16 MXFP8 kernel: the row above)

    # the public calls, end to end (host work included, launches back to back)
    from fp4convert import quantize_mxfp8, quantize_nvfp4

    report(
        "quantize_nvfp4(x) end to end (python call, launches back to back)",
        wall_time(lambda: quantize_nvfp4(x)),
        "nvfp4",
        2,
    )
    report("quantize_nvfp4(x) from a CUDA graph (amax + quantize)", graph_time(lambda: quantize_nvfp4(x)), "nvfp4", 2)
    report("quantize_mxfp8(x) end to end (python call)", wall_time(lambda: quantize_mxfp8(x)), "mxfp8", 1)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        for _ in range(5):
            quantize_nvfp4(x)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


if __name__ == "__main__":
    main()
