"""CUDA == CPU, byte for byte. Runs only where a GPU is present (a skip is not a pass)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from _helpers import NVFP4_LAUNCHES, adversarial, assert_bytes_equal
from _helpers import check_mxfp8_segments as check_mxfp8
from _helpers import check_nvfp4_segment_mismatches as check_nvfp4_mismatches
from _helpers import check_nvfp4_segments as check_nvfp4
from _helpers import segment_group as group
from formats._e2m1_check import disagreements as e2m1_disagreements

from fp4convert.formats import _triton, kernels, profiles
from fp4convert.formats import _triton_segments as ts
from fp4convert.formats.mxfp8 import quantize_mxfp8
from fp4convert.formats.nvfp4 import four_over_six_choices, quantize_nvfp4
from fp4convert.verify import golden

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

GOLDEN = Path(__file__).resolve().parents[2] / "golden"


def test_golden_fixtures_on_cuda():
    results = list(golden.verify(GOLDEN, device="cuda"))
    bad = [r for r in results if not r.equal]
    assert not bad, bad[:3]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("profile", profiles.PROFILES)
@pytest.mark.parametrize("scope", ["tensor", "row"])
def test_nvfp4_cuda_equals_cpu(dtype, profile, scope):
    x = adversarial((2048, 4096), dtype, seed=11)
    columnwise = not (scope == "row" and profile in profiles.FOUR_OVER_SIX_PROFILES)  # TE refuses it
    cpu = quantize_nvfp4(x, profile=profile, scope=scope, columnwise=columnwise)
    gpu = quantize_nvfp4(x.cuda(), profile=profile, scope=scope, columnwise=columnwise)
    fields = ("data", "scale", "amax", "data_t", "scale_t", "amax_t") if columnwise else ("data", "scale", "amax")
    for field in fields:
        assert_bytes_equal(getattr(gpu, field), getattr(cpu, field))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("profile", ["te", *profiles.FOUR_OVER_SIX_PROFILES])
def test_nvfp4_cuda_16x16_and_experts(dtype, profile):
    x = adversarial((8, 256, 512), dtype, seed=12)
    for kwargs in ({"tile": "16x16"}, {"scope": "expert"}, {"scope": "expert", "tile": "16x16"}):
        cpu = quantize_nvfp4(x, profile=profile, columnwise=True, **kwargs)
        gpu = quantize_nvfp4(x.cuda(), profile=profile, columnwise=True, **kwargs)
        for field in ("data", "scale", "data_t", "scale_t"):
            assert_bytes_equal(getattr(gpu, field), getattr(cpu, field))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("profile", profiles.FOUR_OVER_SIX_PROFILES)
@pytest.mark.parametrize("tile", ["1x16", "16x16"])
def test_4over6_cuda_choices_equal_cpu(dtype, profile, tile):
    x = adversarial((1024, 2064), dtype, seed=15)
    cpu = four_over_six_choices(x, profile=profile, tile=tile)
    gpu = four_over_six_choices(x.cuda(), profile=profile, tile=tile)
    assert torch.equal(gpu.cpu(), cpu)
    assert cpu.any() and not cpu.all()


@pytest.mark.parametrize("profile", profiles.FOUR_OVER_SIX_PROFILES)
def test_4over6_cuda_eager_reference_equals_cpu_reference(profile):
    x = adversarial((256, 512), torch.bfloat16, seed=16)
    cpu = quantize_nvfp4(x, profile=profile, tile="16x16", backend="reference")
    gpu = quantize_nvfp4(x.cuda(), profile=profile, tile="16x16", backend="reference")
    assert_bytes_equal(gpu.data, cpu.data)
    assert_bytes_equal(gpu.scale, cpu.scale)


@pytest.fixture(params=[False, True], ids=["integer-e4m3", "instruction-e4m3"])
def e4m3_instruction(request, monkeypatch):
    """Both ways the MXFP8 kernels may take their E4M3 bytes, whatever the library's default (on a GPU
    without the instruction both are the integer rounding)."""
    monkeypatch.setattr(ts, "_E4M3_INSTRUCTION", request.param)
    return request.param


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("axis", ["row", "col"])
def test_mxfp8_cuda_equals_cpu(dtype, axis, e4m3_instruction):
    # 2048x4096 fills every launch; the small shape leaves rows (row blocks) and columns over: the
    # masked loads and stores
    for shape, seed in (((2048, 4096), 13), ((50 if axis == "row" else 96, 352), 15)):
        x = adversarial(shape, dtype, seed=seed)
        cpu = quantize_mxfp8(x, axis=axis)
        gpu = quantize_mxfp8(x.cuda(), axis=axis)
        assert_bytes_equal(gpu.data, cpu.data)
        assert_bytes_equal(gpu.scale, cpu.scale)


def test_cuda_eager_reference_equals_cpu_reference():
    x = adversarial((256, 1024), torch.bfloat16, seed=14)
    cpu = quantize_nvfp4(x, backend="reference")
    gpu = quantize_nvfp4(x.cuda(), backend="reference")
    assert_bytes_equal(gpu.data, cpu.data)
    assert_bytes_equal(gpu.scale, cpu.scale)


def test_large_random_weight_cuda_equals_cpu():
    x = torch.randn(4096, 14336, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert_bytes_equal(quantize_nvfp4(x.cuda()).data, quantize_nvfp4(x).data)
    assert_bytes_equal(quantize_mxfp8(x.cuda()).data, quantize_mxfp8(x).data)


def test_flashinfer_gate_matches_this_device():
    import importlib.util

    major, _ = torch.cuda.get_device_capability()
    installed = importlib.util.find_spec("flashinfer") is not None
    assert kernels.flashinfer_quantize_usable() is (major >= 10 and installed)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_tile_amax_cuda_equals_cpu(dtype):
    x = adversarial((1024, 2064), dtype, seed=17)
    assert_bytes_equal(kernels.tile_amax(x.cuda()), kernels.tile_amax(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("profile", ["te", "te-2.13", "modelopt", "te-4over6-mae"])
@pytest.mark.parametrize("tile", ["1x16", "16x16"])
def test_segment_kernels_on_cuda_equal_the_cpu_reference(dtype, profile, tile):
    check_nvfp4(*group(dtype, "cuda"), profile, tile)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("profile", ["te", "te-2.13", "modelopt"])
def test_one_pass_nvfp4_compare_on_cuda_flags_exactly_the_differing_rows(dtype, profile):
    for tile in ("1x16", "16x16"):
        check_nvfp4_mismatches(*group(dtype, "cuda"), profile, tile)
    odd = [adversarial((21, 96), dtype, seed=21).cuda(), adversarial((5, 96), dtype, seed=22).cuda()]
    check_nvfp4_mismatches(odd, [0, 1], profile, "1x16")


@pytest.mark.parametrize("prefetch", [False, True], ids=["read-then-encode", "prefetch"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_segment_kernels_on_rows_of_several_column_steps_equal_the_cpu_reference(dtype, prefetch, monkeypatch):
    # 2048 columns (8 steps, an expert's width), 800 (the last of 4 steps masked, 21 rows: masked rows)
    monkeypatch.setattr(ts, "_PREFETCH", prefetch)
    for cols, rows in ((2048, (768, 768, 256)), (800, (32, 21, 16))):
        parts = [adversarial((n, cols), dtype, seed=40 + i).cuda() for i, n in enumerate(rows)]
        for profile in ("te", "modelopt"):
            check_nvfp4(parts, [0, 1, 1], profile, "1x16")
            check_nvfp4_mismatches(parts, [0, 1, 1], profile, "1x16")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mxfp8_segment_kernel_on_cuda_equals_the_cpu_reference(dtype, e4m3_instruction):
    check_mxfp8(group(dtype, "cuda")[0])


@pytest.fixture(params=list(NVFP4_LAUNCHES.values()), ids=list(NVFP4_LAUNCHES))
def nvfp4_launch(request, monkeypatch):
    """The tensor scope's NVFP4 launches on CUDA (the grid of column-step programs, the persistent
    launch without and with its next step read ahead), whatever FP4CONVERT_PERSISTENT and
    FP4CONVERT_PREFETCH say."""
    monkeypatch.setattr(ts, "_PERSISTENT", request.param[0])
    monkeypatch.setattr(ts, "_PREFETCH", request.param[1])
    return request.param


def test_large_random_weight_persistent_launch_equals_cpu(nvfp4_launch):
    x = torch.randn(4096, 14336, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    for kwargs in ({}, {"tile": "16x16"}):
        gpu, cpu = quantize_nvfp4(x.cuda(), **kwargs), quantize_nvfp4(x, **kwargs)
        assert_bytes_equal(gpu.data, cpu.data)
        assert_bytes_equal(gpu.scale, cpu.scale)


@pytest.mark.parametrize("shape", [(4096, 2048), (1536, 768), (48, 80)])
def test_dense_kernels_on_large_and_odd_shapes_equal_cpu(shape, nvfp4_launch):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 0.02).to(torch.bfloat16)
    for kwargs in ({}, {"tile": "16x16"} if shape[0] % 16 == 0 else {}, {"scope": "row"}):
        gpu, cpu = quantize_nvfp4(x.cuda(), **kwargs), quantize_nvfp4(x, **kwargs)
        assert_bytes_equal(gpu.data, cpu.data)
        assert_bytes_equal(gpu.scale, cpu.scale)
        assert_bytes_equal(gpu.amax, cpu.amax)
    if shape[1] % 32 == 0:
        for axis in ("row", "col") if shape[0] % 32 == 0 else ("row",):
            gpu8, cpu8 = quantize_mxfp8(x.cuda(), axis=axis), quantize_mxfp8(x, axis=axis)
            assert_bytes_equal(gpu8.data, cpu8.data)
            assert_bytes_equal(gpu8.scale, cpu8.scale)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_views_off_the_allocation_grid_equal_cpu(dtype):
    # a view starting one element in (a 2-byte offset for bf16) with an odd row stride: the kernels
    # must not assume 16-byte (or 4-byte: the bf16 MXFP8 kernel's words) alignment
    base = adversarial((96, 4 * 97), dtype, seed=21)
    for x in (base[:, 1:257], base.reshape(-1)[1 : 1 + 64 * 256].reshape(64, 256)):
        assert x.data_ptr() % 16
        for gpu, cpu in (
            (quantize_nvfp4(_same_view_on_cuda(x)), quantize_nvfp4(x)),
            (quantize_mxfp8(_same_view_on_cuda(x)), quantize_mxfp8(x)),
        ):
            assert_bytes_equal(gpu.data, cpu.data)
            assert_bytes_equal(gpu.scale, cpu.scale)


def _same_view_on_cuda(x: torch.Tensor) -> torch.Tensor:
    """``x``'s view (offset and strides) of its storage, the storage copied to the GPU."""
    storage = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage()).cuda()
    return storage.as_strided(x.shape, x.stride(), x.storage_offset())


