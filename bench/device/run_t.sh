# Issue 15 after this stop's first-call and validator changes: GPU tests, the first-call profile,
# every live_sync row (kernels timed back to back now); issue 13: conversions after the read_back fold.
timeout 170 python3 -m pytest -m gpu tests/formats/test_cuda.py tests/megatron -q -n 8 -rf -p no:cacheprovider 2>&1 | tail -5
timeout 150 python3 bench/device/first_call_profile.py 48 > $OUT/first_call_profile.txt 2>&1
grep -v "^$" $OUT/first_call_profile.txt | grep -E "^==|function calls|^ +[0-9]" | cut -c1-150 | head -60
timeout 200 python3 bench/live_sync.py --repeat 3 > $OUT/live_sync.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync.txt; grep -E "^bytes|export_hf steady on" $OUT/live_sync.txt
W=/tmp/fd; . bench/device/source.sh
for i in 1 2 3; do python3 bench/device/conv_once.py --fresh; done
rm -rf /dev/shm/out_cuda
python3 -m fp4convert convert $W/src /dev/shm/out_cuda --contract contracts/nvfp4-experts-per-token.yaml --max-shard-size 500MB --quiet --device cuda
for f in /dev/shm/out/*; do cmp -s "$f" "/dev/shm/out_cuda/$(basename $f)" && echo "same: $(basename $f)" || echo "DIFFERENT: $(basename $f)"; done
