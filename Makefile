# rekindle — the two commands a new machine needs are `make demo` and `make test`.
# Both install what is missing first (as root on Debian/Ubuntu): `make demo`
# only what building rekindle needs (`demo-deps`), `make test` everything its
# tests use (`deps`).

CARGO ?= cargo
PYTHON ?= python3

.PHONY: all deps demo-deps build demo test lint unit clean drill fuzz chaos gpu-check cuda-env skip-summary test-under-load

# The CUDA toolkit the `cuda` feature (candle's CUDA backend) builds with:
# CUDA_ROOT when given (a system toolkit, e.g. CUDA_ROOT=/usr/local/cuda),
# else the one `deps` installs from NVIDIA's PyPI wheels into .cuda/
# (.ci/cuda-toolkit.sh; CUDA 13.0, about 1.2 GB). Building needs no GPU:
# candle's kernels are compiled for CUDA_COMPUTE_CAP (lint: 80, i.e. A100
# and newer; gpu-check: the GPU's own, asked from nvidia-smi when unset).
# docs/gpus.md says which to use on a cluster.
DEFAULT_CUDA_ROOT := $(CURDIR)/.cuda/nvidia/cu13
CUDA_ROOT ?= $(DEFAULT_CUDA_ROOT)
CUDA_COMPUTE_CAP ?=
CUDA_ENV = CUDA_ROOT="$(CUDA_ROOT)" CUDA_HOME="$(CUDA_ROOT)" CUDA_PATH="$(CUDA_ROOT)" NVCC="$(CUDA_ROOT)/bin/nvcc" \
	PATH="$(CUDA_ROOT)/bin:$$PATH" $(if $(CUDA_COMPUTE_CAP),CUDA_COMPUTE_CAP=$(CUDA_COMPUTE_CAP))

all: build

## demo-deps: what building rekindle needs and a machine with Rust may lack
## (idempotent): the C compiler that builds libgit2 and libssh2 from source,
## and pkg-config with OpenSSL's headers for git2's https and ssh. Nothing the
## demo does not use: no CUDA, MPI, SLURM, Python or Chromium.
demo-deps:
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust from https://rustup.rs"; exit 1; }
	@command -v cc >/dev/null || { command -v apt-get >/dev/null && apt-get update && apt-get install -y gcc libc6-dev; } || \
		{ echo "no C compiler (cc): install one (Debian/Ubuntu: apt-get install gcc libc6-dev)"; exit 1; }
	@pkg-config --exists openssl 2>/dev/null || { command -v apt-get >/dev/null && apt-get update && apt-get install -y pkg-config libssl-dev; } || \
		{ echo "pkg-config and OpenSSL's headers are needed: install them (Debian/Ubuntu: apt-get install pkg-config libssl-dev)"; exit 1; }

# The project's virtual environment with PyPI's torch, for the tests that
# run PyTorch programs under `rekindle exec` (tests/it/torch_exec.rs, the
# exec-ddp drill). PyPI's Linux wheel brings its CUDA libraries (torch 2.15.0
# +cu132: 5.4 GB installed, 1m09s here); it trains on the CPU without a GPU.
# Hugging Face's sharded loader (huggingface_hub, with safetensors) reads our
# sharded checkpoints there (tests/it/python_interop.rs). The trainers
# whose callbacks the client package serves (transformers with accelerate,
# lightning) and that package itself (python/, editable: `import rekindle`)
# go there too (tests/it/torch_exec.rs builds tiny models from config:
# nothing is downloaded at run time).
# pip is upgraded first: the venv's own pip 23.2 crashed on a half-installed
# site-packages.
VENV ?= $(CURDIR)/.venv

