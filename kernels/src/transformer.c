/* Transformer kernels: embedding, layer norm, GELU, tanh, scaling, softmax, batched GEMM, permute, broadcast
 * add and its row sums, mean over a middle dim, integer helpers, scaled dot-product attention (plain: score
 * matrices through GEMMs; tiled: FlashAttention-style online softmax) and token-level cross-entropy with an
 * ignore index.
 *
 * Determinism: every reduction runs in a fixed order in double (a row: 8 partial sums by index mod 8, combined
 * pairwise; a column: rows in index order); OpenMP splits independent outputs only (rows, column blocks, attention
 * (batch*head) slices and query blocks), so the results do not depend on the thread count (GEMMs on the BLAS
 * backend aside, see port_kernels.h).  exp / log / tanh / erfc are the portable ones of portmath.c (their
 * branch-free inline forms in internal.h, so that element-wise loops vectorise): the same bits with every C
 * library. */
#include "internal.h"

#include <limits.h>
#include <math.h>

/* Column block of the column-parallel reductions (a cache line of floats x 4); per-block double accumulators
 * live on the stack (1 KiB). */
#define COLB 64

static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* sum of n floats in double: 8 partial sums (element j into lane j % 8) combined pairwise, then the tail; a
 * fixed order (vectorises, unlike one running sum) */
static inline double sum_f64(const float *a, int64_t n) {
    double acc[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[j + l];
    double s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; j < n; j++) s += a[j];
    return s;
}

static inline float max_f(const float *a, int64_t n) {
    float m = a[0];
    for (int64_t j = 1; j < n; j++) m = a[j] > m ? a[j] : m;
    return m;
}

/* In place: row[j] = exp(row[j] - mx) for j < n (-inf entries give 0); returns their sum. */
PORT_ISA_CLONES static double exp_row(float *row, int64_t n, float mx) {
    for (int64_t j = 0; j < n; j++) row[j] = port__expf_inline(row[j] - mx);
    return sum_f64(row, n);
}

/* y[j] = exp(x[j] - m) for j < n; y may be x (each x[j] is read before y[j] is written). */
PORT_ISA_CLONES static void exp_shift(float *y, const float *x, int64_t n, float m) {
    for (int64_t j = 0; j < n; j++) y[j] = port__expf_inline(x[j] - m);
}

/* Mask row entries j0 + c (c < n) that query i may not see: keys past lim (causal) and keys with km == 0. */
static inline void mask_row(float *row, int64_t n, int64_t j0, int64_t lim, const uint8_t *km) {
    int64_t vis = lim - j0 + 1;   /* entries c >= vis are past the causal limit */
    for (int64_t c = vis < 0 ? 0 : vis; c < n; c++) row[c] = -PORT__INF;
    if (km) {
        const uint8_t *kr = km + j0;
        for (int64_t c = 0; c < n; c++) row[c] = kr[c] ? row[c] : -PORT__INF;
    }
}

/* ------------------------------------------------------------------ */
/* Embedding                                                           */
/* ------------------------------------------------------------------ */
port_status port_embedding_forward(float *y, const int64_t *idx, const float *w, int64_t n, int64_t v,
                                   int64_t d) {
    PORT_NOTNULL(y); PORT_NOTNULL(idx); PORT_NOTNULL(w);
    PORT_CHECK(n >= 0 && v > 0 && d > 0, PORT_ERR_SHAPE);
    PORT_CHECK(!port__ranges_overlap(y, (size_t)(n * d) * sizeof(float), w, (size_t)(v * d) * sizeof(float)),
               PORT_ERR_ALIAS);
    for (int64_t i = 0; i < n; i++) PORT_CHECK(idx[i] >= 0 && idx[i] < v, PORT_ERR_ARG);
#pragma omp parallel for schedule(static) if (n * d > PORT_PAR_MIN)
    for (int64_t i = 0; i < n; i++) memcpy(y + i * d, w + idx[i] * d, (size_t)d * sizeof(float));
    return PORT_OK;
}

port_status port_embedding_backward_weight(float *dw, const float *dy, const int64_t *idx, int64_t n, int64_t v,
                                           int64_t d) {
    PORT_NOTNULL(dw); PORT_NOTNULL(dy); PORT_NOTNULL(idx);
    PORT_CHECK(n >= 0 && v > 0 && d > 0, PORT_ERR_SHAPE);
    for (int64_t i = 0; i < n; i++) PORT_CHECK(idx[i] >= 0 && idx[i] < v, PORT_ERR_ARG);
    /* column blocks in parallel; within a block the rows are added in index order i = 0..n-1 */
    int64_t nb = ceil_div(d, 16);
#pragma omp parallel for schedule(static) if (n * d > PORT_PAR_MIN && nb > 1)
    for (int64_t cbk = 0; cbk < nb; cbk++) {
        int64_t j0 = cbk * 16, j1 = PORT_MIN(d, j0 + 16);
        for (int64_t i = 0; i < n; i++) {
            float *row = dw + idx[i] * d;
            const float *g = dy + i * d;
            for (int64_t j = j0; j < j1; j++) row[j] += g[j];
        }
    }
    return PORT_OK;
}

/* ------------------------------------------------------------------ */
/* Layer norm over the last dim                                        */
/* ------------------------------------------------------------------ */
port_status port_layernorm_forward(float *y, float *stats, const float *x, const float *gamma, const float *beta,
                                   int64_t rows, int64_t d, float eps) {
    PORT_NOTNULL(y); PORT_NOTNULL(stats); PORT_NOTNULL(x);
    PORT_CHECK(rows > 0 && d > 0, PORT_ERR_SHAPE);
    PORT_CHECK(eps >= 0.0f && isfinite(eps), PORT_ERR_ARG);
#pragma omp parallel for schedule(static) if (rows * d > PORT_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        double s = 0.0;
        for (int64_t j = 0; j < d; j++) s += xr[j];
        double mean = s / (double)d, v = 0.0;
        for (int64_t j = 0; j < d; j++) {
            double t = (double)xr[j] - mean;
            v += t * t;
        }
        float fm = (float)mean, rstd = (float)(1.0 / sqrt(v / (double)d + (double)eps));
        stats[r] = fm;
        stats[rows + r] = rstd;
        for (int64_t j = 0; j < d; j++) {
            float t = (xr[j] - fm) * rstd;
            if (gamma) t *= gamma[j];
            if (beta) t += beta[j];
            yr[j] = t;
        }
    }
    return PORT_OK;
}

