# Stop 32, for an H200 with the device time left (~4 min): every sync row on 48 layers, both
# replays (validator, LiveExporter) beside their kernel-by-kernel steady states.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 170 python3 bench/live_sync.py --skip-kernels --layers 48 --repeat 2 > $OUT/live_sync48.txt 2>&1
grep -E "^(export|LiveExporter|validate|device copy|    device memory)" $OUT/live_sync48.txt | cut -c1-170; grep -E "^bytes|!!|Error|error" $OUT/live_sync48.txt | cut -c1-300
