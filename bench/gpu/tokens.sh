# bench/gpu/tokens.sh — sourced by the GPU benchmarks: DATA names a shard of
# 2^23 uniformly random GPT-2 tokens in llm.c's format (header magic 20240520,
# uint16 tokens), made once per machine. Speed does not depend on the text.
DATA=/tmp/bench-tokens.bin
[ -f $DATA ] || python3 -c "
import numpy as np
n = 1 << 23
h = np.zeros(256, np.int32); h[0], h[1], h[2] = 20240520, 1, n
t = np.random.default_rng(0).integers(0, 50257, n).astype(np.uint16)
open('$DATA', 'wb').write(h.tobytes() + t.tobytes())"
# DATA32: the same for Llama 3's vocabulary, a "llama-3" shard (magic
# 20240801, version 7, uint32 tokens below 128,256).
DATA32=/tmp/bench-tokens-u32.bin
[ -f $DATA32 ] || python3 -c "
import numpy as np
n = 1 << 23
h = np.zeros(256, np.int32); h[0], h[1], h[2] = 20240801, 7, n
t = np.random.default_rng(0).integers(0, 128256, n).astype(np.uint32)
open('$DATA32', 'wb').write(h.tobytes() + t.tobytes())"