port_status port_layernorm_backward_input(float *dx, const float *dy, const float *x, const float *stats,
                                          const float *gamma, int64_t rows, int64_t d) {
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(stats);
    PORT_CHECK(rows > 0 && d > 0, PORT_ERR_SHAPE);
#pragma omp parallel for schedule(static) if (rows * d > PORT_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *gr = dy + r * d;
        float *dr = dx + r * d;
        float mean = stats[r], rstd = stats[rows + r];
        double sg = 0.0, sgx = 0.0;   /* sum g, sum g*xhat with g = dy*gamma */
        for (int64_t j = 0; j < d; j++) {
            float g = gamma ? gr[j] * gamma[j] : gr[j];
            float xh = (xr[j] - mean) * rstd;
            sg += g;
            sgx += (double)g * xh;
        }
        float a = (float)(sg / (double)d), b = (float)(sgx / (double)d);
        for (int64_t j = 0; j < d; j++) {
            float g = gamma ? gr[j] * gamma[j] : gr[j];
            float xh = (xr[j] - mean) * rstd;
            dr[j] = rstd * (g - a - xh * b);
        }
    }
    return PORT_OK;
}

port_status port_layernorm_backward_weight(float *dgamma, float *dbeta, const float *dy, const float *x,
                                           const float *stats, int64_t rows, int64_t d) {
    PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(stats);
    PORT_CHECK(dgamma || dbeta, PORT_ERR_NULL);
    PORT_CHECK(rows > 0 && d > 0, PORT_ERR_SHAPE);
    int64_t nb = ceil_div(d, COLB);
#pragma omp parallel for schedule(static) if (rows * d > PORT_PAR_MIN && nb > 1)
    for (int64_t cbk = 0; cbk < nb; cbk++) {
        int64_t j0 = cbk * COLB, w = PORT_MIN(COLB, d - j0);
        double ag[COLB] = {0}, ab[COLB] = {0};
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * d + j0, *gr = dy + r * d + j0;
            float mean = stats[r], rstd = stats[rows + r];
            for (int64_t j = 0; j < w; j++) {
                ag[j] += (double)gr[j] * ((xr[j] - mean) * rstd);
                ab[j] += gr[j];
            }
        }
        for (int64_t j = 0; j < w; j++) {
            if (dgamma) dgamma[j0 + j] += (float)ag[j];
            if (dbeta) dbeta[j0 + j] += (float)ab[j];
        }
    }
    return PORT_OK;
}

/* ------------------------------------------------------------------ */
/* GELU, tanh, scale                                                   */
/* ------------------------------------------------------------------ */
#define SQRT1_2 0.70710678118654752440      /* 1/sqrt(2) */
#define INV_SQRT_2PI 0.39894228040143267794 /* 1/sqrt(2 pi) */
#define GELU_K 0.79788456080286535588       /* sqrt(2/pi) */
#define GELU_C 0.044715

/* sigmoid(2u) = (1 + tanh u)/2 and 1 - sigmoid(2u), without overflow or cancellation in either (branch-free) */
static inline void sig2(double u, double *s, double *one_minus_s) {
    double e = port__exp_inline(u >= 0 ? -2.0 * u : 2.0 * u), a = 1.0 / (1.0 + e), b = e / (1.0 + e);
    *s = u >= 0 ? a : b;
    *one_minus_s = u >= 0 ? b : a;
}

#define ELT_PAR(count) if ((count) > PORT_PAR_MIN / 8)

#define ELT_BLOCK 4096   /* elements per parallel chunk */

/* erf for the exact GELU as an odd rational function z P(z^2) / Q(z^2) in float32 (a minimax fit for float,
 * the same coefficients as Eigen's and XLA's fast erf: within a few float32 ulps on [-4, 4], +-1 beyond, where
 * erf is 1 to float precision). Branch-free, so the element-wise loops vectorise. */
static inline float gelu_erff(float x) {
    float z = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x), z2 = z * z;
    float p = -2.72614225801306e-10f;
    p = p * z2 + 2.77068142495902e-08f;
    p = p * z2 - 2.10102402082508e-06f;
    p = p * z2 - 5.69250639462346e-05f;
    p = p * z2 - 7.34990630326855e-04f;
    p = p * z2 - 2.95459980854025e-03f;
    p = p * z2 - 1.60960333262415e-02f;
    float q = -1.45660718464996e-05f;
    q = q * z2 - 2.13374055278905e-04f;
    q = q * z2 - 1.68282697438203e-03f;
    q = q * z2 - 7.37332916720468e-03f;
    q = q * z2 - 1.42647390514189e-02f;
    return z * p / q;
}

/* e^t for t <= 0 in float32 (GELU's density term e^(-x^2/2)): t = k ln2 + r, |r| <= ln2/2, a degree-7 polynomial
 * for e^r (Cephes' expf coefficients), 2^k built in the exponent bits; 0 below -87 (the density times x is
 * below 1e-37 there). Round-to-nearest of k by the 1.5 * 2^23 shift, so it vectorises without SSE4.1. */
static inline float gelu_expf_neg(float t) {
    float tc = t < -87.0f ? -87.0f : t;
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
    return t < -87.0f ? 0.0f : e * scale;
}

PORT_ISA_CLONES static void gelu_erf_forward_block(float *restrict y, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + gelu_erff(v * (float)SQRT1_2));   /* x Phi(x) */
    }
}

