/*
 * Internal helpers shared by the kernel sources (not part of the cffi
 * interface).
 *
 * Run-time dispatch: one build has to run on every x86-64 machine and be
 * fast on the one it lands on.  Plain loops are compiled once per
 * instruction-set level with GCC's target_clones; the dynamic loader picks
 * the best clone on first call (an ifunc).  Loops that need intrinsics (the
 * F16C / AVX-512 half-precision conversions in cast.c) are dispatched by
 * hand with __builtin_cpu_supports.  Other architectures and compilers get
 * the portable C loops.
 */
#ifndef MPICOLL_SIMD_H
#define MPICOLL_SIMD_H

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MPICOLL_NO_DISPATCH)
#  define MPICOLL_X86_DISPATCH 1
#  define MPICOLL_CLONES __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#  define MPICOLL_CLONES
#endif

/* "The loop carries no dependence": true for element-wise kernels even when
 * dst and a source are the same pointer, and it spares GCC the run-time
 * overlap check that would send the in-place case down the scalar path. */
#if defined(__GNUC__) && !defined(__clang__)
#  define MPICOLL_IVDEP _Pragma("GCC ivdep")
/* Four vectors per iteration: keeps enough loads in flight to saturate the
 * memory system (measured: ~10% on 16 MiB float32 sums). */
#  define MPICOLL_UNROLL _Pragma("GCC unroll 4")
#else
#  define MPICOLL_IVDEP
#  define MPICOLL_UNROLL
#endif

/* Signature shared by every binary kernel: dst = a OP b over n elements. */
typedef void (*mpicoll_binop_fn)(void *dst, const void *a, const void *b, size_t n);

#endif
