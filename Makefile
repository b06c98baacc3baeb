# One verb per job. `make run` and `make test` set everything up on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench lint types protos fmt setup clean analytics lock compiled

$(STAMP): pyproject.toml requirements.lock scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	touch $(STAMP)

setup: $(STAMP) compiled

# The sans-I/O core (codec, topic trie, channel) compiled with mypyc into $(VENV)/compiled
# (docs/compiled-core.md): about a minute the first time, then only when its sources change.
# A failed build warns and everything runs as Python; STARLING_PURE=1 asks for Python.
compiled: $(STAMP)
	@$(PY) -m scripts.build_compiled

# Re-resolve pyproject.toml's ranges into requirements.lock (then make test and commit both).
lock:
	bash scripts/lock.sh

run: $(STAMP) compiled
	$(VENV)/bin/starling up

# The files run side by side on TEST_WORKERS pytest-xdist workers (each file whole on one
# worker, longest first: tests/scheduling.py); TEST_WORKERS=0 runs them in one process, in
# order (docs/testing.md has the figures, and says how to run one part).
TEST_WORKERS ?= 2
# Then the files that assert failover and partition times (marked `timed`), beside each other
# only, on two workers: the partition suite (one unit: its files share the namespaced mesh)
# beside the others. Last the files that assert a bystander's latency (`alone`), by themselves.
TIMED_WORKERS ?= 2
# The compiled core and the Spark class archive (tests/spark_jvm.py: the tests' Spark JVMs map
# their classes from it) are built side by side first.
test: $(STAMP)
	@$(MAKE) --no-print-directory -j2 compiled $(VENV)/spark-classes.jsa
	@rc=0; \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not timed and not alone" || rc=$$?; \
	$(PY) -m pytest -q -n $(TIMED_WORKERS) --dist loadfile --no-loadscope-reorder -m timed || rc=$$?; \
	$(PY) -m pytest -q -m alone || rc=$$?; \
	exit $$rc

$(VENV)/spark-classes.jsa: $(STAMP)
	$(PY) -m tests.spark_jvm

bench: $(STAMP) compiled
	$(PY) -m bench.run

# make analytics JOB=queue-compaction [ARGS="--dry-run"]
analytics: $(STAMP)
	$(VENV)/bin/starling analytics $(JOB) $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check services tests bench analytics scripts
	$(VENV)/bin/ruff format --check services tests bench analytics scripts

# services/common, and strictly every module the compiled core holds (mypyc needs it); the
# modules they import are read for their types only, as the build reads them.
types: $(STAMP)
	$(VENV)/bin/mypy --follow-imports=silent services/common services/connection/channel services/compiled.py \
		$(addprefix services/connection/,$(addsuffix .py,fanout ingress mesh publish_answers replica routing stats writes))

protos: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m scripts.gen_protos

fmt: $(STAMP)
	$(VENV)/bin/ruff format services tests bench analytics scripts
	$(VENV)/bin/ruff check --fix services tests bench analytics scripts

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