/* dx may alias dy (in place): no restrict on them */
PORT_ISA_CLONES static void gelu_erf_backward_block(float *dx, const float *dy, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float g = 0.5f * (1.0f + gelu_erff(v * (float)SQRT1_2)) +
                  v * (float)INV_SQRT_2PI * gelu_expf_neg(-0.5f * v * v);   /* Phi(x) + x phi(x) */
        dx[i] = dy[i] * g;
    }
}

port_status port_gelu_forward(float *y, const float *x, int64_t count, int approximate) {
    PORT_NOTNULL(y); PORT_NOTNULL(x);
    PORT_CHECK(count >= 0, PORT_ERR_SHAPE);
    PORT_CHECK(approximate == 0 || approximate == 1, PORT_ERR_ARG);
    PORT_CHECK(!port__ranges_overlap(y, (size_t)count * sizeof(float), x, (size_t)count * sizeof(float)),
               PORT_ERR_ALIAS);
    if (approximate) {
#pragma omp parallel for schedule(static) ELT_PAR(count)
        for (int64_t i = 0; i < count; i++) {
            double v = x[i], s, oms;
            sig2(GELU_K * (v + GELU_C * v * v * v), &s, &oms);
            y[i] = (float)(v * s);   /* 0.5 x (1 + tanh u) = x sigmoid(2u) */
        }
    } else {
        int64_t nb = (count + ELT_BLOCK - 1) / ELT_BLOCK;
#pragma omp parallel for schedule(static) ELT_PAR(count)
        for (int64_t b = 0; b < nb; b++) {
            int64_t i0 = b * ELT_BLOCK, n = count - i0 < ELT_BLOCK ? count - i0 : ELT_BLOCK;
            gelu_erf_forward_block(y + i0, x + i0, n);
        }
    }
    return PORT_OK;
}

port_status port_gelu_backward(float *dx, const float *dy, const float *x, int64_t count, int approximate) {
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(x);
    PORT_CHECK(count >= 0, PORT_ERR_SHAPE);
    PORT_CHECK(approximate == 0 || approximate == 1, PORT_ERR_ARG);
    if (approximate) {
#pragma omp parallel for schedule(static) ELT_PAR(count)
        for (int64_t i = 0; i < count; i++) {
            double v = x[i], s, oms;
            sig2(GELU_K * (v + GELU_C * v * v * v), &s, &oms);
            /* d/dx [x s(2u)] = s + x * 2 s (1-s) * u', u' = K (1 + 3 C x^2): 1 - s without cancellation */
            double g = s + v * 2.0 * s * oms * GELU_K * (1.0 + 3.0 * GELU_C * v * v);
            dx[i] = (float)(dy[i] * g);
        }
    } else {
        int64_t nb = (count + ELT_BLOCK - 1) / ELT_BLOCK;
#pragma omp parallel for schedule(static) ELT_PAR(count)
        for (int64_t b = 0; b < nb; b++) {
            int64_t i0 = b * ELT_BLOCK, n = count - i0 < ELT_BLOCK ? count - i0 : ELT_BLOCK;
            gelu_erf_backward_block(dx + i0, dy + i0, x + i0, n);
        }
    }
    return PORT_OK;
}

port_status port_tanh_forward(float *y, const float *x, int64_t count) {
    PORT_NOTNULL(y); PORT_NOTNULL(x);
    PORT_CHECK(count >= 0, PORT_ERR_SHAPE);
#pragma omp parallel for schedule(static) ELT_PAR(count)
    for (int64_t i = 0; i < count; i++) {
        double v = x[i];
        y[i] = (float)port__tanh_inline(v);
    }
    return PORT_OK;
}

port_status port_tanh_backward(float *dx, const float *dy, const float *y, int64_t count) {
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(y);
    PORT_CHECK(count >= 0, PORT_ERR_SHAPE);
#pragma omp parallel for simd schedule(static) if (count > PORT_PAR_MIN)
    for (int64_t i = 0; i < count; i++) {
        float t = y[i];
        dx[i] = dy[i] * (1.0f - t * t);
    }
    return PORT_OK;
}

port_status port_scale(float *y, const float *x, int64_t count, float alpha) {
    PORT_NOTNULL(y); PORT_NOTNULL(x);
    PORT_CHECK(count >= 0, PORT_ERR_SHAPE);
#pragma omp parallel for simd schedule(static) if (count > PORT_PAR_MIN)
    for (int64_t i = 0; i < count; i++) y[i] = alpha * x[i];
    return PORT_OK;
}

/* ------------------------------------------------------------------ */
/* Softmax over the last dim                                           */
/* ------------------------------------------------------------------ */
port_status port_softmax_forward(float *y, const float *x, int64_t rows, int64_t d) {
    PORT_NOTNULL(y); PORT_NOTNULL(x);
    PORT_CHECK(rows > 0 && d > 0, PORT_ERR_SHAPE);
#pragma omp parallel for schedule(static) if (rows * d > PORT_PAR_MIN / 4)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        float mx = max_f(xr, d);
        exp_shift(yr, xr, d, mx);   /* in place allowed: x[j] read first */
        double inv = 1.0 / sum_f64(yr, d);
        for (int64_t j = 0; j < d; j++) yr[j] = (float)(yr[j] * inv);
    }
    return PORT_OK;
}

port_status port_softmax_backward(float *dx, const float *dy, const float *y, int64_t rows, int64_t d) {
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(y);
    PORT_CHECK(rows > 0 && d > 0, PORT_ERR_SHAPE);
#pragma omp parallel for schedule(static) if (rows * d > PORT_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *gr = dy + r * d, *yr = y + r * d;
        float *dr = dx + r * d;
        double acc[8] = {0}, s;
        int64_t j = 0;
        for (; j + 8 <= d; j += 8)
            for (int l = 0; l < 8; l++) acc[l] += (double)gr[j + l] * yr[j + l];
        s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        for (; j < d; j++) s += (double)gr[j] * yr[j];
        float fs = (float)s;
        for (int64_t j = 0; j < d; j++) dr[j] = yr[j] * (gr[j] - fs);
    }
    return PORT_OK;
}

