# Stop 45 (issue 15): after run_44c.sh found 7 GPU tests of tests/megatron failing under the new
# LiveExporter default (device="auto": the first output set made at construction), (1) every GPU test
# of tests/megatron with runs off (the default) and (2) on, the failures' tracebacks in full;
# (3) run_44b.sh's tests of the tensor-scope pair (cut by their 120 s timeout in run_44c.sh);
# (4) the sync rows (defaults: buffers retyped once per matrix). NO_PAIR skips (3), NO_SYNC (4).
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for m in 0 1; do echo "== GPU tests of tests/megatron, FP4CONVERT_MERGE_RUNS=$m"; FP4CONVERT_MERGE_RUNS=$m \
  timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q -m gpu \
  tests/megatron -n 14 -rfE --tb=short > $OUT/megatron-runs$m.txt 2>&1; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/megatron-runs$m.txt; done
[ -z "$NO_PAIR" ] && NO_TEE=1 NO_SYNC=1 TESTS_TIMEOUT=${PAIR_TIMEOUT:-200} bash bench/device/run_44b.sh 2>&1 | grep -v "^NVIDIA"
[ -z "$NO_SYNC" ] && SYNC_TIMEOUT=${SYNC_TIMEOUT:-150} bash bench/device/sync_rows.sh defaults
