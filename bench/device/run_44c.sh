# Stop 44 (issue 15): runs (FP4CONVERT_MERGE_RUNS=1: a whole update's groups of one format, tile and
# width quantized by one set of launches) on a GPU for the first time, most important first:
# (1) every GPU test of tests/megatron with runs on (bytes against the CPU, no host synchronisation,
#     no memory growth, graph replays);
# (2) run_44b.sh's tests of the tensor-scope pair under the PDL default;
# (3) the sync rows without and with runs (first-call rows the median of 3), ROUNDS rounds (1);
# (4) bench/device/nvfp4_ab.py once with PDL on (the default) and once off: the amax + quantize row,
#     each row's bytes against the CPU's (NO_AB skips);
# (5) first_call_profile.py with runs on (a constructed exporter not told its device included).
# NO_TESTS skips (1) and (2), NO_PAIR (2), NO_PROFILE (5). About 6-8 minutes (an estimate); the
# timeouts (TESTS_TIMEOUT, SYNC_TIMEOUT) bound each part, and what a part wrote under $OUT comes back.
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
L=$(python3 -c "import torch; print(48 if torch.cuda.get_device_properties(0).total_memory > 100e9 else 36)")
[ -z "$NO_TESTS" ] && { echo "== GPU tests of tests/megatron, FP4CONVERT_MERGE_RUNS=1"; FP4CONVERT_MERGE_RUNS=1 \
  timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q -m gpu \
  tests/megatron -n 14 -rfE 2>&1 | tail -4; }
[ -z "$NO_PAIR" ] && NO_TEE=1 NO_SYNC=1 TESTS_TIMEOUT=120 bash bench/device/run_44b.sh 2>&1 | grep -v "^NVIDIA"
for round in $(seq ${ROUNDS:-1}); do
  SYNC_TIMEOUT=${SYNC_TIMEOUT:-240} bash bench/device/sync_rows.sh groups-$round "FP4CONVERT_MERGE_RUNS=0" "--skip-kernels"
  SYNC_TIMEOUT=${SYNC_TIMEOUT:-240} bash bench/device/sync_rows.sh runs-$round "FP4CONVERT_MERGE_RUNS=1" "--skip-kernels"
done
[ -z "$NO_AB" ] && for pdl in 2 0; do echo "== nvfp4_ab.py FP4CONVERT_PDL=$pdl"
  NVFP4_AB_SHORT=1 FP4CONVERT_PDL=$pdl timeout 60 python3 bench/device/nvfp4_ab.py | grep -E "amax|te 1x16|Error"; done
[ -z "$NO_PROFILE" ] && { FP4CONVERT_MERGE_RUNS=1 timeout 240 python3 bench/device/first_call_profile.py $L \
  > $OUT/first_call_profile-runs.txt 2>&1; grep -h "^==" $OUT/first_call_profile-runs.txt; }
