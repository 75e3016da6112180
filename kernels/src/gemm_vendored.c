/* Vendored blocked SGEMM (row-major): the GEMM when no BLAS is present, on CPUs with AVX-512 (alone, or beside
 * OpenBLAS for the products its small-matrix kernels do better: the defaults chosen in common.c), and the test
 * oracle for the BLAS path.
 *
 * Blocking (Goto's): C is cut into tasks of up to MB rows x NC columns handled by OpenMP threads (at least one per
 * thread, and a multiple of the thread count below 4 per thread); inside a task, K is blocked by KC and the
 * task's rows by MC.  Operands are packed (transposition is resolved while packing) into MR-row / NR-column micro
 * panels, zero padded, and an MR x NR register-blocked micro kernel written with GCC vector extensions runs on
 * them: the B block (KC x NC) is packed once per task and K block, the A block (MC x KC) once per task, K block
 * and row block.  Both are packed a few rows of the source at a time across all panels (panel by panel, rows a
 * power-of-two stride apart aliased in the caches); with at most 72 rows of A, B's whole panels are read in place
 * instead (each B float would be used too few times to repay its packing).  The first K block of a product with
 * beta = 0 writes C without reading it (no separate zeroing pass); the kernel prefetches its C rows.
 *
 * Narrow products (n <= 32 and the like, port__gemm_skinny_pick) go to gemm_skinny.c's AVX-512 kernels first.
 *
 * Two configurations, chosen at run time with __builtin_cpu_supports:
 *   * AVX-512 (x86 with AVX-512F): a 12 x 32 micro kernel, 24 accumulator registers of 16 floats; per step of k
 *     two loads of B and 12 broadcasts of A feed 24 fused multiply-adds (the 8 x 16 kernel below did 8 FMAs per
 *     9 loads, about half the FMA units' rate); panels of at most 8 or 4 rows run 8- and 4-row bodies, panels
 *     of at most 16 columns the left half;
 *   * the portable one: an 8 x 16 kernel compiled for AVX2+FMA and for the baseline ISA (the only one off x86).
 * Every configuration sums over k in the same order (p = 0, 1, ... within a K block, K blocks added to C in
 * order), so they give the same bits up to FMA contraction, at any thread count.  Packing buffers live on the
 * stack (no malloc, as for every kernel): 2 x 64 KiB for the portable configuration, 512 KiB + 144 KiB for the
 * AVX-512 one (x86-64 only; threads there have MiBs of stack).
 *
 * Measured on an Intel Xeon (AVX-512) core, 1 thread, two paired rounds, before -> after the in-place B,
 * row-block packing, C prefetch, overwrite and short-panel bodies: 64x1024x576 108-109 -> 116-125 GFLOP/s,
 * 576x1024x64 TN 122 -> 168-170, 64x576x1024 NT 132-134 -> 143-151, 1024^3 151 -> 172-177, 64x8192x576 69-98 ->
 * 126-130; geometric mean of 10 conv shapes 129-132 -> 155 (torch.mm: 138 on 64x1024x576, 158 on 1024^3). */
#pragma GCC optimize("fp-contract=fast")
#include "internal.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#define MR 8
#define NR 16
#define KC 256
#define MC 64
#define NCHUNK 64 /* multiple of NR */

typedef float v16f __attribute__((vector_size(64), aligned(4)));
typedef float v16fa __attribute__((vector_size(64)));

/* The micro kernels' signature: C[r][0..NR) += alpha * sum_p ap[p * ldap + r] bp[p * ldbp + 0..NR) for r < mr,
 * columns < nr (ow: C[r][..] = alpha * sum, C's old values never read: the first K block of a beta = 0 product) */
typedef void (*tile_fn)(int64_t kc, const float *ap, int64_t ldap, const float *bp, int64_t ldbp, float *c,
                        int64_t ldc, float alpha, int64_t mr, int64_t nr, int ow);

