# Stop 36, on an H200 (issue 15): does the te NVFP4 kernels' bf16 word path (FP4CONVERT_BF16_WORDS=1) pay
# where bandwidth is 40% above the H100's? (1) GPU tests of tests/formats and tests/megatron with the path
# on (every bf16 value at every position against the specification; CUDA == CPU everywhere). (2) The
# NVFP4 kernels of 19a06f8 (_head/), this tree with the path on, and this tree with it off, alternating,
# two rounds (bench/device/nvfp4_ab.py). (3) The sync rows at the scale (48 layers fit only an
# H200): this tree with the path off, then on with the kernel rows. (4) Issue 13's read-size sweep on this
# host. (5) bench/device/wave_lab.py: the dense launch's last partial wave against persistent launches.
# Everything goes to $OUT/run.txt too: a reply returns only its last 12,000 characters.
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
cp fp4convert/formats/_native.so _head/fp4convert/formats/
for i in 1 2; do
  echo "== 19a06f8"; PYTHONPATH=$PWD/_head:$PYTHONPATH timeout 40 python3 bench/device/nvfp4_ab.py
  echo "== this, word path on"; FP4CONVERT_BF16_WORDS=1 timeout 40 python3 bench/device/nvfp4_ab.py
  echo "== this, word path off"; FP4CONVERT_BF16_WORDS=0 timeout 40 python3 bench/device/nvfp4_ab.py
done
echo "== waves: the package's launch against persistent ones (bench/device/wave_lab.py), word path on, then off"
FP4CONVERT_BF16_WORDS=1 timeout 60 python3 bench/device/wave_lab.py
FP4CONVERT_BF16_WORDS=0 timeout 60 python3 bench/device/wave_lab.py
FP4CONVERT_BF16_WORDS=1 timeout 140 $P -m gpu tests/formats tests/megatron -n 8 -rfE 2>&1 | tail -8
L=36; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && L=48
echo "== sync rows, $L layers, word path off"
FP4CONVERT_BF16_WORDS=0 timeout 90 python3 bench/live_sync.py --skip-kernels --layers $L --repeat 3 > $OUT/live_sync$L-off.txt 2>&1
grep -E "^(export|LiveExporter|validate)" $OUT/live_sync$L-off.txt | cut -c1-170
echo "== sync rows, $L layers, word path on, with the kernel rows"
FP4CONVERT_BF16_WORDS=1 timeout 120 python3 bench/live_sync.py --layers $L --repeat 3 > $OUT/live_sync$L-on.txt 2>&1
grep -E "^(export|LiveExporter|validate|device copy|NVFP4|MXFP8|  )" $OUT/live_sync$L-on.txt | cut -c1-170
grep -hE "^bytes|!!|Error|error" $OUT/live_sync$L-*.txt | cut -c1-300
for i in 1 2 3; do head -c 2G /dev/zero > /tmp/hz$i; done
timeout 45 python3 bench/device/hash_probe.py --chunks /tmp/hz1 /tmp/hz2 /tmp/hz3
