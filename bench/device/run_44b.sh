# Stop 44 (issue 15), after run_44a.sh: programmatic dependent launches on by default (FP4CONVERT_PDL=2),
# the pipelined-loop knobs removed, first-call rows the median of 3. (1) the GPU tests of
# tests/formats/test_cuda.py that run the tensor-scope amax + quantize pair (where PDL applies), or
# those TESTS_K selects; (2) the sync rows (bench/device/sync_rows.sh defaults: its byte checks and
# validator cover the segment kernels). NO_TESTS skips (1), NO_SYNC (2).
[ -z "$NO_TEE" ] && exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
K=${TESTS_K:-"golden or nvfp4_cuda or large or dense or views or tensor_amax or never_wait or eager_reference"}
[ -z "$NO_TESTS" ] && { echo "== GPU tests of tests/formats/test_cuda.py -k '$K'"; timeout ${TESTS_TIMEOUT:-120} python3 -m pytest \
  -o addopts=--import-mode=importlib -p no:cacheprovider -q -m gpu tests/formats/test_cuda.py -k "$K" -n 14 -rfE 2>&1 | tail -4; }
[ -z "$NO_SYNC" ] && SYNC_TIMEOUT=${SYNC_TIMEOUT:-200} bash bench/device/sync_rows.sh defaults
