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