def test_tensor_amax_kernel_ignores_nan_and_keeps_inf():
    x = adversarial((512, 1024), torch.bfloat16, seed=18)
    x[7, 9] = float("-inf")
    assert_bytes_equal(kernels.tensor_amax(x.cuda()).cpu(), torch.tensor(float("inf")))
    y = adversarial((512, 1024), torch.float32, seed=19)
    want = torch.where(y.isnan(), torch.zeros_like(y), y.abs()).amax()
    assert_bytes_equal(kernels.tensor_amax(y.cuda()).cpu(), want)


def test_tables_upload_in_one_copy_with_their_values_dtypes_and_alignment():
    from fp4convert.formats.uploads import upload

    tables = [
        torch.arange(5, dtype=torch.int64),
        torch.tensor([[1, 2], [3, 4]], dtype=torch.int32),
        torch.empty(0, dtype=torch.int64),
        torch.tensor([7], dtype=torch.int32),
    ]
    torch.cuda._sleep(50_000_000)  # the copy queues behind pending work; the values are still right
    got = upload(tables, "cuda")
    for host, dev in zip(tables, got, strict=True):
        assert dev.is_cuda and dev.dtype == host.dtype and dev.shape == host.shape
        assert torch.equal(dev.cpu().view(torch.uint8), host.view(torch.uint8))
        assert dev.data_ptr() % 256 == 0
    assert len({t.untyped_storage().data_ptr() for t in got}) == 1  # one buffer, one copy


