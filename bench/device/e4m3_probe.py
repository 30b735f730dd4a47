"""Where the MXFP8 bf16 kernel's bytes with the E4M3 instruction differ from the integer rounding:
the same launch both ways on tests' adversarial input and on randn, the first differing bytes with
their inputs, and one elementwise kernel over the same scaled values (instruction against integer,
no pairing of halves) to tell the conversion from the kernel's packing."""

import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, ".")
from fp4convert.formats import _triton_segments as ts
from tests._helpers import adversarial


def launch(x, hw, nb=8):
    rows, cols = x.shape
    data = torch.empty(rows, cols, dtype=torch.uint8, device=x.device)
    scale = torch.empty(rows, cols // 32, dtype=torch.uint8, device=x.device)
    ts._mxfp8_bf16_dense_kernel[(triton.cdiv(rows, ts.BLOCK_ROWS), triton.cdiv(cols // 32, nb))](
        x,
        x.stride(0),
        rows,
        data,
        scale,
        cols,
        EVEN_R=rows % ts.BLOCK_ROWS == 0,
        EVEN_C=cols % (32 * nb) == 0,
        BR=ts.BLOCK_ROWS,
        NB=nb,
        HW=hw,
        enable_fp_fusion=False,
    )
    return data, scale


@triton.jit
def _elementwise(y_ptr, a_ptr, b_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    y = tl.load(y_ptr + i, mask=m, other=0.0)
    tl.store(a_ptr + i, ts._e4m3_byte(y, True).to(tl.uint8), mask=m)
    tl.store(b_ptr + i, ts._e4m3_byte(y, False).to(tl.uint8), mask=m)


for name, x in (
    ("adversarial", adversarial((2048, 4096), torch.bfloat16, seed=13)),
    ("randn", torch.randn(512, 4096, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)),
):
    x = x.cuda()
    d0, s0 = launch(x, False)
    d1, s1 = launch(x, True)
    torch.cuda.synchronize()
    differ = (d0 != d1).nonzero()
    print(f"== {name}: scales equal {torch.equal(s0, s1)}, data bytes differing {differ.shape[0]} of {d0.numel()}")
    inv = torch.ldexp(torch.ones_like(s0, dtype=torch.float32), 127 - s0.to(torch.int32))
    y = (x.float() * inv.repeat_interleave(32, dim=1)).reshape(-1).contiguous()
    a = torch.empty(y.numel(), dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    _elementwise[(triton.cdiv(y.numel(), 1024),)](y, a, b, y.numel(), BLOCK=1024, enable_fp_fusion=False)
    same_int, same_hw = torch.equal(b, d0.reshape(-1)), torch.equal(a, d1.reshape(-1))
    print(
        f"   elementwise over the scaled values: instruction != integer at {(a != b).sum().item()}; "
        f"integer == kernel(integer) {same_int}, instruction == kernel(HW) {same_hw}"
    )
    for r, c in differ[:12].tolist():
        v = x[r, c].float().item()
        bits, scaled = x[r, c].view(torch.int16).item() & 0xFFFF, y[r * x.shape[1] + c].item()
        print(
            f"   [{r},{c}] x={v!r} bits={bits:#06x} scaled={scaled!r} int={d0[r, c].item():#04x} "
            f"hw={d1[r, c].item():#04x} neighbour hw={d1[r, c ^ 1].item():#04x} int={d0[r, c ^ 1].item():#04x}"
        )
    if differ.shape[0]:
        cols = differ[:, 1]
        swapped = (d1[differ[:, 0], cols] == d0[differ[:, 0], cols ^ 1]).float().mean().item()
        print(
            f"   differing columns: even {(cols % 2 == 0).sum().item()}, odd {(cols % 2 == 1).sum().item()}; "
            f"hw byte == int byte of the neighbour: {swapped:.3f}"
        )
