# Two commands do all the set-up on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Isaac Lab's own dataset writers (HDF5DatasetFileHandler) for tests/isaac: 2.x and 3.x side by
# side, each in its own folder, without their Isaac Sim dependencies (the datasets module needs
# only h5py, numpy and torch). 3.0.0 declares Python 3.12; its datasets code runs on 3.10+.
ISAACLAB := $(VENV)/isaaclab

.PHONY: demo test lint clean extension-manifest

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# Pin torch first: the CPU wheel on disk; an unpinned torch pulls gigabytes of CUDA packages.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[gen,usd,hdf5,compare,dev,cluster]'
	touch $(STAMP)

$(ISAACLAB)/.installed: $(STAMP)
	$(BIN)/pip install -q --no-deps --ignore-requires-python --only-binary=:all: --python-version 3.11 --target $(ISAACLAB)/2 isaaclab==2.3.2
	$(BIN)/pip install -q --no-deps --ignore-requires-python --only-binary=:all: --python-version 3.12 --target $(ISAACLAB)/3 isaaclab==3.0.0
	touch $@

demo: $(STAMP)
	$(BIN)/lingbot-isaac demo

test: $(STAMP) $(ISAACLAB)/.installed
	@command -v chromium >/dev/null 2>&1 || sh scripts/install-chromium.sh
	$(BIN)/pytest -q

# Kit's standard manifest place is config/extension.toml; extension.toml at the top is the one we edit.
extension-manifest:
	cp extension.toml config/extension.toml

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache
