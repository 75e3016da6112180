/* Vendored blocked SGEMM (row-major), the fallback when no BLAS is present
 * and the test oracle for the BLAS path.
 *
 * Blocking: the N dimension is split into column chunks of NCHUNK handled by
 * OpenMP threads; inside a chunk, K is blocked by KC and M by MC.  Operands
 * are packed (transposition is resolved while packing) into MR-row /
 * NR-column micro panels, zero padded, and an MR x NR register-blocked micro
 * kernel written with GCC vector extensions runs on them.  The micro kernel
 * is compiled three times (AVX-512, AVX2+FMA, baseline) and chosen at run
 * time with __builtin_cpu_supports; on non-x86 only the portable one exists.
 * Packing buffers live on the stack (no malloc, as for every kernel). */
#pragma GCC optimize("fp-contract=fast")
#include "internal.h"

#define MR 8
#define NR 16
#define KC 256
#define MC 64
#define NCHUNK 64 /* multiple of NR */

typedef float v16f __attribute__((vector_size(64), aligned(4)));
typedef float v16fa __attribute__((vector_size(64)));

/* acc[MR][NR] = sum_p Ap[p][0..MR) (x) Bp[p][0..NR) */
#define MICROKERNEL_BODY                                                     \
    v16fa c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0}, c4 = {0}, c5 = {0}, c6 = {0}, \
          c7 = {0};                                                          \
    for (int64_t p = 0; p < kc; p++) {                                       \
        v16fa bv = *(const v16f *)(bp + p * NR);                             \
        const float *ap_ = ap + p * MR;                                      \
        c0 += ap_[0] * bv;                                                   \
        c1 += ap_[1] * bv;                                                   \
        c2 += ap_[2] * bv;                                                   \
        c3 += ap_[3] * bv;                                                   \
        c4 += ap_[4] * bv;                                                   \
        c5 += ap_[5] * bv;                                                   \
        c6 += ap_[6] * bv;                                                   \
        c7 += ap_[7] * bv;                                                   \
    }                                                                        \
    *(v16f *)(acc + 0 * NR) = c0;                                            \
    *(v16f *)(acc + 1 * NR) = c1;                                            \
    *(v16f *)(acc + 2 * NR) = c2;                                            \
    *(v16f *)(acc + 3 * NR) = c3;                                            \
    *(v16f *)(acc + 4 * NR) = c4;                                            \
    *(v16f *)(acc + 5 * NR) = c5;                                            \
    *(v16f *)(acc + 6 * NR) = c6;                                            \
    *(v16f *)(acc + 7 * NR) = c7;

typedef void (*microkernel_fn)(int64_t kc, const float *ap, const float *bp, float *acc);

static void mk_generic(int64_t kc, const float *ap, const float *bp, float *acc) {
    MICROKERNEL_BODY
}
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,fma"))) static void mk_avx512(int64_t kc, const float *ap,
                                                              const float *bp, float *acc) {
    MICROKERNEL_BODY
}
__attribute__((target("avx2,fma"))) static void mk_avx2(int64_t kc, const float *ap,
                                                         const float *bp, float *acc) {
    MICROKERNEL_BODY
}
#endif

static microkernel_fn select_microkernel(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return mk_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return mk_avx2;
#endif
    return mk_generic;
}

static microkernel_fn g_mk = NULL;

/* Pack op(A)[i0:i0+mc, p0:p0+kc] into MR-row panels: ap[panel][p][r]. */
static void pack_a(float *ap, int ta, const float *a, int64_t lda, int64_t i0, int64_t mc,
                   int64_t p0, int64_t kc) {
    for (int64_t ir = 0; ir < mc; ir += MR) {
        int64_t mr = PORT_MIN(MR, mc - ir);
        float *dst = ap + ir * kc;
        for (int64_t p = 0; p < kc; p++) {
            int64_t r = 0;
            if (!ta) {
                for (; r < mr; r++) dst[p * MR + r] = a[(i0 + ir + r) * lda + p0 + p];
            } else {
                const float *src = a + (p0 + p) * lda + i0 + ir;
                for (; r < mr; r++) dst[p * MR + r] = src[r];
            }
            for (; r < MR; r++) dst[p * MR + r] = 0.0f;
        }
    }
}

