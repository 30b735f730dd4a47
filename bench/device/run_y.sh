# Issue 15, stop 27, second batch: a steady export and validate on 48 layers, wall time against the
# GPU's busy time and cProfile (after the one-pass NVFP4 compare), then every sync row of live_sync.
timeout 200 python3 bench/device/validate_profile.py 48 > $OUT/validate_profile.txt 2>&1
grep -v -E "^$|^-+$|Ordered by|List reduced|^ +ncalls" $OUT/validate_profile.txt | cut -c1-170 | head -100
timeout 250 python3 bench/live_sync.py --skip-kernels --repeat 3 > $OUT/live_sync48.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync48.txt; grep -E "^bytes" $OUT/live_sync48.txt
