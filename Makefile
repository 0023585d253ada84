# Two commands do all the set-up on a fresh machine:
#   make demo   - install, then run the main job
#   make test   - install what the tests need, then run them
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

install: $(PY)
	$(PIP) install -q -r requirements.txt
	$(PIP) install -q -e .

demo: install
	$(VENV)/bin/hyperparallel train recipes/tiny_mllm.yaml --run-dir runs/demo

test: install
	$(PY) -m pytest -q tests

# the demo conversations data set that recipes/tiny_mllm_data.yaml reads (see README "Your own data")
demo-data: install
	$(PY) tools/make_demo_data.py data/demo

.PHONY: install demo test demo-data
