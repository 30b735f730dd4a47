# This stop's last device batch (about 7 minutes of device time were left): the GPU tests of
# formats and megatron (uploads, segment tables, device= buffers), a CUDA conversion compared byte
# for byte with the CPU's (this stop changed reading, hashing and writing), then live_sync's rows.
timeout 150 python3 -m pytest -m gpu tests/formats/test_cuda.py tests/megatron -q -n 8 -rf -p no:cacheprovider 2>&1 | tail -6
W=/tmp/fd; . bench/device/source.sh
python3 bench/device/conv_once.py --fresh
rm -rf /dev/shm/out_cuda
python3 -m fp4convert convert $W/src /dev/shm/out_cuda --contract contracts/nvfp4-experts-per-token.yaml --max-shard-size 500MB --quiet --device cuda
for f in /dev/shm/out/*; do cmp -s "$f" "/dev/shm/out_cuda/$(basename $f)" && echo "same: $(basename $f)" || echo "DIFFERENT: $(basename $f)"; done
rm -rf /dev/shm/out /dev/shm/out_cuda $W
timeout 200 python3 bench/live_sync.py --skip-kernels --repeat 3 2>&1 | grep -v "^ *$" | head -40
