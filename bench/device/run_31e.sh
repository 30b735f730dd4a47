# Stop 31, last batch (issues 15 and 13), run_31d.sh trimmed to the device time left: the CUDA format
# tests (four column steps on large matrices), the NVFP4 kernels of 520500a (_base/) against this tree
# once each, live_sync's kernel rows, three one-process conversions of the 6.23 GB source.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
timeout 100 $P -m gpu tests/formats/test_cuda.py -n 8 -rfs 2>&1 | tail -2
cp fp4convert/formats/_native.so _base/fp4convert/formats/_native.so
echo "== before (_base)"; PYTHONPATH=$PWD/_base:/tmp/site timeout 60 python3 bench/device/nvfp4_ab.py
echo "== this revision"; timeout 60 python3 bench/device/nvfp4_ab.py
timeout 90 python3 bench/live_sync.py --layers 4 --repeat 3 > $OUT/live_sync.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync.txt | grep -E "NVFP4|MXFP8|copy" | grep -v sweep | cut -c1-110
W=/tmp/fd; timeout 60 bash -c '. bench/device/source.sh'
nproc; for i in 1 2 3; do timeout 30 python3 bench/device/conv_once.py --fresh; done
