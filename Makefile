# `make test` builds everything from a fresh clone and runs every test.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test extension ui demo venv bench clean

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
	$(MAKE) --no-print-directory ui

# The VS Code extension: build, unit and integration tests (real adapter, real chromium), .vsix.
extension: $(STAMP)
	vscode-extension/scripts/ensure-chromium.sh
	cd vscode-extension && npm ci --no-audit --no-fund --loglevel=error && npx tsc -p . && \
		REWIND_PYTHON=$(abspath $(BIN))/python node --test out/test/*.test.js && npm run --silent package

# The real VS Code UI: code-server with the packaged .vsix, driven in headless chromium (tests/ui, screenshots in
# tests/ui/out/). code-server's postinstall builds native modules for the node running it, so the scripts run once
# the lockfile's node 24 is in place; the build (minutes on two cores) is kept until the lockfile changes.
UI := tests/ui
UI_STAMP := $(UI)/node_modules/.installed

$(UI_STAMP): $(UI)/package-lock.json
	$(UI)/ensure-build-packages.sh
	cd $(UI) && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error && npm rebuild node --loglevel=error && \
		PATH="$$PWD/node_modules/.bin:$$PATH" npm rebuild --loglevel=error
	touch $@

ui: $(STAMP) $(UI_STAMP)
	vscode-extension/scripts/ensure-chromium.sh
	test -f vscode-extension/rewind-debugger.vsix || $(MAKE) --no-print-directory extension
	cd $(UI) && REWIND_PYTHON=$(abspath $(BIN))/python PATH="$$PWD/node_modules/.bin:$$PATH" node --test vscode.test.mjs

demo: $(STAMP)
	$(BIN)/rewind debug examples/gpt.py -x examples/demo.rewind

bench: $(STAMP)
	$(BIN)/python benchmarks/engine.py
	$(BIN)/python benchmarks/dap.py

clean:
	rm -rf $(VENV)
