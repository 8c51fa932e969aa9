/*
 * Wire compression kernels: float32 partial sums that travel as 16 bits.
 *
 * A compressed all-reduce keeps every rank's own contribution in float32 and
 * sends partial sums as float16 or bfloat16.  At each reduction step a rank
 * widens the 16-bit partial it received, adds it to its own float32 values
 * in float32, and rounds the float32 sum once, to 16 bits, for sending on:
 *
 *     dst[i] = round16(a[i] / divisor + widen16(b[i]))
 *
 * so the accumulation is float32 at every step and the only roundings are
 * the ones the wire format forces.  ``divisor`` folds the optional
 * pre-division by the world size (against float16 overflow) into the same
 * pass; with b == NULL the kernel is the first send, round16(a / divisor).
 *
 * The loop works on blocks of 1024 elements with the dispatched conversions
 * of cast.c (F16C / AVX-512 where the CPU has them), as reduce.c does for
 * 16-bit reductions: the float32 temporary stays in L1 between the passes.
 *
 * Every buffer is aligned to its element size: the loops load through
 * typed pointers (float, uint16_t), and a misaligned one is undefined
 * behaviour that UBSan reports. mpicoll/compression.py refuses misaligned
 * buffers before calling, and its schedule copies users' float32 views at
 * a byte offset into aligned scratch first.
 */
#include "kernels.h"
#include "simd.h"

#define ACC_BLOCK 1024

typedef void (*to32_fn)(float *, const uint16_t *, size_t);
typedef void (*from32_fn)(uint16_t *, const float *, size_t);

/* t = a / divisor + t.  A division, not a multiplication by 1/divisor:
 * GCC may contract a*s + t into an FMA in some clones and not others, which
 * would make the bits depend on the CPU; a quotient is never contracted, is
 * correctly rounded (numpy's x / p), and is exact for divisor 1. */
MPICOLL_CLONES
static void add_quotient_f32(float *restrict t, const float *restrict a, float divisor, size_t n)
{
    MPICOLL_IVDEP MPICOLL_UNROLL
    for (size_t i = 0; i < n; i++)
        t[i] = a[i] / divisor + t[i];
}

MPICOLL_CLONES
static void add_f32(float *restrict acc, const float *restrict t, size_t n)
{
    MPICOLL_IVDEP MPICOLL_UNROLL
    for (size_t i = 0; i < n; i++)
        acc[i] += t[i];
}

static void accumulate_round(to32_fn to32, from32_fn from32, uint16_t *dst,
                             const float *a, float divisor, const uint16_t *b, size_t n)
{
    float t[ACC_BLOCK] __attribute__((aligned(64)));
    if (!b && divisor == 1.0f) {        /* first send, no pre-division: a plain conversion */
        from32(dst, a, n);
        return;
    }
    for (size_t i = 0; i < n; i += ACC_BLOCK) {
        size_t m = n - i < ACC_BLOCK ? n - i : ACC_BLOCK;
        if (b)
            to32(t, b + i, m);
        else
            for (size_t j = 0; j < m; j++) t[j] = 0.0f;
        if (divisor == 1.0f)
            add_f32(t, a + i, m);       /* a / 1 is a: skip the division */
        else
            add_quotient_f32(t, a + i, divisor, m);
        from32(dst + i, t, m);
    }
}

void mpicoll_accumulate_round_f16(uint16_t *dst, const float *a, float divisor, const uint16_t *b, size_t n)
{
    accumulate_round(mpicoll_f16_to_f32, mpicoll_f32_to_f16, dst, a, divisor, b, n);
}

void mpicoll_accumulate_round_bf16(uint16_t *dst, const float *a, float divisor, const uint16_t *b, size_t n)
{
    accumulate_round(mpicoll_bf16_to_f32, mpicoll_f32_to_bf16, dst, a, divisor, b, n);
}

/* acc[i] += widen16(in[i]): float32 accumulation of 16-bit inputs. */
static void accumulate(to32_fn to32, float *acc, const uint16_t *in, size_t n)
{
    float t[ACC_BLOCK] __attribute__((aligned(64)));
    for (size_t i = 0; i < n; i += ACC_BLOCK) {
        size_t m = n - i < ACC_BLOCK ? n - i : ACC_BLOCK;
        to32(t, in + i, m);
        add_f32(acc + i, t, m);
    }
}

void mpicoll_accumulate_f16(float *acc, const uint16_t *in, size_t n)
{
    accumulate(mpicoll_f16_to_f32, acc, in, n);
}

void mpicoll_accumulate_bf16(float *acc, const uint16_t *in, size_t n)
{
    accumulate(mpicoll_bf16_to_f32, acc, in, n);
}
