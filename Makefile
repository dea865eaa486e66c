# `make demo`: set up everything, then decode one request plainly and speculatively (scripts/demo.py):
#    the same text, both speeds, the speedup.
# `make test`: set up everything (the Qwen2.5-Coder pair included: the tests need it), then run the
#    whole test suite: the continuous-integration command.
# `make test-quick`: set up (no Qwen download), then the quick tier: tests marked `quick`
#    (verification, sampling, trees, policy, server protocol, errors), under 5 minutes on 2 cores.
# `make qwen`: install the Qwen2.5-Coder pair on demand (about 1.6 GB to download).
VENV ?= .venv
PROMPT ?=

.PHONY: setup qwen demo test test-quick
setup:
	@bash scripts/setup.sh

qwen:
	@bash scripts/setup.sh --qwen

demo: setup
	$(VENV)/bin/python scripts/demo.py $(if $(PROMPT),--prompt "$(PROMPT)")

test: qwen
	$(VENV)/bin/python -m pytest -q

test-quick: setup
	$(VENV)/bin/python -m pytest -q -m "quick and not qwen"
