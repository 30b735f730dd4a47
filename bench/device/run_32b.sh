# Stop 32, second batch (issues 15 and 13), for an H200: live_sync's kernel rows (this stop's
# kernels: fminf E2M1, scale bytes by instruction, four column steps), every sync row on 48 layers
# with the validator's steady state replayed as one CUDA graph and issued kernel by kernel, then three
# one-process conversions of the 6.23 GB source (conv_once.py).
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 100 python3 bench/live_sync.py --layers 4 --repeat 3 > $OUT/live_sync.txt 2>&1
grep -E "NVFP4|MXFP8|copy" $OUT/live_sync.txt | grep -v sweep | cut -c1-110
L=36; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && L=48
timeout 240 python3 bench/live_sync.py --skip-kernels --layers $L --repeat 3 > $OUT/live_sync$L.txt 2>&1
grep -E "^(export|LiveExporter|validate|device copy)" $OUT/live_sync$L.txt | cut -c1-170; grep -E "^bytes|!!|Error|error" $OUT/live_sync$L.txt | cut -c1-300
W=/tmp/fd; timeout 60 bash -c '. bench/device/source.sh'
nproc; for i in 1 2 3; do timeout 30 python3 bench/device/conv_once.py --fresh; done
