# Issue 15, stop 26: the CUDA format tests (with the no-synchronization test), then live_sync's kernel rows
# on 4 layers (the kernel rows do not depend on the layer count).
timeout 280 python3 -m pytest -m gpu tests/formats/test_cuda.py -q -n 8 -rf -p no:cacheprovider 2>&1 | tail -4
timeout 200 python3 bench/live_sync.py --layers 4 --repeat 5 > $OUT/live_sync.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync.txt | head -60
