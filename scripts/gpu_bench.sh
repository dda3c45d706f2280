#!/usr/bin/env bash
# The engine's figures on a GPU, beside transformers generate on the same device, in one run:
#   scripts/gpu_bench.sh [SHAPE] [CONCURRENCY]
# SHAPE: llama-1b (default), llama-8b, smollm2, or any other shape of scripts/random_model.py
# (mixtral-small, olmoe-1b-7b, phi3-mini, gemma2-2b; random weights, SmolLM2's tokenizer), or
# default (the embedded SmolLM2-135M-Instruct itself). CONCURRENCY: the sweep,
# default 1,32,128,256. Load: streaming requests, 190-token prompts, 128 new tokens,
# ignore_eos, greedy; bf16 on cuda:0. Right after start-up one c=128 level runs (LMI), then the
# sweep with LMI streaming and the baseline, then the sweep with OpenAI streaming; one table
# of all of it is printed at the end (scripts/bench_table.py). Environment: PYTHON (default
# python3), PORT (8090), WORK (a directory for the model and reports; default a new temporary
# one), BENCH_ARGS (more `lmiserve bench` arguments), COLD_C (the first level, 128; empty: none),
# TOKENIZER (SmolLM2's tokenizer directory for the random shapes; default: the embedded model's).
# The reports land in $WORK/cold, $WORK/lmi and $WORK/openai.
set -euo pipefail
cd "$(dirname "$0")/.."
SHAPE=${1:-llama-1b}
CONCURRENCY=${2:-1,32,128,256}
COLD_C=${COLD_C-128}
PY=${PYTHON:-python3}
PORT=${PORT:-8090}
WORK=${WORK:-$(mktemp -d)}
export HF_HUB_OFFLINE=1
mkdir -p "$WORK/serve"
{
  echo "model_name=bench"
  if [ "$SHAPE" != default ]; then
    "$PY" scripts/random_model.py "$SHAPE" "$WORK/model" --dtype bf16 ${TOKENIZER:+--tokenizer "$TOKENIZER"} >/dev/null
    echo "option.model_id=$WORK/model"
  fi
  echo "option.rolling_batch=lmi"
  echo "option.dtype=bf16"
  echo "option.device=${DEVICE:-cuda:0}"
  echo "option.max_rolling_batch_size=256"
} >"$WORK/serve/serving.properties"
"$PY" -m lmiserve serve --model-dir "$WORK/serve" --host 127.0.0.1 --port "$PORT" >"$WORK/server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  if curl -sf "http://127.0.0.1:$PORT/ping" >/dev/null; then break; fi
  if ! kill -0 $server 2>/dev/null; then cat "$WORK/server.log" >&2; exit 1; fi
  sleep 1
done
grep -E "engine ready|decode graphs" "$WORK/server.log" >&2 || true
bench() { # API CONCURRENCY OUT [ARGS...]
  local api=$1 levels=$2 out=$3
  shift 3
  # shellcheck disable=SC2086
  "$PY" -m lmiserve bench --url "http://127.0.0.1:$PORT" --api "$api" --concurrency "$levels" \
    --out "$out" "$@" ${BENCH_ARGS:-} >&2
}
cold=()
if [ -n "$COLD_C" ]; then
  bench lmi "$COLD_C" "$WORK/cold" --warmup 0
  cold=(--cold "$WORK/cold")
fi
bench lmi "$CONCURRENCY" "$WORK/lmi" --baseline
bench openai "$CONCURRENCY" "$WORK/openai"
"$PY" scripts/bench_table.py --run "lmi=$WORK/lmi" --run "openai=$WORK/openai" "${cold[@]}"
