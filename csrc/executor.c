/*
 * mpicoll's schedule executor: runs a compiled schedule without Python.
 *
 * A schedule (in mpicoll/algorithms/) is a generator; for algorithms whose
 * messages do not depend on the data, mpicoll/program.py records it once per
 * kept plan into a flat program of steps (executor.h): sends and receives
 * posted with MPI_Isend/MPI_Irecv into request slots, waits that complete a
 * list of slots, and the reductions and copies between them. This file runs
 * such a program. It is the same sequence of MPI calls and kernel calls the
 * generator's blocking driver makes (schedule.run), in the same order, so
 * the two give the same bits; what it removes is the Python between them
 * (a generator resume, Op objects, mpi4py's argument parsing per message).
 *
 * It is called through cffi, which releases the GIL for the call: other
 * Python threads run while a blocking run waits in MPI_Waitall. That needs
 * MPI_THREAD_MULTIPLE when other threads call MPI (mpicoll's progress
 * thread does; it only starts when the library provides that level).
 *
 * Bounds: every (region, offset, bytes) was computed by the recorder from
 * arrays inside the region, for buffers of the kept plan's exact size, and
 * the Python side passes only buffers of that size (the kept plan's
 * signature); this file trusts them and checks only slot numbers.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "executor.h"

typedef int (*reduce_fn)(int, int, void *, const void *, const void *, size_t);
typedef int (*reduce_many_fn)(int, int, void *, const void *const *, int, size_t);

static reduce_fn kernel_reduce;
static reduce_many_fn kernel_reduce_many;

void mpicoll_x_set_kernels(void *reduce, void *reduce_many)
{
    kernel_reduce = (reduce_fn)reduce;
    kernel_reduce_many = (reduce_many_fn)reduce_many;
}

/* kernels.h's (the executor sees the window only through these) */
struct mpicoll_shm_ctl;
typedef int (*shm_run_fn)(struct mpicoll_shm_ctl *, const int64_t *, char *, const char *, int64_t, size_t, int, int,
                          int *, int, int64_t, int64_t);
typedef int (*shm_ready_fn)(const struct mpicoll_shm_ctl *, int64_t);

static shm_run_fn shm_run;
static shm_ready_fn shm_ready;
static int shm_spins;
static int64_t shm_yield_ns, shm_round_ns;

void mpicoll_x_set_shm(void *run, void *ready, int spins, int64_t yield_ns, int64_t round_ns)
{
    shm_run = (shm_run_fn)run;
    shm_ready = (shm_ready_fn)ready;
    shm_spins = spins;
    shm_yield_ns = yield_ns;
    shm_round_ns = round_ns;
}

struct mpicoll_xstate {
    int64_t pc;            /* the next step to run (a pending wait step stays current) */
    int shm_stage;         /* a shared-memory step's: 0 not started, else the sync it waits at */
    int nslots, maxk;
    MPI_Request *reqs;     /* by slot */
    MPI_Request *batch;    /* one wait step's requests, in list order */
    MPI_Status *stats;     /* their statuses */
    const void **srcs;     /* one k-way reduction's sources */
};

struct mpicoll_xstate *mpicoll_x_new(int nslots, int maxk)
{
    struct mpicoll_xstate *x = calloc(1, sizeof *x);
    if (x == NULL)
        return NULL;
    if (nslots < 1)
        nslots = 1;
    if (maxk < 1)
        maxk = 1;
    x->nslots = nslots;
    x->maxk = maxk;
    x->reqs = malloc(sizeof(MPI_Request) * (size_t)nslots);
    x->batch = malloc(sizeof(MPI_Request) * (size_t)nslots);
    x->stats = malloc(sizeof(MPI_Status) * (size_t)nslots);
    x->srcs = malloc(sizeof(void *) * (size_t)maxk);
    if (!x->reqs || !x->batch || !x->stats || !x->srcs) {
        free(x->reqs), free(x->batch), free(x->stats), free(x->srcs), free(x);
        return NULL;
    }
    for (int i = 0; i < nslots; i++)
        x->reqs[i] = MPI_REQUEST_NULL;
    return x;
}

