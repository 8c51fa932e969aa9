/*
 * Flag synchronisation for the shared-memory all-reduce (mpicoll/algorithms/shm.py).
 *
 * Each rank of a node owns one int64 counter in the shared window. To pass
 * a sync point, a rank stores the sync's number in its counter (release: its
 * earlier writes to the window become visible first) and waits until every
 * counter has reached that number (acquire: its later reads see the peers'
 * writes). Counters only grow, so no reset is needed between syncs. Every
 * access to a counter is an __atomic load or store with that ordering, the
 * nonblocking test's included: a plain load would let a weakly ordered CPU
 * (AArch64, POWER) read the window's data before the counter that
 * published it.
 *
 * A wait is bounded: it returns "not yet" (0) after budget_ns, so the
 * caller (in Python, with the GIL back) can run signal handlers (Ctrl-C)
 * and check its deadline before waiting again; a dead peer never holds a
 * rank in C. While it waits it backs off in three stages, because the rank
 * it waits for may need this core (tests run 8 ranks on 2 cores):
 *   1. `spins` polls with the CPU's pause hint (a peer a few hundred
 *      nanoseconds behind);
 *   2. sched_yield at each poll until yield_ns have passed (a peer that
 *      is runnable: it gets the core at once);
 *   3. sleeps growing from SLEEP_MIN_NS to SLEEP_MAX_NS (a peer that is
 *      late by more than a scheduler slice: polling faster would not
 *      hurry it, and a yielding spinner still costs a core on an idle one).
 */
#include <sched.h>
#include <string.h>
#include <time.h>
#include "kernels.h"

#define SLEEP_MIN_NS 20000L
#define SLEEP_MAX_NS 1000000L

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

void mpicoll_flag_set(int64_t *flag, int64_t value)
{
    __atomic_store_n(flag, value, __ATOMIC_RELEASE);
}

/* The first of the k counters below value, from rank `from` on; k if none. */
static int first_behind(const char *base, size_t stride, int k, int64_t value, int from)
{
    for (int r = from; r < k; r++)
        if (__atomic_load_n((const int64_t *)(base + (size_t)r * stride), __ATOMIC_ACQUIRE) < value)
            return r;
    return k;
}

int mpicoll_flag_test(const char *base, size_t stride, int k, int64_t value)
{
    return first_behind(base, stride, k, value, 0) == k;
}

int mpicoll_flag_wait(const char *base, size_t stride, int k, int64_t value, int spins,
                      int64_t yield_ns, int64_t budget_ns)
{
    int r = first_behind(base, stride, k, value, 0);
    if (r == k)
        return 1;
    const int64_t start = now_ns();
    long pause = SLEEP_MIN_NS;
    for (int n = 0;; n++) {
        if (n < spins) {
            cpu_relax();
        } else {
            const int64_t waited = now_ns() - start;
            if (waited >= budget_ns)
                return 0;
            if (waited < yield_ns) {
                sched_yield();
            } else {
                long left = (long)(budget_ns - waited);
                struct timespec ts = {0, pause < left ? pause : left};
                nanosleep(&ts, NULL);
                pause = pause * 2 < SLEEP_MAX_NS ? pause * 2 : SLEEP_MAX_NS;
            }
        }
        /* Counters only grow: the ranks already seen at value stay there. */
        r = first_behind(base, stride, k, value, r);
        if (r == k)
            return 1;
    }
}

/* Element offset of slice i of n elements in k slices (np.array_split: the
 * first n % k slices hold one element more), as block_bounds in Python. */
static int64_t slice_start(int64_t n, int k, int i)
{
    const int64_t q = n / k, r = n % k;
    return i * q + (i < r ? i : r);
}

