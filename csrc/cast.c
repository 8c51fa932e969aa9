/*
 * float32 <-> float16 / bfloat16 conversions.
 *
 * Both 16-bit formats are reduced by widening to float32, applying the op,
 * and rounding back (reduce.c), so these loops are on the hot path of every
 * 16-bit reduction and of wire compression.  Rounding is to nearest, ties to
 * even, in every variant, so the hardware and portable paths give the same
 * bits: float32 has more than 2p+2 significand bits for both formats, which
 * makes widen-op-round equal to a correctly rounded 16-bit op.
 */
#include <string.h>
#include "kernels.h"
#include "simd.h"

#ifdef MPICOLL_X86_DISPATCH
#  include <immintrin.h>
#endif

/* ---- portable float16 (binary16) conversions ---------------------------- */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline uint16_t f32_to_f16_one(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) {                       /* inf, NaN */
        if (ax > 0x7f800000u)                      /* NaN: quiet it, keep top payload bits (as F16C) */
            return sign | 0x7e00u | (uint16_t)((ax >> 13) & 0x3ffu);
        return sign | 0x7c00u;
    }
    if (ax >= 0x477ff000u)                         /* >= 65520 rounds to inf */
        return sign | 0x7c00u;
    if (ax < 0x38800000u) {                        /* result is subnormal or zero */
        /* Adding 0.5 puts the float16 subnormal ulp (2^-24) at float32's ulp,
         * so the FPU's round-to-nearest-even does the rounding for us. */
        uint32_t r = f32_bits(bits_f32(ax) + 0.5f);
        return sign | (uint16_t)(r - 0x3f000000u);
    }
    /* Normal: rebias the exponent (127 -> 15) and round on bit 13, ties to even. */
    ax += 0xc8000fffu + ((ax >> 13) & 1u);
    return sign | (uint16_t)(ax >> 13);
}

static inline float f16_to_f32_one(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    if (em >= 0x7c00u) {                           /* inf, NaN (NaN comes out quiet, as F16C) */
        uint32_t mant = (em & 0x3ffu) << 13;
        return bits_f32(sign | 0x7f800000u | mant | (mant ? 0x00400000u : 0u));
    }
    if (em >= 0x0400u)                             /* normal */
        return bits_f32(sign | ((em << 13) + 0x38000000u));
    /* zero or subnormal: em * 2^-24 is exact in float32 */
    return bits_f32(sign | f32_bits((float)em * 5.9604644775390625e-8f));
}

static void f32_to_f16_generic(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = f32_to_f16_one(src[i]);
}

static void f16_to_f32_generic(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32_one(src[i]);
}

/* ---- hardware float16 conversions (x86-64) ------------------------------ */
#ifdef MPICOLL_X86_DISPATCH
/* Tails go through a zero-padded full vector, never a scalar loop, so every
 * element of a buffer is converted by the same instruction. */

__attribute__((target("avx,f16c")))
static void f16_to_f32_f16c(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    if (i < n) {
        uint16_t h[8] = {0}; float f[8];
        memcpy(h, src + i, (n - i) * sizeof *src);
        _mm256_storeu_ps(f, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)));
        memcpy(dst + i, f, (n - i) * sizeof *dst);
    }
}

__attribute__((target("avx,f16c")))
static void f32_to_f16_f16c(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        float f[8] = {0}; uint16_t h[8];
        memcpy(f, src + i, (n - i) * sizeof *src);
        _mm_storeu_si128((__m128i *)h, _mm256_cvtps_ph(_mm256_loadu_ps(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        memcpy(dst + i, h, (n - i) * sizeof *dst);
    }
}

__attribute__((target("avx512f")))
static void f16_to_f32_avx512(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    if (i < n) {
        uint16_t h[16] = {0}; float f[16];
        memcpy(h, src + i, (n - i) * sizeof *src);
        _mm512_storeu_ps(f, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)));
        memcpy(dst + i, f, (n - i) * sizeof *dst);
    }
}

__attribute__((target("avx512f")))
static void f32_to_f16_avx512(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        float f[16] = {0}; uint16_t h[16];
        memcpy(f, src + i, (n - i) * sizeof *src);
        _mm256_storeu_si256((__m256i *)h, _mm512_cvtps_ph(_mm512_loadu_ps(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        memcpy(dst + i, h, (n - i) * sizeof *dst);
    }
}
#endif

/* ---- dispatch ------------------------------------------------------------ */

typedef void (*to32_fn)(float *, const uint16_t *, size_t);
typedef void (*from32_fn)(uint16_t *, const float *, size_t);

static struct { to32_fn to32; from32_fn from32; const char *isa; } f16_impl;

/* Resolved once, by the dynamic loader, while the extension is being loaded
 * (dlopen runs constructors before it returns), so no caller can see the
 * table half-filled.  Resolving lazily on first call instead would race:
 * cffi releases the GIL around these calls, the progress thread and the main
 * thread can both arrive first, and plain stores give no ordering, so one
 * thread could see isa set before the function pointers it guards.
 * GCC's own target_clones resolvers run at the same point (ifuncs), for the
 * same reason.  __builtin_cpu_init is required this early: libgcc's CPU
 * model may not be initialised yet when a constructor runs. */
__attribute__((constructor))
static void f16_resolve(void)
{
    to32_fn to32 = f16_to_f32_generic;
    from32_fn from32 = f32_to_f16_generic;
    const char *isa = "generic";
#ifdef MPICOLL_X86_DISPATCH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        to32 = f16_to_f32_avx512; from32 = f32_to_f16_avx512; isa = "avx512f";
    } else if (__builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx")) {
        to32 = f16_to_f32_f16c; from32 = f32_to_f16_f16c; isa = "f16c";
    }
#endif
    f16_impl.to32 = to32;
    f16_impl.from32 = from32;
    f16_impl.isa = isa;
}

void mpicoll_f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    f16_impl.to32(dst, src, n);
}

void mpicoll_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
    f16_impl.from32(dst, src, n);
}

const char *mpicoll_isa(void)
{
    return f16_impl.isa;
}

/* ---- bfloat16: plain integer arithmetic, vectorised by target_clones ---- */

MPICOLL_CLONES
void mpicoll_bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    /* memcpy is the defined way to store integer bits into a float object
     * (a uint32_t * store into float storage breaks the aliasing rules); GCC
     * turns it into a plain move and still vectorises the loop.  Bits are
     * copied memory to memory, never through a float register, so a
     * signalling NaN arrives unchanged. */
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(dst + i, &u, sizeof u);
    }
}

/* Round to nearest even on the dropped 16 bits; NaN keeps its sign and top
 * payload and is made quiet (so it cannot round into an infinity).  Same
 * rule as ml_dtypes.bfloat16. Subnormals are kept, not flushed. */
MPICOLL_CLONES
void mpicoll_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t x;
        memcpy(&x, src + i, sizeof x);  /* the bits, as in mpicoll_bf16_to_f32 */
        uint16_t rounded = (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
        uint16_t quiet_nan = (uint16_t)((x >> 16) | 0x0040u);
        dst[i] = (x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
    }
}
