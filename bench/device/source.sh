# The 6.23 GB 4-layer Qwen3-30B-A3B-shaped source in $W/src, drawn on the GPU, flushed to disk.
W=${W:-/tmp/fd}; mkdir -p $W
python3 -c "
import sys; sys.path.insert(0, 'bench')
from pathlib import Path
from multi_gpu import make_source
make_source(Path('$W/src'), 4, 'cuda', shards=3)" >/dev/null 2>&1
sync; sleep 1