/* Pack op(B)[p0:p0+kc, j0:j0+nc] into NR-column panels: bp[panel][p][c]. */
static void pack_b(float *bp, int tb, const float *b, int64_t ldb, int64_t p0, int64_t kc,
                   int64_t j0, int64_t nc) {
    for (int64_t jr = 0; jr < nc; jr += NR) {
        int64_t nr = PORT_MIN(NR, nc - jr);
        float *dst = bp + jr * kc;
        for (int64_t p = 0; p < kc; p++) {
            int64_t c = 0;
            if (!tb) {
                const float *src = b + (p0 + p) * ldb + j0 + jr;
                for (; c < nr; c++) dst[p * NR + c] = src[c];
            } else {
                for (; c < nr; c++) dst[p * NR + c] = b[(j0 + jr + c) * ldb + p0 + p];
            }
            for (; c < NR; c++) dst[p * NR + c] = 0.0f;
        }
    }
}

static void gemm_chunk(int ta, int tb, int64_t m, int64_t j0, int64_t nc, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                       int64_t ldc) {
    float bp[KC * NCHUNK] __attribute__((aligned(64)));
    float ap[MC * KC] __attribute__((aligned(64)));
    float acc[MR * NR] __attribute__((aligned(64)));
    for (int64_t p0 = 0; p0 < k; p0 += KC) {
        int64_t kc = PORT_MIN(KC, k - p0);
        pack_b(bp, tb, b, ldb, p0, kc, j0, nc);
        for (int64_t i0 = 0; i0 < m; i0 += MC) {
            int64_t mc = PORT_MIN(MC, m - i0);
            pack_a(ap, ta, a, lda, i0, mc, p0, kc);
            for (int64_t jr = 0; jr < nc; jr += NR) {
                int64_t nr = PORT_MIN(NR, nc - jr);
                for (int64_t ir = 0; ir < mc; ir += MR) {
                    int64_t mr = PORT_MIN(MR, mc - ir);
                    g_mk(kc, ap + ir * kc, bp + jr * kc, acc);
                    for (int64_t r = 0; r < mr; r++) {
                        float *crow = c + (i0 + ir + r) * ldc + j0 + jr;
                        for (int64_t cc = 0; cc < nr; cc++) crow[cc] += alpha * acc[r * NR + cc];
                    }
                }
            }
        }
    }
}

void port__sgemm_vendored(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                          float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    if (!g_mk) g_mk = select_microkernel(); /* idempotent, benign race */
    /* C = beta*C (beta == 0 overwrites, ignoring NaNs in C like BLAS) */
    if (beta != 1.0f) {
        for (int64_t i = 0; i < m; i++) {
            float *row = c + i * ldc;
            if (beta == 0.0f)
                memset(row, 0, (size_t)n * sizeof(float));
            else
                for (int64_t j = 0; j < n; j++) row[j] *= beta;
        }
    }
    if (k <= 0 || alpha == 0.0f) return;
    /* 2-D task grid: row blocks of MB rows x column chunks of NCHUNK. */
    const int64_t MB = 256;
    int64_t nchunks = (n + NCHUNK - 1) / NCHUNK, mblocks = (m + MB - 1) / MB;
    int64_t ntasks = nchunks * mblocks;
    int par = (double)m * (double)n * (double)k > 1e6 && ntasks > 1;
    (void)par;   /* read by the OpenMP pragma only */
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int64_t t = 0; t < ntasks; t++) {
        int64_t i0 = (t / nchunks) * MB, j0 = (t % nchunks) * NCHUNK;
        const float *a0 = ta ? a + i0 : a + i0 * lda;
        gemm_chunk(ta, tb, PORT_MIN(MB, m - i0), j0, PORT_MIN(NCHUNK, n - j0), k, alpha, a0, lda,
                   b, ldb, c + i0 * ldc, ldc);
    }
}
