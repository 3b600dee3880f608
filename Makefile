# The two commands: `make run` (execute the collection in quick mode, write a report) and `make test`.
# ENV picks the environments/ file: cpu (default), cuda, rocm, xpu, free-threaded.
PYTHON ?= python3
ENV ?= cpu
VENV ?= .venv
BIN := $(VENV)/bin
REQS := environments/$(ENV).txt
WORKERS ?= 2

.PHONY: setup browser run test lab doctor labs clean

setup: $(VENV)/.installed-$(ENV)

# torch first and pinned (with the file's index options), so pip never resolves a multi-GB CUDA build.
$(VENV)/.installed-$(ENV): pyproject.toml $(REQS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $$(grep -E '^(--(extra-)?index-url|torch==)' $(REQS))
	$(BIN)/python -m pip install -q -r $(REQS) -e ".[lab,test]"
	touch $@

run: setup
	$(BIN)/python -m helpers doctor
	$(BIN)/python -m helpers run --workers $(WORKERS) --out runs/latest

# The browser tests drive Debian's Chromium (never a downloaded browser); installed here when root with apt.
browser:
	@command -v chromium >/dev/null || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Chromium for the browser tests"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "Chromium not found: the browser tests will be skipped (apt-get install chromium)"; fi; }

test: setup browser
	LABS_QUICK=1 LABS_HEADLESS=1 $(BIN)/python -m pytest -n $(WORKERS) --dist loadfile

lab: setup
	$(BIN)/python -m jupyter lab --ip 127.0.0.1 --no-browser --IdentityProvider.token="$$($(BIN)/python -c 'import secrets; print(secrets.token_hex(16))')" $(if $(filter 0,$(shell id -u)),--allow-root,)

doctor: setup
	$(BIN)/python -m helpers doctor

labs: setup
	$(BIN)/python -m helpers labs build

clean:
	rm -rf $(VENV) runs .pytest_cache
