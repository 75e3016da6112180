/* Private helpers shared by the kernel sources (not part of the ABI). */
#ifndef PORT_INTERNAL_H
#define PORT_INTERNAL_H
#include "port_kernels.h"
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif


#define PORT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define PORT_MAX(a, b) ((a) > (b) ? (a) : (b))
#define PORT_CHECK(cond, code) \
    do {                       \
        if (!(cond)) return (code); \
    } while (0)
#define PORT_NOTNULL(ptr) PORT_CHECK((ptr) != NULL, PORT_ERR_NULL)

/* Only parallelise loops with at least this much work (elements). */
#define PORT_PAR_MIN 32768
/* ... or this many multiply-adds (direct depthwise loops: ~100 us on one core).  A parallel region costs a few
 * us on a quiet machine but up to a scheduler slice (ms) when another process holds a core and the region
 * waits for a descheduled worker: small kernels stay on one thread. */
#define PORT_PAR_MIN_MACS (8 * PORT_PAR_MIN)
/* Split a BLAS GEMM over the OpenMP threads only above this many MACs. */
#define PORT_GEMM_PAR_MIN 1048576.0

/* Whether the caller runs inside a parallel region, active or not: a kernel there must not open one of its own.
 * (Inside an inactive region -- an `if` clause that came out false -- omp_in_parallel() is 0, and a nested region
 * opened there gets a fresh team of threads each time: a linear layer at batch 1 took 22 ms instead of 0.2.) */
static inline int port__in_parallel(void) {
#ifdef _OPENMP
    return omp_get_level() > 0;
#else
    return 0;
#endif
}

/* RMS norm's arithmetic (normpool.c): one row's rstd, and y = x rstd gamma (gamma may be NULL) */
float port__rmsnorm_rstd(const float *xr, int64_t d, float eps);
void port__rmsnorm_row(float *yr, const float *xr, float rs, const float *gamma, int64_t d);

/* Run-time ISA dispatch for element-wise and stencil loops (GCC's target_clones: an ifunc picks the AVX-512, AVX2 or
 * baseline build of the function when the library loads).  With -std=c11 there is no FMA contraction, so every
 * clone performs the same IEEE operations per element and gives the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) && \
    !defined(PORT_NO_TARGET_CLONES)
#define PORT_ISA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PORT_ISA_CLONES
#endif
/* Reductions in PORT_LANES = 8 independent partial sums (element q into lane q % 8), combined pairwise at the
 * end: a single running sum is a serial chain of dependent adds that the compiler may not vectorise (it would
 * reorder float adds).  The lanes are two 4-float vectors (GCC/Clang vector extensions: SSE / NEON registers where
 * the target has them, scalar code where it does not); written as an array of 8 floats, GCC's vectoriser
 * shuffled them through scalar adds, 3x slower on 8x8 maps.  The same operations per lane in the same order
 * either way, so the same bits. */
#define PORT_LANES 8
typedef float port_v4f __attribute__((vector_size(16)));
typedef int32_t port_v4i __attribute__((vector_size(16)));
static inline port_v4f port_ld4(const float *p) {
    port_v4f r;
    memcpy(&r, p, sizeof r);
    return r;
}
static inline port_v4f port_splat4(float x) { return (port_v4f){x, x, x, x}; }
/* lanes 0-3 in lo, 4-7 in hi, combined ((0+1)+(2+3)) + ((4+5)+(6+7)) */
static inline float port_hsum8(port_v4f lo, port_v4f hi) {
    return ((lo[0] + lo[1]) + (lo[2] + lo[3])) + ((hi[0] + hi[1]) + (hi[2] + hi[3]));
}
/* v where mask (a vector comparison's all-ones / zero lanes) is zero, +0.0f where it is all-ones */
static inline port_v4f port_zero_where(port_v4f v, port_v4i mask) {
    port_v4i b;
    memcpy(&b, &v, sizeof b);
    b &= ~mask;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* A helper that must be compiled into its caller's ISA clone (a static inline one left out of line is built for
 * the baseline ISA, where 16-float vectors are emulated). */
