# Two commands do all the set-up on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Isaac Lab's own dataset writers (HDF5DatasetFileHandler) for tests/isaac: 2.x and 3.x side by
# side, each in its own folder, without their Isaac Sim dependencies (the datasets module needs
# only h5py, numpy and torch). 3.0.0 declares Python 3.12; its datasets code runs on 3.10+.
ISAACLAB := $(VENV)/isaaclab
ISAACLAB_PY_2 := 3.11
ISAACLAB_PY_3 := 3.12
# Every install below takes its versions from lock/ (the versions `make test` passed with), so an
# upstream release cannot change a result between two runs of one commit. `make lock` updates them.
LOCK     := lock/constraints.txt
TORCH    := torch==2.13.0
EXTRAS   := gen,usd,hdf5,compare,dev,cluster
LOCK_VENV := .lock-venv

.PHONY: demo test test-kit lint clean extension-manifest lock

$(STAMP): pyproject.toml $(LOCK)
	@echo "setting up $(VENV) (first run: ~2 min: PyTorch and the project's packages; pip is quiet meanwhile) ..."
	$(PYTHON) -m venv $(VENV)
	# Pin torch first: the CPU wheel on disk; an unpinned torch pulls gigabytes of CUDA packages.
	$(BIN)/pip install -q -c $(LOCK) $(TORCH)
	$(BIN)/pip install -q -c $(LOCK) -e '.[$(EXTRAS)]'
	touch $(STAMP)

$(ISAACLAB)/.installed: $(STAMP) lock/isaaclab-2.txt lock/isaaclab-3.txt
	$(BIN)/pip install -q --no-deps --require-hashes --ignore-requires-python --only-binary=:all: --python-version $(ISAACLAB_PY_2) --target $(ISAACLAB)/2 -r lock/isaaclab-2.txt
	$(BIN)/pip install -q --no-deps --require-hashes --ignore-requires-python --only-binary=:all: --python-version $(ISAACLAB_PY_3) --target $(ISAACLAB)/3 -r lock/isaaclab-3.txt
	touch $@

# $(call hash_isaaclab,MAJOR): pin the wheel of the Isaac Lab release lock/isaaclab-MAJOR.txt names by its
# hash (edit the version there to move to another release).
define hash_isaaclab
	v=$$(sed -n 's/^isaaclab==\([^ ]*\).*/\1/p' lock/isaaclab-$(1).txt) && \
	$(LOCK_VENV)/bin/pip download -q --no-deps --only-binary=:all: --python-version $(ISAACLAB_PY_$(1)) -d $(LOCK_VENV)/isaaclab-$(1) isaaclab==$$v && \
	{ sed -n '/^#/p' lock/isaaclab-$(1).txt; echo "isaaclab==$$v $$($(LOCK_VENV)/bin/pip hash $(LOCK_VENV)/isaaclab-$(1)/*.whl | tail -1)"; } > lock/isaaclab-$(1).txt.new && \
	mv lock/isaaclab-$(1).txt.new lock/isaaclab-$(1).txt
endef

# Update lock/ on purpose: the newest releases pyproject.toml allows, installed into a throw-away venv,
# then frozen (torch stays $(TORCH); its local tag is left off so the CUDA wheel matches too), and the
# Isaac Lab wheels' hashes. Then run `make clean test` and commit lock/ with the change that needed it.
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q $(TORCH)
	$(LOCK_VENV)/bin/pip install -q -e '.[$(EXTRAS)]'
	{ sed -n '/^#/p' $(LOCK); $(LOCK_VENV)/bin/pip freeze --exclude-editable | sed 's/^torch==\([^+]*\)+.*/torch==\1/'; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	$(call hash_isaaclab,2)
	$(call hash_isaaclab,3)
	rm -rf $(LOCK_VENV)

# The extension inside a real Omniverse Kit (tests/kit): Kit 110's wheel is CPython 3.12 only, so
# it gets a venv of its own with exact pins (lock/kit.txt, lock/kit-isaacsim.txt; edited by hand): Kit, Isaac Sim 6.2's run loop runner and version
# extensions (isaacsim-core, without its dependencies: torch and the rest are never needed here,
# in a folder of their own), and the Isaac side's packages (pxr from usd-core: Kit's kernel has none).
PYTHON312 ?= $(firstword $(foreach p,python3.12 $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12 $(PYENV_ROOT)/versions/3.12*/bin/python3.12),\
	$(shell $(p) -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && echo $(p))))
KIT_VENV := .venv-kit
KIT_LOCK := lock/kit.txt

$(KIT_VENV)/.installed: $(KIT_LOCK) lock/kit-isaacsim.txt
	@test -n "$(PYTHON312)" || { echo "test-kit needs Python 3.12 (omniverse-kit is cp312 only): none found"; exit 1; }
	$(PYTHON312) -m venv $(KIT_VENV)
	$(KIT_VENV)/bin/pip install -q -c $(KIT_LOCK) -r $(KIT_LOCK)
	$(KIT_VENV)/bin/pip install -q --no-deps --target $(KIT_VENV)/isaacsim -r lock/kit-isaacsim.txt
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
	rm -rf $(VENV) $(LOCK_VENV) $(KIT_VENV) .pytest_cache
