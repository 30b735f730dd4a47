# Issue 15, stop 27, first batch: the E4M3 conversion instruction in the MXFP8 kernels (all 2^32
# float32 patterns against the integer rounding, then every CUDA == CPU test), which instruction
# Triton emits, the host time of one public call, and live_sync's kernel rows on 4 layers.
timeout 300 python3 -m pytest -m gpu tests/formats/test_cuda.py tests/megatron -q -n 8 -rfs -p no:cacheprovider 2>&1 | tail -6
python3 - <<'PY'
import torch
from fp4convert.formats import _triton_segments as ts
x = torch.randn(64, 512, device="cuda").to(torch.bfloat16)
d = torch.empty(64, 512, dtype=torch.uint8, device="cuda"); s = torch.empty(64, 16, dtype=torch.uint8, device="cuda")
for hw in (False, True):
    k = ts._mxfp8_bf16_dense_kernel[(4, 2)](x, 512, 64, d, s, 512, EVEN_R=True, EVEN_C=True, BR=16, NB=8, HW=hw, enable_fp_fusion=False)
    ptx = k.asm["ptx"]
    cvt = sorted({l.strip().split()[0] for l in ptx.splitlines() if "cvt" in l and "e4m3" in l})
    print(f"HW={hw}: ptx lines {len(ptx.splitlines())}, e4m3 conversions: {cvt}")
PY
timeout 120 python3 bench/device/call_overhead.py --calls 3000 > $OUT/call_overhead.txt 2>&1
sed -n '1,13p' $OUT/call_overhead.txt; grep -A 30 "^== cProfile" $OUT/call_overhead.txt | grep -E "^==|^ +[0-9]" | cut -c1-140 | head -40
timeout 200 python3 bench/live_sync.py --layers 4 --repeat 3 > $OUT/live_sync.txt 2>&1
grep -E "NVFP4|MXFP8|copy|export_hf steady|validate_export, steady" $OUT/live_sync.txt | grep -v "^  [a-z]* *(issue" | head -40