#if defined(__GNUC__)
#define PORT_ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define PORT_ALWAYS_INLINE static inline
#endif
/* 16-float vectors (GCC/Clang vector extensions: one AVX-512 register, two AVX or four SSE/NEON registers, scalar
 * code elsewhere) for the per-channel and per-row loops (norm.c, transformer.c).  The same operations per lane in
 * the same order on every ISA (no FMA contraction under -std=c11), so the same bits; PORT_ISA_CLONES only widens
 * the registers. */
typedef float port_v16 __attribute__((vector_size(64)));
typedef int32_t port_i16 __attribute__((vector_size(64)));
typedef float port_v8 __attribute__((vector_size(32)));
typedef int32_t port_i8 __attribute__((vector_size(32)));
typedef float port_v16u __attribute__((vector_size(64), aligned(4), may_alias));
#define PORT_V16_W 16
/* loads and stores of 16 floats at any alignment, and the fold of two accumulators' lanes: 16 -> 8 -> 4 -> 2 -> 1
 * (lane i + lane i + h at each step).
 * Macros: a 64-byte vector passed by value changes the ABI between the ISA clones (GCC's -Wpsabi). */
#define PORT_V16_LD(p) (*(const port_v16u *)(p))
#define PORT_V16_ST(p, v) (*(port_v16u *)(p) = (v))
#define PORT_V16_SPLAT(x) ((port_v16){(x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x)})
/* v where mask (a comparison's all-ones / zero lanes) is zero, +0.0f where it is all-ones */
#define PORT_V16_ZERO_WHERE(v, mask) ((port_v16)((port_i16)(v) & ~(mask)))
#define PORT_V16_HSUM(out, a, b)                                            \
    do {                                                                    \
        port_v16 s_ = (a) + (b);                                            \
        port_v8 l8_, h8_;                                                   \
        memcpy(&l8_, &s_, sizeof l8_);                                      \
        memcpy(&h8_, (const char *)&s_ + sizeof l8_, sizeof h8_);           \
        port_v8 s8_ = l8_ + h8_;                                            \
        port_v4f l4_, h4_;                                                  \
        memcpy(&l4_, &s8_, sizeof l4_);                                     \
        memcpy(&h4_, (const char *)&s8_ + sizeof l4_, sizeof h4_);          \
        port_v4f s4_ = l4_ + h4_;                                           \
        (out) = (s4_[0] + s4_[2]) + (s4_[1] + s4_[3]);                      \
    } while (0)

/* db[j] += sum over the rows of dy[rows x cols]'s column j (linear.c): a fixed order (float sums of 32-row chunks,
 * added in double), the same bits at any thread count */
/* PORT's generator (rng.c): the integer threshold ceil(p 2^32) a draw is compared with (0 for p <= 0, 2^32 for
 * p >= 1), and keep[i] = (draw of element e0 + i >= thr) for i < n. */
uint64_t port__rng_threshold(double p);
void port__rng_keep(uint8_t *keep, int64_t n, uint64_t e0, uint64_t seed, uint64_t stream, uint64_t thr);
void port__colsum_acc(float *db, const float *dy, int64_t rows, int64_t cols);

/* Sum of a[0..n) and of (a[j] - m)^2 in 32 lanes (element q into lane q % 32: two vectors), combined by
 * PORT_V16_HSUM's fixed tree, then the tail (< 16) in order: a batch-norm segment (norm.c), a layer-norm or
 * softmax row (transformer.c).  Always inlined, so they run in their caller's ISA clone. */
PORT_ALWAYS_INLINE float port__v16_sum(const float *a, int64_t n) {
    port_v16 a0 = {0}, a1 = {0};
    int64_t j = 0;
    for (; j + 2 * PORT_V16_W <= n; j += 2 * PORT_V16_W) {
        a0 += PORT_V16_LD(a + j);
        a1 += PORT_V16_LD(a + j + PORT_V16_W);
    }
    if (j + PORT_V16_W <= n) {
        a0 += PORT_V16_LD(a + j);
        j += PORT_V16_W;
    }
    float s;
    PORT_V16_HSUM(s, a0, a1);
    for (; j < n; j++) s += a[j];
    return s;
}