/* ------------------------------------------------------------------ */
/* Batched GEMM                                                        */
/* ------------------------------------------------------------------ */
port_status port_bmm(float *c, const float *a, const float *b, int64_t batch, int64_t m, int64_t n, int64_t k,
                     int trans_a, int trans_b, float alpha, float beta) {
    PORT_NOTNULL(c);
    PORT_CHECK(batch >= 0 && m >= 0 && n >= 0 && k >= 0, PORT_ERR_SHAPE);
    PORT_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, PORT_ERR_SHAPE);
    PORT_CHECK(trans_a == 0 || trans_a == 1, PORT_ERR_ARG);
    PORT_CHECK(trans_b == 0 || trans_b == 1, PORT_ERR_ARG);
    if (batch == 0 || m == 0 || n == 0) return PORT_OK;
    if (k > 0) {
        PORT_NOTNULL(a); PORT_NOTNULL(b);
        size_t cb = (size_t)(batch * m * n) * sizeof(float);
        PORT_CHECK(!port__ranges_overlap(c, cb, a, (size_t)(batch * m * k) * sizeof(float)) &&
                       !port__ranges_overlap(c, cb, b, (size_t)(batch * k * n) * sizeof(float)),
                   PORT_ERR_ALIAS);
    }
    int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
    if (lda < 1) lda = 1;
    if (ldb < 1) ldb = 1;
    double macs = (double)m * (double)n * (double)k;
    /* Across the batch (one single-threaded GEMM per matrix) unless there are fewer matrices than threads and
     * each is large enough for port__gemm to split it over the threads itself.  Both give the same bits: the
     * GEMM's split depends on its shape alone (port_kernels.h, Threads). */
    int across = batch > 1 && (macs < PORT_GEMM_PAR_MIN || batch >= port_get_num_threads()) &&
                 macs * (double)batch >= (double)PORT_PAR_MIN_MACS;
    (void)across;
#pragma omp parallel for schedule(static) if (across)
    for (int64_t i = 0; i < batch; i++)
        port__gemm(trans_a, trans_b, m, n, k, alpha, a ? a + i * m * k : a, lda, b ? b + i * k * n : b, ldb,
                   beta, c + i * m * n, n);
    return PORT_OK;
}

/* ------------------------------------------------------------------ */
/* Permute                                                             */
/* ------------------------------------------------------------------ */
port_status port_permute(float *y, const float *x, int64_t rank, const int64_t *shape, const int64_t *perm) {
    PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(shape); PORT_NOTNULL(perm);
    PORT_CHECK(rank >= 1 && rank <= 6, PORT_ERR_ARG);
    int64_t total = 1, xs[6], od[6], os[6];
    int seen[6] = {0};
    for (int64_t i = 0; i < rank; i++) {
        PORT_CHECK(shape[i] > 0, PORT_ERR_SHAPE);
        PORT_CHECK(perm[i] >= 0 && perm[i] < rank && !seen[perm[i]], PORT_ERR_ARG);
        seen[perm[i]] = 1;
        total *= shape[i];
    }
    PORT_CHECK(!port__ranges_overlap(y, (size_t)total * sizeof(float), x, (size_t)total * sizeof(float)),
               PORT_ERR_ALIAS);
    xs[rank - 1] = 1;
    for (int64_t i = rank - 2; i >= 0; i--) xs[i] = xs[i + 1] * shape[i + 1];
    /* drop size-1 dims and merge output dims that are adjacent in x too */
    int r = 0;
    for (int64_t i = 0; i < rank; i++) {
        int64_t dd = shape[perm[i]], st = xs[perm[i]];
        if (dd == 1) continue;
        if (r > 0 && os[r - 1] == st * dd) {
            od[r - 1] *= dd;
            os[r - 1] = st;
        } else {
            od[r] = dd;
            os[r] = st;
            r++;
        }
    }
    if (r == 0 || (r == 1 && os[0] == 1)) {
        memcpy(y, x, (size_t)total * sizeof(float));
        return PORT_OK;
    }
    int64_t inner = od[r - 1], ist = os[r - 1], outer = total / inner;
#pragma omp parallel for schedule(static) if (total > PORT_PAR_MIN)
    for (int64_t o = 0; o < outer; o++) {
        int64_t rem = o, off = 0;
        for (int q = r - 2; q >= 0; q--) {
            off += (rem % od[q]) * os[q];
            rem /= od[q];
        }
        const float *src = x + off;
        float *dst = y + o * inner;
        if (ist == 1) memcpy(dst, src, (size_t)inner * sizeof(float));
        else
            for (int64_t j = 0; j < inner; j++) dst[j] = src[j * ist];
    }
    return PORT_OK;
}

/* ------------------------------------------------------------------ */
/* Broadcast add, row sums, mean over the middle dim                   */
/* ------------------------------------------------------------------ */
port_status port_add_broadcast(float *y, const float *a, const float *b, int64_t outer, int64_t inner) {
    PORT_NOTNULL(y); PORT_NOTNULL(a); PORT_NOTNULL(b);
    PORT_CHECK(outer >= 0 && inner > 0, PORT_ERR_SHAPE);
#pragma omp parallel for schedule(static) if (outer * inner > PORT_PAR_MIN)
    for (int64_t o = 0; o < outer; o++) {
        const float *ar = a + o * inner;
        float *yr = y + o * inner;
        for (int64_t i = 0; i < inner; i++) yr[i] = ar[i] + b[i];
    }
    return PORT_OK;
}