/* the portable 8 x 16 tile: accumulators in 8 vectors, added to C through a stack tile */
#define TILE8_BODY                                                                 \
    v16fa c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0}, c4 = {0}, c5 = {0}, c6 = {0}, c7 = {0}; \
    for (int64_t p = 0; p < kc; p++) {                                             \
        v16fa bv = *(const v16f *)(bp + p * ldbp);                                 \
        const float *ap_ = ap + p * ldap;                                          \
        c0 += ap_[0] * bv;                                                         \
        c1 += ap_[1] * bv;                                                         \
        c2 += ap_[2] * bv;                                                         \
        c3 += ap_[3] * bv;                                                         \
        c4 += ap_[4] * bv;                                                         \
        c5 += ap_[5] * bv;                                                         \
        c6 += ap_[6] * bv;                                                         \
        c7 += ap_[7] * bv;                                                         \
    }                                                                              \
    float acc[MR * NR] __attribute__((aligned(64)));                               \
    *(v16f *)(acc + 0 * NR) = c0;                                                  \
    *(v16f *)(acc + 1 * NR) = c1;                                                  \
    *(v16f *)(acc + 2 * NR) = c2;                                                  \
    *(v16f *)(acc + 3 * NR) = c3;                                                  \
    *(v16f *)(acc + 4 * NR) = c4;                                                  \
    *(v16f *)(acc + 5 * NR) = c5;                                                  \
    *(v16f *)(acc + 6 * NR) = c6;                                                  \
    *(v16f *)(acc + 7 * NR) = c7;                                                  \
    for (int64_t r = 0; r < mr; r++)                                               \
        for (int64_t cc = 0; cc < nr; cc++)                                       \
            c[r * ldc + cc] = ow ? alpha * acc[r * NR + cc] : c[r * ldc + cc] + alpha * acc[r * NR + cc];

static void mk_generic(int64_t kc, const float *ap, int64_t ldap, const float *bp, int64_t ldbp, float *c,
                       int64_t ldc, float alpha, int64_t mr, int64_t nr, int ow) {
    TILE8_BODY
}
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) static void mk_avx2(int64_t kc, const float *ap, int64_t ldap, const float *bp,
                                                         int64_t ldbp, float *c, int64_t ldc, float alpha, int64_t mr,
                                                         int64_t nr, int ow) {
    TILE8_BODY
}
#define PORT_GEMM_HAVE_AVX512 1
#endif

/* tr(dst, ldd, src, lds, rows, kc): a transposing copy of up to 16 rows, dst[p * ldd + r] = src[r * lds + p]
 * for r < rows, 0 for rows <= r < min(ldd, 16), p < kc (a panel of A's rows, or 16 columns of a transposed B
 * panel); NULL: element by element */
typedef void (*tr_fn)(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows, int64_t kc);

/* Whole w-float panels of rows ld floats apart: dst[j * kc + p * w + c] = src[p * ld + j + c] for j < whole (a
 * multiple of w), p < kc, c < w; 8 source rows at a time, whose segments stay in L1 while every panel takes its
 * 8 x w floats (contiguous).  (Row by row over all panels, the panels' rows, kc * w floats apart, aliased.) */
static inline void pack_rows(float *dst, const float *src, int64_t ld, int64_t kc, int64_t whole, int64_t w) {
    for (int64_t p1 = 0; p1 < kc; p1 += 8) {
        int64_t p2 = PORT_MIN(kc, p1 + 8);
        for (int64_t j = 0; j < whole; j += w)
            for (int64_t p = p1; p < p2; p++) memcpy(dst + j * kc + p * w, src + p * ld + j, (size_t)w * sizeof(float));
    }
}

/* Pack op(A)[i0:i0+mc, p0:p0+kc] into mr_-row panels: ap[panel][p][r]. */
static inline void pack_a(float *ap, int64_t mr_, int ta, tr_fn tr, const float *a, int64_t lda, int64_t i0,
                          int64_t mc, int64_t p0, int64_t kc) {
    for (int64_t ir = 0; ir < mc; ir += mr_) {
        int64_t mr = PORT_MIN(mr_, mc - ir);
        float *dst = ap + ir * kc;
        if (!ta && tr && mr_ <= 16) {
            tr(dst, mr_, a + (i0 + ir) * lda + p0, lda, mr, kc);
            continue;
        }
        if (!ta) { /* rows of A are contiguous in p: read them in order, write every mr_-th float */
            for (int64_t r = 0; r < mr; r++) {
                const float *src = a + (i0 + ir + r) * lda + p0;
                for (int64_t p = 0; p < kc; p++) dst[p * mr_ + r] = src[p];
            }
            for (int64_t p = 0; p < kc; p++)
                for (int64_t r = mr; r < mr_; r++) dst[p * mr_ + r] = 0.0f;
            continue;
        }
        if (mr == mr_ && (mr_ == 12 || mr_ == 8)) continue; /* a whole panel of A^T: below */
        for (int64_t p = 0; p < kc; p++) {
            int64_t r = 0;
            const float *src = a + (p0 + p) * lda + i0 + ir;
            for (; r < mr; r++) dst[p * mr_ + r] = src[r];
            for (; r < mr_; r++) dst[p * mr_ + r] = 0.0f;
        }
    }
    /* A^T's whole panels: panel by panel over all kc rows, rows lda floats apart aliased in the caches (lda =
     * 4608: two sets), and the copies went float by float */
    if (ta && mr_ == 12) pack_rows(ap, a + p0 * lda + i0, lda, kc, mc / 12 * 12, 12);
    else if (ta && mr_ == 8) pack_rows(ap, a + p0 * lda + i0, lda, kc, mc / 8 * 8, 8);
}

