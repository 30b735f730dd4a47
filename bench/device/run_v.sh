# Issue 15, this stop's last device batch: GPU tests, then every sync row of live_sync.
timeout 170 python3 -m pytest -m gpu tests/formats/test_cuda.py tests/megatron -q -n 8 -rf -p no:cacheprovider 2>&1 | tail -4
timeout 220 python3 bench/live_sync.py --skip-kernels --repeat 5 > $OUT/live_sync.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync.txt; grep -E "^bytes|device memory" $OUT/live_sync.txt