def test_public_quantize_calls_never_wait_for_the_device():
    # A call that synchronizes (a blocking host copy, an .item()) stalls every call issued behind it,
    # so back-to-back quantizes run at the host's pace instead of the GPU's.
    x = adversarial((256, 512), torch.bfloat16, seed=13).cuda()
    calls = (
        lambda: quantize_nvfp4(x),
        lambda: quantize_nvfp4(x, amax=1.5),  # a Python number: filled on the device, not copied
        lambda: quantize_nvfp4(x, tile="16x16"),
        lambda: quantize_nvfp4(x, scope="row"),
        lambda: quantize_mxfp8(x),
    )
    for call in calls:  # Triton compiles at the first launch
        call()
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        results = [call() for call in calls]
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    given = quantize_nvfp4(x.cpu(), amax=torch.tensor(1.5))
    for field in ("data", "scale", "amax"):
        assert_bytes_equal(getattr(results[1], field), getattr(given, field))


@triton.jit
def _e4m3_disagreements(out_ptr, start, BLOCK: tl.constexpr, WHAT: tl.constexpr):
    """Over ``BLOCK`` float32 bit patterns from ``start``: how many take other bytes from the
    conversion instruction than from the integer rounding (``out[0]``), and the smallest (``out[1]``).
    ``WHAT``: "byte" (the MXFP8 rounding); "pair", each pattern as the low half of a packed pair whose
    high half is another pattern (times an odd constant: every pattern is a high half exactly once
    too); "scale", the NVFP4 block scale's code and its decoded value (every code 0..0x7F occurs)."""
    bits = (start + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)).to(tl.uint32)
    y = bits.to(tl.float32, bitcast=True)
    if WHAT == "pair":
        other = (bits * 0x9E3779B1).to(tl.float32, bitcast=True)
        differ = ts._e4m3_pair(y, other, True) != ts._e4m3_pair(y, other, False)
    elif WHAT == "scale":
        code = ts._e4m3_nonneg(y)
        value = ts._e4m3_scale_value(code, True).to(tl.uint32, bitcast=True)
        differ = (ts._e4m3_scale_code(y, True) != code) | (value != ts._e4m3_value(code).to(tl.uint32, bitcast=True))
    else:
        differ = ts._e4m3_byte(y, True) != ts._e4m3_byte(y, False)
    tl.atomic_add(out_ptr, tl.sum(differ.to(tl.int64)))
    tl.atomic_min(out_ptr + 1, tl.min(tl.where(differ, bits.to(tl.int64), 1 << 40)))


