# Stop 32, last batch (issue 15, then 13): the GPU tests of both CUDA-graph replays (validator and
# LiveExporter) and every megatron GPU test; every sync row on 48 layers (an H200; 36 on an H100) with
# the replayed and the kernel-by-kernel steady states of both in the same run; live_sync's kernel rows;
# three one-process conversions of the 6.23 GB source. In order of need: later steps may not fit.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
timeout 120 $P -m gpu tests/megatron -n 8 -rfs 2>&1 | tail -12
L=36; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && L=48
timeout 200 python3 bench/live_sync.py --skip-kernels --layers $L --repeat 3 > $OUT/live_sync$L.txt 2>&1
grep -E "^(export|LiveExporter|validate|device copy|    device memory)" $OUT/live_sync$L.txt | cut -c1-170; grep -E "^bytes|!!|Error|error" $OUT/live_sync$L.txt | cut -c1-300
timeout 90 python3 bench/live_sync.py --layers 4 --repeat 3 > $OUT/live_sync.txt 2>&1
grep -E "NVFP4|MXFP8|copy" $OUT/live_sync.txt | grep -v sweep | head -14 | cut -c1-110
W=/tmp/fd; timeout 60 bash -c '. bench/device/source.sh'
nproc; for i in 1 2 3; do timeout 30 python3 bench/device/conv_once.py --fresh; done