port_status port_sum_rows(float *db, const float *dy, int64_t outer, int64_t inner) {
    PORT_NOTNULL(db); PORT_NOTNULL(dy);
    PORT_CHECK(outer >= 0 && inner > 0, PORT_ERR_SHAPE);
    int64_t nb = ceil_div(inner, COLB);
#pragma omp parallel for schedule(static) if (outer * inner > PORT_PAR_MIN && nb > 1)
    for (int64_t cbk = 0; cbk < nb; cbk++) {
        int64_t j0 = cbk * COLB, w = PORT_MIN(COLB, inner - j0);
        double acc[COLB] = {0};
        for (int64_t o = 0; o < outer; o++) {
            const float *g = dy + o * inner + j0;
            for (int64_t j = 0; j < w; j++) acc[j] += g[j];
        }
        for (int64_t j = 0; j < w; j++) db[j0 + j] = (float)acc[j];
    }
    return PORT_OK;
}

port_status port_mean_mid_forward(float *y, const float *x, int64_t outer, int64_t mid, int64_t inner) {
    PORT_NOTNULL(y); PORT_NOTNULL(x);
    PORT_CHECK(outer >= 0 && mid > 0 && inner > 0, PORT_ERR_SHAPE);
    int64_t nb = ceil_div(inner, COLB);
#pragma omp parallel for collapse(2) schedule(static) if (outer * mid * inner > PORT_PAR_MIN)
    for (int64_t o = 0; o < outer; o++)
        for (int64_t cbk = 0; cbk < nb; cbk++) {
            int64_t j0 = cbk * COLB, w = PORT_MIN(COLB, inner - j0);
            double acc[COLB] = {0};
            for (int64_t m = 0; m < mid; m++) {
                const float *xr = x + (o * mid + m) * inner + j0;
                for (int64_t j = 0; j < w; j++) acc[j] += xr[j];
            }
            for (int64_t j = 0; j < w; j++) y[o * inner + j0 + j] = (float)(acc[j] / (double)mid);
        }
    return PORT_OK;
}

port_status port_mean_mid_backward(float *dx, const float *dy, int64_t outer, int64_t mid, int64_t inner) {
    PORT_NOTNULL(dx); PORT_NOTNULL(dy);
    PORT_CHECK(outer >= 0 && mid > 0 && inner > 0, PORT_ERR_SHAPE);
    float fm = (float)mid;
#pragma omp parallel for collapse(2) schedule(static) if (outer * mid * inner > PORT_PAR_MIN)
    for (int64_t o = 0; o < outer; o++)
        for (int64_t m = 0; m < mid; m++) {
            const float *g = dy + o * inner;
            float *dr = dx + (o * mid + m) * inner;
            for (int64_t j = 0; j < inner; j++) dr[j] = g[j] / fm;
        }
    return PORT_OK;
}

/* ------------------------------------------------------------------ */
/* Integer helpers                                                     */
/* ------------------------------------------------------------------ */
port_status port_arange_i64(int64_t *y, int64_t count, int64_t start) {
    PORT_NOTNULL(y);
    PORT_CHECK(count >= 0, PORT_ERR_SHAPE);
    for (int64_t i = 0; i < count; i++) y[i] = start + i;
    return PORT_OK;
}

port_status port_ne_scalar_i64(uint8_t *y, const int64_t *x, int64_t count, int64_t value) {
    PORT_NOTNULL(y); PORT_NOTNULL(x);
    PORT_CHECK(count >= 0, PORT_ERR_SHAPE);
    for (int64_t i = 0; i < count; i++) y[i] = (uint8_t)(x[i] != value);
    return PORT_OK;
}

/* ------------------------------------------------------------------ */
/* Scaled dot-product attention                                        */
/* ------------------------------------------------------------------ */
/* Tiles of the tiled algorithm: ATTN_BQ queries x ATTN_BK keys. */
#define ATTN_BQ 64
#define ATTN_BK 64

static port_status attn_check(const port_attention_params *p, int algo) {
    PORT_NOTNULL(p);
    PORT_CHECK(p->bh > 0 && p->heads > 0 && p->tq > 0 && p->tk > 0 && p->dh > 0, PORT_ERR_SHAPE);
    PORT_CHECK(p->bh % p->heads == 0, PORT_ERR_SHAPE);
    PORT_CHECK(p->tq <= INT_MAX && p->tk <= INT_MAX && p->dh <= INT_MAX, PORT_ERR_SHAPE);
    /* the largest buffer (bh * max(tq,tk) * dh, or the plain workspace) must be addressable */
    double big = (double)p->bh * (double)PORT_MAX(p->tq, p->tk) * (double)PORT_MAX(p->dh, PORT_MAX(p->tq, p->tk));
    PORT_CHECK(big * 8.0 < 9.0e18, PORT_ERR_SHAPE);
    PORT_CHECK(isfinite(p->scale), PORT_ERR_ARG);
    PORT_CHECK(algo == PORT_ATTN_PLAIN || algo == PORT_ATTN_TILED, PORT_ERR_ARG);
    return PORT_OK;
}

/* floats of workspace */
static int64_t attn_ws_floats(const port_attention_params *p, int algo, int backward) {
    int64_t bq = PORT_MIN(ATTN_BQ, p->tq), bk = PORT_MIN(ATTN_BK, p->tk);
    if (algo == PORT_ATTN_PLAIN) return (backward ? 2 : 1) * p->bh * p->tq * p->tk;
    if (backward) return p->bh * (2 * bq * bk + bq);               /* P, dS tiles and D per bh */
    return p->bh * ceil_div(p->tq, bq) * (bq * bk + 2 * bq);       /* S tile, m, l per (bh, query block) */
}

size_t port_attention_workspace_bytes(const port_attention_params *p, int algo, int backward) {
    if (attn_check(p, algo) != PORT_OK) return 0;
    return (size_t)attn_ws_floats(p, algo, backward) * sizeof(float);
}