@pytest.mark.parametrize("what", ["byte", "pair", "scale"])
def test_hardware_e4m3_equals_the_integer_rounding_on_every_float32(what):
    # MXFP8 kernels on sm_89+ take their E4M3 bytes from cvt.rn.satfinite.e4m3x2.f32, the NVFP4
    # kernels their block scales; the integer rounding (the interpreter's and older GPUs' path, the
    # CPU kernel's arithmetic) is the specification. Every one of the 2^32 bit patterns: normals,
    # subnormals, ties, overflow, inf, NaN, negatives; alone and as either half of a packed pair (the
    # bf16 kernel's two bytes per 16-bit store); as an NVFP4 scale, code and value.
    if not ts.has_e4m3_instruction(torch.device("cuda")):
        pytest.skip("this GPU has no E4M3 conversion instruction (compute capability < 8.9)")
    out = torch.tensor([0, 1 << 40], dtype=torch.int64, device="cuda")
    block, chunk = 4096, 1 << 30
    for start in range(0, 1 << 32, chunk):
        _e4m3_disagreements[(chunk // block,)](out, start, BLOCK=block, WHAT=what, enable_fp_fusion=False)
    differing, first = out.tolist()
    assert differing == 0, f"{differing} float32 patterns differ, the first {first:#010x}"


@pytest.mark.parametrize("signed_zero", [True, False], ids=["signed-zero", "plain-sign"])
def test_one_add_e2m1_rounding_equals_the_thresholds_on_every_float32(signed_zero):
    # The NVFP4 kernels round to E2M1 with one float add on the bits; the threshold comparisons of
    # _triton._e2m1_code are the specification: normals, subnormals, ties, saturation, inf, NaN.
    differing, first = e2m1_disagreements(signed_zero)
    assert differing == 0, f"{differing} float32 patterns differ, the first {first:#010x}"


@triton.jit
def _bf16_word_disagreements(out_ptr, enc_ptr, BLOCK: tl.constexpr, PTX: tl.constexpr, AMAX_PTX: tl.constexpr):
    """Program k, lane i: the eight bf16 ``(i + 8191 j) mod 2^16`` (j = 0..7, so every pattern comes
    at every position) as four words, times ``enc[k // (65536 / BLOCK)]``: how many words of codes
    from ``_e2m1_word`` differ from the specification's ``_triton._e2m1_code`` (``out[0]``), and how
    many maxima from ``_bf16_amax`` differ from the NaN-ignoring float32 maximum (``out[1]``)."""
    pid = tl.program_id(0)
    enc = tl.load(enc_ptr + pid // (65536 // BLOCK))
    v = (pid % (65536 // BLOCK)) * BLOCK + tl.arange(0, BLOCK)
    b0 = v & 0xFFFF
    b1 = (v + 8191) & 0xFFFF
    b2 = (v + 2 * 8191) & 0xFFFF
    b3 = (v + 3 * 8191) & 0xFFFF
    b4 = (v + 4 * 8191) & 0xFFFF
    b5 = (v + 5 * 8191) & 0xFFFF
    b6 = (v + 6 * 8191) & 0xFFFF
    b7 = (v + 7 * 8191) & 0xFFFF
    w0 = (b0 | (b1 << 16)).to(tl.uint32)
    w1 = (b2 | (b3 << 16)).to(tl.uint32)
    w2 = (b4 | (b5 << 16)).to(tl.uint32)
    w3 = (b6 | (b7 << 16)).to(tl.uint32)
    want = tl.zeros((BLOCK,), dtype=tl.uint32)
    best = tl.full((BLOCK,), -1.0, tl.float32)  # -1: every value NaN so far
    xs = (b0, b1, b2, b3, b4, b5, b6, b7)
    for j in tl.static_range(8):
        x = (xs[j] << 16).to(tl.uint32).to(tl.float32, bitcast=True)
        want = want | (_triton._e2m1_code(x * enc, True).to(tl.uint32) << (4 * j))
        best = tl.where(x == x, tl.maximum(best, tl.abs(x)), best)
    got = ts._e2m1_word_as(w0, w1, w2, w3, enc, PTX)
    amax = ts._bf16_amax_as(w0, w1, w2, w3, AMAX_PTX)
    same = amax.to(tl.uint32, bitcast=True) == best.to(tl.uint32, bitcast=True)
    amax_wrong = tl.where(best < 0.0, amax == amax, ~same)
    tl.atomic_add(out_ptr, tl.sum((got != want).to(tl.int64)))
    tl.atomic_add(out_ptr + 1, tl.sum(amax_wrong.to(tl.int64)))


@pytest.mark.parametrize("amax_way", ["mask", "xorsign"])
@pytest.mark.parametrize("pack", ["shift", "horner", "horner-hi"])
def test_bf16_word_rounding_and_amax_equal_the_specification_on_every_bf16(pack, amax_way):
    # By default (FP4CONVERT_BF16_WORDS=0 turns it off) the te kernels on sm_89+ read bf16 as 32-bit words:
    # block amaxes by max.bf16x2, codes by the PTX of _e2m1_word (signs from the products' sign bits: a NaN product
    # is the canonical, positive NaN). Both functions, called directly whatever the variable says:
    # every bf16 pattern at each of the eight positions of a word group, times encode factors from
    # subnormal to FLT_MAX (normals, subnormals, ties, saturation, inf, NaN of either sign, -0). The
    # kernels' bytes with the path on: the other tests here (it is on by default). Each way of gathering
    # the codes (FP4CONVERT_E2M1_PACK) and of clearing the signs for the maxima (FP4CONVERT_BF16_AMAX),
    # whatever the variables say.
    if not ts.has_e4m3_instruction(torch.device("cuda")):
        pytest.skip("the word path runs on compute capability 8.9 and later")
    tiny = torch.finfo(torch.float32).tiny
    encs = [1.0, 0.5, 2.0, 1 / 3, 6 / 448, 448.0, 1e-30, tiny, tiny / 1024, 2.0**-149, 1e30, 3.4028234663852886e38]
    enc = torch.tensor(encs, dtype=torch.float32, device="cuda")
    out = torch.zeros(2, dtype=torch.int64, device="cuda")
    block = 1024
    ptx, amax_ptx = ts.e2m1_word_ptx(pack), ts.bf16_amax_ptx(amax_way)
    grid = (len(encs) * 65536 // block,)
    _bf16_word_disagreements[grid](out, enc, BLOCK=block, PTX=ptx, AMAX_PTX=amax_ptx, enable_fp_fusion=False)
    wrong_words, wrong_amax = out.tolist()
    assert (wrong_words, wrong_amax) == (0, 0), f"{wrong_words} code words and {wrong_amax} maxima differ"


@triton.jit
def _bf16_amax_of_words(words_ptr, out_ptr, BLOCK: tl.constexpr, AMAX_PTX: tl.constexpr):
    """``_bf16_amax`` of each row of four words (``words[i, 0:4]``) into ``out[i]``."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    w0, w1, w2, w3 = (tl.load(words_ptr + i * 4), tl.load(words_ptr + i * 4 + 1), tl.load(words_ptr + i * 4 + 2),
                      tl.load(words_ptr + i * 4 + 3))  # fmt: skip
    tl.store(out_ptr + i, ts._bf16_amax_as(w0, w1, w2, w3, AMAX_PTX))


@pytest.mark.parametrize("amax_way", ["mask", "xorsign"])
def test_bf16_word_amax_with_nan_in_both_halves_of_a_word(amax_way):
    # The exhaustive test above never puts NaN in two lanes that one maximum compares. Here eight bf16
    # drawn from NaN of both signs and payloads, infinities, zeros of both signs, subnormals and
    # normals, every group of eight NaN included: the maximum of the non-NaN |x| (NaN when all are NaN).
    if not ts.has_e4m3_instruction(torch.device("cuda")):
        pytest.skip("the word path runs on compute capability 8.9 and later")
    pool = torch.tensor([0x7FC0, 0xFFC0, 0x7F81, 0xFFFF, 0x0000, 0x8000, 0x3F80, 0xC000, 0x7F80, 0xFF80,
                         0x7F7F, 0x0001, 0x8001], dtype=torch.int32)  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    groups = 1 << 16
    bits = pool[torch.randint(len(pool), (groups, 8), generator=generator)]
    bits[: len(pool) * 4] = pool[torch.randint(4, (len(pool) * 4, 8), generator=generator)]  # NaN only
    values = (bits << 16).view(torch.float32)
    magnitudes = torch.where(values.isnan(), -1.0, values.abs()).amax(dim=1)
    want = torch.where(magnitudes < 0, 0.0, magnitudes)
    words = (bits[:, 0::2] | (bits[:, 1::2] << 16)).cuda()
    out = torch.empty(groups, dtype=torch.float32, device="cuda")
    block = 256
    _bf16_amax_of_words[(groups // block,)](words, out, BLOCK=block, AMAX_PTX=ts.bf16_amax_ptx(amax_way))
    got = out.cpu()
    assert torch.equal(got.isnan(), magnitudes < 0)
    assert_bytes_equal(torch.where(got.isnan(), 0.0, got), want)


@pytest.mark.parametrize("profile", ["te", "te-2.13", "modelopt", "te-4over6-mse-256"])
def test_outer_scales_in_one_launch_equal_the_torch_chain(profile):
    tiny = torch.finfo(torch.float32).tiny
    amax = torch.tensor([0.0, -0.0, 1.0, 448.0, 2688.0, tiny, tiny / 8, -tiny / 8, -1.0, 3e38, float("inf")])
    want = profiles.outer_scales(amax, profile)
    assert_bytes_equal(kernels.outer_decode_scales(amax.cuda(), profile), want.s_dec)
    assert_bytes_equal(kernels.outer_encode_scales(amax.cuda(), profile), want.s_enc)
