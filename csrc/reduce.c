/*
 * Element-wise reduction kernels: dst = a OP b, k-way reduction, and the
 * scale used by "avg".
 *
 * One table maps (op, dtype) to a type-erased function with the signature
 * of mpicoll_binop_fn (the shape gloo uses: fn(dst, a, b, n)).  The loops
 * are stamped out by macros, one per (op, type), and each is compiled for
 * several instruction-set levels (MPICOLL_CLONES).  A NULL table entry is
 * an op the dtype does not have (bitwise and logical ops on floats).
 *
 * Semantics, chosen to match numpy so tests can compare bit for bit:
 *  - integer sum and prod wrap modulo 2^bits (computed in unsigned
 *    arithmetic, so there is no undefined signed overflow);
 *  - min/max on floats: NaN in either operand gives that NaN, as
 *    np.minimum/np.maximum do; and the result's bits do not depend on the
 *    operand order, so every rank gets the same bits whatever order an
 *    algorithm (or the MPI library, running this kernel as a commutative
 *    user op) combines them in: min(-0.0, +0.0) is -0.0 and max is +0.0
 *    (IEEE 754-2019 minimum/maximum), and two NaNs give the bitwise OR of
 *    both (a NaN, and the same either way round). numpy leaves those two
 *    ties unspecified, so the values match numpy and the bits match across
 *    ranks;
 *  - logical ops give 1 or 0 in the operand type, as MPI_LAND etc.;
 *  - float16 and bfloat16 widen to float32, apply the op, round back to
 *    nearest even: bit-identical to numpy's float16 arithmetic.
 */
#include <string.h>
#include "kernels.h"
#include "simd.h"

/* The scalar head runs until dst sits on a 64-byte boundary: numpy's large
 * arrays start 16 bytes past a page, and 64-byte vector stores that straddle
 * two cache lines cost about 20% of the loop's throughput here. */
#define BINOP(NAME, T, EXPR)                                                  \
    MPICOLL_CLONES                                                            \
    static void NAME(void *dst_, const void *a_, const void *b_, size_t n)    \
    {                                                                         \
        T *dst = (T *)dst_;                                                   \
        const T *a = (const T *)a_, *b = (const T *)b_;                       \
        size_t head = ((64 - ((uintptr_t)dst & 63)) & 63) / sizeof(T);        \
        size_t i = 0;                                                         \
        if (head > n) head = n;                                               \
        for (; i < head; i++) {                                               \
            T x = a[i], y = b[i];                                             \
            dst[i] = (T)(EXPR);                                               \
        }                                                                     \
        MPICOLL_IVDEP MPICOLL_UNROLL                                          \
        for (; i < n; i++) {                                                  \
            T x = a[i], y = b[i];                                             \
            dst[i] = (T)(EXPR);                                               \
        }                                                                     \
    }

/* W: the unsigned type the arithmetic is done in (at least unsigned int,
 * so narrow types do not promote to signed int and overflow). */