int mpicoll_shm_allreduce(char *const *slots, int k, int me, char *buf, const char *own, int64_t n,
                          size_t itemsize, int op, int dtype, char *flags, size_t stride, int64_t epoch,
                          const int64_t *sig, int sig_at, int sig_words, int stage, int spins,
                          int64_t yield_ns, int64_t budget_ns, const void **srcs)
{
    const size_t a = (size_t)slice_start(n, k, me), b = (size_t)slice_start(n, k, me + 1);
    char *mine = slots[me];
    int64_t *my_flag = (int64_t *)(flags + (size_t)me * stride);
    if (stage == 0) {
        /* This rank's own slice stays private: only it reads that part. */
        memcpy(mine, own, a * itemsize);
        memcpy(mine + b * itemsize, own + b * itemsize, ((size_t)n - b) * itemsize);
        /* Plain stores: the release store of the counter publishes them. */
        for (int i = 0; i < sig_words; i++)
            my_flag[sig_at + i] = sig[i];
        mpicoll_flag_set(my_flag, epoch);
        stage = 1;
    }
    if (stage == 1) {
        /* Every stage starts by waiting for its sync (again, when a call
         * comes back after the budget ran out): its acquire loads make the
         * peers' signatures and slots visible. */
        if (!mpicoll_flag_wait(flags, stride, k, epoch, spins, yield_ns, budget_ns))
            return 1;
        for (int q = 0; q < k; q++) {
            const int64_t *theirs = (const int64_t *)(flags + (size_t)q * stride) + sig_at;
            for (int i = 0; i < sig_words; i++)
                if (theirs[i] != sig[i])
                    return MPICOLL_SHM_EMISMATCH;
        }
        if (b > a) {
            for (int q = 0; q < k; q++)
                srcs[q] = (q == me ? own : slots[q]) + a * itemsize;
            const int rc = mpicoll_reduce_many(op, dtype, mine + a * itemsize, srcs, k, b - a);
            if (rc)
                return rc;
        }
        mpicoll_flag_set(my_flag, epoch + 1);
        stage = 2;
    }
    if (!mpicoll_flag_wait(flags, stride, k, epoch + 1, spins, yield_ns, budget_ns))
        return 2;
    for (int q = 0; q < k; q++) {
        const size_t qa = (size_t)slice_start(n, k, q), qb = (size_t)slice_start(n, k, q + 1);
        memcpy(buf + qa * itemsize, slots[q] + qa * itemsize, (qb - qa) * itemsize);
    }
    return 0;
}

/* ``running`` is the one field a thread without the GIL writes while
 * another may read it (the engine's progress thread ends a run while the
 * caller's thread starts the next call): the end of a run stores it last,
 * with release, after the turn and the sync count; readers load it with
 * acquire, so a reader that sees it at 0 sees them too. */
int64_t mpicoll_shm_running(const struct mpicoll_shm_ctl *c)
{
    return __atomic_load_n(&c->running, __ATOMIC_ACQUIRE);
}

int mpicoll_shm_ready(const struct mpicoll_shm_ctl *c, int64_t nbytes)
{
    return nbytes > 0 && mpicoll_shm_running(c) == 0 && c->slot_bytes >= nbytes && c->queued == 0;
}

int mpicoll_shm_run(struct mpicoll_shm_ctl *c, const int64_t *sig, char *buf, const char *own, int64_t n,
                    size_t itemsize, int op, int dtype, int *stage, int spins, int64_t yield_ns, int64_t budget_ns)
{
    if (*stage == 0) {
        /* (ShmWindow.publish's and the first sync's numbers, as the schedule takes them) */
        c->checks += 1;
        c->epoch += 1;
        __atomic_store_n(&c->running, c->running + 1, __ATOMIC_RELAXED);
    }
    const int64_t first = c->epoch;
    const int sig_at = 1 + (int)(c->checks & 1) * MPICOLL_SHM_SIG_WORDS;
    const int rc = mpicoll_shm_allreduce(c->turn ? c->slots1 : c->slots0, c->k, c->me, buf, own, n, itemsize, op,
                                         dtype, c->flags, c->stride, first, sig, sig_at, MPICOLL_SHM_SIG_WORDS,
                                         *stage, spins, yield_ns, budget_ns, c->srcs);
    if (rc > 0) {
        *stage = rc;
        return rc;
    }
    *stage = 0;
    if (rc != MPICOLL_SHM_EMISMATCH) { /* (a mismatch: every rank stays on this slot, past the first sync only) */
        c->turn ^= 1;
        if (rc == 0)
            c->epoch = first + 1;
    }
    __atomic_store_n(&c->running, c->running - 1, __ATOMIC_RELEASE); /* (last: see mpicoll_shm_running) */
    return rc;
}