#ifndef GEMM_DIRECT_B_ROWS
#define GEMM_DIRECT_B_ROWS 72
#endif
/* Pack op(B)[p0:p0+kc, j0:j0+nc] into nr_-column panels: bp[panel][p][c]. */
static inline void pack_b(float *bp, int64_t nr_, int tb, tr_fn tr, const port__bpack *bs, const float *b,
                          int64_t ldb, int64_t p0, int64_t kc, int64_t j0, int64_t nc) {
    if (bs) { /* B exists only as a packing function */
        bs->pack(bs->ctx, bp, nr_, p0, kc, j0, nc);
        return;
    }
    for (int64_t jr = 0; jr < nc; jr += nr_) {
        int64_t nr = PORT_MIN(nr_, nc - jr);
        float *dst = bp + jr * kc;
        if (tb) { /* columns of op(B) are rows of B: read them in order, write every nr_-th float */
            int64_t c0 = 0;
            if (tr) /* 16 columns at a time, the last group's missing ones zero (n = 27 weight gradients: 11) */
                for (; c0 < nr; c0 += 16)
                    tr(dst + c0, nr_, b + (j0 + jr + c0) * ldb + p0, ldb, PORT_MIN(16, nr - c0), kc);
            for (int64_t c = c0; c < nr; c++) {
                const float *src = b + (j0 + jr + c) * ldb + p0;
                for (int64_t p = 0; p < kc; p++) dst[p * nr_ + c] = src[p];
            }
            for (int64_t p = 0; p < kc; p++)
                for (int64_t c = PORT_MAX(nr, c0); c < nr_; c++) dst[p * nr_ + c] = 0.0f;
            continue;
        }
        if (nr == nr_ && (nr_ == 32 || nr_ == 16)) continue; /* a whole panel: below */
        for (int64_t p = 0; p < kc; p++) {
            int64_t c = 0;
            const float *src = b + (p0 + p) * ldb + j0 + jr;
            for (; c + 16 <= nr; c += 16) *(v16f *)(dst + p * nr_ + c) = *(const v16f *)(src + c);
            for (; c < nr; c++) dst[p * nr_ + c] = src[c];
            for (; c < nr_; c++) dst[p * nr_ + c] = 0.0f;
        }
    }
    /* B's whole panels (pack_rows): panel by panel over all kc rows, the rows ldb floats apart aliased to a few
     * cache sets when ldb is a multiple of 1024: a third of a 64 x 8192 x 576 product's time went to packing B */
    if (!tb && nr_ == 32) pack_rows(bp, b + p0 * ldb + j0, ldb, kc, nc / 32 * 32, 32);
    else if (!tb && nr_ == 16) pack_rows(bp, b + p0 * ldb + j0, ldb, kc, nc / 16 * 16, 16);
}

/* C[0:m, j0:j0+nc] (+)= alpha op(A) op(B) with an mr_ x nr_ tile kernel, K blocks of kc_, A blocks of mc_ rows
 * (ow: the first K block overwrites C); bp holds kc_ x nc and ap mc_ x kc_ floats */
