# Issue 15, this stop's first device batch: where the first calls spend their time (cProfile of a
# constructed exporter's and validator's first and steady calls), then every row of live_sync,
# the kernels included (the last stops ran it with --skip-kernels).
timeout 240 python3 bench/device/first_call_profile.py 48 > $OUT/first_call_profile.txt 2>&1
grep -v "^$" $OUT/first_call_profile.txt | cut -c1-160 | head -150
timeout 280 python3 bench/live_sync.py --repeat 3 > $OUT/live_sync.txt 2>&1
grep -v "^ *$" $OUT/live_sync.txt | head -60
