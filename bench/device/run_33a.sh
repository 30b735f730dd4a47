# Stop 33 (issue 15): the megatron GPU tests, then every sync row on 48 layers (an H200; 36 on an
# H100) for this tree and for 694bff8 in _base/ (`git archive 694bff8 fp4convert contracts`), one
# after the other on the same machine: the validator's first call with and without the constructor's
# canonical-layout check plan. Then the 48-layer rows stop 32's run_32d.sh was meant to give.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
timeout 120 $P -m gpu tests/megatron -n 8 -rfs 2>&1 | tail -12
L=36; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && L=48
for tree in this base; do
  if [ $tree = base ]; then P0=$PWD/_base:$PYTHONPATH; cp fp4convert/formats/_native.so _base/fp4convert/formats/; else P0=$PYTHONPATH; fi
  echo "== $tree"
  PYTHONPATH=$P0 timeout 200 python3 bench/live_sync.py --skip-kernels --layers $L --repeat 3 > $OUT/live_sync$L-$tree.txt 2>&1
  grep -E "^(export|LiveExporter|validate|device copy)" $OUT/live_sync$L-$tree.txt | cut -c1-170
  grep -E "^bytes|!!|Error|error" $OUT/live_sync$L-$tree.txt | cut -c1-300
done
