#!/usr/bin/env bash
# Speculative decoding on a GPU, at one stream, on a random model of Llama-3.1-8B's shape (bf16 on
# cuda:0; the memory ceiling of its decode step is about 208 tok/s on an H100/H200-class GPU):
#   scripts/gpu_spec_bench.sh [SHAPE]
# Servers in turn (scripts/spec_bench.py): no speculation; prompt lookup proposing 4 tokens every
# step (adaptive off: random weights rarely repeat their prompt, so this measures what a verify
# step of 5 rows costs against a decode); an EAGLE head (random, in EAGLE-1's published layout,
# for the same shape), 4 tokens a step. Grounded prompts, c=1, greedy. Environment: PYTHON
# (default python3), WORK (default a new temporary directory), TOKENIZER (SmolLM2's tokenizer
# directory for the random shape; default the embedded model's).
set -euo pipefail
cd "$(dirname "$0")/.."
SHAPE=${1:-llama-8b}
PY=${PYTHON:-python3}
WORK=${WORK:-$(mktemp -d)}
export HF_HUB_OFFLINE=1
"$PY" scripts/random_model.py "$SHAPE" "$WORK/model" --dtype bf16 ${TOKENIZER:+--tokenizer "$TOKENIZER"} >/dev/null
"$PY" - "$WORK/model" "$WORK/eagle" <<'PY'
import json, sys
from pathlib import Path
from tests.unit.engine import eagle_helpers as h
config = json.loads(Path(sys.argv[1], "config.json").read_text())
h.HIDDEN, h.INTER = config["hidden_size"], config["intermediate_size"]
h.HEADS, h.KV_HEADS = config["num_attention_heads"], config["num_key_value_heads"]
h.write_eagle(Path(sys.argv[2]), config["vocab_size"])
PY
NGRAM='{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":3,"adaptive":false}'
EAGLE="{\"method\":\"eagle\",\"model\":\"$WORK/eagle\",\"num_speculative_tokens\":4,\"adaptive\":false}"
"$PY" scripts/spec_bench.py --model-dir "$WORK/model" --workloads grounded --concurrency 1 \
  --env OPTION_DEVICE=cuda:0 --env OPTION_DTYPE=bf16 --work "$WORK/runs" \
  --config baseline --config ngram "OPTION_SPECULATIVE_CONFIG=$NGRAM" --config eagle "OPTION_SPECULATIVE_CONFIG=$EAGLE"
