/* Narrow GEMMs on AVX-512: the products a convolution makes at batch 1 on small maps (ResNet-18's last stage on a
 * 32x32 input: 4x4 = 16 output pixels, so the forward is W[512 x 4608] x cols[4608 x 16]), where a blocked GEMM
 * packs the whole weight matrix into panels to multiply it by one vector's worth of columns.  Three shapes, each
 * reading the large operand once, in place, with the narrow one in registers or L1/L2:
 *
 *   NN:  C[m x n] = alpha A[m x k] B[k x n] + beta C, n <= 32 (or 48 / 64).  R rows of C in R x NV accumulators
 *        (NV = n / 16 rounded up, the last vector masked); per term p: NV loads of B's row p, R broadcasts of A.
 *   TN:  C = alpha A^T B + beta C with A stored [k x m] (a convolution's input gradient W^T dy), n <= 32.  R
 *        consecutive rows of C take R consecutive floats of each row of A, 16 terms at a time (partial sums on the
 *        stack), so a chunk reads 16 rows of A as 16 sequential streams: term by term the rows are lda floats
 *        apart, a strided walk no hardware prefetcher follows (2x slower inside a training step than in a loop),
 *        so each term prefetches its row SK_PF_TN floats ahead; NN prefetches its R rows SK_PF floats ahead.
 *        In a step the weights arrive cold (last read a step ago): 512x16x4608 NN 0.90 -> 0.60 ms, TN 0.69 ->
 *        0.52 ms with 8 weight matrices in rotation (Intel Xeon, 2 threads); ResNet-18 batch-1 step 32.6 -> 30.1
 *        ms.
 *   NT:  C = alpha A[m x k] B^T + beta C with B stored [n x k] (a weight gradient dy cols^T with few output pixels),
 *        k <= 16.  The rows of C split over the threads; each thread transposes B a chunk of columns at a time
 *        into a 64 KiB stack tile and walks its rows 4 at a time, 64 columns at a time (16 accumulators).
 *
 * The arithmetic is the vendored GEMM's, element by element (below): the same bits as gemm_vendored.c -- so the
 * portable build stays bit-identical across ISAs where only x86 runs these (tests/e2e/test_rt_cross.py) -- and,
 * since no sum is split over threads, at any thread count.  port__gemm_skinny_pick takes a product by its shape
 * alone (port__gemm_pick counts these as the vendored GEMM), where they measured faster than the vendored GEMM /
 * OpenBLAS on an Intel Xeon (2 threads, ms): 512x16x4608 NN 0.36 / 0.54, TN 0.43 / 0.56, NT 0.42 / 0.45;
 * 512x32x4608 NN 0.54 / 0.68, TN 0.65 / 0.69; 256x64x2304 NN 0.30 / 0.33; not n = 49 (a 7x7 map: 1.03-1.16x) nor
 * TN with n = 64 (1.0-1.07x) nor products of under 2^16 floats in A (OpenBLAS's small kernels: 1.0-1.17x).
 * Tests: tests/kernels/test_conv.py (float64 torch with leading dimensions, the vendored GEMM's bits),
 * test_threads.py (1, 2 and 3 threads). */
#pragma GCC optimize("fp-contract=fast")
#include "internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SK_TGT __attribute__((target("avx512f,fma")))
#define SK_INL static inline __attribute__((always_inline, target("avx512f,fma")))
#define SK_NT_NJ 64 /* columns of C per NT register block: 4 vectors */
#define SK_NT_KMAX 16

static inline __mmask16 sk_mask(int64_t cols) {
    return cols >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (cols > 0 ? cols : 0)) - 1u);
}

/* The calling thread's rows [i0, i1) of m, split evenly over the team in whole units */
static inline void sk_my_rows(int64_t m, int64_t unit, int64_t *i0, int64_t *i1) {
    int64_t nt = 1, id = 0;
#ifdef _OPENMP
    nt = omp_get_num_threads();
    id = omp_get_thread_num();
#endif
    const int64_t units = (m + unit - 1) / unit, per = (units + nt - 1) / nt;
    *i0 = PORT_MIN(m, id * per * unit);
    *i1 = PORT_MIN(m, (id + 1) * per * unit);
}

/* The vendored GEMM's arithmetic, element by element (so these kernels give its bits, and the portable build's
 * on every ISA): C = beta C first (beta = 0 and a product to add: C is overwritten, never read), then per block of
 * SK_KC terms, in order, the block's sum from zero by fused multiply-adds, added as C = fma(alpha, sum, C). */
#define SK_KC 256 /* the vendored GEMM's K block (KC, KC5) */
#define SK_PF 256   /* NN: floats ahead on each of the R rows of A (every 16 terms: one line per row) */
#define SK_PF_TN 64 /* TN: floats ahead on the term's row of A (measured best of 0/64/128/256) */

/* rows of C scaled by beta where the products do not overwrite them (ow: beta = 0 with a product to add) */
static void sk_prescale(int64_t m, int64_t n, float beta, int ow, float *c, int64_t ldc) {
    if (beta == 1.0f || ow) return;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
}

/* NN / TN: R rows of C over terms [0, kc) of one chunk of a K block; A's element (r, p) at a[r * lda + p] (NN) or
 * a[p * lda + r] (TN).  first: the block's sum starts from zero, else from buf (the block's earlier chunks);
 * last: C = fma(alpha, sum, ow ? 0 : C), else buf = the partial sum (stored as floats: chunking changes no bit) */
SK_INL void sk_rows(const int R, const int NV, int tn, int first, int last, int ow, int64_t kc, const float *a,
                    int64_t lda, const float *b, int64_t ldb, float alpha, float *c, int64_t ldc, float *buf,
                    __mmask16 ml) {
    __m512 acc[16][4];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[r][v] = first ? _mm512_setzero_ps() : _mm512_load_ps(buf + (r * NV + v) * 16);
    for (int64_t p = 0; p < kc; p++) {
        __m512 bv[4];
        const float *bp = b + p * ldb;
        if (!tn && SK_PF && (p & 15) == 0) {
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) _mm_prefetch((const char *)(a + r * lda + p + SK_PF), _MM_HINT_T0);
        }
        if (tn && SK_PF_TN) _mm_prefetch((const char *)(a + p * lda + SK_PF_TN), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            bv[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(ml, bp + 16 * v) : _mm512_loadu_ps(bp + 16 * v);
        const float *ap = tn ? a + p * lda : a + p;
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            __m512 av = _mm512_set1_ps(tn ? ap[r] : ap[r * lda]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    if (!last) {
#pragma GCC unroll 16
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) _mm512_store_ps(buf + (r * NV + v) * 16, acc[r][v]);
        return;
    }
    const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            __mmask16 mk = v == NV - 1 ? ml : (__mmask16)0xFFFF;
            float *cp = c + r * ldc + 16 * v;
            __m512 old = ow ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk, cp);
            _mm512_mask_storeu_ps(cp, mk, _mm512_fmadd_ps(va, acc[r][v], old));
        }
    }
}

/* rows [i0, i1) of C (blocks of R rows, then single rows) in super-blocks of SK_SB floats of partial sums (buf),
 * each over the K blocks, each K block in chunks of pb terms: TN (pb = 16) walks a chunk's 16 rows of A as 16
 * sequential streams (term by term, the rows are lda floats apart: a strided walk no prefetcher follows, 2x
 * slower inside a training step than in a loop over one product); NN takes a K block at once (pb = SK_KC) */
#define SK_SB 8192
SK_INL void sk_span(const int R, const int NV, int tn, int64_t i0, int64_t i1, int64_t k, const int64_t pb,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float alpha, int ow, float *c,
                    int64_t ldc, float *buf, __mmask16 ml) {
    const int64_t sb = SK_SB / (16 * NV) / R * R; /* rows per super-block: a multiple of R */
    for (int64_t s0 = i0; s0 < i1; s0 += sb) {
        const int64_t s1 = PORT_MIN(i1, s0 + sb);
        for (int64_t k0 = 0; k0 < k; k0 += SK_KC) {
            const int64_t k1 = PORT_MIN(k, k0 + SK_KC);
            const int owb = ow && k0 == 0;
            for (int64_t p0 = k0; p0 < k1; p0 += pb) {
                const int64_t kc = PORT_MIN(pb, k1 - p0);
                const int first = p0 == k0, last = p0 + kc >= k1;
                const float *ap = tn ? a + p0 * lda : a + p0, *bp = b + p0 * ldb;
                int64_t i = s0;
                float *bu = buf;
                if (first && last) { /* one chunk: the flags as constants */
                    for (; i + R <= s1; i += R)
                        sk_rows(R, NV, tn, 1, 1, owb, kc, tn ? ap + i : ap + i * lda, lda, bp, ldb, alpha,
                                c + i * ldc, ldc, NULL, ml);
                    for (; i < s1; i++)
                        sk_rows(1, NV, tn, 1, 1, owb, kc, tn ? ap + i : ap + i * lda, lda, bp, ldb, alpha,
                                c + i * ldc, ldc, NULL, ml);
                    continue;
                }
                for (; i + R <= s1; i += R, bu += R * NV * 16)
                    sk_rows(R, NV, tn, first, last, owb, kc, tn ? ap + i : ap + i * lda, lda, bp, ldb, alpha,
                            c + i * ldc, ldc, bu, ml);
                for (; i < s1; i++, bu += NV * 16)
                    sk_rows(1, NV, tn, first, last, owb, kc, tn ? ap + i : ap + i * lda, lda, bp, ldb, alpha,
                            c + i * ldc, ldc, bu, ml);
            }
        }
    }
}

