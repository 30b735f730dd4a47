# Stop 46 (issue 15): this stop cut a sync's first call on the host (a whole update read in C-level
# passes, each address table read once per bind, q/k/v rows gathered by one strided copy), measured on
# the CPU only (bench/sync_host.py --stub-kernels). (1) every GPU test of tests/megatron: the bytes
# against the CPU's; (2) the sync rows for this tree and for stop 45's, alternating, twice: put 39c8cfa
# in _base/ first (`mkdir _base && git archive 39c8cfa fp4convert contracts | tar -x -C _base`, carry
# it with `.whl`); (3) on an H200, nvfp4_ab.py's amax + quantize rows with PDL on and off.
# NO_TESTS skips (1), NO_BASE the stop-45 rows, NO_AB (3).
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ -z "$NO_TESTS" ]; then echo "== GPU tests of tests/megatron"
  timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q -m gpu \
    tests/megatron -n 14 -rfE --tb=short > $OUT/megatron.txt 2>&1; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/megatron.txt; fi
[ -d _base ] && cp fp4convert/formats/_native.so _base/fp4convert/formats/
for round in 1 2; do
  [ -z "$NO_BASE" ] && [ -d _base ] && SYNC_TIMEOUT=${SYNC_TIMEOUT:-150} bash bench/device/sync_rows.sh stop45-$round \
    "PYTHONPATH=$PWD/_base:$PYTHONPATH" "--skip-kernels"
  SYNC_TIMEOUT=${SYNC_TIMEOUT:-150} bash bench/device/sync_rows.sh stop46-$round "" "--skip-kernels"
done
if [ -z "$NO_AB" ] && [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ]; then
  for pdl in 2 0; do echo "== nvfp4_ab.py FP4CONVERT_PDL=$pdl"
    NVFP4_AB_SHORT=1 FP4CONVERT_PDL=$pdl timeout 60 python3 bench/device/nvfp4_ab.py | grep -E "amax|te 1x16|Error"; done
fi
