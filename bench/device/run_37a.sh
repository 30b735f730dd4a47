# Stop 37, on an H200 where one is lent (issue 15). (1) GPU tests of tests/formats and tests/megatron
# with the defaults (the bf16 word path and the persistent launches; ran on an H100 in stop 37:
# bench/results/nvfp4-ab-h100-stop37.txt), then tests/megatron (the exporter's and validator's segment
# kernels) with FP4CONVERT_PREFETCH=1. (2) bench/device/nvfp4_ab.py, alternating, two rounds: the
# defaults, the defaults with each next column step read ahead (FP4CONVERT_PREFETCH=1), both off: the
# amax + quantize row against 1.5 TB/s, and the back-to-back Python row that stop 36 could not tell
# from noise. (3) bench/device/wave_lab.py. (4) The sync rows (48 layers where they fit): the defaults
# with the kernel rows, prefetch, then both off (the old defaults). Everything also goes to
# $OUT/run.txt; NO_SYNC=1 stops before the sync rows; QUICK_TESTS=1 runs the NVFP4 launch tests first and
# every GPU test last. BASE=dir (a git archive of another revision's fp4convert/, carried) adds its
# defaults to the nvfp4_ab rounds, on the same GPU.
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
if [ -n "$QUICK_TESTS" ]; then  # QUICK_TESTS=1: the NVFP4 launch tests first, every GPU test at the end
  timeout 120 $P -m gpu tests/formats/test_cuda.py -n 12 -rfE -k "segment or large or dense or bf16_word" 2>&1 | tail -4
  NO_TESTS=1
fi
if [ -z "$NO_TESTS" ]; then  # NO_TESTS=1: the measurements only (the tests ran on another GPU)
  timeout 200 $P -m gpu tests/formats tests/megatron -n 12 -rfE 2>&1 | tail -6
  echo "== FP4CONVERT_PREFETCH=1 tests/megatron"
  FP4CONVERT_PREFETCH=1 timeout 80 $P -m gpu tests/megatron -n 12 -rfE 2>&1 | tail -4
fi
if [ -n "$BASE" ]; then
  gcc -O3 -std=c11 -ffp-contract=off -fno-fast-math -fno-math-errno -fno-trapping-math -shared -fPIC \
    -o $BASE/fp4convert/formats/_native.so $BASE/fp4convert/formats/_native.c -lm -lpthread
fi
for i in 1 2; do
  echo "== defaults"; timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
  if [ -n "$BASE" ]; then
    echo "== $BASE, defaults"; PYTHONPATH=$BASE:$PYTHONPATH timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
  fi
  echo "== defaults + prefetch"; FP4CONVERT_PREFETCH=1 timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
  echo "== both off"; FP4CONVERT_BF16_WORDS=0 FP4CONVERT_PERSISTENT=0 timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
done
timeout 60 python3 bench/device/wave_lab.py
[ -n "$NO_SYNC" ] && exit 0
for run in ${SYNC_RUNS:-on prefetch off}; do  # SYNC_RUNS: which of them
  case $run in
    on) bash bench/device/sync_rows.sh on ;;
    prefetch) bash bench/device/sync_rows.sh prefetch FP4CONVERT_PREFETCH=1 --skip-kernels ;;
    off) bash bench/device/sync_rows.sh off "FP4CONVERT_BF16_WORDS=0 FP4CONVERT_PERSISTENT=0" --skip-kernels ;;
  esac
done
if [ -n "$QUICK_TESTS" ]; then
  echo "== every GPU test"; timeout 200 $P -m gpu tests/formats tests/megatron -n 12 -rfE 2>&1 | tail -6
fi
