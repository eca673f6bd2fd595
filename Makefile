# The two commands of the README: `make lab` opens the course, `make test` runs every test.
# `make lab-instructor` adds nbgrader's tools and opens solutions/*.py as notebooks; `make demo`
# serves the lecture dashboards.
# Both create .venv with pip on first use (Python 3.11) and reinstall when pyproject.toml changes.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8888
WORKERS ?= 2
export PATH := $(abspath $(BIN)):$(PATH)
# Jupyter refuses to run as root (containers, CI) unless told it may.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: lab lab-instructor demo demo-warm screenshots test test-profile check release selfcheck bench bench-grade checkpoints clean help

help:
	@echo "make lab         open the course in JupyterLab (prints the URL; headless)"
	@echo "make lab-instructor  JupyterLab with nbgrader's tools; solutions/*.py open as notebooks"
	@echo "make demo        lecture dashboards: every chapter's slider demos (Voila; prints the URL)"
	@echo "make demo-warm   measure every dashboard once before class, so that each opens in seconds"
	@echo "make screenshots retake the README's screenshots (docs/) in full mode with Chromium"
	@echo "make test        run the whole test suite (fast mode, $(WORKERS) workers); profile in build/test-profile.md"
	@echo "make test-profile  the whole suite, then where its time went: per file, per chapter, fixed costs"
	@echo "make check CHAPTER=ch04_partial_training  one chapter's tests (hidden checks, wrong and second answers,"
	@echo "                 hostile cases, notebook, release): the inner loop for authors"
	@echo "make release     regenerate course/ from solutions/"
	@echo "make selfcheck   references score full marks, blank releases score 0"
	@echo "make bench       slow benchmarks (GPU ones skip without CUDA)"
	@echo "make bench-grade seconds per submission: the course's grader beside plain nbgrader, same submissions"
	@echo "                 (BENCH_CHAPTERS=\"ch00_memory ch01_lora\" N=6; as root, on a quiet machine)"
	@echo "make checkpoints retrain the small pretrained checkpoints in data/"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

# Kernels on Unix sockets: no TCP port race between kernels started at the same time.
LAB = $(BIN)/jupyter lab --no-browser --ip=127.0.0.1 --port=$(PORT) $(ALLOW_ROOT) --ServerApp.root_dir=$(CURDIR) --KernelManager.transport=ipc

# Students get no instructor tools: config/student switches nbgrader's menus and server pages off.
lab: $(STAMP)
	JUPYTER_CONFIG_PATH=$(CURDIR)/config/student $(LAB) --LabApp.default_url=/lab/tree/course

# config/instructor: solutions/*.py open read-only (saving them from the notebook view would rewrite
# their headers); EDIT=1 allows it.
lab-instructor: $(STAMP)
	COURSE_EDIT_SOURCES=$(if $(EDIT),1,0) JUPYTER_CONFIG_PATH=$(CURDIR)/config/instructor \
	  $(LAB) --LabApp.app_settings_dir=$(CURDIR)/config/instructor/lab-settings --LabApp.default_url=/lab/tree

# Dashboards are generated from solutions/ into build/demo/ each time, then served by Voila.
demo: $(STAMP)
	$(BIN)/python -m grader demo --port=$(PORT)

# Before class: every dashboard runs once and saves its measurements (build/demo/cache/), so that
# each opens in seconds. CHAPTERS="ch01_lora ch04_partial_training" warms only those.
demo-warm: $(STAMP)
	$(BIN)/python -m grader demo --warm $(CHAPTERS)

# The README's screenshots (docs/*.png), retaken in full mode with Chromium: `make demo-warm` first.
screenshots: $(STAMP)
	$(BIN)/python -m scripts.screenshots

# One thread per test worker: the workers already fill the cores, and torch's own threads
# competing with them make notebooks several times slower on a 2-core machine.
PYTEST = COURSE_FAST=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n $(WORKERS) --dist loadgroup

# Every run writes build/test-profile.md (tests/profiling.py): wall time per file and chapter, fixed costs.
test: $(STAMP)
	$(PYTEST)

test-profile: $(STAMP)
	$(PYTEST) || status=$$?; cat build/test-profile.md; exit $${status:-0}

# The tests that name one chapter (its id or short id, e.g. ch04): the graded batch grades that chapter alone.
CHAPTERS := $(basename $(notdir $(wildcard solutions/ch*.py)))
check: $(STAMP)
	@test -n "$(CHAPTER)" || { echo "usage: make check CHAPTER=<id>, one of: $(CHAPTERS)"; exit 2; }
	@case " $(CHAPTERS) " in *" $(CHAPTER) "*) ;; *) echo "unknown chapter '$(CHAPTER)'; one of: $(CHAPTERS)"; exit 2;; esac
	$(PYTEST) -k "$(firstword $(subst _, ,$(CHAPTER)))"

release: $(STAMP)
	$(BIN)/python -m grader release

selfcheck: $(STAMP)
	$(BIN)/python -m grader selfcheck

bench: $(STAMP)
	$(BIN)/python -m grader bench

# N synthetic submissions per chapter (correct, second and wrong answers in turn), graded by
# `python -m grader autograde` and by plain `nbgrader autograde`; not part of `make test`.
N ?= 6
bench-grade: $(STAMP)
	$(BIN)/python -m grader.bench_grade $(BENCH_CHAPTERS) -n $(N) --workers $(WORKERS)

checkpoints: $(STAMP)
	$(BIN)/python -m coursekit.pretrain

# Chapter 16's shipped profile and table (data/capstone/): fine-tunes and measurements, one thread per process.
capstone-data: $(STAMP)
	$(BIN)/python -m coursekit.capstone --jobs 2

clean:
	rm -rf $(VENV) .pytest_cache