static inline void gemm_blocks(tile_fn tile, tr_fn tr, const port__bpack *bs, int64_t mr_, int64_t nr_,
                               int64_t kc_, int64_t mc_, float *bp,
                               float *ap, int ta, int tb, int64_t m, int64_t j0, int64_t nc, int64_t k,
                               float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                               int64_t ldc, int ow) {
    /* B's whole panels read in place (rows ldb apart) when at most 6 row panels use each: packing B cost 20-30%
     * of a 27 x 1024 x 64 product (each B float used 27 times); no loss at m = 64 */
    int direct = !tb && !bs && m <= GEMM_DIRECT_B_ROWS && nr_ % 16 == 0;
    int64_t whole = direct ? nc / nr_ * nr_ : 0;
    for (int64_t p0 = 0; p0 < k; p0 += kc_) {
        int64_t kc = PORT_MIN(kc_, k - p0);
        if (!direct) pack_b(bp, nr_, tb, tr, bs, b, ldb, p0, kc, j0, nc);
        else if (whole < nc) pack_b(bp + whole * kc, nr_, tb, tr, bs, b, ldb, p0, kc, j0 + whole, nc - whole);
        for (int64_t i0 = 0; i0 < m; i0 += mc_) {
            int64_t mc = PORT_MIN(mc_, m - i0);
            pack_a(ap, mr_, ta, tr, a, lda, i0, mc, p0, kc);
            for (int64_t jr = 0; jr < nc; jr += nr_)
                for (int64_t ir = 0; ir < mc; ir += mr_)
                    tile(kc, ap + ir * kc, mr_, jr < whole ? b + p0 * ldb + j0 + jr : bp + jr * kc,
                         jr < whole ? ldb : nr_, c + (i0 + ir) * ldc + j0 + jr, ldc, alpha, PORT_MIN(mr_, mc - ir),
                         PORT_MIN(nr_, nc - jr), ow && p0 == 0);
        }
    }
}

/* the portable configuration: 8 x 16 tiles, blocks of 64 columns, 64 rows, 256 deep */
static void gemm_chunk(tile_fn mk, const port__bpack *bs, int ta, int tb, int64_t m, int64_t j0, int64_t nc,
                       int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                       int64_t ldc, int ow) {
    float bp[KC * NCHUNK] __attribute__((aligned(64)));
    float ap[MC * KC] __attribute__((aligned(64)));
    gemm_blocks(mk, NULL, bs, MR, NR, KC, MC, bp, ap, ta, tb, m, j0, nc, k, alpha, a, lda, b, ldb, c, ldc, ow);
}

#ifdef PORT_GEMM_HAVE_AVX512
#define MR5 12
#define NR5 32
#define KC5 256
#define MC5 (MR5 * 12)
/* A block 144 x 256 floats (144 KiB): in L2 */
#define NC5 512
#define MB5 (MC5 * 2) /* rows of a task */
/* B block 256 x 512 floats (512 KiB); its 32-column panels (32 KiB) stay in L1 */

/* C[r][0..32) (+)= alpha * sum_p ap[p][r] bp[p][0..32) for r < mr, columns < nr; full tiles update C in
 * registers, partial ones through a stack tile and masked row updates.  Tiles of at most 16 columns (GEMMs with
 * n <= 16: a single image's 4x4 map, batch-1 late layers) run only the left half of the kernel: the right half
 * would multiply the panel's zero padding.  Likewise tiles of at most 4 or 8 rows (the last panel of 64 or 27
 * rows) run a 4- or 8-row body: a 12-row one spent 8 of its 72 rows' work on padding at m = 64.  A row's sum is
 * the same whichever body computes it. */
#define R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define R8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define R4(X) X(0) X(1) X(2) X(3)
#define DECL(r) v16fa c##r##a = {0}, c##r##b = {0};
#define STEP(r) { float a_ = ap_[r]; c##r##a += a_ * b0; c##r##b += a_ * b1; }
#define STEPH(r) { c##r##a += ap_[r] * b0; }
/* C's rows are wanted after the k loop: fetch them now (a 12 x 32 tile of a C larger than the caches missed on
 * every row, ~10% of a 1024^3 product's time) */
#define PFC(r)                                                                                                 \
    if ((r) < mr && !ow) {                                                                                     \
        __builtin_prefetch(c + (r) * ldc, 1, 3);                                                               \
        __builtin_prefetch(c + (r) * ldc + 16, 1, 3);                                                          \
    }