PORT_ALWAYS_INLINE float port__v16_sqdev(const float *a, int64_t n, float m) {
    port_v16 a0 = {0}, a1 = {0}, vm = PORT_V16_SPLAT(m);
    int64_t j = 0;
    for (; j + 2 * PORT_V16_W <= n; j += 2 * PORT_V16_W) {
        port_v16 d0 = PORT_V16_LD(a + j) - vm, d1 = PORT_V16_LD(a + j + PORT_V16_W) - vm;
        a0 += d0 * d0;
        a1 += d1 * d1;
    }
    if (j + PORT_V16_W <= n) {
        port_v16 d0 = PORT_V16_LD(a + j) - vm;
        a0 += d0 * d0;
        j += PORT_V16_W;
    }
    float s;
    PORT_V16_HSUM(s, a0, a1);
    for (; j < n; j++) {
        float d = a[j] - m;
        s += d * d;
    }
    return s;
}

/* Softmax cross-entropy gradient rows (loss.c): dlogits[i] = (probs[i] - smoothed one-hot(labels[i])) * scale,
 * zero rows where labels[i] == ignore_index (-1: none, labels in [0, k)) */
void port__xent_grad_rows(float *dlogits, const float *probs, const int64_t *labels, int64_t n, int64_t k,
                          float scale, float label_smoothing, int64_t ignore_index);

/* GEMM dispatch (row-major), honouring the selected backend. Sizes must be
 * validated by the caller (fit in int32 for BLAS). */
/* Portable math (portmath.c): exp, log, integer power, e^x - 1, tanh, erf, erfc from +, -, *, / and exact
 * scalings by powers of two only, so that they give the same bits on every ISA and C library (glibc, newlib on a
 * Cortex-M, ...), which libm's expf / exp / tanh / erf do not promise.  Accuracy: exp about 1e-16 relative (before
 * port__expf's final rounding to float), log about 2 ulp of double, tanh / erf about 1e-15, erfc about 1e-13
 * relative: far inside float32 rounding.  The *_inline versions below are the same functions, branch-free so that
 * element-wise loops vectorise; the out-of-line ones in portmath.c call them (identical bits). */
float port__expf(float x);
double port__exp(double x);
double port__expm1(double x);
double port__tanh(double x);
double port__erf(double x);
double port__erfc(double x);
double port__log(double x);
double port__powi(double b, int64_t n);

#define PORT__LN2_HI 6.93147180369123816490e-01 /* ln 2, high part: k * LN2_HI is exact for |k| < 2^20 */
#define PORT__LN2_LO 1.90821492927058770002e-10
#define PORT__INV_LN2 1.44269504088896338700e+00
#define PORT__INF (__builtin_inff()) /* INFINITY without <math.h> (whose names some sources reuse) */

#if defined(__FLT_EVAL_METHOD__) && __FLT_EVAL_METHOD__ == 2
#error "portable math needs double arithmetic in double precision (x87: build with -mfpmath=sse)"
#endif
/* Round t (|t| < 2^50) to an integer k with the 1.5*2^52 shifter (round to nearest even; no float -> int
 * conversion, which does not vectorise): returns k as a double and sets *p2 = 2^k exactly, built from the
 * shifter's low bits (-1022 <= k <= 1023). */
static inline double port__round_pow2(double t, double *p2) {
    double sh = t + 6755399441055744.0;
    uint64_t b;
    memcpy(&b, &sh, sizeof b);
    b = (b + 1023) << 52; /* the low bits of sh hold k in two's complement */
    memcpy(p2, &b, sizeof b);
    return sh - 6755399441055744.0;
}

/* e^r, |r| <= ln2/2: Taylor to degree `deg` (12 or 13), Horner in double. */
static inline double port__exp_poly(double r, int deg) {
    double p = deg == 13 ? 1.0 / 6227020800.0 : 1.0 / 479001600.0;
    if (deg == 13) p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    return p;
}

