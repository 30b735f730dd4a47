# Stop 32, first batch (issue 15): the validator's byte check replayed as one CUDA graph. The GPU
# tests of the replay (and every megatron GPU test), then the sync rows on 36 layers (48 on an H200)
# with the validator's steady state replayed and issued kernel by kernel in the same run.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
timeout 200 $P -m gpu tests/megatron -n 8 -rfs -x 2>&1 | tail -15
L=36; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && L=48
timeout 300 python3 bench/live_sync.py --skip-kernels --layers $L --repeat 3 > $OUT/live_sync$L.txt 2>&1
grep -E "^(export|LiveExporter|validate|device copy)" $OUT/live_sync$L.txt | cut -c1-170; grep -E "^bytes|!!|Error|error" $OUT/live_sync$L.txt | cut -c1-300