## deps: install what a fresh Debian/Ubuntu machine lacks for the whole test
## suite, the drills and the GPU builds (idempotent)
deps: demo-deps
	@$(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt
	@$(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy
	@command -v $(PYTHON) >/dev/null || { apt-get update && apt-get install -y python3 python3-pip; }
	@$(PYTHON) -c "import safetensors, numpy" 2>/dev/null || $(PYTHON) -m pip install --quiet safetensors numpy
	@$(PYTHON) -c "import tensorboard" 2>/dev/null || $(PYTHON) -m pip install --quiet tensorboard
	@command -v promtool >/dev/null && command -v prometheus-node-exporter >/dev/null || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus prometheus-node-exporter; }
	@$(VENV)/bin/python -c "import torch, numpy" 2>/dev/null || { \
		{ $(PYTHON) -m venv $(VENV) || { apt-get update && apt-get install -y python3-venv && $(PYTHON) -m venv $(VENV); }; } && \
		$(VENV)/bin/pip install --quiet --upgrade pip && $(VENV)/bin/pip install --quiet torch numpy; }
	@$(VENV)/bin/python -c "import huggingface_hub, safetensors" 2>/dev/null || $(VENV)/bin/pip install --quiet huggingface_hub safetensors
	@$(VENV)/bin/python -c "import transformers, accelerate, lightning" 2>/dev/null || $(VENV)/bin/pip install --quiet transformers accelerate lightning
	@$(VENV)/bin/python -c "import rekindle.hf" 2>/dev/null || $(VENV)/bin/pip install --quiet -e ./python
	@dpkg -s librocm-smi-dev libclang-dev >/dev/null 2>&1 || { apt-get update && apt-get install -y librocm-smi-dev libclang-dev; }
	@command -v chromium >/dev/null || { apt-get update && apt-get install -y chromium; } || \
		echo "*** WARNING: cannot install chromium: tests/it/report_browser.rs will fail (outside CI, REKINDLE_SKIP_CHROMIUM=1 skips it) ***"
	@command -v strace >/dev/null || { apt-get update && apt-get install -y strace; }
	@dpkg -s libopenmpi-dev openmpi-bin >/dev/null 2>&1 || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y libopenmpi-dev openmpi-bin; }
	@command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null && command -v munged >/dev/null || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y slurmctld slurmd slurm-client munge; }
	@[ "$(CUDA_ROOT)" != "$(DEFAULT_CUDA_ROOT)" ] || PYTHON=$(PYTHON) .ci/cuda-toolkit.sh
	@[ -x "$(CUDA_ROOT)/bin/nvcc" ] || { echo "no nvcc under CUDA_ROOT=$(CUDA_ROOT)"; exit 1; }

## build: the release binary at target/release/rekindle
build:
	$(CARGO) build --release

## demo: build, then scripts/demo.sh: train the built-in GPT on Shakespeare's
## sonnets (configs/demo.toml), SIGTERM it past half way, resume it, show its
## checkpoints, verify them, its status and its report (runs/demo/report.html)
demo: demo-deps build
	scripts/demo.sh --bin $(or $(CARGO_TARGET_DIR),target)/release/rekindle

# The features the tests build with: `mpi` (data-parallel ranks through the
# system's OpenMPI, which `deps` installs), so that its tests run in CI.
FEATURES ?= --features mpi

## lint: formatting and clippy, as CI enforces them; the `rocm`, `mpi` and
## `cuda` features must keep building and linking (`cuda` with no GPU: the
## toolkit from `deps`; its tests run with `make gpu-check` on a GPU machine)
# `cuda` is built, not clippied: `cargo clippy` and `cargo build` compile the
# build scripts apart, so clippy would compile candle's CUDA kernels (about
# 10 CPU-minutes) a second time, for nothing: no rekindle code is conditional
# on the feature (it asks candle at run time), so clippy above checks it all.
lint: deps
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --all-targets --features rocm -- -D warnings
	$(CARGO) clippy --all-targets --features mpi -- -D warnings
	$(CARGO) build --features rocm
	$(CUDA_ENV) CUDA_COMPUTE_CAP=$(or $(CUDA_COMPUTE_CAP),80) $(CARGO) build --features cuda

## cuda-env: the variables that point cargo at that toolkit, for
## `eval "$$(make -s cuda-env)"` before `cargo build --features cuda`
cuda-env:
	@echo 'export CUDA_ROOT="$(CUDA_ROOT)" CUDA_HOME="$(CUDA_ROOT)" CUDA_PATH="$(CUDA_ROOT)" NVCC="$(CUDA_ROOT)/bin/nvcc"'
	@echo 'export PATH="$(CUDA_ROOT)/bin:$$PATH" LD_LIBRARY_PATH="$(CUDA_ROOT)/lib:$${LD_LIBRARY_PATH:-}"'
	@$(if $(CUDA_COMPUTE_CAP),echo 'export CUDA_COMPUTE_CAP=$(CUDA_COMPUTE_CAP)',true)

