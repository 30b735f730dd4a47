# Stop 39 (issue 15), on an H200 where one is lent, in what little device time is left: the
# measurements first, the tests after. (1) bench/device/nvfp4_ab.py once (this tree's kernels have not
# run on an H200 yet: the word path and the persistent launches came after stop 31). (2)
# bench/live_sync.py, 48 layers on an H200 (36 on an H100), with its kernel rows. (3) tests/megatron
# (the validator's compare kernel now keeps a verdict per block across its column steps and reduces
# them once, after the loop) and the segment tests of tests/formats/test_cuda.py. Everything also
# goes to $OUT/run.txt.
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; nproc
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
SYNC_TIMEOUT=150 bash bench/device/sync_rows.sh defaults
timeout 80 $P -m gpu tests/megatron -n 12 -rfE 2>&1 | tail -3
timeout 60 $P -m gpu tests/formats/test_cuda.py -n 12 -rfE -k segment 2>&1 | tail -3
