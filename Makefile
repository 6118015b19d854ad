# The README's commands. `make setup` then `make test` on a fresh clone must just work.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
# CPU machines get this torch (on this project's CI machines it is a CPU build on local disk).
# On a Linux laptop without a GPU add TORCH_INDEX=https://download.pytorch.org/whl/cpu to avoid the CUDA wheel.
TORCH_CPU   ?= torch==2.13.0
TRITON_CPU  ?= triton==3.6.0
TORCH_INDEX ?=
JOBS   ?= 2
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0)

.PHONY: setup test test-fast check lab lectures slides bugs-guide assignments grade selftest bench bench-cpu gradescope student-release site site-test clean

setup:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
ifeq ($(HAS_GPU),0)
	$(BIN)/pip install $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) --extra-index-url https://pypi.org/simple) "$(TORCH_CPU)"
	if [ "$$(uname -s)" = Linux ]; then $(BIN)/pip install "$(TRITON_CPU)"; fi
endif
	$(BIN)/pip install -r requirements.txt
	# rfc3987-syntax (jsonschema's check of the "iri" format, pulled in by jupyter-events; nothing here validates an
	# IRI) compiles a grammar when it is imported: 1.3 s in every process that imports nbformat
	$(BIN)/pip uninstall -y -q rfc3987-syntax
	$(BIN)/pip install --no-deps -e .
	$(PY) -c "import numpy, torch, matplotlib, nbclient; print('torch', torch.__version__, '| cuda:', torch.cuda.is_available())"

test:
	$(PY) -m pytest -n $(JOBS) --dist worksteal -q --durations=15

# everything but the notebooks and the grader's self-test
test-fast:
	$(PY) -m pytest -n $(JOBS) -q -m "not notebooks and not selftest and not slow"

# the visible checks of an assignment on your own notebook, through pytest; MARK: one function's checks
#   make check ASSIGNMENT=a1_attention [SUBMISSION=my.ipynb] [MARK=online_softmax]
check:
	$(PY) -m pytest autograder/tests_visible -q -p no:cacheprovider \
		--assignment $(or $(ASSIGNMENT),$(error give ASSIGNMENT=a1_attention (and SUBMISSION=..., MARK=...))) \
		$(if $(SUBMISSION),--submission "$(SUBMISSION)") $(if $(MARK),-m "$(MARK)")

lab:
	$(BIN)/jupyter lab

lectures:
	$(PY) -m lectures.build

# a reveal.js deck per lecture in build/slides/ (offline: reveal.js, MathJax, RequireJS, jQuery installed once with npm)
slides:
	$(PY) -m lectures.slides

# docs/common_bugs/<aid>.md from the grader's wrong submissions (run after adding one to autograder/submissions/)
bugs-guide:
	$(PY) -m autograder.bugs_guide

assignments:
	$(PY) -m assignments.generate

grade:
	$(PY) -m autograder grade $(if $(ASSIGNMENT),$(ASSIGNMENT) $(SUBMISSION),--example)

selftest:
	$(PY) -m autograder selftest

bench-cpu:
	$(PY) -m benchmarks.course.cpu_numpy

bench:
	$(PY) -m benchmarks.course.bench_attention
	$(PY) -m benchmarks.course.bench_decode

gradescope:
	$(PY) -m autograder gradescope $(or $(ASSIGNMENT),a1_attention) -o build/gradescope_$(or $(ASSIGNMENT),a1_attention).zip

# what students get: lectures, stub notebooks, check() with the visible cases; no solution or reference code.
# EXCLUDE="05_triton_kernels a6" leaves out lectures / assignments (numbers and short ids work too).
EXCLUDE ?=
student-release:
	$(PY) -m assignments.release -o build/student-release $(foreach x,$(EXCLUDE),--exclude $(x))

# the course website from the committed notebooks, READMEs and docs (nothing executed): build/site/index.html.
# SITE_JOBS: Sphinx's parallel jobs.
SITE_JOBS ?= auto
site:
	$(PY) docs/site/make_site.py --out build/site -j $(SITE_JOBS)

# the built site in headless Chromium (Debian: apt-get install chromium chromium-driver); fails without it
site-test: site
	COURSE_SITE_DIR=build/site COURSE_SITE_REQUIRE_BROWSER=1 $(PY) -m pytest tests/test_site.py -p no:xdist -q

clean:
	rm -rf build dist grades .pytest_cache .hypothesis *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
