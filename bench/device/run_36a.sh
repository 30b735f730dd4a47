# Stop 36 (issue 15), on an H200 where one is lent: the two candidate changes to the te NVFP4 kernels,
# each behind a variable read at import: FP4CONVERT_BF16_WORDS=1 (bf16 read as words, rounded by PTX)
# and FP4CONVERT_PERSISTENT=1 (a tensor-scope matrix by a persistent launch instead of a grid whose last
# wave may leave SMs idle). (1) The four combinations, alternating, two rounds (bench/device/nvfp4_ab.py:
# bytes against the CPU, GPU time, amax + quantize). (2) bench/device/wave_lab.py: occupancy, waves, a
# persistent launch at several programs per SM, a persistent amax pass. (3) GPU tests of tests/formats
# and tests/megatron with both on (both launches are also tested whatever the variable says). (4) The
# sync rows (48 layers where they fit): both off, then both on with the kernel rows. 19a06f8 is not run:
# with both off this tree compiles to its machine code (bench/kernel_sass.py). Everything goes to
# $OUT/run.txt too: a reply returns only its last 12,000 characters.
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
for i in 1 2; do
  for w in 0 1; do for p in 0 1; do
    echo "== words=$w persistent=$p"
    FP4CONVERT_BF16_WORDS=$w FP4CONVERT_PERSISTENT=$p timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
  done; done
done
echo "== bench/device/wave_lab.py, word path on"
FP4CONVERT_BF16_WORDS=1 timeout 60 python3 bench/device/wave_lab.py
FP4CONVERT_BF16_WORDS=1 FP4CONVERT_PERSISTENT=1 timeout 140 $P -m gpu tests/formats tests/megatron -n 8 -rfE 2>&1 | tail -8
L=36; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && L=48
echo "== sync rows, $L layers, both off"
FP4CONVERT_BF16_WORDS=0 FP4CONVERT_PERSISTENT=0 timeout 90 python3 bench/live_sync.py --skip-kernels --layers $L --repeat 3 > $OUT/live_sync$L-off.txt 2>&1
grep -E "^(export|LiveExporter|validate)" $OUT/live_sync$L-off.txt | cut -c1-170
echo "== sync rows, $L layers, both on, with the kernel rows"
FP4CONVERT_BF16_WORDS=1 FP4CONVERT_PERSISTENT=1 timeout 120 python3 bench/live_sync.py --layers $L --repeat 3 > $OUT/live_sync$L-on.txt 2>&1
grep -E "^(export|LiveExporter|validate|device copy|NVFP4|MXFP8|  )" $OUT/live_sync$L-on.txt | cut -c1-170
grep -hE "^bytes|!!|Error|error" $OUT/live_sync$L-*.txt | cut -c1-300