void mpicoll_x_reset(struct mpicoll_xstate *x)
{
    for (int i = 0; i < x->nslots; i++)
        if (x->reqs[i] != MPI_REQUEST_NULL)
            MPI_Request_free(&x->reqs[i]);
    x->pc = 0;
    /* (a shared-memory call left between its syncs stays counted as running
     * on its window: the node's ranks can no longer agree on it, and the
     * window's later calls wait for it, to a deadline, rather than run on
     * counters the peers do not share) */
    x->shm_stage = 0;
}

void mpicoll_x_free(struct mpicoll_xstate *x)
{
    if (x == NULL)
        return;
    mpicoll_x_reset(x);
    free(x->reqs), free(x->batch), free(x->stats), free(x->srcs), free(x);
}

int64_t mpicoll_x_position(const struct mpicoll_xstate *x)
{
    return x->pc;
}

int64_t mpicoll_x_mark(const struct mpicoll_xstate *x)
{
    return x->pc * 4 + x->shm_stage; /* (a shared-memory step's stage is 0, 1 or 2) */
}

static inline char *at(char *buf, char *src, char **scratch, int64_t region, int64_t off)
{
    char *base = region == 0 ? buf : region == 1 ? src : scratch[region - 2];
    return base + off;
}

/* One wait step: complete the k (slot, expected bytes) pairs at list;
 * expected < 0 marks a send. */
static int wait_step(struct mpicoll_xstate *x, const int64_t *list, int k, int blocking, int64_t *info)
{
    for (int i = 0; i < k; i++) {
        int64_t slot = list[2 * i];
        if (slot < 0 || slot >= x->nslots) {
            info[0] = x->pc;
            return MPICOLL_X_ESTEP;
        }
        x->batch[i] = x->reqs[slot];
    }
    int rc, flag = 1;
    if (blocking)
        rc = MPI_Waitall(k, x->batch, x->stats);
    else
        rc = MPI_Testall(k, x->batch, &flag, x->stats);
    for (int i = 0; i < k; i++)  /* completed requests came back as MPI_REQUEST_NULL */
        x->reqs[list[2 * i]] = x->batch[i];
    if (rc != MPI_SUCCESS) {
        info[0] = rc;
        info[1] = x->pc;
        info[2] = -1;
        info[3] = MPI_SUCCESS;
        if (rc == MPI_ERR_IN_STATUS) {
            for (int i = 0; i < k; i++) {
                int e = x->stats[i].MPI_ERROR;
                if (e != MPI_SUCCESS && e != MPI_ERR_PENDING) {
                    info[2] = list[2 * i];
                    info[3] = e;
                    break;
                }
            }
        }
        return MPICOLL_X_EMPI;
    }
    if (!flag)
        return MPICOLL_X_PENDING;
    for (int i = 0; i < k; i++) {
        int64_t expect = list[2 * i + 1];
        if (expect >= 0) {
            int got = 0;
            MPI_Get_count(&x->stats[i], MPI_BYTE, &got);
            if (got != expect) {
                info[0] = list[2 * i];
                info[1] = got;
                info[2] = x->pc;
                return MPICOLL_X_EMISMATCH;
            }
        }
    }
    return MPICOLL_X_DONE;
}

