# Stop 39 (issue 15), run on an H100 at 3ab11c0 (bench/results/scale-store-h100-stop39.txt). (1) The
# NVFP4 launch tests, tests/megatron, with the defaults of that tree: the scale bytes stored and compared
# from the registers' layout with inline PTX (FP4CONVERT_SCALE_ASM), no shared-memory round trip and
# no barrier per column step; the MXFP8 row kernel storing its scale bytes the same way. (2)
# bench/device/nvfp4_ab.py, alternating, two rounds: the defaults, FP4CONVERT_SCALE_ASM=0 (Triton's
# store through shared memory), the defaults with prefetch. (3) The sync rows (48 layers on an H200,
# 36 on an H100) both ways (SYNC_RUNS picks). (4) Every GPU test. Everything also goes to $OUT/run.txt.
# The inline PTX and its flag were taken out after this run (1.6x slower), so on a later tree every
# variant runs Triton's store.
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; nproc
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
timeout 120 $P -m gpu tests/formats/test_cuda.py -n 12 -rfE -k "segment or large or dense or bf16_word" 2>&1 | tail -4
timeout 100 $P -m gpu tests/megatron -n 12 -rfE 2>&1 | tail -4
for i in 1 2; do
  echo "== defaults"; timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
  echo "== FP4CONVERT_SCALE_ASM=0"; FP4CONVERT_SCALE_ASM=0 timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
  echo "== defaults + prefetch"; FP4CONVERT_PREFETCH=1 timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
done
[ -n "$NO_SYNC" ] && exit 0
for run in ${SYNC_RUNS:-on off}; do
  case $run in
    on) bash bench/device/sync_rows.sh on ;;
    off) bash bench/device/sync_rows.sh off FP4CONVERT_SCALE_ASM=0 --skip-kernels ;;
  esac
done
echo "== every GPU test"; timeout 200 $P -m gpu tests/formats tests/megatron -n 12 -rfE 2>&1 | tail -6
