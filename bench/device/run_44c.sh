# Stop 44 (issue 15): runs (FP4CONVERT_MERGE_RUNS=1: a whole update's groups of one format, tile and
# width quantized by one set of launches) on a GPU for the first time. (1) every GPU test of
# tests/megatron with runs on (bytes against the CPU, no host synchronisation, no memory growth, graph
# replays); (2) the sync rows without and with runs, alternating, ROUNDS rounds (1). NO_TESTS skips (1)
# (and, passed on, the pair's tests below).
# Then run_44b.sh's part (1) (the tensor-scope pair's tests) if it has not run yet: NO_PAIR skips it.
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ -z "$NO_TESTS" ] && { echo "== GPU tests of tests/megatron, FP4CONVERT_MERGE_RUNS=1"; FP4CONVERT_MERGE_RUNS=1 \
  timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q -m gpu \
  tests/megatron -n 14 -rfE 2>&1 | tail -4; }
[ -z "$NO_PAIR" ] && NO_TEE=1 NO_SYNC=1 TESTS_TIMEOUT=120 bash bench/device/run_44b.sh 2>&1 | grep -v "^NVIDIA"
for round in $(seq ${ROUNDS:-1}); do
  SYNC_TIMEOUT=${SYNC_TIMEOUT:-240} bash bench/device/sync_rows.sh groups-$round "FP4CONVERT_MERGE_RUNS=0" "--skip-kernels"
  SYNC_TIMEOUT=${SYNC_TIMEOUT:-240} bash bench/device/sync_rows.sh runs-$round "FP4CONVERT_MERGE_RUNS=1" "--skip-kernels"
done
