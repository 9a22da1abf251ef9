#!/bin/bash
# bench/gpu/timeline.sh — one GPT-2 or Llama step as it really runs on the
# GPU: the trainer on one GPU (1x1) with bench/gpu/trace.c injected (CUPTI's
# kernel timeline: concurrent streams, real gaps), then bench/gpu/timeline.py
# on the second last step: the compute stream's busy and idle time, what the
# host delayed, what runs beside it, its kernels by name, the largest gaps.
# Where bench/gpu/profile.sh (Nsight Compute) says what each kernel costs
# alone, this says what the step waits for.
#
#   TL="d48:8:0" bench/gpu/timeline.sh      (model:micro-batch:checkpointing)
#   TL_ARGS="--fp8 1"                        more trainer options
#   TL_STEPS=6                               steps (the second last is read)
#   TL_BIN=llama TL=llama3.2-1b:2:0 TL_T=4096  the Llama trainer and one of its
#                                            presets (4-byte tokens); TL_T: the
#                                            sequence length (default 1024)
#
# Needs a build (bench/gpu/build.sh). Reports: $OUT/timeline-*.txt, the raw
# trace in $OUT/timeline-*.tsv.
set -u
OUT=${OUT:-$PWD/gpu-out}
export NCCL_NVLS_ENABLE=0
IFS=: read -r model b ck <<<"${TL:-d48:8:0}"
case "$model:$b:$ck" in
    ?*:[1-9]*:[01]) ;;
    *) echo "timeline.sh: TL=MODEL:MICRO-BATCH:CKPT, e.g. TL=d48:8:0 (got '${TL:-}')" >&2; exit 2 ;;
esac
case "$b" in *[!0-9]*) echo "timeline.sh: the micro-batch of TL is a whole number, e.g. TL=d48:8:0" >&2; exit 2 ;; esac
steps=${TL_STEPS:-6} bin=${TL_BIN:-gpt2} T=${TL_T:-1024}
case "$bin" in gpt2 | llama) ;; *) echo "timeline.sh: TL_BIN is gpt2 or llama, not '$bin'" >&2; exit 2 ;; esac
case "$T" in '' | *[!0-9]* | 0) echo "timeline.sh: TL_T must be a whole number >= 1, not '$T'" >&2; exit 2 ;; esac
case "$steps" in '' | *[!0-9]* | [0-2]) echo "timeline.sh: TL_STEPS must be a whole number >= 3, not '$steps'" >&2; exit 2 ;; esac
make -s build/bench/libbmt_trace.so || { echo "timeline.sh: libbmt_trace.so does not build (needs CUPTI)" >&2; exit 1; }
mkdir -p "$OUT"
. "$(dirname "$0")/tokens.sh" # DATA, DATA32
[ "$bin" = llama ] && DATA=$DATA32
tag=$bin-$model-b$b-t$T-ckpt$ck$(echo "${TL_ARGS:-}" | tr -c 'a-zA-Z0-9\n' _)
# A job of one without bmlaunch (a PMIx singleton), as profile.sh runs it.
# shellcheck disable=SC2086 # TL_ARGS is words on purpose
CUDA_INJECTION64_PATH=$PWD/build/bench/libbmt_trace.so BMT_TRACE_OUT="$OUT/timeline-$tag.tsv" \
    BMT_DEVICE=cuda timeout "${TL_TIMEOUT:-300}" build/bin/$bin --model "$model" -b "$b" -t "$T" \
    --steps "$steps" --data "$DATA" --ckpt "$ck" --lr 3e-4 --warmup 0 ${TL_ARGS:-} >"$OUT/timeline-$tag.log" 2>&1 ||
    { echo "timeline.sh: the trainer failed: $OUT/timeline-$tag.log" >&2; tail -5 "$OUT/timeline-$tag.log" >&2; exit 1; }
grep "step" "$OUT/timeline-$tag.log" | tail -2
python3 "$(dirname "$0")/timeline.py" "$OUT/timeline-$tag.tsv" | tee "$OUT/timeline-$tag.txt"