#define INT_KERNELS(S, T, W)                                                  \
    BINOP(sum_##S, T, (W)x + (W)y)                                            \
    BINOP(prod_##S, T, (W)x * (W)y)                                           \
    BINOP(min_##S, T, x < y ? x : y)                                          \
    BINOP(max_##S, T, x > y ? x : y)                                          \
    BINOP(band_##S, T, x & y)                                                 \
    BINOP(bor_##S, T, x | y)                                                  \
    BINOP(bxor_##S, T, x ^ y)                                                 \
    BINOP(land_##S, T, (x != 0) & (y != 0))                                   \
    BINOP(lor_##S, T, (x != 0) | (y != 0))                                    \
    BINOP(lxor_##S, T, (x != 0) ^ (y != 0))

/* Float min/max done on the bits (U, the unsigned type of the float's
 * width; I, the signed one), order-independent and branch-free so the loops
 * vectorise:
 *  - a float's bits become a signed integer key that sorts like the float
 *    (negative floats get their magnitude bits flipped), with -0.0 just below
 *    +0.0; two keys are equal only for equal bits, so the smaller key is
 *    IEEE 754-2019's minimum whatever the operand order;
 *  - a NaN (magnitude above infinity's) overrides that: the one NaN, or the
 *    OR of two (still a NaN, the same either way round).
 * MAG is the mask of everything but the sign bit, INF infinity's bits. */
#define FLOAT_MINMAX(NAME, U, I, MAG, INF, WINS)                              \
    static inline __attribute__((always_inline)) U NAME(U x, U y)             \
    {                                                                         \
        I kx = (I)(x ^ ((U)((I)x >> (sizeof(U) * 8 - 1)) & (MAG)));           \
        I ky = (I)(y ^ ((U)((I)y >> (sizeof(U) * 8 - 1)) & (MAG)));           \
        U ordered = kx WINS ky ? x : y;                                       \
        int nx = (x & (MAG)) > (INF), ny = (y & (MAG)) > (INF);               \
        U nan = nx ? (ny ? (x | y) : x) : y;                                  \
        return (nx | ny) ? nan : ordered;                                     \
    }

FLOAT_MINMAX(fmin_bits32, uint32_t, int32_t, 0x7fffffffu, 0x7f800000u, <)
FLOAT_MINMAX(fmax_bits32, uint32_t, int32_t, 0x7fffffffu, 0x7f800000u, >)
FLOAT_MINMAX(fmin_bits64, uint64_t, int64_t, 0x7fffffffffffffffull, 0x7ff0000000000000ull, <)
FLOAT_MINMAX(fmax_bits64, uint64_t, int64_t, 0x7fffffffffffffffull, 0x7ff0000000000000ull, >)

/* min/max run over the floats' bits as U (the kernels are type-erased). */
#define FLOAT_KERNELS(S, T, U, BITS)                                          \
    BINOP(sum_##S, T, x + y)                                                  \
    BINOP(prod_##S, T, x * y)                                                 \
    BINOP(min_##S, U, fmin_bits##BITS(x, y))                                  \
    BINOP(max_##S, U, fmax_bits##BITS(x, y))

INT_KERNELS(i8, int8_t, uint32_t)
INT_KERNELS(i16, int16_t, uint32_t)
INT_KERNELS(i32, int32_t, uint32_t)
INT_KERNELS(i64, int64_t, uint64_t)
INT_KERNELS(u8, uint8_t, uint32_t)
INT_KERNELS(u16, uint16_t, uint32_t)
INT_KERNELS(u32, uint32_t, uint32_t)
INT_KERNELS(u64, uint64_t, uint64_t)
FLOAT_KERNELS(f32, float, uint32_t, 32)
FLOAT_KERNELS(f64, double, uint64_t, 64)

/* ---- 16-bit floats: widen a block to float32, apply, round back -------- */

/* 1024 elements: two float32 blocks of 4 KiB stay in L1 while the three
 * passes (widen, op, narrow) run over them. */
#define HALF_BLOCK 1024

typedef void (*to32_fn)(float *, const uint16_t *, size_t);
typedef void (*from32_fn)(uint16_t *, const float *, size_t);

static void half_binop(mpicoll_binop_fn f32op, to32_fn to32, from32_fn from32,
                       void *dst_, const void *a_, const void *b_, size_t n)
{
    uint16_t *dst = (uint16_t *)dst_;
    const uint16_t *a = (const uint16_t *)a_, *b = (const uint16_t *)b_;
    float fa[HALF_BLOCK] __attribute__((aligned(64))), fb[HALF_BLOCK] __attribute__((aligned(64)));
    for (size_t i = 0; i < n; i += HALF_BLOCK) {
        size_t m = n - i < HALF_BLOCK ? n - i : HALF_BLOCK;
        to32(fa, a + i, m);
        to32(fb, b + i, m);
        f32op(fa, fa, fb, m);
        from32(dst + i, fa, m);
    }
}

#define HALF_KERNEL(OP, S, TO32, FROM32)                                      \
    static void OP##_##S(void *dst, const void *a, const void *b, size_t n)   \
    {                                                                         \
        half_binop(OP##_f32, TO32, FROM32, dst, a, b, n);                     \
    }
#define HALF_KERNELS(S, TO32, FROM32)                                         \
    HALF_KERNEL(sum, S, TO32, FROM32)                                         \
    HALF_KERNEL(prod, S, TO32, FROM32)                                        \
    HALF_KERNEL(min, S, TO32, FROM32)                                         \
    HALF_KERNEL(max, S, TO32, FROM32)

HALF_KERNELS(f16, mpicoll_f16_to_f32, mpicoll_f32_to_f16)
HALF_KERNELS(bf16, mpicoll_bf16_to_f32, mpicoll_f32_to_bf16)

/* ---- the (op, dtype) table ---------------------------------------------- */

#define INT_ROW(S) { sum_##S, prod_##S, min_##S, max_##S, band_##S, bor_##S, \
                     bxor_##S, land_##S, lor_##S, lxor_##S }
#define FLOAT_ROW(S) { sum_##S, prod_##S, min_##S, max_##S, NULL, NULL, NULL, \
                       NULL, NULL, NULL }

/* Indexed [dtype][op], in the order of the enums in kernels.h. */
static const mpicoll_binop_fn table[MPICOLL_NDTYPES][MPICOLL_NOPS] = {
    INT_ROW(i8), INT_ROW(i16), INT_ROW(i32), INT_ROW(i64),
    INT_ROW(u8), INT_ROW(u16), INT_ROW(u32), INT_ROW(u64),
    FLOAT_ROW(f16), FLOAT_ROW(bf16), FLOAT_ROW(f32), FLOAT_ROW(f64),
};

static const size_t itemsize[MPICOLL_NDTYPES] = {1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8};

static int lookup(int op, int dtype, mpicoll_binop_fn *fn)
{
    if (dtype < 0 || dtype >= MPICOLL_NDTYPES) return MPICOLL_EDTYPE;
    if (op < 0 || op >= MPICOLL_NOPS) return MPICOLL_EOP;
    *fn = table[dtype][op];
    return *fn ? MPICOLL_OK : MPICOLL_EOPDTYPE;
}

/* One OR of the addresses tests all of them: itemsizes are powers of two. */
static int misaligned(uintptr_t addr_bits, int dtype)
{
    return (addr_bits & (itemsize[dtype] - 1)) != 0;
}

int mpicoll_reduce(int op, int dtype, void *dst, const void *a, const void *b, size_t n)
{
    mpicoll_binop_fn fn;
    int rc = lookup(op, dtype, &fn);
    if (rc != MPICOLL_OK) return rc;
    if (misaligned((uintptr_t)dst | (uintptr_t)a | (uintptr_t)b, dtype)) return MPICOLL_EALIGN;
    if (n > 0) fn(dst, a, b, n);
    return MPICOLL_OK;
}

/* One pass over memory for k inputs: walk the vector in cache-sized chunks
 * and fold every source into the chunk before moving on, so dst is written
 * once and each source read once, with no temporaries. The result is the
 * same as k-1 pairwise mpicoll_reduce calls in source order. */
int mpicoll_reduce_many(int op, int dtype, void *dst, const void *const *srcs, int k, size_t n)
{
    mpicoll_binop_fn fn;
    int rc = lookup(op, dtype, &fn);
    if (rc != MPICOLL_OK) return rc;
    if (k < 1) return MPICOLL_EARG;
    uintptr_t addr_bits = (uintptr_t)dst;
    for (int j = 0; j < k; j++) addr_bits |= (uintptr_t)srcs[j];
    if (misaligned(addr_bits, dtype)) return MPICOLL_EALIGN;
    size_t sz = itemsize[dtype];
    if (k == 1) {
        if (dst != srcs[0] && n) memmove(dst, srcs[0], n * sz);
        return MPICOLL_OK;
    }
    const size_t chunk = 16384 / sz;               /* 16 KiB of dst per chunk */
    char *d = (char *)dst;
    for (size_t i = 0; i < n; i += chunk) {
        size_t m = n - i < chunk ? n - i : chunk;
        size_t off = i * sz;
        fn(d + off, (const char *)srcs[0] + off, (const char *)srcs[1] + off, m);
        for (int j = 2; j < k; j++)
            fn(d + off, d + off, (const char *)srcs[j] + off, m);
    }
    return MPICOLL_OK;
}

/* ---- scale (avg = sum / p) ---------------------------------------------- */

MPICOLL_CLONES
static void scale_f32(float *buf, size_t n, float d)
{
    for (size_t i = 0; i < n; i++) buf[i] = buf[i] / d;
}

MPICOLL_CLONES
static void scale_f64(double *buf, size_t n, double d)
{
    for (size_t i = 0; i < n; i++) buf[i] = buf[i] / d;
}

static void scale_half(uint16_t *buf, size_t n, float d, to32_fn to32, from32_fn from32)
{
    float f[HALF_BLOCK] __attribute__((aligned(64)));
    for (size_t i = 0; i < n; i += HALF_BLOCK) {
        size_t m = n - i < HALF_BLOCK ? n - i : HALF_BLOCK;
        to32(f, buf + i, m);
        scale_f32(f, m, d);
        from32(buf + i, f, m);
    }
}

/* Division, not multiplication by 1/d: x / d is correctly rounded, and it
 * is what numpy's mean-by-hand (x / p) gives. The loop is memory-bound. */
int mpicoll_scale(int dtype, void *buf, size_t n, double divisor)
{
    if (dtype >= 0 && dtype < MPICOLL_NDTYPES && misaligned((uintptr_t)buf, dtype)) return MPICOLL_EALIGN;
    switch (dtype) {
    case MPICOLL_FLOAT32: scale_f32((float *)buf, n, (float)divisor); return MPICOLL_OK;
    case MPICOLL_FLOAT64: scale_f64((double *)buf, n, divisor); return MPICOLL_OK;
    case MPICOLL_FLOAT16:
        scale_half((uint16_t *)buf, n, (float)divisor, mpicoll_f16_to_f32, mpicoll_f32_to_f16);
        return MPICOLL_OK;
    case MPICOLL_BFLOAT16:
        scale_half((uint16_t *)buf, n, (float)divisor, mpicoll_bf16_to_f32, mpicoll_f32_to_bf16);
        return MPICOLL_OK;
    default:
        return (dtype < 0 || dtype >= MPICOLL_NDTYPES) ? MPICOLL_EDTYPE : MPICOLL_EARG;
    }
}
