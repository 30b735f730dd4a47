# Stop 29, fourth batch (needs an H200: 48 layers do not fit an H100's 80 GB): live_sync's kernel rows
# on 4 layers (E4M3 instruction by default), every sync row on 48 layers.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 130 python3 bench/live_sync.py --layers 4 --repeat 3 > $OUT/live_sync.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync.txt | grep -E "NVFP4|MXFP8|copy" | grep -v sweep; grep -E "^bytes" $OUT/live_sync.txt
timeout 250 python3 bench/live_sync.py --skip-kernels --repeat 3 > $OUT/live_sync48.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync48.txt; grep -E "^bytes|device memory" $OUT/live_sync48.txt
