# Issue 15, steady syncs after this stop's second round (validator picks, extras, same-memory BF16,
# bind fast path, C-level reuse check): GPU tests, every sync row of live_sync, the steady profiles.
timeout 170 python3 -m pytest -m gpu tests/formats/test_cuda.py tests/megatron -q -n 8 -rf -p no:cacheprovider 2>&1 | tail -4
timeout 200 python3 bench/live_sync.py --skip-kernels --repeat 5 > $OUT/live_sync.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync.txt; grep -E "^bytes" $OUT/live_sync.txt
timeout 150 python3 bench/device/first_call_profile.py 48 > $OUT/first_call_profile.txt 2>&1
grep -v "^$" $OUT/first_call_profile.txt | grep -E "^==|function calls|^ +[0-9]" | cut -c1-150 | sed -n '1,4p;/steady call/,+14p'