/* float e^x: x = k ln2 + r (Cody-Waite), e^r in double, times 2^k (exact in double), one rounding to float.
 * (The same bits as an earlier ldexp-based version for every float input: checked exhaustively.) */
static inline float port__expf_inline(float xf) {
    float xc = xf > -104.0f ? xf : -104.0f; /* NaN -> -104, patched below */
    xc = xc < 88.73f ? xc : 88.73f;
    double x = xc, p2;
    double kd = port__round_pow2(x * PORT__INV_LN2, &p2);
    double r = (x - kd * PORT__LN2_HI) - kd * PORT__LN2_LO; /* |r| <= ln2/2 */
    float y = (float)(port__exp_poly(r, 12) * p2);
    y = xf > 88.73f ? PORT__INF : y;
    y = xf < -104.0f ? 0.0f : y;
    return xf != xf ? xf : y;
}

/* e^t in float32 arithmetic for t <= 88 (softmax's shifted scores, GELU's density term; neither needs libm-grade
 * accuracy): t = k ln2 + r (Cody-Waite in float), |r| <= ln2/2, Cephes' degree-7 polynomial for e^r, 2^k built in
 * the exponent bits; 0 below -87 (FLT_MIN is e^-87.3: no subnormal results), NaN for NaN.  About 1-2 float ulps
 * against 0.5 for port__expf_inline, in 16-lane float vectors where that one runs in 8-lane double: 3-4x faster.
 * Round-to-nearest of k by the 1.5 * 2^23 shift, so it vectorises without SSE4.1; branch-free. */
static inline float port__expf_f32(float t) {
    float tc = t > -87.0f ? t : -87.0f; /* NaN -> -87, patched below */
    tc = tc < 88.0f ? tc : 88.0f;
    float kf = (tc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = (tc - kf * 0.693359375f) + kf * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float e = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)kf + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    float y = t < -87.0f ? 0.0f : e * scale;
    return t != t ? t : y;
}

/* double e^x; 2^k applied in two exact halves (k = k1 + k2) so that subnormal results round once. */
static inline double port__exp_inline(double x0) {
    double x = x0 > -745.2 ? x0 : -745.2; /* NaN -> -745.2, patched below */
    x = x < 709.782712893384 ? x : 709.782712893384;
    double p1, p2;
    double kd = port__round_pow2(x * PORT__INV_LN2, &p1);
    double k1 = port__round_pow2(0.5 * kd, &p1);
    port__round_pow2(kd - k1, &p2);
    double r = (x - kd * PORT__LN2_HI) - kd * PORT__LN2_LO;
    double y = (port__exp_poly(r, 13) * p1) * p2;
    y = x0 > 709.782712893384 ? PORT__INF : y;
    y = x0 < -745.2 ? 0.0 : y;
    return x0 != x0 ? x0 : y;
}

/* e^x - 1: Taylor to degree 15 for |x| < 0.35 (no cancellation), e^x - 1 elsewhere (|e^x - 1| >= 0.29 there:
 * the subtraction loses < 2 bits). */
static inline double port__expm1_inline(double x) {
    double xs = x > -0.35 ? x : -0.35;
    xs = xs < 0.35 ? xs : 0.35;
    double p = 1.0 / 1307674368000.0;
    p = p * xs + 1.0 / 87178291200.0;
    p = p * xs + 1.0 / 6227020800.0;
    p = p * xs + 1.0 / 479001600.0;
    p = p * xs + 1.0 / 39916800.0;
    p = p * xs + 1.0 / 3628800.0;
    p = p * xs + 1.0 / 362880.0;
    p = p * xs + 1.0 / 40320.0;
    p = p * xs + 1.0 / 5040.0;
    p = p * xs + 1.0 / 720.0;
    p = p * xs + 1.0 / 120.0;
    p = p * xs + 1.0 / 24.0;
    p = p * xs + 1.0 / 6.0;
    p = p * xs + 0.5;
    p = p * xs + 1.0;
    double small = p * xs, big = port__exp_inline(x) - 1.0;
    return (x > -0.35 && x < 0.35) ? small : big;   /* NaN: big is NaN */
}

