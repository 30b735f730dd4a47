# Issue 15's first calls on the GPU (cProfile), then issue 13: one round of run_o and a conversion on
# the GPU compared byte for byte with the CPU's (this stop changed reading, hashing and writing).
python3 bench/device/first_call_profile.py 48 2>&1 | grep -v "^$" | cut -c1-170
W=/tmp/fd; . bench/device/source.sh
R=$PWD; conv() { python3 $R/bench/device/conv_once.py --fresh "$@"; }
conv --workers 12; conv --workers 13; conv
rm -rf /dev/shm/out_cuda
python3 -m fp4convert convert $W/src /dev/shm/out_cuda --contract contracts/nvfp4-experts-per-token.yaml --max-shard-size 500MB --quiet --device cuda
for f in /dev/shm/out/*; do cmp -s "$f" "/dev/shm/out_cuda/$(basename $f)" && echo "same: $(basename $f)" || echo "DIFFERENT: $(basename $f)"; done
python3 -m fp4convert verify /dev/shm/out_cuda --source $W/src 2>&1 | tail -2
rm -rf /dev/shm/out /dev/shm/out_cuda
