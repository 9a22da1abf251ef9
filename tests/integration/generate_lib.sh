# tests/integration/generate_lib.sh — what test_generate.sh and
# tests/gpu/test_generate.sh share: the oracle's four small models
# (tests/tools/generate_oracle.py make) in $M, and the prompts.
#
#   . ".../integration/lib.sh"
#   PY=<python with torch> ORACLE=<generate_oracle.py> M=<models folder>
#   . ".../integration/generate_lib.sh"
#
# g1: GPT-2 f32; g2: GPT-2 bf16 in 3 shards, no "transformer." prefix; l1:
# Llama GQA 2:1 with Llama 3's RoPE scaling; l2: Llama MHA, tied, bf16 in 2
# shards. A model the oracle cannot make is said as a comment; the tests that
# need it then fail. P: a 7-token prompt; LONG: 70 tokens (two chunks).
mkdir -p "$M"
$PY "$ORACLE" make "$M/g1" --model gpt2 --layers 3 --embd 48 --heads 4 --vocab 97 --max-pos 64 \
    --seed 3 ||
    echo "# the oracle could not make g1"
$PY "$ORACLE" make "$M/g2" --model gpt2 --layers 2 --embd 32 --heads 2 --vocab 256 --max-pos 48 \
    --prefix 0 --dtype bf16 --shards 3 --seed 3 ||
    echo "# the oracle could not make g2"
$PY "$ORACLE" make "$M/l1" --model llama --layers 2 --embd 48 --heads 8 --kv 4 --head-dim 8 \
    --ffn 96 --vocab 101 --max-pos 128 --llama3 1 --theta 500000 --seed 3 ||
    echo "# the oracle could not make l1"
$PY "$ORACLE" make "$M/l2" --model llama --layers 3 --embd 64 --heads 4 --kv 4 --head-dim 16 \
    --ffn 128 --vocab 256 --max-pos 64 --tied 1 --dtype bf16 --shards 2 --seed 3 ||
    echo "# the oracle could not make l2"
P=3,1,4,1,5,9,2
LONG=$(seq 0 69 | awk '{ print ($1 * 37 + 11) % 101 }' | paste -sd,) # 70 tokens: two chunks
