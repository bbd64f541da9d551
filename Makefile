# Two commands do all the set-up on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Isaac Lab's own dataset writers (HDF5DatasetFileHandler) for tests/isaac: 2.x and 3.x side by
# side, each in its own folder, without their Isaac Sim dependencies (the datasets module needs
# only h5py, numpy and torch). 3.0.0 declares Python 3.12; its datasets code runs on 3.10+.
ISAACLAB := $(VENV)/isaaclab

.PHONY: demo test test-kit lint clean extension-manifest

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

# The extension inside a real Omniverse Kit (tests/kit): Kit 110's wheel is CPython 3.12 only, so
# it gets a venv of its own with exact pins: Kit, Isaac Sim 6.2's run loop runner and version
# extensions (isaacsim-core, without its dependencies: torch and the rest are never needed here,
# in a folder of their own), and the Isaac side's packages (pxr from usd-core: Kit's kernel has none).
PYTHON312 ?= $(firstword $(foreach p,python3.12 $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12),\
	$(shell $(p) -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && echo $(p))))
KIT_VENV := .venv-kit
KIT_PINS := omniverse-kit==110.4.0.386251 numpy==2.4.6 pillow==13.0.0 pyzmq==27.3.0 msgpack==1.2.4 \
	tqdm==4.70.1 scipy==1.17.1 usd-core==26.11

$(KIT_VENV)/.installed: Makefile
	@test -n "$(PYTHON312)" || { echo "test-kit needs Python 3.12 (omniverse-kit is cp312 only): none found"; exit 1; }
	$(PYTHON312) -m venv $(KIT_VENV)
	$(KIT_VENV)/bin/pip install -q $(KIT_PINS)
	$(KIT_VENV)/bin/pip install -q --no-deps --target $(KIT_VENV)/isaacsim isaacsim-core==6.2.0.0
	touch $@

test-kit: $(STAMP) $(KIT_VENV)/.installed
	$(BIN)/pytest -q -rP -m kit tests/kit

demo: $(STAMP)
	$(BIN)/lingbot-isaac demo

# tests/kit runs where Python 3.12 is found (else its tests are skipped, with one line saying why).
test: $(STAMP) $(ISAACLAB)/.installed $(if $(PYTHON312),$(KIT_VENV)/.installed)
	@command -v chromium >/dev/null 2>&1 || sh scripts/install-chromium.sh
	$(BIN)/pytest -q

# Kit's standard manifest place is config/extension.toml; extension.toml at the top is the one we edit.
extension-manifest:
	cp extension.toml config/extension.toml

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) $(KIT_VENV) .pytest_cache