#define STORE0(r) { float *cr = c + (r) * ldc; *(v16f *)cr = alpha * c##r##a; *(v16f *)(cr + 16) = alpha * c##r##b; }
#define STORE(r) { float *cr = c + (r) * ldc; *(v16f *)cr += alpha * c##r##a; *(v16f *)(cr + 16) += alpha * c##r##b; }
#define SPILL(r) { *(v16fa *)(acc + (r) * NR5) = c##r##a; *(v16fa *)(acc + (r) * NR5 + 16) = c##r##b; }
#define MK5_BODY(RX, ROWS)                                                                                      \
    RX(DECL)                                                                                                    \
    RX(PFC)                                                                                                     \
    if (nr <= 16) {                                                                                             \
        _Pragma("GCC unroll 2") for (int64_t p = 0; p < kc; p++) {                                              \
            v16fa b0 = *(const v16f *)(bp + p * ldbp);                                                          \
            const float *ap_ = ap + p * ldap;                                                                   \
            RX(STEPH)                                                                                           \
        }                                                                                                       \
    } else {                                                                                                    \
        _Pragma("GCC unroll 2") for (int64_t p = 0; p < kc; p++) {                                              \
            v16fa b0 = *(const v16f *)(bp + p * ldbp), b1 = *(const v16f *)(bp + p * ldbp + 16);                \
            const float *ap_ = ap + p * ldap;                                                                   \
            RX(STEP)                                                                                            \
        }                                                                                                       \
    }                                                                                                           \
    if (mr == (ROWS) && nr == NR5 && ow) {                                                                      \
        RX(STORE0)                                                                                              \
        return;                                                                                                 \
    }                                                                                                           \
    if (mr == (ROWS) && nr == NR5) {                                                                            \
        RX(STORE)                                                                                               \
        return;                                                                                                 \
    }                                                                                                           \
    float acc[(ROWS) * NR5] __attribute__((aligned(64)));                                                       \
    RX(SPILL)                                                                                                   \
    mk5_rows_out(acc, c, ldc, alpha, mr, nr, ow);

/* rows r < mr of a spilled tile into C, columns < nr */
__attribute__((target("avx512f,fma"))) static inline void mk5_rows_out(const float *acc, float *c, int64_t ldc,
                                                                      float alpha, int64_t mr, int64_t nr, int ow) {
    __mmask16 k0 = (__mmask16)(nr >= 16 ? 0xFFFFu : (1u << nr) - 1u);
    __mmask16 k1 = (__mmask16)(nr >= 32 ? 0xFFFFu : nr > 16 ? (1u << (nr - 16)) - 1u : 0u);
    __m512 va = _mm512_set1_ps(alpha);
    for (int64_t r = 0; r < mr; r++) {
        float *cr = c + r * ldc;
        __m512 v = ow ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(k0, cr);
        _mm512_mask_storeu_ps(cr, k0, _mm512_fmadd_ps(va, _mm512_load_ps(acc + r * NR5), v));
        if (k1) {
            v = ow ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(k1, cr + 16);
            _mm512_mask_storeu_ps(cr + 16, k1, _mm512_fmadd_ps(va, _mm512_load_ps(acc + r * NR5 + 16), v));
        }
    }
}
__attribute__((target("avx512f,fma"))) static void mk5_12(int64_t kc, const float *ap, int64_t ldap,
    const float *bp, int64_t ldbp, float *c, int64_t ldc, float alpha, int64_t mr, int64_t nr, int ow) {
    MK5_BODY(R12, 12)
}
__attribute__((target("avx512f,fma"))) static void mk5_8(int64_t kc, const float *ap, int64_t ldap,
    const float *bp, int64_t ldbp, float *c, int64_t ldc, float alpha, int64_t mr, int64_t nr, int ow) {
    MK5_BODY(R8, 8)
}
__attribute__((target("avx512f,fma"))) static void mk5_4(int64_t kc, const float *ap, int64_t ldap,
    const float *bp, int64_t ldbp, float *c, int64_t ldc, float alpha, int64_t mr, int64_t nr, int ow) {
    MK5_BODY(R4, 4)
}
__attribute__((target("avx512f,fma"))) static void mk5(int64_t kc, const float *ap, int64_t ldap,
    const float *bp, int64_t ldbp, float *c, int64_t ldc, float alpha, int64_t mr, int64_t nr, int ow) {
    if (mr > 8) mk5_12(kc, ap, ldap, bp, ldbp, c, ldc, alpha, mr, nr, ow);
    else if (mr > 4) mk5_8(kc, ap, ldap, bp, ldbp, c, ldc, alpha, mr, nr, ow);
    else mk5_4(kc, ap, ldap, bp, ldbp, c, ldc, alpha, mr, nr, ow);
}
#undef MK5_BODY
#undef R12
#undef R8
#undef R4
#undef DECL
#undef STEP
#undef STEPH
#undef PFC
#undef STORE0
#undef STORE
#undef SPILL

