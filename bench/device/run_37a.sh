# Next stop, on an H200 where one is lent (issue 15): this tree's defaults (the bf16 word path and the
# persistent launches) against both off. (1) GPU tests of tests/formats and tests/megatron with the
# defaults: the package's persistent amax pass has not run on a GPU yet (stop 36 ran out of device time).
# (2) bench/device/nvfp4_ab.py, defaults and both off, alternating, two rounds: the amax + quantize row
# against 1.5 TB/s; the back-to-back Python row, which stop 36 could not tell from noise; and the
# persistent launch reading its next step ahead (FP4CONVERT_PREFETCH=1). (3) bench/device/wave_lab.py.
# (4) The sync rows (48 layers where they fit), both off, then the defaults with the kernel rows. Everything also goes to $OUT/run.txt.
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
timeout 200 $P -m gpu tests/formats tests/megatron -n 8 -rfE 2>&1 | tail -6
for i in 1 2; do
  echo "== defaults"; timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
  echo "== defaults + prefetch"; FP4CONVERT_PREFETCH=1 timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
  echo "== both off"; FP4CONVERT_BF16_WORDS=0 FP4CONVERT_PERSISTENT=0 timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
done
timeout 50 python3 bench/device/wave_lab.py
[ -n "$NO_SYNC" ] && exit 0  # NO_SYNC=1: the kernel rows only (an H100, whose sync rows stop 36 measured)
L=36; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && L=48
echo "== sync rows, $L layers, both off"
FP4CONVERT_BF16_WORDS=0 FP4CONVERT_PERSISTENT=0 timeout 90 python3 bench/live_sync.py --skip-kernels --layers $L --repeat 3 > $OUT/live_sync$L-off.txt 2>&1
grep -E "^(export|LiveExporter|validate)" $OUT/live_sync$L-off.txt | cut -c1-170
echo "== sync rows, $L layers, defaults, with the kernel rows"
timeout 120 python3 bench/live_sync.py --layers $L --repeat 3 > $OUT/live_sync$L-on.txt 2>&1
grep -E "^(export|LiveExporter|validate|device copy|NVFP4|MXFP8)" $OUT/live_sync$L-on.txt | cut -c1-170
grep -hE "^bytes|!!|Error|error" $OUT/live_sync$L-*.txt | cut -c1-300
