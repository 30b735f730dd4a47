# Stop 31, fourth batch (issues 15 and 13): the NVFP4 kernels of 520500a (_base/) against this tree
# (fminf E2M1, scale bytes by instruction, four column steps on large matrices), alternating; the
# NVFP4/MXFP8 CUDA tests; live_sync's kernel rows and every sync row on 48 layers where they fit (an
# H200), else 36; then three one-process conversions of the 6.23 GB source (conv_once.py).
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
cp fp4convert/formats/_native.so _base/fp4convert/formats/_native.so
for i in 1 2; do
  echo "== before (_base)"; PYTHONPATH=$PWD/_base:/tmp/site timeout 60 python3 bench/device/nvfp4_ab.py
  echo "== this revision"; timeout 60 python3 bench/device/nvfp4_ab.py
done
timeout 100 $P -m gpu tests/formats/test_cuda.py -n 8 -rfs 2>&1 | tail -2
timeout 100 python3 bench/live_sync.py --layers 4 --repeat 3 > $OUT/live_sync.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync.txt | grep -E "NVFP4|MXFP8|copy" | grep -v sweep | cut -c1-110
L=36; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && L=48
timeout 200 python3 bench/live_sync.py --skip-kernels --layers $L --repeat 3 > $OUT/live_sync$L.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync$L.txt | cut -c1-150; grep -E "^bytes|!!" $OUT/live_sync$L.txt | cut -c1-200
W=/tmp/fd; timeout 60 bash -c '. bench/device/source.sh'
nproc; for i in 1 2 3; do timeout 30 python3 bench/device/conv_once.py --fresh; done
