# Issue 15, stop 27, first batch (all that must run if only one does): the GPU tests (the E4M3
# conversion instruction against the integer rounding on all 2^32 float32 patterns, the one-pass NVFP4
# compare, the one-launch outer scales, every CUDA == CPU test, the megatron GPU tests); which E4M3
# instruction Triton emits; live_sync's kernel rows on 4 layers; a steady 48-layer export and validate
# (validate_profile.py) of this revision, then of stop 26's from _base/ on the same host.
timeout 240 python3 -m pytest -m gpu tests/formats/test_cuda.py tests/megatron -q -n 8 -rfs -p no:cacheprovider 2>&1 | tail -6
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
timeout 120 python3 bench/live_sync.py --layers 4 --repeat 3 > $OUT/live_sync.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync.txt | grep -E "NVFP4|MXFP8|copy"; grep -E "^bytes|MXFP8 bf16 kernel|amax pass" $OUT/live_sync.txt
timeout 100 python3 bench/device/validate_profile.py 48 > $OUT/validate_profile.txt 2>&1
grep -v -E "^$|^-+$|Ordered by|List reduced|^ +ncalls" $OUT/validate_profile.txt | cut -c1-160 | head -60
PYTHONPATH=$PWD/_base:/tmp/site timeout 90 python3 bench/device/validate_profile.py 48 > $OUT/validate_profile_base.txt 2>&1
grep -E "^==" $OUT/validate_profile_base.txt
