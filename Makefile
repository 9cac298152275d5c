# rekindle — the two commands a new machine needs are `make demo` and `make test`.
# Both install what is missing first (as root on Debian/Ubuntu; see `deps`).

CARGO ?= cargo
PYTHON ?= python3

.PHONY: all deps build demo test lint unit clean drill fuzz

all: build

## deps: install what a fresh Debian/Ubuntu machine lacks (idempotent)
deps:
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust from https://rustup.rs"; exit 1; }
	@$(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt
	@$(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy
	@command -v $(PYTHON) >/dev/null || { apt-get update && apt-get install -y python3 python3-pip; }
	@$(PYTHON) -c "import safetensors, numpy" 2>/dev/null || $(PYTHON) -m pip install --quiet safetensors numpy
	@dpkg -s libssl-dev pkg-config >/dev/null 2>&1 || { apt-get update && apt-get install -y libssl-dev pkg-config; }
	@dpkg -s librocm-smi-dev libclang-dev >/dev/null 2>&1 || { apt-get update && apt-get install -y librocm-smi-dev libclang-dev; }
	@command -v chromium >/dev/null || { apt-get update && apt-get install -y chromium; } || \
		echo "*** WARNING: cannot install chromium: tests/it/report_browser.rs will fail (outside CI, REKINDLE_SKIP_CHROMIUM=1 skips it) ***"
	@dpkg -s libopenmpi-dev openmpi-bin >/dev/null 2>&1 || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y libopenmpi-dev openmpi-bin; }
	@command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null && command -v munged >/dev/null || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y slurmctld slurmd slurm-client munge; }

## build: the release binary at target/release/rekindle
build:
	$(CARGO) build --release

## demo: train configs/tiny.toml, stop it half-way, resume it, verify the checkpoints
demo: deps build
	rm -rf runs/tiny
	./target/release/rekindle run --config configs/tiny.toml --stop-at-step 100; test $$? -eq 75
	./target/release/rekindle run --config configs/tiny.toml
	./target/release/rekindle checkpoints runs/tiny
	./target/release/rekindle verify runs/tiny
	./target/release/rekindle status runs/tiny
	./target/release/rekindle report runs/tiny
	@echo "open runs/tiny/report.html to see the run"

# The features the tests build with: `mpi` (data-parallel ranks through the
# system's OpenMPI, which `deps` installs), so that its tests run in CI.
FEATURES ?= --features mpi

## lint: formatting and clippy, as CI enforces them; the `rocm` and `mpi` features must keep building and linking
lint: deps
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) clippy --all-targets --features rocm -- -D warnings
	$(CARGO) clippy --all-targets --features mpi -- -D warnings
	$(CARGO) build --features rocm

## test: everything CI runs (lint, unit and integration tests)
# The SLURM drills (tests/it/drills.rs) last minutes and judge timings: they
# run alone after the rest, as when they had a test binary of their own.
# Built with $(FEATURES); the library's unit tests of `distributed` also run
# without any feature, where a world of several ranks must be refused.
test: deps lint
	$(CARGO) build --examples $(FEATURES)
	$(CARGO) test --all-targets $(FEATURES) -- --skip drills::
	$(CARGO) test --test it $(FEATURES) drills::
	$(CARGO) test --doc $(FEATURES)
	$(CARGO) test --lib distributed::

## fuzz: the fuzz tests of every reader (src/fuzz.rs) with many more cases
## than `make test` runs (64 each); FUZZ_CASES=N to choose, bounded by FUZZ_TIMEOUT
FUZZ_CASES ?= 5000
FUZZ_TIMEOUT ?= 1800
fuzz:
	PROPTEST_CASES=$(FUZZ_CASES) timeout $(FUZZ_TIMEOUT) $(CARGO) test --lib -- fuzz mutated_state_json

clean:
	$(CARGO) clean
	rm -rf runs

## drill: the SLURM drills (docs/drills.md) on the local two-node cluster, with
## the debug binary; DRILLS="term cancel" picks some. Leaves the cluster as found.
DRILLS ?=
drill: deps
	$(CARGO) build
	@up=0; slurm/local-cluster.sh status >/dev/null 2>&1 && up=1; \
	slurm/local-cluster.sh up || exit 1; \
	eval "$$(slurm/local-cluster.sh env)"; \
	REKINDLE_BIN=$${REKINDLE_BIN:-$(CURDIR)/target/debug/rekindle} slurm/drill.sh $(DRILLS); rc=$$?; \
	[ $$up = 1 ] || slurm/local-cluster.sh down; exit $$rc
