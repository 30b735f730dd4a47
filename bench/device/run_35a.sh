# Stop 35. (1) GPU tests of tests/formats and tests/megatron with FP4CONVERT_BF16_WORDS=1: the te NVFP4
# kernels' bf16 word path (every bf16 value at every position against the specification; CUDA == CPU
# everywhere). (2) Issue 15: the NVFP4 kernels of 19a06f8 (_head/: `git archive 19a06f8 fp4convert
# contracts`) and of this tree with the word path, alternating, two rounds (bench/device/nvfp4_ab.py).
# (3) Issue 13: the hash child's read size against the mapped file on this host. (4) The sync rows, this
# tree with the word path and the kernel rows, then 19a06f8. Everything also goes to $OUT/run.txt: a
# reply returns only the last 12,000 characters, and the first run of this lost its tests and A/B rows so.
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
export FP4CONVERT_BF16_WORDS=1  # the word path (off by default until this has run)
timeout 170 $P -m gpu tests/formats tests/megatron -n 8 -rfE 2>&1 | tail -15
cp fp4convert/formats/_native.so _head/fp4convert/formats/
for i in 1 2; do
  echo "== 19a06f8"; PYTHONPATH=$PWD/_head:$PYTHONPATH timeout 45 python3 bench/device/nvfp4_ab.py
  echo "== this, word path"; timeout 45 python3 bench/device/nvfp4_ab.py
done
for i in 1 2 3; do head -c 2G /dev/zero > /tmp/hz$i; done
timeout 60 python3 bench/device/hash_probe.py --chunks /tmp/hz1 /tmp/hz2 /tmp/hz3
L=36; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && L=48
timeout 140 python3 bench/live_sync.py --layers $L --repeat 3 > $OUT/live_sync$L-this.txt 2>&1
grep -E "^(export|LiveExporter|validate|device copy|NVFP4|MXFP8|  )" $OUT/live_sync$L-this.txt | cut -c1-170
grep -E "^bytes|!!|Error|error" $OUT/live_sync$L-this.txt | cut -c1-300
PYTHONPATH=$PWD/_head:$PYTHONPATH timeout 100 python3 bench/live_sync.py --skip-kernels --layers $L --repeat 3 > $OUT/live_sync$L-head.txt 2>&1
grep -E "^(export|LiveExporter|validate)" $OUT/live_sync$L-head.txt | cut -c1-170
