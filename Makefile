# `make demo`: set up everything, then generate from a real prompt on the bundled model.
# `make test`: set up everything (the Qwen2.5-Coder pair included: the tests need it), then run the test suite.
# `make qwen`: install the Qwen2.5-Coder pair on demand (about 1.6 GB to download).
VENV ?= .venv
PROMPT ?= Explain in three sentences why speculative decoding does not change the output of a language model.

.PHONY: setup qwen demo test
setup:
	@bash scripts/setup.sh

qwen:
	@bash scripts/setup.sh --qwen

demo: setup
	$(VENV)/bin/speculative generate "$(PROMPT)"

test: qwen
	$(VENV)/bin/python -m pytest -q
