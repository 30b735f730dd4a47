# This stop's last device batch: issue 13 conversion on the 16-core host (phases), the kernel lab,
# live sync, then the CUDA format tests (xdist) in what time is left. Run after setup.sh.
W=/tmp/fd; . bench/device/source.sh
C=contracts/nvfp4-experts-per-token.yaml
TIMEFORMAT="wall %R s, user %U s, sys %S s"
for dev in cpu cpu cuda; do
  rm -rf $W/out; sync
  { time python3 -m fp4convert convert $W/src $W/out --contract $C --max-shard-size 500MB --device $dev --json --quiet \
      | python3 -c "import json,sys; t=sys.stdin.read(); r=json.loads(t[t.index('{'):]); print('$dev', 'seconds', round(r['seconds'], 2), 'GB/s', round(r['source_bytes'] / 1e9 / r['seconds'], 2), r.get('phases'))"; } 2>&1
done | tee $OUT/convert-h200.txt
rm -rf $W
timeout 100 python3 bench/device/kernel_lab.py 2>&1 | grep -v Warning | head -40 > $OUT/kernel-lab.txt
timeout 150 python3 bench/live_sync.py --skip-kernels 2>&1 | tee $OUT/live-sync-h200.txt | tail -16
timeout 170 python3 -m pytest -m gpu tests/formats/test_cuda.py tests/megatron -q -n 8 -p no:cacheprovider 2>&1 | tail -6 | tee $OUT/gpu-tests.txt