/* tanh = sign(x) (e^{2|x|} - 1) / (e^{2|x|} + 1) with e^{2|x|} - 1 from port__expm1 (exact near 0); 1 beyond 20. */
static inline double port__tanh_inline(double x) {
    double a = x < 0 ? -x : x;
    double e = port__expm1_inline(2.0 * a); /* no clamp of a here: GCC 12 then fails to vectorise callers */
    double t = e / (e + 2.0);               /* inf / inf = NaN for a > 354: replaced by 1 */
    t = a > 20.0 ? 1.0 : t;
    t = x < 0 ? -t : t;
    return x != x ? x : t;
}

/* erfc: for z = |x| <= 27.3, erfc z = t exp(P(t) - z^2), t = 2/(2+z), P a degree-20 Chebyshev series on
 * t in [2/29.3, 1] (fitted to log(erfc(z)/t) + z^2 in 60-digit arithmetic; relative error about 1e-13; the
 * exp argument is exact but for the rounding of z^2); 0 beyond 27.3; erfc(-z) = 2 - erfc(z). */
static inline double port__erfc_inline(double x) {
    static const double c[21] = {
        -6.11161927876790245e-01, 6.05742899036397775e-01, 1.39511368549415111e-02,
        -8.27857495495911387e-03, -5.45530670381142650e-04, 2.89388756236579070e-04,
        1.58532252160018356e-05, -1.38665673470759464e-05, -1.42737763114819592e-08,
        7.21210554623779873e-07, -5.75110065841101616e-08, -3.47366466287490313e-08,
        6.78528012535825151e-09, 1.23832941513791208e-09, -5.39597071032470664e-10,
        -2.98040843117013580e-12, 3.16046166095718840e-11, -4.31948203521748684e-12,
        -1.15691941841827649e-12, 4.22937513814121191e-13, -9.15110537166738903e-15};
    double z = x < 0 ? -x : x;
    double zc = z < 27.3 ? z : 27.3; /* NaN -> 27.3, patched below */
    double t = 2.0 / (2.0 + zc);
    double u = (2.0 * t - 1.0682593856655290102) * 1.0732600732600732601, u2 = 2.0 * u;
    /* Clenshaw, unrolled (a loop here would keep element-wise callers from vectorising) */
    double b1 = c[20], b2 = 0.0, b0;
#define PORT__CLENSHAW(j) b0 = u2 * b1 - b2 + c[j]; b2 = b1; b1 = b0;
    PORT__CLENSHAW(19) PORT__CLENSHAW(18) PORT__CLENSHAW(17) PORT__CLENSHAW(16) PORT__CLENSHAW(15)
    PORT__CLENSHAW(14) PORT__CLENSHAW(13) PORT__CLENSHAW(12) PORT__CLENSHAW(11) PORT__CLENSHAW(10)
    PORT__CLENSHAW(9) PORT__CLENSHAW(8) PORT__CLENSHAW(7) PORT__CLENSHAW(6) PORT__CLENSHAW(5)
    PORT__CLENSHAW(4) PORT__CLENSHAW(3) PORT__CLENSHAW(2) PORT__CLENSHAW(1)
#undef PORT__CLENSHAW
    double pv = u * b1 - b2 + c[0];
    double r = t * port__exp_inline(pv - zc * zc);
    r = z > 27.3 ? 0.0 : r;
    r = x < 0 ? 2.0 - r : r;
    return x != x ? x : r;
}

/* erf: odd Taylor series to x^25 for |x| < 0.5 (terms below 1e-17), 1 - erfc(|x|) beyond (erfc(0.5) = 0.48:
 * the subtraction loses < 1 bit). */
