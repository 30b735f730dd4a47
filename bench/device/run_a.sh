set -x
. bench/device/setup.sh
timeout 170 python3 -m pytest -m gpu tests/megatron tests/formats/test_cuda.py -q --durations=10 -p no:cacheprovider 2>&1 | tail -40 | tee $OUT/gpu-tests-livesync-h200.txt
timeout 330 python3 bench/live_sync.py 2>&1 | tee $OUT/live-sync-h200.txt | tail -60
