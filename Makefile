# The two commands of the README. Each installs what it needs into .venv first.
PORT ?= 8080

.PHONY: serve test install install-test

install:
	scripts/install.sh

install-test:
	scripts/install.sh test

serve: install
	HF_HUB_OFFLINE=1 .venv/bin/lmiserve serve --port $(PORT)

test: install-test
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest
