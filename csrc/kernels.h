/*
 * mpicoll element-wise kernels: the public C interface.
 *
 * This header is read twice: by the C compiler, and by cffi (build_kernels.py
 * strips the preprocessor lines and hands the rest to ffibuilder.cdef), so it
 * must stay within the C subset cffi parses: no macros in declarations,
 * enums with explicit values.
 *
 * Nothing here knows about MPI. Every function takes element counts as size_t
 * and touches exactly n elements of each buffer it is given; the Python
 * wrappers in mpicoll/kernels.py check that each buffer is that long.
 * Buffers must be aligned to their element size (a misaligned access through
 * a typed pointer is undefined behaviour in C, and numpy views can start at
 * any byte): the functions returning a status refuse misaligned buffers with
 * MPICOLL_EALIGN, before touching anything.
 */
#ifndef MPICOLL_KERNELS_H
#define MPICOLL_KERNELS_H
#include <stddef.h>
#include <stdint.h>

/* Element types. float16 is IEEE binary16; bfloat16 is the top half of an
 * IEEE binary32. Both are reduced through float32 (see reduce.c). */
enum mpicoll_dtype {
    MPICOLL_INT8 = 0, MPICOLL_INT16 = 1, MPICOLL_INT32 = 2, MPICOLL_INT64 = 3,
    MPICOLL_UINT8 = 4, MPICOLL_UINT16 = 5, MPICOLL_UINT32 = 6, MPICOLL_UINT64 = 7,
    MPICOLL_FLOAT16 = 8, MPICOLL_BFLOAT16 = 9, MPICOLL_FLOAT32 = 10, MPICOLL_FLOAT64 = 11,
    MPICOLL_NDTYPES = 12
};

/* Reduction operators. The bitwise and logical ones exist for integers only. */
enum mpicoll_op {
    MPICOLL_SUM = 0, MPICOLL_PROD = 1, MPICOLL_MIN = 2, MPICOLL_MAX = 3,
    MPICOLL_BAND = 4, MPICOLL_BOR = 5, MPICOLL_BXOR = 6,
    MPICOLL_LAND = 7, MPICOLL_LOR = 8, MPICOLL_LXOR = 9,
    MPICOLL_NOPS = 10
};

enum mpicoll_status {
    MPICOLL_OK = 0,
    MPICOLL_EDTYPE = -1,      /* dtype code out of range */
    MPICOLL_EOP = -2,         /* op code out of range */
    MPICOLL_EOPDTYPE = -3,    /* op not defined for this dtype (band on float) */
    MPICOLL_EARG = -4,        /* bad argument (k < 1, non-float dtype for scale) */
    MPICOLL_EALIGN = -5       /* a buffer's address is not a multiple of the element size */
};

/* dst[i] = a[i] OP b[i] for i < n.  dst may be the same pointer as a or b
 * (in-place use); partial overlap is not allowed.  For min/max, a NaN in
 * either operand gives NaN and ties pick a (the sign of a -0.0/+0.0 tie is
 * the one place numpy may differ: it leaves that unspecified), as numpy's
 * np.minimum(a, b)/np.maximum(a, b); integer sum and prod wrap. */
int mpicoll_reduce(int op, int dtype, void *dst, const void *a, const void *b, size_t n);

/* dst[i] = ((srcs[0][i] OP srcs[1][i]) OP srcs[2][i]) ... OP srcs[k-1][i]:
 * k inputs reduced in the given order in one pass over memory.  dst may be
 * srcs[0] but no other source. */
int mpicoll_reduce_many(int op, int dtype, void *dst, const void *const *srcs, int k, size_t n);

/* buf[i] = buf[i] / divisor for floating dtypes (the "avg" op). */
int mpicoll_scale(int dtype, void *buf, size_t n, double divisor);

/* Conversions used by 16-bit reductions and by wire compression.
 * float32 -> 16 bit rounds to nearest even; NaN stays NaN. */
void mpicoll_f32_to_f16(uint16_t *dst, const float *src, size_t n);
void mpicoll_f16_to_f32(float *dst, const uint16_t *src, size_t n);
void mpicoll_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
void mpicoll_bf16_to_f32(float *dst, const uint16_t *src, size_t n);

/* Shared-memory sync flags (shmsync.c), every access atomic: set this rank's
 * counter (release store); test whether each of k counters, stride bytes
 * apart from base, is at least value (acquire loads; 1 if so); wait for
 * that (spin `spins` polls, then yield until yield_ns have passed, then
 * sleep with back-off) for at most budget_ns: 1 when every counter reached
 * value, 0 when the budget ran out (the caller checks signals and its
 * deadline and waits again). */
void mpicoll_flag_set(int64_t *flag, int64_t value);
int mpicoll_flag_test(const char *base, size_t stride, int k, int64_t value);
int mpicoll_flag_wait(const char *base, size_t stride, int k, int64_t value, int spins,
                      int64_t yield_ns, int64_t budget_ns);

/* One blocking shared-memory all-reduce of a message that fits one slot
 * (mpicoll/algorithms/shm.py, steps 1-5 of one chunk, with the same syncs,
 * signature words and slices as the schedule, so that ranks running this
 * and ranks running the schedule meet), resumable at its two syncs:
 *   stage 0: copy the input into this rank's slot (every slice but its
 *            own), write the call's signature (sig_words words at word
 *            sig_at of this rank's flag slot), store sync number epoch;
 *   stage 1: wait for every rank to reach epoch; compare every rank's
 *            signature with sig; reduce this rank's slice from every
 *            rank's slot (its own input for its own slice) in rank order
 *            into its slot; store epoch + 1;
 *   stage 2: wait for every rank to reach epoch + 1; copy every rank's
 *            reduced slice from its slot into buf.
 * slots[q] is rank q's slot of this call's turn; the n elements are split
 * into k slices as np.array_split does; own is the input (buf when in
 * place); srcs has room for k pointers. Each wait spins, yields, sleeps
 * as mpicoll_flag_wait for at most budget_ns (0: test once); returns the
 * stage to resume at (1 or 2) when that ran out, 0 when the call is complete,
 * MPICOLL_SHM_EMISMATCH when the signatures differ (nothing reduced, no
 * second sync), or a kernel status (< 0) from the reduction. */
enum mpicoll_shm_status { MPICOLL_SHM_EMISMATCH = -100, MPICOLL_SHM_SIG_WORDS = 4 };
int mpicoll_shm_allreduce(char *const *slots, int k, int me, char *buf, const char *own, int64_t n,
                          size_t itemsize, int op, int dtype, char *flags, size_t stride, int64_t epoch,
                          const int64_t *sig, int sig_at, int sig_words, int stage, int spins,
                          int64_t yield_ns, int64_t budget_ns, const void **srcs);

/* A communicator's shared-memory window ("flags" syncs) as C runs it:
 * the counters the shm schedule keeps (mpicoll/shmwindow.py reads and
 * writes them here, so that calls in C and calls of the schedule take
 * turns on one window) and where the window is. One per communicator
 * state, made before its first window and kept across the window's
 * replacements (a bigger one); the window fills in slot_bytes and the
 * pointers when it is made and sets slot_bytes to 0 when it is freed.
 *   turn, epoch, checks: the slot the next call uses, the sync points
 *       passed, the signature checks passed (the same on every rank);
 *   queued: calls of the schedule queued on the window (shm.py's queue),
 *       running: calls in C started and not finished - a call in C starts
 *       only when both are 0, and a queued schedule call waits for
 *       running to be 0 (calls run in the order they were started);
 *   slots0/slots1: every rank's slot of turn 0/1; srcs: room for k
 *       pointers; flags: the k counters, stride bytes apart. */
struct mpicoll_shm_ctl { /* (running: see mpicoll_shm_running) */
    int64_t turn, epoch, checks, slot_bytes, queued, running;
    int k, me;
    char *flags;
    size_t stride;
    char **slots0, **slots1;
    const void **srcs;
};

/* Whether a call of nbytes (> 0) may run in C now: a window with slots of
 * at least nbytes, nothing queued or running on it (1), or not (0). */
int mpicoll_shm_ready(const struct mpicoll_shm_ctl *c, int64_t nbytes);

/* c->running, loaded with acquire (a run's end stores it last, with
 * release, after the counters: the engine's progress thread may end a run
 * while another thread reads them). */
int64_t mpicoll_shm_running(const struct mpicoll_shm_ctl *c);

/* mpicoll_shm_allreduce on the window of c, keeping its counters as the
 * schedule does: *stage 0 starts a call (after mpicoll_shm_ready: the
 * signature check's number, the first sync's number, running), a later
 * one resumes it. Returns as mpicoll_shm_allreduce; at its end (0 or an
 * error) *stage is 0 and running is down again; the turn changes unless
 * the signatures differed (every rank then stays on the slot), the sync
 * count moves past the call's second sync when it completed. */
int mpicoll_shm_run(struct mpicoll_shm_ctl *c, const int64_t *sig, char *buf, const char *own, int64_t n,
                    size_t itemsize, int op, int dtype, int *stage, int spins, int64_t yield_ns, int64_t budget_ns);

/* The instruction set the run-time dispatch chose for 16-bit conversions:
 * "avx512f", "f16c" or "generic". */
const char *mpicoll_isa(void);

/* Wire compression (compress.c): float32 accumulation of 16-bit partials.
 * dst[i] = round16(a[i] / divisor + widen16(b[i])), the sum in float32 and
 * rounded once; b may be NULL (then dst = round16(a / divisor)). Every
 * buffer must be aligned to its element size (no status to refuse one:
 * the callers in mpicoll/compression.py check it). */
void mpicoll_accumulate_round_f16(uint16_t *dst, const float *a, float divisor, const uint16_t *b, size_t n);
void mpicoll_accumulate_round_bf16(uint16_t *dst, const float *a, float divisor, const uint16_t *b, size_t n);
/* acc[i] += widen16(in[i]), in float32. */
void mpicoll_accumulate_f16(float *acc, const uint16_t *in, size_t n);
void mpicoll_accumulate_bf16(float *acc, const uint16_t *in, size_t n);

#endif
