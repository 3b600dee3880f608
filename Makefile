# The two commands: `make run` (execute the collection in quick mode, write a report) and `make test`.
# ENV picks the environments/ file and its venv: cpu (default, .venv), cuda, latest, minimal, rocm, xpu,
# free-threaded (.venv-ENV). `make matrix` runs the quick collection and checks its stored outputs in several environments
# and merges their records into one report (runs/matrix/).
PYTHON ?= python3
ENV ?= cpu
venv_of = $(if $(filter cpu,$(1)),.venv,.venv-$(1))
VENV ?= $(call venv_of,$(ENV))
BIN := $(VENV)/bin
REQS := environments/$(ENV).txt
WORKERS ?= 2

MATRIX_ENVS ?= cpu cuda latest minimal

.PHONY: setup browser bubblewrap axe site site-check run test matrix matrix-env gpu-sections free-threaded free-threaded-setup gpu-check gpu-check-env colab-venv colab-check lab doctor labs nbgrader nbgrader-setup clean

setup: $(VENV)/.installed-$(ENV)

# torch first and pinned (with the file's index options), so pip never resolves a multi-GB CUDA build.
# A multi-GB wheel whose download breaks off resumes where it stopped (pip >= 25.1, installed just before).
PIP_RESUME := --retries 10 --resume-retries 20
$(VENV)/.installed-$(ENV): pyproject.toml $(REQS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --retries 10 --upgrade pip
	$(BIN)/python -m pip install -q $(PIP_RESUME) $$(grep -E '^(--(extra-)?index-url|torch==)' $(REQS))
	$(BIN)/python -m pip install -q $(PIP_RESUME) $(if $(filter free-threaded,$(ENV)),--prefer-binary -r $(REQS) -e .,$(if $(filter torch-%,$(ENV)),-r $(REQS) -e .,-r $(REQS) -e ".[lab,test]"))
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

# The course website (helpers.runner.site, Sphinx with MyST-NB): every lesson, deep dive and lab page with its
# outputs and, under each section header, where that section ran or was skipped and why, from the records of
# SITE_RUNS (what `make run` writes, plus a `make gpu-check` record when there is one, and the GPU records kept in
# helpers/recorded/): runs/site/html.
# `make site-check` opens every page in Chromium with axe-core (from npm, into build/npm: `make axe`).
SITE_RUNS ?= runs/latest $(wildcard runs/gpu-check/gpu-check-bundle.json helpers/recorded/gpu-check-*.json)
AXE_VERSION := 4.11.0
site: setup
	$(BIN)/python -m helpers site $(SITE_RUNS) --out runs/site

site-check: setup browser axe
	LABS_SITE_DIR=$(CURDIR)/runs/site/html $(BIN)/python -m pytest -q -p no:xdist tests/test_site.py

axe:
	@test -f build/npm/node_modules/axe-core/axe.min.js || { command -v npm >/dev/null && \
	  npm install --silent --no-save --no-audit --no-fund --prefix build/npm axe-core@$(AXE_VERSION) || \
	  echo "npm not found: the accessibility check of the site will be skipped (install Node.js and npm)"; }

# The grader isolates each submission with bubblewrap (helpers.grading.isolation); installed here when
# root with apt. Without it the grader still grades, says so loudly, and marks every row "not isolated".
bubblewrap:
	@command -v bwrap >/dev/null || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing bubblewrap for the grader's isolation"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	else echo "bubblewrap not found: grading runs without isolation (apt-get install bubblewrap)"; fi; }

test: setup browser axe bubblewrap
	LABS_QUICK=1 LABS_HEADLESS=1 $(BIN)/python -m pytest -n $(WORKERS) --dist loadfile

# One environment of the matrix: the quick collection (record, sections, peak memory), the cells tagged
# nbval-check-output of each executed notebook against the stored outputs (nbval's comparison, without a
# second execution: nbval.xml) and the static check of the GPU sections against this torch, into
# runs/matrix/$(ENV)/. A failure is recorded there and reported by `make matrix`.
matrix-env: setup
	rm -rf runs/matrix/$(ENV) && mkdir -p runs/matrix/$(ENV)
	-$(BIN)/python -m pytest -q -p no:xdist tests/test_gpu_sections.py --junitxml runs/matrix/$(ENV)/gpu_sections.xml \
	  >runs/matrix/$(ENV)/gpu_sections.log 2>&1; tail -1 runs/matrix/$(ENV)/gpu_sections.log
	-$(BIN)/python -m helpers run --label $(ENV) --workers $(WORKERS) --out runs/matrix/$(ENV) --no-progress --check-outputs

# Every environment of MATRIX_ENVS, then one report: runs/matrix/matrix.html and matrix.json. The exit
# status is that of the report: 0 only when every notebook passed its quick run and nbval everywhere.
matrix:
	for env in $(MATRIX_ENVS); do $(MAKE) --no-print-directory matrix-env ENV=$$env || exit 1; done
	$(call venv_of,$(lastword $(MATRIX_ENVS)))/bin/python -m helpers report $(addprefix runs/matrix/,$(MATRIX_ENVS)) --out runs/matrix
	@! grep -l '<failure\|<error' $(addsuffix /gpu_sections.xml,$(addprefix runs/matrix/,$(MATRIX_ENVS))) 2>/dev/null \
	  || { echo "the static check of the GPU sections failed in the environments above"; exit 1; }

# The static check of the GPU sections alone, in an environment that holds only a torch no other environment
# has, the package and pytest (environments/torch-2.11.txt): make gpu-sections ENV=torch-2.11
gpu-sections: setup
	$(BIN)/python -m pytest -q -p no:xdist -o addopts="" tests/test_gpu_sections.py

# Free-threaded leg: a free-threaded CPython (found, or built once into the user's cache by
# .ci/free-threaded-python), its own venv, then lesson 01, lab 01 and helpers.data's tests with the GIL
# off; fails unless the section "Pure-Python scaling with threads" really ran. With the default venv (.venv)
# present, lesson 01 also runs its benchmark there, side by side. Record: runs/matrix/free-threaded/.
FT_SECTION = Pure-Python scaling with threads
free-threaded-setup:
	$(MAKE) --no-print-directory setup ENV=free-threaded PYTHON="$$(.ci/free-threaded-python)"

free-threaded: free-threaded-setup
	.venv-free-threaded/bin/python -m helpers doctor
	rm -rf runs/matrix/free-threaded
	$(if $(wildcard .venv/bin/python),LABS_OTHER_PYTHON=$(CURDIR)/.venv/bin/python) \
	  .venv-free-threaded/bin/python -m helpers run --label free-threaded --workers 1 --out runs/matrix/free-threaded \
	  --no-progress notebooks/01_free_threaded_data_loading.ipynb notebooks/01_free_threaded_data_loading_deep_dive.ipynb \
	  labs/solutions/01_data_loading_lab.ipynb
	.venv-free-threaded/bin/python -c "import json, sys; r = json.load(open('runs/matrix/free-threaded/record.json')); \
	  ran = [s['ran'] for n in r['notebooks'] for s in n['sections'] if s['section'] == '$(FT_SECTION)']; \
	  sys.exit(0 if ran == [True] else 'section \'$(FT_SECTION)\' did not run: ' + repr(ran))"
	LABS_QUICK=1 .venv-free-threaded/bin/python -m pytest -p no:xdist tests/test_data.py -q

# A GPU machine (NVIDIA, AMD or Intel): the vendor from its own tools (nvidia-smi, rocminfo, xpu-smi or
# sycl-ls), that vendor's environment file (cuda, rocm or xpu), the static check, every notebook in quick
# mode with its GPU sections, then the verdict in runs/gpu-check/: record.json, matrix.html,
# gpu_figures.json (every GPU timing with its section) and gpu-check-bundle.json, the one file to attach to
# a GPU verification report (record, figures, static check, doctor). It fails on a failed notebook, a
# failed static check and a section skipped although this GPU has what it needs. Without a GPU it runs the
# static check, says so, and fails.
GPU_WORKERS ?= 4
gpu-check:
	@gpu=$$($(PYTHON) -m helpers.runner.gpu_check vendor) || { \
	  $(MAKE) --no-print-directory setup && \
	  $(call venv_of,cpu)/bin/python -m pytest -q -p no:xdist tests/test_gpu_sections.py; \
	  echo "gpu-check: NO GPU on this machine: only the static check of the GPU sections ran (above)"; exit 1; }; \
	$(MAKE) --no-print-directory gpu-check-env ENV=$$gpu

gpu-check-env: setup
	rm -rf runs/gpu-check && mkdir -p runs/gpu-check
	$(BIN)/python -m helpers doctor >runs/gpu-check/doctor.txt && cat runs/gpu-check/doctor.txt
	-$(BIN)/python -m pytest -q -p no:xdist tests/test_gpu_sections.py --junitxml runs/gpu-check/gpu_sections.xml
	-$(BIN)/python -m helpers run --label gpu-check-$(ENV) --workers $(GPU_WORKERS) --out runs/gpu-check --no-progress
	$(BIN)/python -m helpers.runner.gpu_check verify runs/gpu-check

# The Colab cell (helpers/colab.py) in a venv holding only PyPI's torch 2.10.0, a CUDA build like Colab's:
# lesson 00's cell runs with a stand-in google.colab module, cloning this repository's committed HEAD into a
# temporary folder; then helpers imports from the clone, the kernel works in the clone's notebooks/, torch is
# still 2.10.0, torchao and torchdata are the versions helpers/colab.py matches to it and import beside it, a
# second set-up finds everything done, and `python -m helpers doctor` runs. A torch with a local version, as
# Colab's: COLAB_TORCH=2.10.0+cu126 COLAB_TORCH_INDEX=https://download.pytorch.org/whl/cu126 make colab-check
COLAB_TORCH ?= 2.10.0
COLAB_TORCH_INDEX ?=
COLAB_SOURCE ?= file://$(CURDIR)
colab-venv: .venv-colab/.torch-only-$(COLAB_TORCH)

.venv-colab/.torch-only-$(COLAB_TORCH):
	rm -rf .venv-colab && $(PYTHON) -m venv .venv-colab
	.venv-colab/bin/python -m pip install -q --retries 10 --upgrade pip
	.venv-colab/bin/python -m pip install -q $(PIP_RESUME) $(if $(COLAB_TORCH_INDEX),--index-url $(COLAB_TORCH_INDEX)) torch==$(COLAB_TORCH)
	touch $@

# the check installs beside torch: the stamp goes first, so the next check starts from a fresh venv
colab-check: colab-venv
	rm .venv-colab/.torch-only-$(COLAB_TORCH)
	.venv-colab/bin/python -m helpers.colab check $(COLAB_SOURCE) $(COLAB_TORCH)

lab: setup
	$(BIN)/python -m jupyter lab --ip 127.0.0.1 --no-browser --IdentityProvider.token="$$($(BIN)/python -c 'import secrets; print(secrets.token_hex(16))')" $(if $(filter 0,$(shell id -u)),--allow-root,)

doctor: setup
	$(BIN)/python -m helpers doctor

labs: setup
	$(BIN)/python -m helpers labs build

# nbgrader in a venv of its own (it enables JupyterLab extensions a learner's venv should not get), then
# the test that runs real nbgrader on the exported lab 00: generate_assignment, autograde, scores.
# nbgrader calls `alembic` from PATH: activate .venv-nbgrader (or put its bin/ on PATH) before using it.
nbgrader-setup:
	$(MAKE) --no-print-directory setup VENV=.venv-nbgrader
	.venv-nbgrader/bin/python -m pip install -q -e ".[nbgrader]"

nbgrader: nbgrader-setup
	PATH=$(CURDIR)/.venv-nbgrader/bin:$$PATH LABS_QUICK=1 LABS_HEADLESS=1 .venv-nbgrader/bin/python -m pytest -q -p no:xdist tests/test_nbgrader.py

clean:
	rm -rf $(VENV) runs .pytest_cache

# The validation pipeline under two torch versions (python -m helpers validate matrix): one venv per version
# (.venv-validate-<version>: pip install torch==<version> first, then environments/validate.txt and the
# package), interleaved runs with identical settings, one comparison: runs/validation-matrix/<date>/report.html.
# Exit 1 when the comparison has findings (regressions beyond the noise, failed checks, numerics drift).
VALIDATE_TORCH ?= 2.9.1 2.10.0
VALIDATE_ARGS ?= --quick
validate-matrix: setup
	$(BIN)/python -m helpers validate matrix $(VALIDATE_TORCH) $(VALIDATE_ARGS)
