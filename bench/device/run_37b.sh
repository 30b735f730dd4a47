# A tree's GPU check on whichever GPU comes, when little device time is left (written in stop 37,
# not run: no machine could be started): every GPU test of tests/formats and tests/megatron with the
# defaults (the prefetch launches through the tests' fixtures), then bench/device/nvfp4_ab.py: the
# defaults, both off, the defaults again.
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
timeout 180 $P -m gpu tests/formats tests/megatron -n 14 -rfE 2>&1 | tail -6
for run in defaults off defaults; do
  echo "== $run"
  if [ $run = off ]; then export FP4CONVERT_BF16_WORDS=0 FP4CONVERT_PERSISTENT=0; else unset FP4CONVERT_BF16_WORDS FP4CONVERT_PERSISTENT; fi
  timeout 30 python3 bench/device/nvfp4_ab.py | grep -v modelopt
done
