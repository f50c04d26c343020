# make demo: set up .venv with partq and run the demo on an embedded directory.
# make test: set up .venv with the test, Spark, benchmark, Celery and dramatiq extras; ruff, mypy, then the whole suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
HASH := $(shell cksum pyproject.toml | cut -d' ' -f1)
BASE := $(VENV)/.installed-base-$(HASH)
FULL := $(VENV)/.installed-full-$(HASH)

.PHONY: demo test bench crash clean lint-imports

$(BASE): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(FULL): $(BASE)
	$(BIN)/pip install -q -e '.[test,spark,bench,celery,dramatiq]'
	touch $@

demo: $(BASE)
	$(BIN)/python -m partq.demo --data demo-data

# The suite runs in two worker processes (pytest-xdist), each test file whole in one of them (a
# module's fixtures, such as the crash-point sweep, run once): 7.5 min instead of 12-13.5 on two
# cores, most tests waiting on processes, sockets and timers. TEST_JOBS=0: one process.
TEST_JOBS ?= 2
# the console's browser tests drive Debian's chromium; without it they are skipped, saying why
test: $(FULL) lint-imports
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
	    || echo "chromium could not be installed: the console's browser tests will be skipped"
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile

# import-linter reads a package from one folder: lay storage/, tools/ and spark/ into a copy of
# partq/ as the installed package has them, then check pyproject's contracts on that copy.
IMPORT_TREE := build/import-tree
lint-imports: $(FULL)
	rm -rf $(IMPORT_TREE) && mkdir -p $(IMPORT_TREE)
	cp -r partq $(IMPORT_TREE)/partq
	for d in storage tools spark; do cp -r $$d $(IMPORT_TREE)/partq/$$d; done
	cd $(IMPORT_TREE) && PYTHONPATH=. $(CURDIR)/$(BIN)/lint-imports $(CURDIR)/pyproject.toml

# make bench: every benchmark script in turn, each line appended to bench/results/make_bench.jsonl
# (tagged with its script), then bench/report.py writes bench/results/README.md and ratios.png.
# A script that fails leaves a "skipped" line; make bench goes on and fails at the end.
BENCH_SCRIPTS := publish encode_cost quota_cost lifecycle_cost rebalance key_ordering online_scaling idle partitioner replication takeover \
                 remote tls_soak memory hostile spark_ingest spark_read peers startup transactions console worker \
                 dramatiq_on_partq celery_on_partq
BENCH_OUT := bench/results/make_bench.jsonl

bench: $(FULL)
	@# the servers bench/peers.py and bench/remote.py start themselves, from Debian (as .ci/run);
	@# one that cannot be installed makes its lines say "skipped"
	if ! command -v redis-server >/dev/null || ! command -v nats-server >/dev/null \
	    || [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then \
	  (apt-get update -qq && apt-get install -y -qq redis-server rabbitmq-server nats-server >/dev/null) \
	    || echo "redis-server, rabbitmq-server or nats-server could not be installed: their" \
	            "benchmark lines will say skipped"; \
	fi
	rm -f $(BENCH_OUT).new
	failed=""; for s in $(BENCH_SCRIPTS); do \
	  $(BIN)/python bench/report.py --collect bench/$$s.py --into $(BENCH_OUT).new || failed="$$failed $$s"; \
	done; \
	mv $(BENCH_OUT).new $(BENCH_OUT); \
	$(BIN)/python bench/report.py --results $(BENCH_OUT) --out bench/results; \
	if [ -n "$$failed" ]; then echo "benchmarks that failed:$$failed"; exit 1; fi

crash: $(FULL)
	PARTQ_CRASH_LONG=1 $(BIN)/python -m pytest -q -s tests/crash/test_random_kills.py::test_random_kills_long

clean:
	rm -rf $(VENV) demo-data build
