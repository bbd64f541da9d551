# Two commands do all the set-up on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench-help clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# Pin torch first: the CPU wheel on disk; an unpinned torch pulls gigabytes of CUDA packages.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[gen,usd,hdf5,compare,dev,cluster]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/lingbot-isaac demo

test: $(STAMP)
	@command -v chromium >/dev/null 2>&1 || sh scripts/install-chromium.sh
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache
