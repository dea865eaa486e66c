# `make demo`: set up everything, then generate from a real prompt on the bundled model.
# `make test`: set up everything, then run the test suite.
VENV ?= .venv
PROMPT ?= Explain in three sentences why speculative decoding does not change the output of a language model.

.PHONY: setup demo test
setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/speculative generate "$(PROMPT)"

test: setup
	$(VENV)/bin/python -m pytest -q
