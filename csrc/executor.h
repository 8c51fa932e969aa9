/*
 * mpicoll's schedule executor: the C interface (see executor.c).
 *
 * Read twice, like kernels.h: by the C compiler and by cffi
 * (build_executor.py strips the preprocessor lines for cdef), so it stays
 * within the C subset cffi parses. Nothing here names an MPI type: the
 * communicator arrives as the integer mpi4py's MPI._handleof() gives (an int
 * in MPICH, a pointer in Open MPI), the state keeps its MPI_Requests out of
 * sight, so the same declarations serve both libraries.
 */
#ifndef MPICOLL_EXECUTOR_H
#define MPICOLL_EXECUTOR_H
#include <stddef.h>
#include <stdint.h>

/* Step codes of a program (mpicoll/program.py writes them; one step is
 * MPICOLL_X_WIDTH int64 words, unused words are 0). A buffer operand is a
 * (region, byte offset) pair: region 0 is the call's result buffer, 1 its
 * input when out of place, 2.. the program's scratch buffers. */
enum mpicoll_step {
    MPICOLL_X_SEND = 1,        /* slot, region, offset, bytes, peer: MPI_Isend */
    MPICOLL_X_RECV = 2,        /* slot, region, offset, bytes, peer: MPI_Irecv */
    MPICOLL_X_WAIT = 3,        /* list index, k: complete the k (slot, expected bytes) pairs there */
    MPICOLL_X_REDUCE = 4,      /* dst region, offset, a region, offset, b region, offset, count */
    MPICOLL_X_REDUCE_MANY = 5, /* dst region, offset, list index, k, count: k (region, offset) sources */
    MPICOLL_X_COPY = 6,        /* dst region, offset, src region, offset, bytes */
    MPICOLL_X_SHM = 7,         /* window, list index, count, item size: a shared-memory all-reduce (below) */
    MPICOLL_X_WIDTH = 8
};

/* What a run returns. */
enum mpicoll_xstatus {
    MPICOLL_X_DONE = 0,
    MPICOLL_X_PENDING = 1,     /* nonblocking: a wait step is not complete yet; call again */
    MPICOLL_X_EMPI = -1,       /* an MPI call failed: info = {error code, step, slot, slot's error} */
    MPICOLL_X_EMISMATCH = -2,  /* a receive brought another size: info = {slot, bytes got, step} */
    MPICOLL_X_EKERNEL = -3,    /* a kernel refused its arguments: info = {kernel status, step} */
    MPICOLL_X_ESTEP = -4,      /* an unknown step code or slot: info = {step} */
    MPICOLL_X_ESHM = -5,       /* a shared-memory step failed: info = {its status (kernels.h), step} */
    MPICOLL_X_DECLINED = -6,   /* a shared-memory step's window is busy or too small: info = {step}; nothing ran */
    MPICOLL_X_EINTR = -7,      /* not the executor's: a caller's blocking run that a signal handler's
                                  exception (Ctrl-C) ended between rounds (csrc/native.c) */
    MPICOLL_X_PROBE = -1       /* the ``blocking`` argument that asks whether a run may start (below) */
};

/* A shared-memory step (MPICOLL_X_SHM) is one call of mpicoll/algorithms/
 * shm.py's one-chunk all-reduce (kernels.h mpicoll_shm_run) on the
 * window whose struct mpicoll_shm_ctl is at the step's address word, with
 * the call's signature (MPICOLL_SHM_SIG_WORDS words) at the list index,
 * over count elements of item size bytes. Its flag waits are its wait
 * steps: nonblocking, each is tested once; blocking, each waits for at
 * most one round (mpicoll_x_set_shm) and the run returns PENDING when the
 * round ran out, so that a blocking caller runs signal handlers (Ctrl-C)
 * and runs it on, blocking again (a peer late, dead or absent: a run with
 * a deadline stays in Python, which has the schedule's rounds). Such
 * a step is its program's only step. A run may start only while the
 * window takes it (mpicoll_shm_ready): a run with blocking =
 * MPICOLL_X_PROBE runs nothing and says so (DONE, or DECLINED), and the
 * callers ask first, before they number the call. */

/* One run's progress: its position in the program and its requests. A
 * program run by two requests at once needs two states. */
struct mpicoll_xstate;

/* The kernels this executor calls (the addresses of mpicoll_reduce and
 * mpicoll_reduce_many in mpicoll._kernels, so both paths run the same
 * code). Called once, before any run. */
void mpicoll_x_set_kernels(void *reduce, void *reduce_many);

/* The shared-memory step's functions (mpicoll_shm_run and
 * mpicoll_shm_ready of mpicoll._kernels) and its blocking waits' polls
 * before yielding, time yielding before sleeping, and round (shmwindow.py's). */
void mpicoll_x_set_shm(void *run, void *ready, int spins, int64_t yield_ns, int64_t round_ns);

/* A state for programs of at most nslots requests and k-way reductions of
 * at most maxk sources; NULL when out of memory. */
struct mpicoll_xstate *mpicoll_x_new(int nslots, int maxk);

/* Start over at step 0. Requests a failed run left active are freed
 * (MPI_Request_free: the library finishes or drops them). */
void mpicoll_x_reset(struct mpicoll_xstate *x);

/* reset, then free the state. */
void mpicoll_x_free(struct mpicoll_xstate *x);

/* Run the program from the state's position. blocking: each wait step
 * blocks in MPI_Waitall, and the call returns DONE or an error (or PENDING
 * after a shared-memory step's round, above); 0: a wait step is tested
 * once (MPI_Testall) and PENDING returned if it is not complete;
 * MPICOLL_X_PROBE: nothing runs (x may be NULL), DONE if a run may start
 * now, DECLINED if not (a shared-memory step's window). DONE leaves the
 * state at step 0, ready for the next run. Every
 * message carries tag on communicator comm; op and dtype are the kernels'
 * codes; scratch holds the program's scratch buffers (region 2 is
 * scratch[0]). info receives four words on an error. */
int mpicoll_x_run(struct mpicoll_xstate *x, const int64_t *steps, int64_t nsteps, const int64_t *lists,
                  char *buf, char *src, char **scratch, int op, int dtype, intptr_t comm, int tag,
                  int blocking, int64_t *info);

/* The step the state is at (for error messages). */
int64_t mpicoll_x_position(const struct mpicoll_xstate *x);

/* How far the run has come: grows with every step done and every sync a
 * shared-memory step passed (the engine's progress test: a pass that
 * moved it made progress). */
int64_t mpicoll_x_mark(const struct mpicoll_xstate *x);

#endif