static inline double port__erf_inline(double x) {
    double a = x < 0 ? -x : x;
    double as = a < 0.5 ? a : 0.5, a2 = as * as;
    /* sum_n (-1)^n a^(2n+1) / (n! (2n+1)), n = 0..12, Horner in a^2 */
    double s = 1.0 / (479001600.0 * 25.0);
    s = s * a2 - 1.0 / (39916800.0 * 23.0);
    s = s * a2 + 1.0 / (3628800.0 * 21.0);
    s = s * a2 - 1.0 / (362880.0 * 19.0);
    s = s * a2 + 1.0 / (40320.0 * 17.0);
    s = s * a2 - 1.0 / (5040.0 * 15.0);
    s = s * a2 + 1.0 / (720.0 * 13.0);
    s = s * a2 - 1.0 / (120.0 * 11.0);
    s = s * a2 + 1.0 / (24.0 * 9.0);
    s = s * a2 - 1.0 / (6.0 * 7.0);
    s = s * a2 + 1.0 / (2.0 * 5.0);
    s = s * a2 - 1.0 / 3.0;
    s = s * a2 + 1.0;
    double small = 1.12837916709551257390 * as * s; /* 2/sqrt(pi) */
    double big = 1.0 - port__erfc_inline(a);
    double r = a < 0.5 ? small : big;
    r = x < 0 ? -r : r;
    return x != x ? x : r;
}

void port__gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* Vendored blocked SGEMM. */
/* gemm_skinny.c: narrow products on AVX-512 (NN / TN with n <= 64, NT with k <= 64); returns 0 (and computes
 * nothing) where it does not take the shape, so port__gemm runs its other GEMMs */
