# Stop 31, third batch (issue 15): live_sync's kernel rows (results no longer kept across timed calls)
# and every sync row on 48 layers where they fit (an H200), else 36; then validate_profile.py on as
# many layers: wall time of a steady export and validate against the GPU's busy time.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 130 python3 bench/live_sync.py --layers 4 --repeat 3 > $OUT/live_sync.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync.txt | grep -E "NVFP4|MXFP8|copy" | grep -v sweep; grep -E "^bytes" $OUT/live_sync.txt
L=36; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && L=48
timeout 200 python3 bench/live_sync.py --skip-kernels --layers $L --repeat 3 > $OUT/live_sync$L.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync$L.txt | cut -c1-150; grep -E "^bytes|!!" $OUT/live_sync$L.txt | cut -c1-200
timeout 200 python3 bench/device/validate_profile.py $L > $OUT/validate_profile$L.txt 2>&1; grep "^==" $OUT/validate_profile$L.txt
