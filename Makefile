# make demo: set up .venv with partq and run the demo on an embedded directory.
# make test: set up .venv with the test, Spark and benchmark extras; ruff, mypy, then the whole suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
HASH := $(shell cksum pyproject.toml | cut -d' ' -f1)
BASE := $(VENV)/.installed-base-$(HASH)
FULL := $(VENV)/.installed-full-$(HASH)

.PHONY: demo test bench crash clean

$(BASE): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(FULL): $(BASE)
	$(BIN)/pip install -q -e '.[test,spark,bench]'
	touch $@

demo: $(BASE)
	$(BIN)/python -m partq.demo --data demo-data

test: $(FULL)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

bench: $(FULL)
	$(BIN)/python bench/publish.py
	$(BIN)/python bench/encode_cost.py
	$(BIN)/python bench/rebalance.py
	$(BIN)/python bench/online_scaling.py
	$(BIN)/python bench/idle.py
	$(BIN)/python bench/partitioner.py
	$(BIN)/python bench/replication.py
	$(BIN)/python bench/remote.py
	$(BIN)/python bench/spark_ingest.py
	$(BIN)/python bench/peers.py

crash: $(FULL)
	PARTQ_CRASH_LONG=1 $(BIN)/python -m pytest -q -s tests/crash/test_random_kills.py::test_random_kills_long

clean:
	rm -rf $(VENV) demo-data
