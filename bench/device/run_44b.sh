# Stop 44 (issue 15), after run_44a.sh: programmatic dependent launches on by default (FP4CONVERT_PDL=2),
# the pipelined-loop knobs removed, first-call rows the median of 3. (1) every GPU test of tests/formats
# and tests/megatron (the tensor-scope pair's bytes under PDL; the constructors told their device);
# (2) the sync rows (bench/device/sync_rows.sh defaults). NO_TESTS skips (1).
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ -z "$NO_TESTS" ] && { echo "== GPU tests of tests/formats and tests/megatron"; timeout ${TESTS_TIMEOUT:-240} python3 -m pytest \
  -o addopts=--import-mode=importlib -p no:cacheprovider -q -m gpu tests/formats tests/megatron -n 14 -rfE 2>&1 | tail -4; }
SYNC_TIMEOUT=${SYNC_TIMEOUT:-200} bash bench/device/sync_rows.sh defaults
