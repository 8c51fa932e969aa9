/*
 * Flag synchronisation for the shared-memory all-reduce (mpicoll/algorithms/shm.py).
 *
 * Each rank of a node owns one int64 counter in the shared window. To pass
 * a sync point, a rank stores the sync's number in its counter (release: its
 * earlier writes to the window become visible first) and waits until every
 * counter has reached that number (acquire: its later reads see the peers'
 * writes). Counters only grow, so no reset is needed between syncs.
 *
 * Waiting spins briefly, then yields the core at every poll: with more ranks
 * than cores (tests run 8 ranks on 2 cores) the rank being waited for needs
 * the core that a pure spin would keep.
 */
#include <sched.h>
#include "kernels.h"

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

void mpicoll_flag_set(int64_t *flag, int64_t value)
{
    __atomic_store_n(flag, value, __ATOMIC_RELEASE);
}

void mpicoll_flag_wait(const char *base, size_t stride, int k, int64_t value, int spins)
{
    for (int r = 0; r < k; r++) {
        const int64_t *f = (const int64_t *)(base + (size_t)r * stride);
        int n = 0;
        while (__atomic_load_n(f, __ATOMIC_ACQUIRE) < value) {
            if (++n > spins)
                sched_yield();
            else
                cpu_relax();
        }
    }
}