## gpu-check: the tests that need an NVIDIA GPU (tests/it/gpu_check.rs:
## detection against nvidia-smi, a step on every planned GPU, stop/resume
## bit-exact on one GPU, the out-of-memory back-off on device memory), built
## with --features cuda for this machine's GPUs. Not part of `make test`.
gpu-check: deps
	@command -v nvidia-smi >/dev/null || { echo "gpu-check needs an NVIDIA GPU and its driver (nvidia-smi)"; exit 1; }
	$(CUDA_ENV) LD_LIBRARY_PATH="$(CUDA_ROOT)/lib:$(CUDA_ROOT)/lib64:$$LD_LIBRARY_PATH" \
		$(CARGO) test --test it --features cuda gpu_check:: -- --ignored --test-threads=1

## test: everything CI runs (lint, unit and integration tests)
# The SLURM drills (tests/it/drills.rs) last minutes and judge timings: they
# run alone after the rest, as when they had a test binary of their own.
# Built with $(FEATURES); the library's unit tests of `distributed` also run
# without any feature, where a world of several ranks must be refused, and
# those of `gpu` with `rocm` (ROCm SMI linked and asked; no AMD GPU here, so
# it must answer "no devices", not fail).
# Skipped tests (a dependency missing outside CI) are recorded in $(SKIPS)
# and listed after the run, never hidden in a passing test's output.
SKIPS = $(or $(CARGO_TARGET_DIR),target)/tmp/rekindle-skipped-tests.txt
test: deps lint
	@rm -f $(SKIPS)
	$(CARGO) build --examples $(FEATURES)
	$(CARGO) test --all-targets $(FEATURES) -- --skip drills::
	$(CARGO) test --workspace --exclude rekindle --all-targets
	$(CARGO) test --test it $(FEATURES) drills::
	$(CARGO) test --doc $(FEATURES)
	$(CARGO) test --lib distributed::
	$(CARGO) test --lib --features rocm gpu::
	@$(MAKE) -s skip-summary

## skip-summary: the tests the last `make test` (or test-under-load) skipped, and why
skip-summary:
	@if [ -s $(SKIPS) ]; then \
		echo "*** $$(wc -l < $(SKIPS)) test(s) were SKIPPED (CI=true makes each a failure):"; \
		sed 's/^/***   /' $(SKIPS); \
	else echo "no test was skipped"; fi

## test-under-load: every unit test and the integration tests that wait on the
## clock (deadlines, heartbeats, intervals, races, kills at random moments,
## recovery, in-job restarts, torch, telemetry, stragglers, health), run beside a CPU
## hog (stress-ng on every core, light I/O and memory pressure): a test that
## passes only on an idle machine fails here. Installs stress-ng if missing.
# Which tests and why: README.md, "Development". The hog starts after
# the build (building under load proves nothing) and is stopped however the
# tests end; --timeout ends it even if this make is killed outright.
LOAD_TESTS ?= interval:: lock:: signals:: watchdog:: exec:: documented:: distributed:: \
	kill_chain:: sigkill:: publish:: boundary:: recovery:: injob:: torch_exec:: telemetry:: \
	straggler:: health::
LOAD_FAILPOINT_TESTS ?= seal_race::
# Every unit test (`cargo test --lib`): those with clocks in them are spread
# over many modules (the lock's heartbeat and takeover, the rank watch, the
# watchdog and deadlines, the exporter, the checkpoint interval, the
# persister and the world's commit, the health command's and scontrol's
# timeouts, the GPU monitor), and a list of them goes stale as modules grow.
# LOAD_UNIT_TESTS="rundir::lock attempt::" picks some.
LOAD_UNIT_TESTS ?=
STRESS ?= --cpu $(shell nproc) --io 1 --vm 1 --vm-bytes 256M --timeout 2h
test-under-load:
	@command -v stress-ng >/dev/null || { apt-get update && apt-get install -y stress-ng; }
	$(CARGO) build --examples $(FEATURES)
	$(CARGO) test --no-run --lib --test it --test failpoints $(FEATURES)
	@rm -f $(SKIPS)
	@echo "test-under-load: stress-ng $(STRESS)"
	@echo "test-under-load: beside it: cargo test --test it $(FEATURES) -- $(LOAD_TESTS)"
	@echo "test-under-load:        and: cargo test --test failpoints $(FEATURES) -- $(LOAD_FAILPOINT_TESTS)"
	@echo "test-under-load:        and: cargo test --lib $(FEATURES) -- $(LOAD_UNIT_TESTS)"
	@stress-ng $(STRESS) --quiet & hog=$$!; \
	trap 'kill $$hog 2>/dev/null; wait $$hog 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	t0=$$(date +%s); \
	$(CARGO) test --test it $(FEATURES) -- $(LOAD_TESTS) && \
	$(CARGO) test --test failpoints $(FEATURES) -- $(LOAD_FAILPOINT_TESTS) && \
	$(CARGO) test --lib $(FEATURES) -- $(LOAD_UNIT_TESTS) && \
	$(CARGO) test --workspace --exclude rekindle --lib -- $(LOAD_UNIT_TESTS); rc=$$?; \
	echo "test-under-load: $$([ $$rc = 0 ] && echo passed || echo FAILED) in $$(( $$(date +%s) - t0 )) s beside stress-ng $(STRESS)"; \
	$(MAKE) -s skip-summary; exit $$rc

