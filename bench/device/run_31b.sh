# Stop 31, second batch (issue 15): the fminf E2M1 form and the NVFP4 scale bytes by instruction on all
# 2^32 patterns; the NVFP4 kernels of the tree before it (_base/: git archive 520500a) and of this one,
# alternating; the host time of one public quantize call (call_overhead.py); every GPU test.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
timeout 90 $P -m gpu tests/formats/test_cuda.py -rA -k "e2m1 or hardware_e4m3" 2>&1 | grep -E "PASSED|FAILED|SKIPPED|Error|passed|failed" | cut -c1-200
cp fp4convert/formats/_native.so _base/fp4convert/formats/_native.so
for i in 1 2; do
  echo "== before (_base)"; PYTHONPATH=$PWD/_base:/tmp/site timeout 60 python3 bench/device/nvfp4_ab.py
  echo "== this revision"; timeout 60 python3 bench/device/nvfp4_ab.py
done
timeout 120 python3 bench/device/call_overhead.py --calls 2000 > $OUT/call_overhead.txt 2>&1; head -14 $OUT/call_overhead.txt
timeout 240 $P -m gpu tests/formats/test_cuda.py tests/megatron -n 8 -rfs 2>&1 | tail -4