/* Up to 16 x 16 blocks transposed in registers: four rounds of two-source permutes swap the off-diagonal 8x8,
 * 4x4, 2x2 and 1x1 blocks (row i and row i + h exchange halves of width h); missing rows are zeros and rows of
 * fewer than 16 floats are written with masked stores.  The element-wise transposing copy wrote every float to
 * another cache line: a third of a conv weight gradient's GEMM time at 64 output channels (B), and ~7% of a
 * square GEMM's time packing A's 12-row panels one float per store. */
typedef int32_t v16i __attribute__((vector_size(64)));
__attribute__((target("avx512f"))) static void tr_avx512(float *dst, int64_t ldd, const float *src, int64_t lds,
                                                          int64_t rows, int64_t kc) {
#define LOJ(j, h) ((j) + (((j) & (h)) ? 16 - (h) : 0)) /* row i's half, then row i + h's */
#define HIJ(j, h) ((j) + (((j) & (h)) ? 16 : (h)))
#define ROW16(F, h) {F(0, h), F(1, h), F(2, h), F(3, h), F(4, h), F(5, h), F(6, h), F(7, h), \
                     F(8, h), F(9, h), F(10, h), F(11, h), F(12, h), F(13, h), F(14, h), F(15, h)}
    static const v16i lo[4] = {ROW16(LOJ, 8), ROW16(LOJ, 4), ROW16(LOJ, 2), ROW16(LOJ, 1)};
    static const v16i hi[4] = {ROW16(HIJ, 8), ROW16(HIJ, 4), ROW16(HIJ, 2), ROW16(HIJ, 1)};
#undef LOJ
#undef HIJ
#undef ROW16
    int64_t w = PORT_MIN(ldd, 16), p = 0;
    __mmask16 keep = (__mmask16)((1u << w) - 1u);
    for (; p + 16 <= kc; p += 16) {
        v16fa x[16];
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) x[r] = r < rows ? *(const v16f *)(src + r * lds + p) : (v16fa){0};
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) {
            int h = 8 >> s;
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                if (i & h) continue;
                v16fa a = x[i], b = x[i + h];
                x[i] = __builtin_shuffle(a, b, lo[s]);
                x[i + h] = __builtin_shuffle(a, b, hi[s]);
            }
        }
        if (w == 16) {
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++) *(v16f *)(dst + (p + j) * ldd) = x[j];
        } else {
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++) _mm512_mask_storeu_ps(dst + (p + j) * ldd, keep, (__m512)x[j]);
        }
    }
    for (; p < kc; p++)
        for (int64_t r = 0; r < w; r++) dst[p * ldd + r] = r < rows ? src[r * lds + p] : 0.0f;
}

/* the AVX-512 configuration: C[0:m, j0:j0+nc] += alpha op(A) op(B), nc <= NC5 columns; compiled for AVX-512 so
 * that the packing loops' 16-float copies are single moves (at the baseline ISA GCC called memmove for each) */
__attribute__((target("avx512f,fma"))) static void gemm_chunk5(const port__bpack *bs, int ta, int tb, int64_t m,
                                                                 int64_t j0, int64_t nc, int64_t k, float alpha,
                                                                 const float *a, int64_t lda, const float *b,
                                                                 int64_t ldb, float *c, int64_t ldc, int ow) {
    float bp[KC5 * NC5] __attribute__((aligned(64)));
    float ap[MC5 * KC5] __attribute__((aligned(64)));
    gemm_blocks(mk5, tr_avx512, bs, MR5, NR5, KC5, MC5, bp, ap, ta, tb, m, j0, nc, k, alpha, a, lda, b, ldb, c,
                ldc, ow);
}
#endif

/* 0: portable kernel at the baseline ISA, 1: AVX2+FMA, 2: AVX-512 configuration */
static int g_isa = -1;
static int select_isa(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
    return 0;
}

