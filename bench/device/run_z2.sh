# Stop 29, second batch: the bf16 MXFP8 kernel's E4M3 pair from the instruction itself (inline PTX),
# then with the instruction on: the all-2^32 tests (byte and pair), every GPU test, live_sync's
# kernel rows on 4 layers; on an H200 (141 GB) the 48-layer export/validate profile.
export FP4CONVERT_E4M3_INSTRUCTION=1
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
timeout 120 $P -m gpu tests/formats/test_cuda.py -rA -k "hardware_e4m3 or mxfp8" 2>&1 | grep -E "PASSED|FAILED|SKIPPED|Error|passed|failed" | cut -c1-200
timeout 240 $P -m gpu tests/formats/test_cuda.py tests/megatron -n 8 -rfs 2>&1 | tail -4
timeout 130 python3 bench/live_sync.py --layers 4 --repeat 3 > $OUT/live_sync.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync.txt | grep -E "NVFP4|MXFP8|copy"; grep -E "^bytes" $OUT/live_sync.txt
if [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ]; then
  timeout 100 python3 bench/device/validate_profile.py 48 > $OUT/validate_profile.txt 2>&1
  grep -v -E "^$|^-+$|Ordered by|List reduced|^ +ncalls" $OUT/validate_profile.txt | cut -c1-160 | head -40
fi
