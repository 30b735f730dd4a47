# Stop 30, first batch (issue 15): the one-add E2M1 rounding. The all-2^32 E2M1 tests; the NVFP4
# kernels of the previous revision (_base/: git archive of 730d3c1) and of this one, alternating,
# three rounds (bench/device/nvfp4_ab.py); then every GPU test.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
timeout 90 $P -m gpu tests/formats/test_cuda.py -rA -k "e2m1 or hardware_e4m3" 2>&1 | grep -E "PASSED|FAILED|SKIPPED|Error|passed|failed" | cut -c1-200
cp fp4convert/formats/_native.so _base/fp4convert/formats/_native.so
for i in 1 2 3; do
  echo "== previous (_base)"; PYTHONPATH=$PWD/_base:/tmp/site timeout 60 python3 bench/device/nvfp4_ab.py
  echo "== this revision"; timeout 60 python3 bench/device/nvfp4_ab.py
done
timeout 240 $P -m gpu tests/formats/test_cuda.py tests/megatron -n 8 -rfs 2>&1 | tail -4