/* Plain forward of one (batch*head) slice: S = scale Q K^T (tq x tk), masked softmax by rows, O = P V. */
static void attn_plain_fwd(float *o, float *lse, const float *q, const float *k, const float *v, const uint8_t *km,
                           const port_attention_params *p, float *S) {
    int64_t tq = p->tq, tk = p->tk, dh = p->dh, off = tk - tq;
    port__gemm(0, 1, tq, tk, dh, p->scale, q, dh, k, dh, 0.0f, S, tk);
    for (int64_t i = 0; i < tq; i++) {
        float *row = S + i * tk;
        mask_row(row, tk, 0, p->causal ? i + off : tk - 1, km);
        float mx = max_f(row, tk);
        if (mx == -INFINITY) {   /* every key masked: zero output, lse = -inf */
            memset(row, 0, (size_t)tk * sizeof(float));
            lse[i] = -INFINITY;
            continue;
        }
        double s = exp_row(row, tk, mx);
        double inv = 1.0 / s;
        for (int64_t j = 0; j < tk; j++) row[j] = (float)(row[j] * inv);
        lse[i] = (float)((double)mx + port__log(s));
    }
    port__gemm(0, 0, tq, dh, tk, 1.0f, S, tk, v, dh, 0.0f, o, dh);
}

/* P[r, c] = exp(S[r, c] - lse[i]) for visible keys, else 0 (rows i0.., keys j0..; S in place, leading dim ld). */
static void attn_probs(float *P, int64_t rb, int64_t cb, int64_t ld, int64_t i0, int64_t j0, const float *lse,
                       const uint8_t *km, const port_attention_params *p) {
    int64_t off = p->tk - p->tq;
    for (int64_t r = 0; r < rb; r++) {
        float *row = P + r * ld;
        float L = lse[i0 + r];
        int64_t lim = p->causal ? i0 + r + off : p->tk - 1;
        if (L == -INFINITY) {
            memset(row, 0, (size_t)cb * sizeof(float));
            continue;
        }
        mask_row(row, cb, j0, lim, km);
        exp_shift(row, row, cb, L);
    }
}

/* dS = P * (dP - D) in place over dP, D[r] = dout[r] . o[r] (rows i0.. of the slice). */
static void attn_ds(float *dP, const float *P, int64_t rb, int64_t cb, int64_t ld, const float *dout,
                    const float *o, int64_t dh) {
    for (int64_t r = 0; r < rb; r++) {
        const float *g = dout + r * dh, *orow = o + r * dh;
        double s = 0.0;
        for (int64_t c = 0; c < dh; c++) s += (double)g[c] * orow[c];
        float D = (float)s;
        float *dr = dP + r * ld;
        const float *pr = P + r * ld;
        for (int64_t c = 0; c < cb; c++) dr[c] = pr[c] * (dr[c] - D);
    }
}

static void attn_plain_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                           const float *v, const float *o, const float *lse, const uint8_t *km,
                           const port_attention_params *p, float *P) {
    int64_t tq = p->tq, tk = p->tk, dh = p->dh;
    float *dS = P + tq * tk;
    port__gemm(0, 1, tq, tk, dh, p->scale, q, dh, k, dh, 0.0f, P, tk);
    attn_probs(P, tq, tk, tk, 0, 0, lse, km, p);
    if (dv) port__gemm(1, 0, tk, dh, tq, 1.0f, P, tk, dout, dh, 0.0f, dv, dh);      /* dV = P^T dO */
    if (!dq && !dk) return;
    port__gemm(0, 1, tq, tk, dh, 1.0f, dout, dh, v, dh, 0.0f, dS, tk);              /* dP = dO V^T */
    attn_ds(dS, P, tq, tk, tk, dout, o, dh);
    if (dq) port__gemm(0, 0, tq, dh, tk, p->scale, dS, tk, k, dh, 0.0f, dq, dh);   /* dQ = scale dS K */
    if (dk) port__gemm(1, 0, tk, dh, tq, p->scale, dS, tk, q, dh, 0.0f, dk, dh);   /* dK = scale dS^T Q */
}

/* Tiled forward of the query block [i0, i0+rb) of one slice: online softmax over key blocks; ws: S tile
 * (rb x ATTN_BK at most), running max m and sum l per row. O accumulates in o. */
