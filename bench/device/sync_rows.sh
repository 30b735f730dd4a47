# One bench/live_sync.py run, 48 layers where the GPU holds them (an H200), else 36: its whole output in
# $OUT/live_sync<layers>-NAME.txt, its rows and its byte checks printed.
#   bash bench/device/sync_rows.sh NAME ["VAR=value ..."] ["live_sync.py flags"]
L=36; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && L=48
echo "== sync rows, $L layers, $1 ($2 $3)"
env $2 timeout ${SYNC_TIMEOUT:-120} python3 bench/live_sync.py $3 --layers $L --repeat 3 > $OUT/live_sync$L-$1.txt 2>&1
grep -E "^(export|LiveExporter|validate|device copy|NVFP4|MXFP8)" $OUT/live_sync$L-$1.txt | cut -c1-170
grep -hE "^bytes|!!|Error|error" $OUT/live_sync$L-$1.txt | cut -c1-300
