# device setup: py3.12 wheels the image lacks, the native kernel built, the tree importable
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONWARNINGS=ignore PATH=/tmp/site/bin:$PATH
gcc -O3 -std=c11 -ffp-contract=off -fno-fast-math -fno-math-errno -fno-trapping-math -shared -fPIC \
  -o fp4convert/formats/_native.so fp4convert/formats/_native.c -lm -lpthread