static void attn_tiled_fwd(float *o, float *lse, const float *q, const float *k, const float *v, const uint8_t *km,
                           const port_attention_params *p, int64_t i0, int64_t rb, float *S, float *m, float *l) {
    int64_t tq = p->tq, tk = p->tk, dh = p->dh, off = tk - tq;
    int64_t bk = PORT_MIN(ATTN_BK, tk);
    float *O = o + i0 * dh;
    memset(O, 0, (size_t)(rb * dh) * sizeof(float));
    for (int64_t r = 0; r < rb; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
    /* keys past the last visible one of the block's last query are skipped */
    int64_t jend = p->causal ? PORT_MIN(tk, i0 + rb - 1 + off + 1) : tk;
    for (int64_t j0 = 0; j0 < jend; j0 += bk) {
        int64_t cb = PORT_MIN(bk, jend - j0);
        port__gemm(0, 1, rb, cb, dh, p->scale, q + i0 * dh, dh, k + j0 * dh, dh, 0.0f, S, cb);
        for (int64_t r = 0; r < rb; r++) {
            float *row = S + r * cb;
            mask_row(row, cb, j0, p->causal ? i0 + r + off : tk - 1, km);
            float mx = max_f(row, cb);
            if (mx == -INFINITY) {   /* no visible key in this block */
                memset(row, 0, (size_t)cb * sizeof(float));
                continue;
            }
            float mo = m[r], mn = mo > mx ? mo : mx;
            float alpha = mo == -INFINITY ? 0.0f : port__expf_inline(mo - mn);
            double s = exp_row(row, cb, mn);
            l[r] = (float)((double)l[r] * alpha + s);
            m[r] = mn;
            if (alpha != 1.0f) {
                float *orow = O + r * dh;
                for (int64_t c = 0; c < dh; c++) orow[c] *= alpha;
            }
        }
        port__gemm(0, 0, rb, dh, cb, 1.0f, S, cb, v + j0 * dh, dh, 1.0f, O, dh);
    }
    for (int64_t r = 0; r < rb; r++) {
        float *orow = O + r * dh;
        if (l[r] == 0.0f) {
            memset(orow, 0, (size_t)dh * sizeof(float));
            lse[i0 + r] = -INFINITY;
            continue;
        }
        double inv = 1.0 / (double)l[r];
        for (int64_t c = 0; c < dh; c++) orow[c] = (float)(orow[c] * inv);
        lse[i0 + r] = (float)((double)m[r] + port__log((double)l[r]));
    }
}

/* Tiled backward of one slice: key blocks outer, query blocks inner, dQ / dK / dV accumulated in a fixed order. */
static void attn_tiled_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                           const float *v, const float *o, const float *lse, const uint8_t *km,
                           const port_attention_params *p, float *P) {
    int64_t tq = p->tq, tk = p->tk, dh = p->dh, off = tk - tq;
    int64_t bq = PORT_MIN(ATTN_BQ, tq), bk = PORT_MIN(ATTN_BK, tk);
    float *dS = P + bq * bk;
    if (dq) memset(dq, 0, (size_t)(tq * dh) * sizeof(float));
    if (dk) memset(dk, 0, (size_t)(tk * dh) * sizeof(float));
    if (dv) memset(dv, 0, (size_t)(tk * dh) * sizeof(float));
    for (int64_t j0 = 0; j0 < tk; j0 += bk) {
        int64_t cb = PORT_MIN(bk, tk - j0);
        /* causal: the first query that sees key j0 is j0 - off */
        int64_t ifirst = p->causal ? PORT_MAX(0, j0 - off) : 0;
        for (int64_t i0 = ifirst / bq * bq; i0 < tq; i0 += bq) {
            int64_t rb = PORT_MIN(bq, tq - i0);
            port__gemm(0, 1, rb, cb, dh, p->scale, q + i0 * dh, dh, k + j0 * dh, dh, 0.0f, P, cb);
            attn_probs(P, rb, cb, cb, i0, j0, lse, km, p);
            if (dv) port__gemm(1, 0, cb, dh, rb, 1.0f, P, cb, dout + i0 * dh, dh, 1.0f, dv + j0 * dh, dh);
            if (!dq && !dk) continue;
            port__gemm(0, 1, rb, cb, dh, 1.0f, dout + i0 * dh, dh, v + j0 * dh, dh, 0.0f, dS, cb);
            attn_ds(dS, P, rb, cb, cb, dout + i0 * dh, o + i0 * dh, dh);
            if (dq) port__gemm(0, 0, rb, dh, cb, p->scale, dS, cb, k + j0 * dh, dh, 1.0f, dq + i0 * dh, dh);
            if (dk) port__gemm(1, 0, cb, dh, rb, p->scale, dS, cb, q + i0 * dh, dh, 1.0f, dk + j0 * dh, dh);
        }
    }
}

port_status port_attention_forward(float *o, float *lse, const float *q, const float *k, const float *v,
                                   const uint8_t *key_mask, const port_attention_params *p, int algo, void *ws,
                                   size_t ws_bytes) {
    port_status st = attn_check(p, algo);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(o); PORT_NOTNULL(lse); PORT_NOTNULL(q); PORT_NOTNULL(k); PORT_NOTNULL(v);
    int64_t bh = p->bh, tq = p->tq, tk = p->tk, dh = p->dh;
    size_t need = (size_t)attn_ws_floats(p, algo, 0) * sizeof(float);
    PORT_CHECK(ws_bytes >= need && (need == 0 || ws != NULL), PORT_ERR_WORKSPACE);
    size_t ob = (size_t)(bh * tq * dh) * sizeof(float), kb = (size_t)(bh * tk * dh) * sizeof(float);
    PORT_CHECK(!port__ranges_overlap(o, ob, q, ob) && !port__ranges_overlap(o, ob, k, kb) &&
                   !port__ranges_overlap(o, ob, v, kb) && !port__ranges_overlap(lse, (size_t)(bh * tq) * sizeof(float), o, ob),
               PORT_ERR_ALIAS);
    float *w = (float *)ws;
    double work = (double)bh * (double)tq * (double)tk * (double)dh;
    (void)work;   /* read by the OpenMP pragmas only */
    if (algo == PORT_ATTN_PLAIN) {
#pragma omp parallel for schedule(static) if (bh > 1 && work >= PORT_PAR_MIN_MACS)
        for (int64_t b = 0; b < bh; b++)
            attn_plain_fwd(o + b * tq * dh, lse + b * tq, q + b * tq * dh, k + b * tk * dh, v + b * tk * dh,
                           key_mask ? key_mask + (b / p->heads) * tk : NULL, p, w + b * tq * tk);
        return PORT_OK;
    }
    int64_t bq = PORT_MIN(ATTN_BQ, tq), bk = PORT_MIN(ATTN_BK, tk), nqb = ceil_div(tq, bq);
    int64_t per = bq * bk + 2 * bq;
#pragma omp parallel for schedule(dynamic, 1) if (bh * nqb > 1 && work >= PORT_PAR_MIN_MACS)
    for (int64_t t = 0; t < bh * nqb; t++) {
        int64_t b = t / nqb, i0 = (t % nqb) * bq;
        float *S = w + t * per;
        attn_tiled_fwd(o + b * tq * dh, lse + b * tq, q + b * tq * dh, k + b * tk * dh, v + b * tk * dh,
                       key_mask ? key_mask + (b / p->heads) * tk : NULL, p, i0, PORT_MIN(bq, tq - i0), S,
                       S + bq * bk, S + bq * bk + bq);
    }
    return PORT_OK;
}

