# The two commands a fresh machine needs are `make demo` and `make test`; both prepare
# everything themselves (tests/tools/bootstrap.sh) and are safe to repeat.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
PYTEST_WORKERS ?= auto
# Every pytest line records where its time goes (tests/support/suite_timing.py) under .build/timings/<tier>.
TIMINGS := $(CURDIR)/.build/timings
PYTEST = GPUFLEET_TIMINGS=$(TIMINGS)/$@ python -m pytest -p no:cacheprovider -p tests.support.suite_timing

.PHONY: bootstrap collection demo simfleet simfleet-down test check report sanity units compat integration integration-fast reliability lint contract containers molecule awx ee ee-jobs \
  prepare-collections prepare-compat prepare-containers prepare-ee prepare-real bench bench-relaunch bench-tune lock clean

bootstrap:
	@tests/tools/bootstrap.sh

collection: bootstrap
	@tests/tools/collection-tree.sh >/dev/null

# Its own small environment (.venv-demo: ansible-core, nvidia-ml-py, setproctitle), so that the first run on a
# fresh machine does not wait for the test tiers' tools.
demo:
	@tests/tools/bootstrap.sh demo
	PATH=$(CURDIR)/.venv-demo/bin:$$PATH $(CURDIR)/.venv-demo/bin/python tests/demo/fleet_relaunch_demo.py

# Simulated GPU hosts and an inventory for trying the playbooks by hand (docs/try-it.md).
HOSTS ?= 3
DIR ?= $(HOME)/simfleet
simfleet: bootstrap
	python tests/tools/simfleet.py up --dir $(DIR) --hosts $(HOSTS) $(if $(ROUTER),--router)

simfleet-down: bootstrap
	python tests/tools/simfleet.py down --dir $(DIR)

# Every tier, on two lanes (tests/tools/suite.py): the tiers one after another, and beside them the environments and
# images the later tiers need, then the container tiers. Ends with each step's wall time against tests/budgets.yml.
test: collection
	python tests/tools/suite.py run test

# The inner loop (at most 5 minutes): sanity, units, and the integration tests that run each module once.
check: collection
	python tests/tools/suite.py run check

# Where the last run's time went: per tier, per file, per fixture set up, per ansible run.
report: bootstrap
	python tests/tools/suite.py report

# Changelog fragments: the sections of changelogs/config.yaml, each entry a string (new modules and plugins
# come from their version_added, never from a fragment).
sanity: collection
	ruff check .
	ruff format --check .
	tests/tools/typecheck.sh
	cd .build/ansible_collections/gpufleet/sglang && ansible-test sanity --venv --python 3.11 --color no
	antsibull-changelog lint
	antsibull-changelog lint-changelog-yaml changelogs/changelog.yaml

units: collection
	cd .build/ansible_collections/gpufleet/sglang && ansible-test units --venv --python 3.11 --color no

# ansible-core 2.17, the oldest release meta/runtime.yml declares, from .venv-2.17 (tests/requirements-2.17.txt):
# the sanity tests that read the collection as that release does (pylint and pep8, linters whose versions
# differ by release, run above under 2.19), the unit tests, and sglang_launch's integration file: its module calls
# as the AnsiballZ payloads 2.17 builds (tests/support/ansiballz.py), its playbooks through 2.17's ansible-playbook
# (the simulated hosts run the modules with the interpreter of the pytest that drives them).
COMPAT := $(CURDIR)/.venv-2.17/bin
prepare-compat: collection
	tests/tools/bootstrap.sh compat

compat: prepare-compat
	cd .build/ansible_collections/gpufleet/sglang && \
	  $(COMPAT)/ansible-test sanity --venv --python 3.11 --color no --skip-test pylint --skip-test pep8 && \
	  $(COMPAT)/ansible-test units --venv --python 3.11 --color no
	GPUFLEET_TIMINGS=$(TIMINGS)/$@ $(COMPAT)/python -m pytest -p no:cacheprovider -p tests.support.suite_timing tests/integration/test_sglang_launch.py

# awx/apply.yml and the molecule scenarios use awx.awx and containers.podman: unpacked into .cache first.
prepare-collections: bootstrap
	tests/awx/install-awx-collection.sh
	tests/containers/install-collections.sh

lint: collection prepare-collections
	cd .build/ansible_collections/gpufleet/sglang && \
	  ANSIBLE_COLLECTIONS_PATH=$(CURDIR)/.cache/collections ansible-lint --profile production --strict

integration: collection
	$(PYTEST) -n $(PYTEST_WORKERS) tests/simgpu tests/simsglang tests/integration

# Each module and playbook family once (tests marked `fast` in tests/integration), for `make check`.
integration-fast: collection
	$(PYTEST) -n $(PYTEST_WORKERS) -m fast tests/integration

# Bad inputs refused before anything stops, faults survived, secrets kept: prints its counts per surface at the end.
reliability: collection
	$(PYTEST) -n 2 --dist loadfile tests/reliability

contract: bootstrap
	$(PYTEST) tests/contract

# AWX job templates run through ansible-runner on the simulated fleet; apply.yml and the execution environment.
awx: bootstrap
	tests/awx/install-awx-collection.sh
	$(PYTEST) -n 2 tests/awx

# The execution environment built from awx/execution-environment.yml with ansible-builder and podman on the
# container tier's base image (needs root), then job templates run in it over SSH (docs/awx.md).
prepare-ee: bootstrap
	tests/awx/build-ee.sh

ee: prepare-ee ee-jobs

ee-jobs: bootstrap
	$(PYTEST) tests/awx/ee_jobs.py

# The collection against the real SGLang 0.5.23 on this machine's CPU (tests/real): its environment (11 GB, from
# tests/real/requirements.txt) and a tiny model are built once into ~/.cache/gpufleet-real and reused.
.PHONY: real
prepare-real: bootstrap
	tests/real/bootstrap.sh

real: prepare-real
	$(PYTEST) tests/real

# Podman containers running systemd, built locally once per machine (needs root).
prepare-containers: bootstrap
	tests/containers/prepare.sh
	tests/containers/install-collections.sh

containers: prepare-containers
	$(PYTEST) tests/containers

# Molecule fleet scenarios (extensions/molecule): three podman hosts each, simulated GPUs (needs root).
molecule: prepare-containers
	tests/molecule/run.sh

bench: collection
	python tests/bench/wait_clean_latency.py

bench-relaunch: bootstrap
	python tests/bench/relaunch_vs_manual.py --hosts 1 4 16
	python tests/bench/relaunch_vs_manual.py --hosts 1 --startup 3 --release 1
	python tests/bench/relaunch_vs_manual.py --noop --hosts 1 3 --repeats 3

# A rolling relaunch behind the real sglang-router 0.3.2 under load: failures, latency before and during, drain/down/ready per host.
.PHONY: bench-roll
bench-roll: bootstrap
	python tests/bench/roll.py --hosts 3 --clients 12

# The same speculative sweep (tune.yml) on 4 simulated hosts and on 1 host, wall times and their ratio side by side;
# then the same grid measured in full and raced, trials and winners side by side.
bench-tune: bootstrap
	python tests/bench/tune_fleet_vs_one.py --hosts 4
	python tests/bench/tune_grid_vs_racing.py --hosts 4 --repeats 12
	python tests/bench/racing_false_elimination.py

lock:
	python3 -m venv .build/lock && .build/lock/bin/pip install -q -r tests/requirements.in && \
	  .build/lock/bin/pip freeze --exclude-editable | sort > tests/requirements.txt

clean:
	rm -rf .build tests/simgpu/build
