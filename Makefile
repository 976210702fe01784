# make demo  - run the system on a private Postgres (and, later, the devnet)
# make test  - the whole suite (real Postgres, real processes, real HTTP)
# make bench - benchmarks; they print figures, they assert nothing
# make soak  - the chaos soak alone, longer: make soak DURATION=30m [SEED=N];
#              SCENARIO=restore|failover runs a disaster-recovery drill instead (default chaos)
PYTHON ?= python3
VENV   ?= .venv
STAMP  := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)

.PHONY: demo test bench lint clean soak

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/paygate demo --data-dir $(CURDIR)/.demo/pg

test: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	# Three workers on two cores: most tests wait on processes, ledgers and leases, not the CPU.
	$(VENV)/bin/pytest -q -p no:cacheprovider -n 3 --durations=15

# The chaos soak and the disaster-recovery drills (tests/chaos) also run in `make test`, short:
# PAYGATE_SOAK_SECONDS (default 150 s), PAYGATE_DRILL_SECONDS (default 20 s of load per drill).
DURATION ?= 30m
SCENARIO ?= chaos
SOAK_TESTS_chaos    := tests/chaos/test_soak.py
SOAK_TESTS_restore  := tests/chaos/test_restore_drill.py
SOAK_TESTS_failover := tests/chaos/test_failover_drill.py
SOAK_TESTS_patroni  := tests/chaos/test_patroni_failover.py
soak: $(STAMP)
	@test -n "$(SOAK_TESTS_$(SCENARIO))" || { echo "SCENARIO must be chaos, restore, failover or patroni"; exit 2; }
	PAYGATE_SOAK_SECONDS=$(DURATION) PAYGATE_DRILL_SECONDS=$(DURATION) $(if $(SEED),PAYGATE_SOAK_SEED=$(SEED)) \
	  $(VENV)/bin/pytest -q -p no:cacheprovider -s -m soak $(SOAK_TESTS_$(SCENARIO))

bench: $(STAMP)
	$(VENV)/bin/python bench/idle_tick.py
	$(VENV)/bin/python bench/cold_commands.py
	$(VENV)/bin/python bench/devnet_throughput.py --batch 10
	$(VENV)/bin/python bench/funding.py
	$(VENV)/bin/python bench/settlement.py
	$(VENV)/bin/python bench/observer.py
	$(VENV)/bin/python bench/relay.py
	$(VENV)/bin/python bench/fee_market.py
	$(VENV)/bin/python bench/ttl.py
	$(VENV)/bin/python bench/ops_scale.py
	$(VENV)/bin/python bench/growth.py
	$(VENV)/bin/python bench/latency.py
	$(VENV)/bin/python bench/throughput.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench

clean:
	-$(VENV)/bin/paygate dev db down --data-dir $(CURDIR)/.demo/pg
	@# as root in a private clone the demo's cluster lives in /var/tmp/paygate-pg-*, named by this pointer
	-d=$$(cat .demo/pg/paygate-datadir 2>/dev/null); case "$$d" in /var/tmp/paygate-pg-*) rm -rf "$$d";; esac
	rm -rf .demo