port_status port_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                    const float *k, const float *v, const float *o, const float *lse,
                                    const uint8_t *key_mask, const port_attention_params *p, int algo, void *ws,
                                    size_t ws_bytes) {
    port_status st = attn_check(p, algo);
    if (st != PORT_OK) return st;
    PORT_CHECK(dq || dk || dv, PORT_ERR_NULL);
    PORT_NOTNULL(dout); PORT_NOTNULL(q);
    PORT_NOTNULL(k); PORT_NOTNULL(v); PORT_NOTNULL(o); PORT_NOTNULL(lse);
    int64_t bh = p->bh, tq = p->tq, tk = p->tk, dh = p->dh;
    size_t need = (size_t)attn_ws_floats(p, algo, 1) * sizeof(float);
    PORT_CHECK(ws_bytes >= need && (need == 0 || ws != NULL), PORT_ERR_WORKSPACE);
    size_t qb = (size_t)(bh * tq * dh) * sizeof(float), kb = (size_t)(bh * tk * dh) * sizeof(float);
    const void *ins[5] = {dout, q, k, v, o};
    size_t insb[5] = {qb, qb, kb, kb, qb};
    for (int i = 0; i < 5; i++)
        PORT_CHECK(!port__ranges_overlap(dq, qb, ins[i], insb[i]) && !port__ranges_overlap(dk, kb, ins[i], insb[i]) &&
                       !port__ranges_overlap(dv, kb, ins[i], insb[i]),
                   PORT_ERR_ALIAS);
    PORT_CHECK(!port__ranges_overlap(dq, qb, dk, kb) && !port__ranges_overlap(dq, qb, dv, kb) &&
                   !port__ranges_overlap(dk, kb, dv, kb),
               PORT_ERR_ALIAS);
    float *w = (float *)ws;
    double work = (double)bh * (double)tq * (double)tk * (double)dh;
    (void)work;   /* read by the OpenMP pragmas only */
    int64_t per = algo == PORT_ATTN_PLAIN ? 2 * tq * tk
                                          : 2 * PORT_MIN(ATTN_BQ, tq) * PORT_MIN(ATTN_BK, tk) + PORT_MIN(ATTN_BQ, tq);
#pragma omp parallel for schedule(dynamic, 1) if (bh > 1 && work >= PORT_PAR_MIN_MACS)
    for (int64_t b = 0; b < bh; b++) {
        const uint8_t *km = key_mask ? key_mask + (b / p->heads) * tk : NULL;
        float *gq = dq ? dq + b * tq * dh : NULL, *gk = dk ? dk + b * tk * dh : NULL;
        float *gv = dv ? dv + b * tk * dh : NULL;
        if (algo == PORT_ATTN_PLAIN)
            attn_plain_bwd(gq, gk, gv, dout + b * tq * dh, q + b * tq * dh, k + b * tk * dh, v + b * tk * dh,
                           o + b * tq * dh, lse + b * tq, km, p, w + b * per);
        else
            attn_tiled_bwd(gq, gk, gv, dout + b * tq * dh, q + b * tq * dh, k + b * tk * dh, v + b * tk * dh,
                           o + b * tq * dh, lse + b * tq, km, p, w + b * per);
    }
    return PORT_OK;
}

/* ------------------------------------------------------------------ */
/* Cross-entropy with ignore_index                                     */
/* ------------------------------------------------------------------ */
static port_status xent_ignore_check(const int64_t *labels, int64_t n, int64_t k, float ls, int64_t ignore_index,
                                     int64_t *count) {
    PORT_CHECK(n > 0 && k > 0, PORT_ERR_SHAPE);
    PORT_CHECK(ls >= 0.0f && ls <= 1.0f, PORT_ERR_ARG);
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) {
        if (labels[i] == ignore_index) continue;
        PORT_CHECK(labels[i] >= 0 && labels[i] < k, PORT_ERR_ARG);
        c++;
    }
    *count = c;
    return PORT_OK;
}

port_status port_softmax_xent_ignore_forward(float *loss, float *probs, const float *logits, const int64_t *labels,
                                             int64_t n, int64_t k, float label_smoothing, int64_t ignore_index) {
    PORT_NOTNULL(loss); PORT_NOTNULL(probs); PORT_NOTNULL(logits); PORT_NOTNULL(labels);
    int64_t count;
    port_status st = xent_ignore_check(labels, n, k, label_smoothing, ignore_index, &count);
    if (st != PORT_OK) return st;
    double total = 0.0, ls = label_smoothing;
    /* rows in parallel; their losses are added in row order (ordered): the sum does not depend on threads */
#pragma omp parallel for ordered schedule(static, 1) if (n * k > PORT_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float *z = logits + i * k;
        float *pr = probs + i * k;
        float mx = max_f(z, k);
        exp_shift(pr, z, k, mx);
        double s = sum_f64(pr, k);
        double sz = sum_f64(z, k) - (double)k * mx;   /* sum_j (z_j - mx) */
        double lse = port__log(s);
        double inv = 1.0 / s;
        for (int64_t j = 0; j < k; j++) pr[j] = (float)(pr[j] * inv);
        double row = 0.0;
        if (labels[i] != ignore_index) {
            double nll = -(((double)z[labels[i]] - mx) - lse);
            double smooth = -(sz - (double)k * lse) / (double)k; /* mean_j -log p_j */
            row = (1.0 - ls) * nll + ls * smooth;
        }
#pragma omp ordered
        total += row;
    }
    loss[0] = count > 0 ? (float)(total / (double)count) : 0.0f;
    return PORT_OK;
}

port_status port_softmax_xent_ignore_backward(float *dlogits, const float *probs, const int64_t *labels,
                                              const float *grad_loss, int64_t n, int64_t k, float label_smoothing,
                                              int64_t ignore_index) {
    PORT_NOTNULL(dlogits); PORT_NOTNULL(probs); PORT_NOTNULL(labels); PORT_NOTNULL(grad_loss);
    int64_t count;
    port_status st = xent_ignore_check(labels, n, k, label_smoothing, ignore_index, &count);
    if (st != PORT_OK) return st;
    port__xent_grad_rows(dlogits, probs, labels, n, k, count > 0 ? grad_loss[0] / (float)count : 0.0f,
                         label_smoothing, ignore_index);
    return PORT_OK;
}
