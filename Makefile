# Two commands do all the set-up on a fresh machine:
#   make demo   - install, then run the main job (a real VLM with transpose on CPU ranks)
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

# the main job: the demo conversations (generated if missing), a tiny Qwen2.5-VL with transpose on 2 CPU ranks
demo: install
	test -f data/demo/train.jsonl || $(PY) tools/make_demo_data.py data/demo
	$(VENV)/bin/hyperparallel train recipes/qwen2_5_vl_tiny.yaml --run-dir runs/demo

# tests/unit/ launches no msrun job, tests/integration/ holds the modules that do (docs/layout.md).
# the suite in TEST_WORKERS pytest processes, one test module per process at a time (module-scoped msrun
# launches run once); TEST_WORKERS=0 runs it in this process. On a failure the failed tests and why are
# printed last (tools/test_recap.py, from pytest's JUnit report), so a CI log's tail names them.
TEST_WORKERS ?= 4
TEST_REPORT ?= .pytest-report.xml
test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --junitxml=$(TEST_REPORT) tests \
		|| { rc=$$?; $(PY) tools/test_recap.py $(TEST_REPORT); exit $$rc; }

# the fast subset for the inner loop: every test that launches no msrun job and trains no model in process
# (markers msrun and slow, pytest.ini); make test runs them all
test-fast: install
	$(PY) -m pytest -q -n 2 -m "not msrun and not slow" tests

# the fuzz test's longer mode (CI runs a bounded number of examples): HP_FUZZ_EXAMPLES per fuzz test
fuzz: install
	HP_FUZZ_EXAMPLES=$${HP_FUZZ_EXAMPLES:-2000} $(PY) -m pytest -q tests/unit/test_fuzz.py

# mutation testing of the checker and the cost model (mutmut, setup.cfg [mutmut]); writes docs/mutation.md.
# Not in CI (minutes on 2 cores): rerun when hyperparallel/mpipe/check.py or cost.py change.
mutation: install
	$(PY) tools/mutation_report.py

# the demo conversations data set that recipes/tiny_mllm_data.yaml reads (see docs/data.md, "Your own data")
demo-data: install
	$(PY) tools/make_demo_data.py data/demo

.PHONY: install demo test test-fast demo-data fuzz mutation