/* rows per block: <= 16 accumulators for NN (A's rows are separate streams), up to 16 consecutive rows for TN */
#define SK_NN_R(NV) ((NV) <= 2 ? 8 : 4)
#define SK_TN_R(NV) ((NV) == 1 ? 16 : (NV) == 2 ? 8 : 4)
#define SK_TN_PB 16 /* TN terms per chunk (divides SK_KC) */

SK_TGT static void sk_nn_tn(int tn, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                            const float *b, int64_t ldb, int ow, float *c, int64_t ldc) {
    const int NV = (int)((n + 15) / 16);
    const __mmask16 ml = sk_mask(n - 16 * (NV - 1));
    const int64_t R = tn ? SK_TN_R(NV) : SK_NN_R(NV);
    int par = m > R && (double)m * (double)n * (double)k >= PORT_GEMM_PAR_MIN && !port__in_parallel();
#pragma omp parallel if (par)
    {
        float buf[SK_SB] __attribute__((aligned(64)));
        int64_t i0, i1;
        sk_my_rows(m, R, &i0, &i1);
        if (i0 < i1) {
            switch (NV * 2 + tn) {
#define SK_CASE(NVC, TN)                                                                                        \
    case NVC * 2 + TN:                                                                                          \
        sk_span(TN ? SK_TN_R(NVC) : SK_NN_R(NVC), NVC, TN, i0, i1, k, TN ? SK_TN_PB : SK_KC, a, lda, b, ldb,   \
                alpha, ow, c, ldc, buf, ml);                                                                    \
        break;
                SK_CASE(1, 0) SK_CASE(1, 1) SK_CASE(2, 0) SK_CASE(2, 1) SK_CASE(3, 0) SK_CASE(3, 1) SK_CASE(4, 0)
                SK_CASE(4, 1)
#undef SK_CASE
            default: break;
            }
        }
    }
}

/* NT: R <= 4 rows of C, 64 columns of a chunk from the transposed B tile bt (row stride ldt floats, zero past the
 * chunk's columns; the stores are masked to the nj columns that exist): 16 accumulators, 4 loads and 4
 * broadcasts per 16 fused multiply-adds */
SK_INL void sk_nt_rows(const int R, const int ow, int64_t k, const float *a, int64_t lda, const float *bt,
                       int64_t ldt, float alpha, float *c, int64_t ldc, int64_t nj) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t q = 0; q < k; q++) {
        const float *bq = bt + q * ldt;
        __m512 bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) bv[v] = _mm512_load_ps(bq + 16 * v);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 av = _mm512_set1_ps(a[r * lda + q]);
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha);
    __mmask16 mk[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) mk[v] = sk_mask(nj - 16 * v);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            float *cp = c + r * ldc + 16 * v;
            __m512 old = ow ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk[v], cp);
            _mm512_mask_storeu_ps(cp, mk[v], _mm512_fmadd_ps(va, acc[r][v], old));
        }
    }
}

/* NT rows [i0, i1) of C against all n columns: chunks of SK_NT_TILE / k columns (a multiple of 64, at most 2048),
 * each transposed into the stack tile bt[k x nj] 16 columns at a time (the 16 rows of B read stay in L1), then the
 * rows 4 at a time, 64 columns at a time: C is read and written in runs of up to 8 KiB per row */
