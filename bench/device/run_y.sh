# Issue 15, stop 27, second batch: the host time of one public quantize call (call_overhead.py),
# every sync row of live_sync on 48 layers; issue 13 (stop 28): one-process conversions of this
# revision (private, huge-page-aligned read buffers) against stop 27's in _prev/, interleaved.
timeout 90 python3 bench/device/call_overhead.py --calls 2000 > $OUT/call_overhead.txt 2>&1
sed -n '1,13p' $OUT/call_overhead.txt; grep -A 26 "^== cProfile" $OUT/call_overhead.txt | grep -E "^==|^ +[0-9]" | cut -c1-140 | head -36
timeout 250 python3 bench/live_sync.py --skip-kernels --repeat 3 > $OUT/live_sync48.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync48.txt; grep -E "^bytes" $OUT/live_sync48.txt
bash bench/device/conv_ab.sh
