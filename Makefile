# `make test` builds everything from a fresh clone and runs every test.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test extension demo venv bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,kernels]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile tests
	cd tests/node && npm ci --no-audit --no-fund --loglevel=error && \
		REWIND_PYTHON=$(abspath $(BIN))/python node --test dap.test.js
	$(MAKE) --no-print-directory extension

# The VS Code extension: build, unit and integration tests (real adapter, real chromium), .vsix.
extension: $(STAMP)
	vscode-extension/scripts/ensure-chromium.sh
	cd vscode-extension && npm ci --no-audit --no-fund --loglevel=error && npx tsc -p . && \
		REWIND_PYTHON=$(abspath $(BIN))/python node --test out/test/*.test.js && npm run --silent package

demo: $(STAMP)
	$(BIN)/rewind debug examples/gpt.py -x examples/demo.rewind

bench: $(STAMP)
	$(BIN)/python benchmarks/engine.py
	$(BIN)/python benchmarks/dap.py

clean:
	rm -rf $(VENV)
