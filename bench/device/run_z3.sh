# Stop 29, third batch (H200): live_sync's kernel rows on 4 layers with the E4M3 instruction now the
# default; every sync row of live_sync on 48 layers; issue 13: one-process conversions of this
# revision (stop 28's private huge-page read buffers, frozen heap) against stop 27's in _prev/.
timeout 130 python3 bench/live_sync.py --layers 4 --repeat 3 > $OUT/live_sync.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync.txt | grep -E "NVFP4|MXFP8|copy" | grep -v sweep; grep -E "^bytes" $OUT/live_sync.txt
timeout 230 python3 bench/live_sync.py --skip-kernels --repeat 3 > $OUT/live_sync48.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync48.txt; grep -E "^bytes" $OUT/live_sync48.txt; tail -3 $OUT/live_sync48.txt
bash bench/device/conv_ab.sh