int port__gemm_skinny_pick(int ta, int tb, int64_t m, int64_t n, int64_t k);
int port__gemm_skinny(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                      const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
void port__sgemm_vendored(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                          float *c, int64_t ldc);
/* A B operand that exists only as a packing function (an im2col built while the GEMM packs it):
 * pack(ctx, bp, nr, p0, kc, j0, nc) writes op(B)[p0:p0+kc, j0:j0+nc] as the vendored GEMM's panels,
 * bp[jr * kc + p * nr + c] = op(B)[p0 + p][j0 + jr + c] for panels jr = 0, nr, 2nr, .. and c < nr, zero
 * where j0 + jr + c >= j0 + nc.  nc <= 512.  Called from several threads at once for different blocks. */
typedef struct {
    void (*pack)(const void *ctx, float *bp, int64_t nr, int64_t p0, int64_t kc, int64_t j0, int64_t nc);
    const void *ctx;
} port__bpack;
/* C = alpha op(A) B + beta C with the vendored GEMM, B given by its packing function (port__gemm_bpack_ok). */
void port__sgemm_vendored_bpack(int ta, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                                const port__bpack *bs, float beta, float *c, int64_t ldc);
/* The backend port__gemm runs for these shapes (PORT_GEMM_BLAS or PORT_GEMM_VENDORED, never AUTO) */
int port__gemm_pick(int ta, int tb, int64_t m, int64_t n, int64_t k);
/* 1 when port__gemm runs the vendored GEMM on op(A)[m x k] B[k x n], so port__sgemm_vendored_bpack computes what it
 * would */
int port__gemm_bpack_ok(int64_t m, int64_t n, int64_t k);

/* im2col of one image xg and one group into cols [K, T] (row stride T): rows [k0, k1) of K and the output
 * tile's rows [r0, r1) -- output rows oh0+r0 .. oh0+r1-1, columns [ow0, ow0+tw) -- written to columns
 * [r0*tw, r1*tw).  Threads over K outside a parallel region when the part is large enough. */
void port__im2col_part(float *cols, int64_t T, const float *xg, const port_conv2d_params *p, int64_t k0,
                       int64_t k1, int64_t oh0, int64_t r0, int64_t r1, int64_t ow0, int64_t tw);
/* dx += col2im(cols) over the same tile. */
void port__col2im_tile(float *dx, const float *cols, int64_t cin, int64_t h, int64_t w,
                       int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                       int64_t oh0, int64_t th, int64_t ow0, int64_t tw);

/* Resolve PORT_CONV_AUTO; returns the algo or -1 when not applicable. */
int port__conv_resolve_algo(const port_conv2d_params *p, int algo);
int port__conv_is_depthwise(const port_conv2d_params *p);
int port__conv_is_pointwise(const port_conv2d_params *p);

static inline int port__ranges_overlap(const void *a, size_t abytes, const void *b, size_t bbytes) {
    const char *pa = (const char *)a, *pb = (const char *)b;
    return a && b && pa < pb + bbytes && pb < pa + abytes;
}


/* Unchecked conv implementations (params validated, algo resolved). */
void port__conv_fwd(float *y, const float *x, const float *w, const float *b,
                    const port_conv2d_params *p, int algo, float *ws);
void port__conv_bwd_in(float *dx, const float *dy, const float *w, const port_conv2d_params *p,
                       int algo, float *ws);
/* overwrite: dw (and db) = the gradient (their old contents never read), else += */
void port__conv_bwd_w(float *dw, float *db, const float *dy, const float *x,
                      const port_conv2d_params *p, int algo, float *ws, int overwrite);
/* Winograd F(2x2,3x3) (kernels/src/winograd.c); ws holds port__conv_winograd_ws_floats(p) floats. */
int port__conv_winograd_legal(const port_conv2d_params *p);
int port__conv_winograd_pays(const port_conv2d_params *p); /* PORT_CONV_AUTO's choice */
size_t port__conv_winograd_ws_floats(const port_conv2d_params *p);
void port__conv_winograd_fwd(float *y, const float *x, const float *w, const float *b,
                             const port_conv2d_params *p, float *ws);
void port__conv_winograd_bwd_in(float *dx, const float *dy, const float *w, const port_conv2d_params *p,
                                float *ws);
void port__conv_winograd_bwd_w(float *dw, const float *dy, const float *x, const port_conv2d_params *p,
                               float *ws);
port_status port__conv_validate(const port_conv2d_params *p, int *algo, void *ws,
                                size_t ws_bytes);

/* Batch-norm cores (norm.c).  relu != 0 fuses a following ReLU. */
void port__bn_train_forward(float *y, float *save_mean, float *save_invstd, float *running_mean,
                            float *running_var, const float *x, const float *gamma,
                            const float *beta, int64_t n, int64_t c, int64_t hw, float eps,
                            float momentum, int relu);
/* dx (may be NULL) overwritten; dgamma/dbeta (may be NULL) accumulate. */
void port__bn_train_backward(float *dx, float *dgamma, float *dbeta, const float *dy,
                             const float *x, const float *gamma, const float *beta,
                             const float *mean, const float *invstd, int64_t n, int64_t c,
                             int64_t hw, int relu);
/* broadcasting (shape.c, mask.c) */
/* strides (in elements) of an operand broadcast along the bits of bcast; its element count in *n */
static inline int port__bstrides(int64_t rank, int64_t bcast, const int64_t *dims, int64_t *s, int64_t *n, int64_t *ny) {
    if (rank < 1 || rank > PORT_BINARY_MAX_RANK || bcast < 0 || (bcast >> rank)) return 0;
    *n = 1, *ny = 1;
    for (int64_t i = rank - 1; i >= 0; i--) {
        if (dims[i] < 1 || *ny > (INT64_C(1) << 40) / dims[i]) return 0;
        int b = (int)((bcast >> i) & 1);
        s[i] = b ? 0 : *n;
        *n *= b ? 1 : dims[i];
        *ny *= dims[i];
    }
    return 1;
}

/* the offset, in an operand of strides s (0 along its broadcast dims), of element e of the full shape dims */
static inline int64_t port__offset_of(int64_t e, int64_t rank, const int64_t *dims, const int64_t *s) {
    int64_t o = 0;
    for (int64_t i = rank - 1; i >= 0; i--) {
        o += (e % dims[i]) * s[i];
        e /= dims[i];
    }
    return o;
}

#endif