static void sgemm_driver(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                         const float *b, int64_t ldb, const port__bpack *bs, float beta, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    if (g_isa < 0) g_isa = select_isa(); /* idempotent, benign race */
    /* C = beta*C (beta == 0 overwrites, ignoring NaNs in C like BLAS: the tiles of the first K block write C
     * without reading it; C is zeroed here only when no product is added) */
    int ow = beta == 0.0f && k > 0 && alpha != 0.0f;
    if (beta != 1.0f && !ow) {
        for (int64_t i = 0; i < m; i++) {
            float *row = c + i * ldc;
            if (beta == 0.0f)
                memset(row, 0, (size_t)n * sizeof(float));
            else
                for (int64_t j = 0; j < n; j++) row[j] *= beta;
        }
    }
    if (k <= 0 || alpha == 0.0f) return;
    int isa = g_isa;
    (void)isa; /* only read on x86 or with OpenMP */
    /* 2-D task grid: row blocks of MB rows x column chunks of NC columns. */
    int64_t NC = NCHUNK;
#ifdef PORT_GEMM_HAVE_AVX512
    if (isa == 2) NC = NC5;
#endif
    int64_t MB = 256;
#ifdef PORT_GEMM_HAVE_AVX512
    if (isa == 2) MB = MB5;
#endif
    int64_t nchunks = (n + NC - 1) / NC, mblocks = (m + MB - 1) / MB;
    int par = (double)m * (double)n * (double)k > 1e6;
#ifdef _OPENMP
    /* AVX-512 blocks are large: split them until every thread has a task (columns first, down to 64;
     * then rows, down to 36), so that a 256-column product is not one thread's work, and while fewer than 4
     * tasks per thread do not divide evenly among the threads (3 tasks on 2 threads ran at 2/3 of the rate) */
    int nt = port__in_parallel() ? 1 : omp_get_max_threads();
    while (isa == 2 && par && nt > 1 &&
           (nchunks * mblocks < nt || (nchunks * mblocks % nt && nchunks * mblocks < 4 * nt))) {
        if (NC > 64 && (n >= m || MB <= 36)) nchunks++;
        else if (MB > 36) mblocks++;
        else break;
        NC = (n + nchunks - 1) / nchunks;
        MB = (m + mblocks - 1) / mblocks;
    }
#endif
#ifdef PORT_GEMM_HAVE_AVX512
    if (isa == 2) { /* even blocks (576 columns: 2 x 288, not 512 + 64), whole micro tiles */
        NC = ((n + nchunks - 1) / nchunks + NR5 - 1) / NR5 * NR5;
        MB = ((m + mblocks - 1) / mblocks + MR5 - 1) / MR5 * MR5;
        nchunks = (n + NC - 1) / NC;
        mblocks = (m + MB - 1) / MB;
    }
#endif
    int64_t ntasks = nchunks * mblocks;
    par = par && ntasks > 1;
    (void)par;   /* read by the OpenMP pragma only */
#pragma omp parallel for schedule(dynamic, 1) if (par && nt > 1)
    for (int64_t t = 0; t < ntasks; t++) {
        int64_t i0 = (t / nchunks) * MB, j0 = (t % nchunks) * NC;
        const float *a0 = ta ? a + i0 : a + i0 * lda;
        int64_t mb = PORT_MIN(MB, m - i0), nc = PORT_MIN(NC, n - j0);
#ifdef PORT_GEMM_HAVE_AVX512
        if (isa == 2) {
            gemm_chunk5(bs, ta, tb, mb, j0, nc, k, alpha, a0, lda, b, ldb, c + i0 * ldc, ldc, ow);
            continue;
        }
        if (isa == 1) {
            gemm_chunk(mk_avx2, bs, ta, tb, mb, j0, nc, k, alpha, a0, lda, b, ldb, c + i0 * ldc, ldc, ow);
            continue;
        }
#endif
        gemm_chunk(mk_generic, bs, ta, tb, mb, j0, nc, k, alpha, a0, lda, b, ldb, c + i0 * ldc, ldc, ow);
    }
}

void port__sgemm_vendored(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                          const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    if (port__gemm_skinny(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return; /* narrow: gemm_skinny.c */
    sgemm_driver(ta, tb, m, n, k, alpha, a, lda, b, ldb, NULL, beta, c, ldc);
}

void port__sgemm_vendored_bpack(int ta, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                                const port__bpack *bs, float beta, float *c, int64_t ldc) {
    sgemm_driver(ta, 0, m, n, k, alpha, a, lda, NULL, 0, bs, beta, c, ldc);
}