#define SK_NT_TILE 16384
SK_INL void sk_nt_span(int64_t i0, int64_t i1, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                       const float *b, int64_t ldb, int ow, float *c, int64_t ldc, float *bt) {
    const int64_t nj_max = PORT_MAX(SK_NT_NJ, PORT_MIN(2048, SK_NT_TILE / k / SK_NT_NJ * SK_NT_NJ));
    for (int64_t j0 = 0; j0 < n; j0 += nj_max) {
        const int64_t nj = PORT_MIN(nj_max, n - j0), ldt = (nj + SK_NT_NJ - 1) / SK_NT_NJ * SK_NT_NJ;
        for (int64_t jb = 0; jb < ldt; jb += 16) {
            const int64_t w = PORT_MAX(0, PORT_MIN(16, nj - jb));
            for (int64_t q = 0; q < k; q++) {
                float *row = bt + q * ldt + jb;
                const float *bq = b + (j0 + jb) * ldb + q;
                for (int64_t j = 0; j < w; j++) row[j] = bq[j * ldb];
                for (int64_t j = w; j < 16; j++) row[j] = 0.0f;
            }
        }
        for (int64_t i = i0, R; i < i1; i += R) {
            R = i1 - i >= 4 ? 4 : 1;
            for (int64_t jj = 0; jj < nj; jj += SK_NT_NJ) {
                float *cij = c + i * ldc + j0 + jj;
                const float *ai = a + i * lda, *bj = bt + jj;
                if (R == 4 && ow) sk_nt_rows(4, 1, k, ai, lda, bj, ldt, alpha, cij, ldc, nj - jj);
                else if (R == 4) sk_nt_rows(4, 0, k, ai, lda, bj, ldt, alpha, cij, ldc, nj - jj);
                else if (ow) sk_nt_rows(1, 1, k, ai, lda, bj, ldt, alpha, cij, ldc, nj - jj);
                else sk_nt_rows(1, 0, k, ai, lda, bj, ldt, alpha, cij, ldc, nj - jj);
            }
        }
    }
}

/* NT: the rows split evenly over the threads (in fours), each thread transposing every chunk of B itself (k x n
 * floats: 1/16 of its multiply-adds for a block of 16 rows, less for more rows) */
SK_TGT static void sk_nt(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                         const float *b, int64_t ldb, int ow, float *c, int64_t ldc) {
    int par = m >= 8 && (double)m * (double)n * (double)k >= PORT_GEMM_PAR_MIN && !port__in_parallel();
#pragma omp parallel if (par)
    {
        float bt[SK_NT_TILE] __attribute__((aligned(64)));
        int64_t i0, i1;
        sk_my_rows(m, 4, &i0, &i1);
        if (i0 < i1) sk_nt_span(i0, i1, n, k, alpha, a, lda, b, ldb, ow, c, ldc, bt);
    }
}

#ifndef PORT_GEMM_NARROW
#define PORT_GEMM_NARROW 1 /* -DPORT_GEMM_NARROW=0: every product to the blocked GEMM (a build for comparisons) */
#endif
int port__gemm_skinny_pick(int ta, int tb, int64_t m, int64_t n, int64_t k) {
    static int avx512 = -1; /* read once (benign race: every thread stores the same value) */
    if (avx512 < 0) avx512 = port_cpu_has_avx512();
    if (!PORT_GEMM_NARROW || !avx512 || m <= 0 || n <= 0 || k <= 0) return 0;
    /* the large operand >= 2^16 floats: on smaller products OpenBLAS's small-matrix kernels are as fast */
    if (!tb && m >= 16 && k >= 16 && (double)m * (double)k >= 65536.0)
        return n <= 32 || (!ta && n <= 64 && n % 16 == 0); /* NN and TN; NN with 3 or 4 whole vectors */
    return !ta && tb && k <= SK_NT_KMAX && n >= 64 && m >= 16 && (double)m * (double)n >= 65536.0; /* NT */
}

int port__gemm_skinny(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                      const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    if (!port__gemm_skinny_pick(ta, tb, m, n, k)) return 0;
    const int ow = beta == 0.0f && alpha != 0.0f; /* k > 0 here */
    sk_prescale(m, n, beta, ow, c, ldc);
    if (alpha == 0.0f) return 1;
    if (!tb) sk_nn_tn(ta, m, n, k, alpha, a, lda, b, ldb, ow, c, ldc);
    else sk_nt(m, n, k, alpha, a, lda, b, ldb, ow, c, ldc);
    return 1;
}

#else /* no AVX-512 path off x86-64: port__gemm runs every product on its other GEMMs */
int port__gemm_skinny_pick(int ta, int tb, int64_t m, int64_t n, int64_t k) {
    (void)ta; (void)tb; (void)m; (void)n; (void)k;
    return 0;
}

int port__gemm_skinny(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                      const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    (void)ta; (void)tb; (void)m; (void)n; (void)k; (void)alpha; (void)a; (void)lda; (void)b; (void)ldb;
    (void)beta; (void)c; (void)ldc;
    return 0;
}
#endif
