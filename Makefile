# make demo: set up .venv and run the demo on an embedded directory.
# make test: set up .venv and run the whole suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test bench crash venv clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,spark,bench]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m partq.demo --data demo-data

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/publish.py
	$(BIN)/python bench/rebalance.py
	$(BIN)/python bench/partitioner.py
	$(BIN)/python bench/replication.py
	$(BIN)/python bench/spark_ingest.py
	$(BIN)/python bench/peers.py

clean:
	rm -rf $(VENV) demo-data