int mpicoll_x_run(struct mpicoll_xstate *x, const int64_t *steps, int64_t nsteps, const int64_t *lists,
                  char *buf, char *src, char **scratch, int op, int dtype, intptr_t comm_handle, int tag,
                  int blocking, int64_t *info)
{
    /* mpi4py's handle is the MPI_Comm itself, as an integer: an int in
     * MPICH's ABI, a pointer in Open MPI's. */
    MPI_Comm comm = (MPI_Comm)comm_handle;
    if (blocking == MPICOLL_X_PROBE) {
        const struct mpicoll_shm_ctl *c = nsteps > 0 && steps[0] == MPICOLL_X_SHM
                                              ? (const struct mpicoll_shm_ctl *)(intptr_t)steps[1]
                                              : NULL;
        if (c != NULL && (shm_ready == NULL || !shm_ready(c, steps[3] * steps[4])))
            return MPICOLL_X_DECLINED;
        return MPICOLL_X_DONE;
    }
    for (; x->pc < nsteps; x->pc++) {
        const int64_t *s = steps + x->pc * MPICOLL_X_WIDTH;
        int rc = MPI_SUCCESS;
        switch (s[0]) {
        case MPICOLL_X_SEND:
        case MPICOLL_X_RECV:
            if (s[1] < 0 || s[1] >= x->nslots) {
                info[0] = x->pc;
                return MPICOLL_X_ESTEP;
            }
            if (s[0] == MPICOLL_X_SEND)
                rc = MPI_Isend(at(buf, src, scratch, s[2], s[3]), (int)s[4], MPI_BYTE, (int)s[5], tag, comm,
                               &x->reqs[s[1]]);
            else
                rc = MPI_Irecv(at(buf, src, scratch, s[2], s[3]), (int)s[4], MPI_BYTE, (int)s[5], tag, comm,
                               &x->reqs[s[1]]);
            if (rc != MPI_SUCCESS) {
                info[0] = rc, info[1] = x->pc, info[2] = s[1], info[3] = rc;
                return MPICOLL_X_EMPI;
            }
            break;
        case MPICOLL_X_WAIT: {
            rc = wait_step(x, lists + s[1], (int)s[2], blocking, info);
            if (rc != MPICOLL_X_DONE)
                return rc;
            break;
        }
        case MPICOLL_X_REDUCE:
            rc = kernel_reduce(op, dtype, at(buf, src, scratch, s[1], s[2]), at(buf, src, scratch, s[3], s[4]),
                               at(buf, src, scratch, s[5], s[6]), (size_t)s[7]);
            if (rc != 0) {
                info[0] = rc, info[1] = x->pc;
                return MPICOLL_X_EKERNEL;
            }
            break;
        case MPICOLL_X_REDUCE_MANY: {
            int k = (int)s[4];
            const int64_t *list = lists + s[3];
            if (k > x->maxk) {
                info[0] = x->pc;
                return MPICOLL_X_ESTEP;
            }
            for (int i = 0; i < k; i++)
                x->srcs[i] = at(buf, src, scratch, list[2 * i], list[2 * i + 1]);
            rc = kernel_reduce_many(op, dtype, at(buf, src, scratch, s[1], s[2]), x->srcs, k, (size_t)s[5]);
            if (rc != 0) {
                info[0] = rc, info[1] = x->pc;
                return MPICOLL_X_EKERNEL;
            }
            break;
        }
        case MPICOLL_X_COPY:
            /* memmove: a recorded copy may be a no-op onto itself */
            memmove(at(buf, src, scratch, s[1], s[2]), at(buf, src, scratch, s[3], s[4]), (size_t)s[5]);
            break;
        case MPICOLL_X_SHM: {
            struct mpicoll_shm_ctl *c = (struct mpicoll_shm_ctl *)(intptr_t)s[1];
            if (x->shm_stage == 0 && (shm_run == NULL || !shm_ready(c, s[3] * s[4]))) {
                info[0] = x->pc;
                return MPICOLL_X_DECLINED;
            }
            /* (blocking: each round spins, yields, then sleeps - also the
             * first blocking round of a run a nonblocking pass started) */
            rc = shm_run(c, lists + s[2], buf, src != NULL ? src : buf, s[3], (size_t)s[4], op, dtype,
                         &x->shm_stage, blocking ? shm_spins : 0, blocking ? shm_yield_ns : 0,
                         blocking ? shm_round_ns : 0);
            if (rc > 0)
                return MPICOLL_X_PENDING; /* blocking: a round ran out (the caller runs signal handlers) */
            if (rc < 0) {
                info[0] = rc, info[1] = x->pc;
                return MPICOLL_X_ESHM;
            }
            break;
        }
        default:
            info[0] = x->pc;
            return MPICOLL_X_ESTEP;
        }
    }
    x->pc = 0;  /* done: the state is ready for the program's next run */
    return MPICOLL_X_DONE;
}