## fuzz: the fuzz tests of every reader (crates/fuzz/src/lib.rs) with many more cases
## than `make test` runs (64 each, from a fixed seed) and a random seed
## (PROPTEST_RNG_SEED=N repeats one); FUZZ_CASES=N to choose, bounded by FUZZ_TIMEOUT
FUZZ_CASES ?= 5000
FUZZ_TIMEOUT ?= 1800
fuzz:
	PROPTEST_CASES=$(FUZZ_CASES) timeout $(FUZZ_TIMEOUT) $(CARGO) test --workspace --lib -- fuzz mutated_state_json

clean:
	$(CARGO) clean
	rm -rf runs

## chaos: the full chaos campaign (tests/it/chaos.rs, docs/drills.md): at least
## CHAOS_FAULTS random faults over every driver and phase, in CHAOS_SHARDS
## campaigns run side by side (seeds CHAOS_SEED, CHAOS_SEED+1, ...; most of a
## fault's time is waiting, so shards share the CPUs well); each shard's table
## goes to target/chaos/seed-<seed>.md. `make test` runs a short one (30 faults).
CHAOS_FAULTS ?= 1000
CHAOS_SHARDS ?= 3
CHAOS_SEED ?= $(shell date +%s)
chaos:
	$(CARGO) test --no-run --test it $(FEATURES)
	@mkdir -p target/chaos
	@per=$$(( ($(CHAOS_FAULTS) + $(CHAOS_SHARDS) - 1) / $(CHAOS_SHARDS) )); pids=; \
	for i in $$(seq 0 $$(( $(CHAOS_SHARDS) - 1 ))); do \
		seed=$$(( $(CHAOS_SEED) + i )); \
		echo "chaos: shard $$i: $$per faults, REKINDLE_CHAOS_SEED=$$seed (log: target/chaos/seed-$$seed.log)"; \
		REKINDLE_CHAOS_FAULTS=$$per REKINDLE_CHAOS_SEED=$$seed REKINDLE_CHAOS_REPORT=$(CURDIR)/target/chaos/seed-$$seed.md \
			$(CARGO) test --test it $(FEATURES) -- chaos:: --nocapture >target/chaos/seed-$$seed.log 2>&1 & pids="$$pids $$!"; \
	done; rc=0; for p in $$pids; do wait $$p || rc=1; done; \
	for i in $$(seq 0 $$(( $(CHAOS_SHARDS) - 1 ))); do f=target/chaos/seed-$$(( $(CHAOS_SEED) + i )); \
		if [ -s $$f.md ]; then cat $$f.md; else echo "chaos: shard $$i FAILED: see $$f.log"; tail -40 $$f.log; fi; done; \
	exit $$rc

## drill: the SLURM drills (docs/drills.md) on the local cluster, with
## the debug binary; DRILLS="term cancel" picks some. Leaves the cluster as found.
# The binary is the one the tests build (`cargo test --no-run`, with
# $(FEATURES)): the dp drills need `mpi`, and the hang and crash drills a
# failpoint of the binary, compiled in only when cargo builds tests
# (`fail/failpoints` is a dev-dependency feature). The own drill needs the
# examples.
DRILLS ?=
drill: deps
	$(CARGO) test --no-run --test it $(FEATURES)
	$(CARGO) build --examples $(FEATURES)
	@up=0; slurm/local-cluster.sh status >/dev/null 2>&1 && up=1; \
	slurm/local-cluster.sh up || exit 1; \
	eval "$$(slurm/local-cluster.sh env)"; \
	REKINDLE_BIN=$${REKINDLE_BIN:-$(CURDIR)/target/debug/rekindle} slurm/drill.sh $(DRILLS); rc=$$?; \
	[ $$up = 1 ] || slurm/local-cluster.sh down; exit $$rc
