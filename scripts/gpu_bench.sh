#!/usr/bin/env bash
# The engine's figures on a GPU, beside transformers generate on the same device, in one run:
#   scripts/gpu_bench.sh [SHAPE] [CONCURRENCY]
# SHAPE: llama-1b (default), llama-8b, smollm2 (random weights of that shape, SmolLM2's
# tokenizer) or default (the embedded SmolLM2-135M-Instruct itself). CONCURRENCY: the sweep,
# default 1,8,32,128. Load: streaming LMI requests, 190-token prompts, 128 new tokens,
# ignore_eos, greedy; bf16 on cuda:0. Environment: PYTHON (default python3), PORT (8090),
# WORK (a directory for the model and report; default a new temporary one), BENCH_ARGS
# (more `lmiserve bench` arguments). The report lands in $WORK/report.
set -euo pipefail
cd "$(dirname "$0")/.."
SHAPE=${1:-llama-1b}
CONCURRENCY=${2:-1,8,32,128}
PY=${PYTHON:-python3}
PORT=${PORT:-8090}
WORK=${WORK:-$(mktemp -d)}
export HF_HUB_OFFLINE=1
mkdir -p "$WORK/serve"
{
  echo "model_name=bench"
  if [ "$SHAPE" != default ]; then
    "$PY" scripts/random_model.py "$SHAPE" "$WORK/model" --dtype bf16 >/dev/null
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
# shellcheck disable=SC2086
"$PY" -m lmiserve bench --url "http://127.0.0.1:$PORT" --api lmi --concurrency "$CONCURRENCY" \
  --baseline --out "$WORK/report" ${BENCH_ARGS:-}
