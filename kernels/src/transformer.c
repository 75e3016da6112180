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
 * library.  Attention and GELU's density exponentiate in float32 (port__expf_f32, 16 lanes), and attention's and
 * layer norm's row loops run in 16-float vectors (port_v16) with their sums in 32 fixed lanes: 2x faster than
 * the double-precision forms on an AVX-512 Xeon (gpt_tiny at batch 32: attention forward 22.6 -> 11.4 ms, layer
 * norm 11.3 -> 5.6 ms per step). */
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

/* y[j] = exp(x[j] - m) for j < n; y may be x (each x[j] is read before y[j] is written). */
PORT_ISA_CLONES static void exp_shift(float *y, const float *x, int64_t n, float m) {
    for (int64_t j = 0; j < n; j++) y[j] = port__expf_inline(x[j] - m);
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

/* pad: the row that gets no gradient (PyTorch's padding_idx), -1 for none */
static port_status embedding_bwd(float *dw, const float *dy, const int64_t *idx, int64_t n, int64_t v, int64_t d,
                                 int64_t pad) {
    PORT_NOTNULL(dw); PORT_NOTNULL(dy); PORT_NOTNULL(idx);
    PORT_CHECK(n >= 0 && v > 0 && d > 0, PORT_ERR_SHAPE);
    PORT_CHECK(pad >= -1 && pad < v, PORT_ERR_ARG);
    for (int64_t i = 0; i < n; i++) PORT_CHECK(idx[i] >= 0 && idx[i] < v, PORT_ERR_ARG);
    /* column blocks in parallel; within a block the rows are added in index order i = 0..n-1 */
    int64_t nb = ceil_div(d, 16);
#pragma omp parallel for schedule(static) if (n * d > PORT_PAR_MIN && nb > 1)
    for (int64_t cbk = 0; cbk < nb; cbk++) {
        int64_t j0 = cbk * 16, j1 = PORT_MIN(d, j0 + 16);
        for (int64_t i = 0; i < n; i++) {
            if (idx[i] == pad) continue;
            float *row = dw + idx[i] * d;
            const float *g = dy + i * d;
            for (int64_t j = j0; j < j1; j++) row[j] += g[j];
        }
    }
    return PORT_OK;
}

port_status port_embedding_backward_weight(float *dw, const float *dy, const int64_t *idx, int64_t n, int64_t v,
                                           int64_t d) {
    return embedding_bwd(dw, dy, idx, n, v, d, -1);
}

port_status port_embedding_backward_weight_pad(float *dw, const float *dy, const int64_t *idx, int64_t n, int64_t v,
                                               int64_t d, int64_t pad) {
    PORT_CHECK(pad >= 0, PORT_ERR_ARG);
    return embedding_bwd(dw, dy, idx, n, v, d, pad);
}

/* ------------------------------------------------------------------ */
/* Layer norm over the last dim                                        */
/* ------------------------------------------------------------------ */
/* Rows in 16-float vectors (port_v16); each row's sums in 32 float lanes combined by a fixed tree (port__v16_sum's
 * order), so the results do not depend on the ISA or the thread count.  LN_ROWS rows per parallel chunk. */
#define LN_ROWS 32

PORT_ISA_CLONES static void ln_fwd_rows(float *y, float *stats, const float *x, const float *gamma, const float *beta,
                                        int64_t r0, int64_t r1, int64_t rows, int64_t d, float eps) {
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        float fm = (float)((double)port__v16_sum(xr, d) / (double)d);
        double var = (double)port__v16_sqdev(xr, d, fm) / (double)d;
        float rstd = (float)(1.0 / sqrt(var + (double)eps));
        stats[r] = fm;
        stats[rows + r] = rstd;
        if (gamma && beta)
            for (int64_t j = 0; j < d; j++) yr[j] = (xr[j] - fm) * rstd * gamma[j] + beta[j];
        else
            for (int64_t j = 0; j < d; j++) {
                float t = (xr[j] - fm) * rstd;
                if (gamma) t *= gamma[j];
                if (beta) t += beta[j];
                yr[j] = t;
            }
    }
}

port_status port_layernorm_forward(float *y, float *stats, const float *x, const float *gamma, const float *beta,
                                   int64_t rows, int64_t d, float eps) {
    PORT_NOTNULL(y); PORT_NOTNULL(stats); PORT_NOTNULL(x);
    PORT_CHECK(rows > 0 && d > 0, PORT_ERR_SHAPE);
    PORT_CHECK(eps >= 0.0f && isfinite(eps), PORT_ERR_ARG);
    int64_t nb = ceil_div(rows, LN_ROWS);
#pragma omp parallel for schedule(static) if (rows * d > PORT_PAR_MIN && nb > 1)
    for (int64_t b = 0; b < nb; b++)
        ln_fwd_rows(y, stats, x, gamma, beta, b * LN_ROWS, PORT_MIN(rows, (b + 1) * LN_ROWS), rows, d, eps);
    return PORT_OK;
}

/* g = dy * gamma (dy without gamma), x-hat = (x - mean) * rstd:
 * dx = rstd * (g - mean(g) - x-hat * mean(g * x-hat)); the row sums in 32 lanes (port__v16_sum's order) */
PORT_ISA_CLONES static void ln_bwd_rows(float *dx, const float *dy, const float *x, const float *stats,
                                        const float *gamma, int64_t r0, int64_t r1, int64_t rows, int64_t d) {
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * d, *gr = dy + r * d;
        float *dr = dx + r * d;
        float mean = stats[r], rstd = stats[rows + r];
        port_v16 vm = PORT_V16_SPLAT(mean), vr = PORT_V16_SPLAT(rstd);
        port_v16 sa0 = {0}, sa1 = {0}, sb0 = {0}, sb1 = {0};
        int64_t j = 0;
        for (; j + 2 * PORT_V16_W <= d; j += 2 * PORT_V16_W) {
            port_v16 g0 = PORT_V16_LD(gr + j), g1 = PORT_V16_LD(gr + j + PORT_V16_W);
            if (gamma) {
                g0 *= PORT_V16_LD(gamma + j);
                g1 *= PORT_V16_LD(gamma + j + PORT_V16_W);
            }
            sa0 += g0;
            sa1 += g1;
            sb0 += g0 * ((PORT_V16_LD(xr + j) - vm) * vr);
            sb1 += g1 * ((PORT_V16_LD(xr + j + PORT_V16_W) - vm) * vr);
        }
        if (j + PORT_V16_W <= d) {
            port_v16 g0 = PORT_V16_LD(gr + j);
            if (gamma) g0 *= PORT_V16_LD(gamma + j);
            sa0 += g0;
            sb0 += g0 * ((PORT_V16_LD(xr + j) - vm) * vr);
            j += PORT_V16_W;
        }
        float a, b;
        PORT_V16_HSUM(a, sa0, sa1);
        PORT_V16_HSUM(b, sb0, sb1);
        for (; j < d; j++) {
            float g = gamma ? gr[j] * gamma[j] : gr[j];
            a += g;
            b += g * ((xr[j] - mean) * rstd);
        }
        a = (float)((double)a / (double)d);
        b = (float)((double)b / (double)d);
        for (j = 0; j < d; j++) {   /* dx may be dy (each dy[j] read before dx[j] is written) */
            float g = gamma ? gr[j] * gamma[j] : gr[j];
            dr[j] = rstd * (g - a - ((xr[j] - mean) * rstd) * b);
        }
    }
}

port_status port_layernorm_backward_input(float *dx, const float *dy, const float *x, const float *stats,
                                          const float *gamma, int64_t rows, int64_t d) {
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(stats);
    PORT_CHECK(rows > 0 && d > 0, PORT_ERR_SHAPE);
    int64_t nb = ceil_div(rows, LN_ROWS);
#pragma omp parallel for schedule(static) if (rows * d > PORT_PAR_MIN && nb > 1)
    for (int64_t b = 0; b < nb; b++)
        ln_bwd_rows(dx, dy, x, stats, gamma, b * LN_ROWS, PORT_MIN(rows, (b + 1) * LN_ROWS), rows, d);
    return PORT_OK;
}

/* dgamma[j] += sum_r dy[r,j] x-hat[r,j], dbeta[j] += sum_r dy[r,j] over the columns [j0, j0+w) (w <= 64): rows in
 * chunks of LN_ROWS summed in float vectors, the chunks' sums added in double in row order */
PORT_ISA_CLONES static void ln_wgrad_cols(float *dgamma, float *dbeta, const float *dy, const float *x,
                                          const float *stats, int64_t rows, int64_t d, int64_t j0, int64_t w) {
    double ag[64] = {0}, ab[64] = {0};
    for (int64_t r0 = 0; r0 < rows; r0 += LN_ROWS) {
        float fg[64] = {0}, fb[64] = {0};
        int64_t r1 = PORT_MIN(rows, r0 + LN_ROWS);
        for (int64_t r = r0; r < r1; r++) {
            const float *xr = x + r * d + j0, *gr = dy + r * d + j0;
            float mean = stats[r], rstd = stats[rows + r];
            for (int64_t j = 0; j < w; j++) {
                fg[j] += gr[j] * ((xr[j] - mean) * rstd);
                fb[j] += gr[j];
            }
        }
        for (int64_t j = 0; j < w; j++) {
            ag[j] += fg[j];
            ab[j] += fb[j];
        }
    }
    for (int64_t j = 0; j < w; j++) {
        if (dgamma) dgamma[j0 + j] += (float)ag[j];
        if (dbeta) dbeta[j0 + j] += (float)ab[j];
    }
}

port_status port_layernorm_backward_weight(float *dgamma, float *dbeta, const float *dy, const float *x,
                                           const float *stats, int64_t rows, int64_t d) {
    PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(stats);
    PORT_CHECK(dgamma || dbeta, PORT_ERR_NULL);
    PORT_CHECK(rows > 0 && d > 0, PORT_ERR_SHAPE);
    int64_t nb = ceil_div(d, COLB);
#pragma omp parallel for schedule(static) if (rows * d > PORT_PAR_MIN && nb > 1)
    for (int64_t cbk = 0; cbk < nb; cbk++)
        ln_wgrad_cols(dgamma, dbeta, dy, x, stats, rows, d, cbk * COLB, PORT_MIN(COLB, d - cbk * COLB));
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
                  v * (float)INV_SQRT_2PI * port__expf_f32(-0.5f * v * v);   /* Phi(x) + x phi(x) */
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
/* Tiles of the tiled algorithm: ATTN_BQ queries x ATTN_BK keys (shrunk to tq / tk below them).  Its workspace
 * is per worker, not per task: ATTN_SLOTS slots at most (a call runs on at most that many threads). */
#define ATTN_BQ 64
#define ATTN_BK 128
#define ATTN_SLOTS 8

/* key/value slices (grouped-query attention: bh / heads * kv_heads) and the group size heads / kv_heads */
static inline int64_t attn_kvh(const port_attention_params *p) { return p->kv_heads > 0 ? p->kv_heads : p->heads; }
static inline int64_t attn_bkv(const port_attention_params *p) { return p->bh / p->heads * attn_kvh(p); }

static port_status attn_check(const port_attention_params *p, int algo) {
    PORT_NOTNULL(p);
    PORT_CHECK(p->bh > 0 && p->heads > 0 && p->tq > 0 && p->tk > 0 && p->dh > 0, PORT_ERR_SHAPE);
    PORT_CHECK(p->bh % p->heads == 0, PORT_ERR_SHAPE);
    PORT_CHECK(p->kv_heads >= 0 && (p->kv_heads == 0 || p->heads % p->kv_heads == 0), PORT_ERR_SHAPE);
    PORT_CHECK(p->tq <= INT_MAX && p->tk <= INT_MAX && p->dh <= INT_MAX, PORT_ERR_SHAPE);
    /* the largest buffer (bh * max(tq,tk) * dh, or the plain workspace) must be addressable */
    double big = (double)p->bh * (double)PORT_MAX(p->tq, p->tk) * (double)PORT_MAX(p->dh, PORT_MAX(p->tq, p->tk));
    PORT_CHECK(big * 8.0 < 9.0e18, PORT_ERR_SHAPE);
    PORT_CHECK(isfinite(p->scale), PORT_ERR_ARG);
    PORT_CHECK(p->dropout_p >= 0.0f && p->dropout_p < 1.0f, PORT_ERR_ARG);
    PORT_CHECK(p->mask_kind >= PORT_ATTN_MASK_KEYS && p->mask_kind <= PORT_ATTN_MASK_ADD, PORT_ERR_ARG);
    if (p->mask_kind != PORT_ATTN_MASK_KEYS) {
        const int64_t full[4] = {p->bh / p->heads, p->heads, p->tq, p->tk};
        for (int i = 0; i < 4; i++) PORT_CHECK(p->mask_dims[i] == 1 || p->mask_dims[i] == full[i], PORT_ERR_SHAPE);
    }
    PORT_CHECK(algo == PORT_ATTN_PLAIN || algo == PORT_ATTN_TILED, PORT_ERR_ARG);
    return PORT_OK;
}

int64_t port_attention_mask_numel(const port_attention_params *p) {
    if (attn_check(p, PORT_ATTN_PLAIN) != PORT_OK) return 0;
    if (p->mask_kind == PORT_ATTN_MASK_KEYS) return p->bh / p->heads * p->tk;
    return p->mask_dims[0] * p->mask_dims[1] * p->mask_dims[2] * p->mask_dims[3];
}

/* What one query slice b reads besides q, k, v: its mask rows (row of query i at i * sq, key j at j * sk; b or f
 * set by the mask's kind, neither without a mask) and its dropout (thr 0: none; element (b tq + i) tk + j). */
typedef struct {
    const uint8_t *b;
    const float *f;
    int64_t sq, sk;
    int64_t slice;
    uint64_t thr;
    float dscale;
    const port_attention_params *p;
} attn_slice;

static attn_slice attn_slice_of(const void *mask, const port_attention_params *p, int64_t b) {
    attn_slice a = {NULL, NULL, 0, 1, b, port__rng_threshold(p->dropout_p),
                    (float)(1.0 / (1.0 - (double)p->dropout_p)), p};
    if (!mask) return a;
    if (p->mask_kind == PORT_ATTN_MASK_KEYS) {
        a.b = (const uint8_t *)mask + (b / p->heads) * p->tk;
        return a;
    }
    const int64_t *md = p->mask_dims;
    int64_t n = b / p->heads, h = b % p->heads;
    int64_t off = (md[0] > 1 ? n * md[1] * md[2] * md[3] : 0) + (md[1] > 1 ? h * md[2] * md[3] : 0);
    a.sk = md[3] > 1;
    a.sq = md[2] > 1 ? md[3] : 0;
    if (p->mask_kind == PORT_ATTN_MASK_BOOL) a.b = (const uint8_t *)mask + off;
    else a.f = (const float *)mask + off;
    return a;
}

/* tiled: tasks of a call (forward: (bh, query block) pairs; backward: bh slices) and workspace slots */
static int64_t attn_tasks(const port_attention_params *p, int backward) {
    return backward ? attn_bkv(p) : p->bh * ceil_div(p->tq, PORT_MIN(ATTN_BQ, p->tq));
}
static int64_t attn_slots(const port_attention_params *p, int backward) {
    return PORT_MIN(attn_tasks(p, backward), ATTN_SLOTS);
}

/* floats of one tiled slot: forward an S tile, running max m and sum l per row; backward the P and dS tiles and
 * D = rowsum(dO * O) of the slice */
static int64_t attn_slot_floats(const port_attention_params *p, int backward) {
    int64_t bq = PORT_MIN(ATTN_BQ, p->tq), bk = PORT_MIN(ATTN_BK, p->tk);
    return backward ? 2 * bq * bk + p->tq : bq * bk + 2 * bq;
}

/* floats of workspace */
static int64_t attn_ws_floats(const port_attention_params *p, int algo, int backward) {
    if (algo == PORT_ATTN_PLAIN) return (backward ? 2 * attn_bkv(p) : p->bh) * p->tq * p->tk;
    return attn_slots(p, backward) * attn_slot_floats(p, backward);
}

size_t port_attention_workspace_bytes(const port_attention_params *p, int algo, int backward) {
    if (attn_check(p, algo) != PORT_OK) return 0;
    return (size_t)attn_ws_floats(p, algo, backward) * sizeof(float);
}

/* Row helpers of the softmax (inlined into the ISA-cloned tile functions below).  Every lane's operations are
 * fixed, so the results do not depend on the ISA or the thread count. */

/* m = max(m, v) per lane (a NaN in v leaves m's lane) */
#define V16_MAX(m, v)                                                   \
    do {                                                                \
        port_i16 g_ = (v) > (m);                                        \
        (m) = (port_v16)(((port_i16)(v) & g_) | ((port_i16)(m) & ~g_)); \
    } while (0)

/* max over a[0..n) (n >= 1); -inf when every entry is -inf; NaN when every entry is NaN or -inf and one is NaN
 * (with a finite entry beside them a NaN is skipped here, and its exp makes the row's sum NaN anyway).  The last
 * (n % 16) entries in one vector that overlaps the previous ones (a max may count an entry twice); 16 lanes
 * folded in halves. */
PORT_ALWAYS_INLINE float row_max(const float *a, int64_t n) {
    float r = -PORT__INF;
    if (n < PORT_V16_W) {
        for (int64_t j = 0; j < n; j++) r = a[j] > r ? a[j] : r;
    } else {
        port_v16 m0 = PORT_V16_SPLAT(-PORT__INF), m1 = m0;
        int64_t j = 0;
        for (; j + 2 * PORT_V16_W <= n; j += 2 * PORT_V16_W) {
            port_v16 v0 = PORT_V16_LD(a + j), v1 = PORT_V16_LD(a + j + PORT_V16_W);
            V16_MAX(m0, v0);
            V16_MAX(m1, v1);
        }
        if (j + PORT_V16_W <= n) {
            port_v16 v0 = PORT_V16_LD(a + j);
            V16_MAX(m0, v0);
            j += PORT_V16_W;
        }
        if (j < n) {
            port_v16 v1 = PORT_V16_LD(a + n - PORT_V16_W);
            V16_MAX(m1, v1);
        }
        V16_MAX(m0, m1);
        port_v8 l8, h8;
        memcpy(&l8, &m0, sizeof l8);
        memcpy(&h8, (const char *)&m0 + sizeof l8, sizeof h8);
        port_v8 m8 = (port_v8)(((port_i8)h8 & (h8 > l8)) | ((port_i8)l8 & ~(h8 > l8)));
        port_v4f l4, h4;
        memcpy(&l4, &m8, sizeof l4);
        memcpy(&h4, (const char *)&m8 + sizeof l4, sizeof h4);
        for (int q = 0; q < 4; q++) {
            r = l4[q] > r ? l4[q] : r;
            r = h4[q] > r ? h4[q] : r;
        }
    }
    if (r == -PORT__INF)   /* rare: every entry masked (or NaN) */
        for (int64_t j = 0; j < n; j++)
            if (a[j] != a[j]) return a[j];
    return r;
}

/* The row sums (port__v16_sum) may take n rounded up to a multiple of 16 where the entries past the true count
 * are zeros (they add nothing). */
/* entries a row sum covers: n rounded up to 16 within the row's cb (exp_shift_row zeroes n..cb) */
static inline int64_t sum_span(int64_t n, int64_t cb) {
    int64_t r = (n + PORT_V16_W - 1) / PORT_V16_W * PORT_V16_W;
    return r < cb ? r : cb;
}

/* row[j] = e^(row[j] - m) for j < n (-inf entries give 0), 0 for n <= j < cb */
PORT_ALWAYS_INLINE void exp_shift_row(float *row, int64_t n, int64_t cb, float m) {
    for (int64_t j = 0; j < n; j++) row[j] = port__expf_f32(row[j] - m);
    for (int64_t j = n; j < cb; j++) row[j] = 0.0f;
}

/* Visible prefix of a score row of query i: keys j0 + c, c < cb, that it may see under the causal limit lim (the
 * last visible key); the slice's mask then sets the masked ones in the prefix to -inf (boolean) or adds to them
 * (additive). */
PORT_ALWAYS_INLINE int64_t visible_prefix(float *row, int64_t cb, int64_t j0, int64_t lim, const attn_slice *a,
                                          int64_t i) {
    int64_t n = lim - j0 + 1;
    n = n < 0 ? 0 : (n > cb ? cb : n);
    if (a->b) {
        const uint8_t *kr = a->b + i * a->sq + j0 * a->sk;
        if (a->sk)
            for (int64_t c = 0; c < n; c++) row[c] = kr[c] ? row[c] : -PORT__INF;
        else if (!kr[0])
            for (int64_t c = 0; c < n; c++) row[c] = -PORT__INF;
    } else if (a->f) {
        const float *fr = a->f + i * a->sq + j0 * a->sk;
        if (a->sk)
            for (int64_t c = 0; c < n; c++) row[c] += fr[c];
        else
            for (int64_t c = 0; c < n; c++) row[c] += fr[0];
    }
    return n;
}

/* Attention dropout of n probabilities of query i from key j0 (row P): P *= keep / (1 - p); with dS (the
 * backward), first dS = P (dS keep / (1 - p) - D) from the undropped P.  The keep mask in chunks of 256. */
static void drop_row(float *P, float *dS, int64_t n, int64_t i, int64_t j0, float D, const attn_slice *a) {
    const port_attention_params *p = a->p;
    uint64_t e0 = ((uint64_t)a->slice * (uint64_t)p->tq + (uint64_t)i) * (uint64_t)p->tk + (uint64_t)j0;
    uint8_t keep[256];
    for (int64_t c0 = 0; c0 < n; c0 += 256) {
        int64_t m = PORT_MIN(256, n - c0);
        port__rng_keep(keep, m, e0 + (uint64_t)c0, p->seed, p->stream, a->thr);
        for (int64_t c = 0; c < m; c++) {
            float s = keep[c] ? a->dscale : 0.0f, pr = P[c0 + c];
            if (dS) dS[c0 + c] = pr * (dS[c0 + c] * s - D);
            P[c0 + c] = pr * s;
        }
    }
}

/* Softmax of a whole score block in place (plain forward: rb rows of cb = tk keys, leading dim cb): P and the
 * rows' log-sum-exp; a row with every key masked gets P = 0 and lse = -inf. */
PORT_ISA_CLONES static void softmax_block(float *S, float *lse, int64_t rb, int64_t cb, int64_t i0,
                                          const attn_slice *a) {
    const port_attention_params *p = a->p;
    int64_t off = p->tk - p->tq;
    for (int64_t r = 0; r < rb; r++) {
        float *row = S + r * cb;
        int64_t n = visible_prefix(row, cb, 0, p->causal ? i0 + r + off : cb - 1, a, i0 + r);
        float mx = n ? row_max(row, n) : -PORT__INF;
        if (mx == -PORT__INF) {
            memset(row, 0, (size_t)cb * sizeof(float));
            lse[r] = -PORT__INF;
            continue;
        }
        exp_shift_row(row, n, cb, mx);
        float s = port__v16_sum(row, sum_span(n, cb)), inv = 1.0f / s;
        for (int64_t j = 0; j < n; j++) row[j] *= inv;
        lse[r] = (float)((double)mx + port__log((double)s));
        if (a->thr) drop_row(row, NULL, n, i0 + r, 0, 0.0f, a);
    }
}

/* Online-softmax step of the tiled forward over one S tile (rb queries from i0 x cb keys from j0, leading dim
 * cb): exponentiates the tile against each row's new running max and rescales the row's running sum l and
 * output O (rows of dh floats) by e^(old max - new max). */
PORT_ISA_CLONES static void online_softmax_tile(float *S, float *m, float *l, float *O, int64_t rb, int64_t cb,
                                                int64_t i0, int64_t j0, const attn_slice *a) {
    const port_attention_params *p = a->p;
    int64_t off = p->tk - p->tq, dh = p->dh;
    for (int64_t r = 0; r < rb; r++) {
        float *row = S + r * cb;
        int64_t n = visible_prefix(row, cb, j0, p->causal ? i0 + r + off : p->tk - 1, a, i0 + r);
        float mx = n ? row_max(row, n) : -PORT__INF;
        if (mx == -PORT__INF) {   /* no visible key in this tile */
            memset(row, 0, (size_t)cb * sizeof(float));
            continue;
        }
        float mo = m[r], mn = mo > mx ? mo : mx;
        exp_shift_row(row, n, cb, mn);
        float s = port__v16_sum(row, sum_span(n, cb));
        if (mo == -PORT__INF) {   /* first visible tile of the row: O's row is still 0 */
            l[r] = s;
        } else {
            float alpha = port__expf_f32(mo - mn);
            l[r] = l[r] * alpha + s;
            if (alpha != 1.0f) {
                float *orow = O + r * dh;
                for (int64_t c = 0; c < dh; c++) orow[c] *= alpha;
            }
        }
        m[r] = mn;
        if (a->thr) drop_row(row, NULL, n, i0 + r, j0, 0.0f, a);   /* l sums the undropped exps */
    }
}

/* O rows /= l, lse = m + log l (0 and -inf for rows that saw no key) */
PORT_ISA_CLONES static void online_softmax_finish(float *O, float *lse, const float *m, const float *l, int64_t rb,
                                                  int64_t dh) {
    for (int64_t r = 0; r < rb; r++) {
        float *orow = O + r * dh;
        if (l[r] == 0.0f) {
            memset(orow, 0, (size_t)dh * sizeof(float));
            lse[r] = -PORT__INF;
            continue;
        }
        float inv = 1.0f / l[r];
        for (int64_t c = 0; c < dh; c++) orow[c] *= inv;
        lse[r] = (float)((double)m[r] + port__log((double)l[r]));
    }
}

/* Backward's probabilities of a recomputed S tile in place: P = e^(S - lse) for visible keys, else 0 (rows from
 * i0, keys from j0, leading dim cb) */
PORT_ISA_CLONES static void probs_tile(float *P, int64_t rb, int64_t cb, int64_t i0, int64_t j0, const float *lse,
                                       const attn_slice *a) {
    const port_attention_params *p = a->p;
    int64_t off = p->tk - p->tq;
    for (int64_t r = 0; r < rb; r++) {
        float *row = P + r * cb;
        float L = lse[i0 + r];
        if (L == -PORT__INF) {
            memset(row, 0, (size_t)cb * sizeof(float));
            continue;
        }
        int64_t n = visible_prefix(row, cb, j0, p->causal ? i0 + r + off : p->tk - 1, a, i0 + r);
        exp_shift_row(row, n, cb, L);
    }
}

/* dS = P * (dP - D) in place over dP (rows from i0; D per query row of the slice) */
PORT_ISA_CLONES static void ds_tile(float *dP, const float *P, int64_t rb, int64_t cb, const float *D) {
    for (int64_t r = 0; r < rb; r++) {
        float d = D[r], *dr = dP + r * cb;
        const float *pr = P + r * cb;
        for (int64_t c = 0; c < cb; c++) dr[c] = pr[c] * (dr[c] - d);
    }
}

/* D[i] = dO[i] . O[i] (in double) for the tq rows of a slice */
static void rowdots(float *D, const float *dout, const float *o, int64_t tq, int64_t dh) {
    for (int64_t i = 0; i < tq; i++) {
        const float *g = dout + i * dh, *orow = o + i * dh;
        double s = 0.0;
        for (int64_t c = 0; c < dh; c++) s += (double)g[c] * orow[c];
        D[i] = (float)s;
    }
}

/* Plain forward of one (batch*head) slice (the reference of the tiled one): S = scale Q K^T (tq x tk), masked
 * softmax by rows (dropped out), O = P V. */
static void attn_plain_fwd(float *o, float *lse, const float *q, const float *k, const float *v,
                           const attn_slice *a, float *S) {
    const port_attention_params *p = a->p;
    int64_t tq = p->tq, tk = p->tk, dh = p->dh;
    port__gemm(0, 1, tq, tk, dh, p->scale, q, dh, k, dh, 0.0f, S, tk);
    softmax_block(S, lse, tq, tk, 0, a);
    port__gemm(0, 0, tq, dh, tk, 1.0f, S, tk, v, dh, 0.0f, o, dh);
}

/* dP (dS's buffer) -> dS = P (dP' - D), P -> the dropped P (dP' = dP keep / (1-p) with dropout) for rows from i0,
 * keys from j0 (leading dim cb); D per query row of the slice */
static void ds_rows(float *P, float *dS, int64_t rb, int64_t cb, int64_t i0, int64_t j0, const float *D,
                    const attn_slice *a) {
    if (!a->thr) {
        ds_tile(dS, P, rb, cb, D + i0);
        return;
    }
    for (int64_t r = 0; r < rb; r++) drop_row(P + r * cb, dS + r * cb, cb, i0 + r, j0, D[i0 + r], a);
}

/* Plain backward of one query slice; beta 0 overwrites dk, dv, 1 adds to them (the later heads of a group) */
static void attn_plain_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                           const float *v, const float *o, const float *lse, const attn_slice *a, float beta,
                           float *P) {
    const port_attention_params *p = a->p;
    int64_t tq = p->tq, tk = p->tk, dh = p->dh;
    float *dS = P + tq * tk;
    port__gemm(0, 1, tq, tk, dh, p->scale, q, dh, k, dh, 0.0f, P, tk);
    probs_tile(P, tq, tk, 0, 0, lse, a);
    if (dq || dk) {
        port__gemm(0, 1, tq, tk, dh, 1.0f, dout, dh, v, dh, 0.0f, dS, tk);          /* dP = dO V^T */
        for (int64_t i = 0; i < tq; i++) {   /* dS = P * (dP - D), D = rowsum(dO * O) */
            float d;
            rowdots(&d, dout + i * dh, o + i * dh, 1, dh);
            if (a->thr) drop_row(P + i * tk, dS + i * tk, tk, i, 0, d, a);
            else ds_tile(dS + i * tk, P + i * tk, 1, tk, &d);
        }
    } else if (a->thr) {
        for (int64_t i = 0; i < tq; i++) drop_row(P + i * tk, NULL, tk, i, 0, 0.0f, a);
    }
    if (dv) port__gemm(1, 0, tk, dh, tq, 1.0f, P, tk, dout, dh, beta, dv, dh);     /* dV = P'^T dO */
    if (dq) port__gemm(0, 0, tq, dh, tk, p->scale, dS, tk, k, dh, 0.0f, dq, dh);   /* dQ = scale dS K */
    if (dk) port__gemm(1, 0, tk, dh, tq, p->scale, dS, tk, q, dh, beta, dk, dh);   /* dK = scale dS^T Q */
}

/* Tiled forward of the query block [i0, i0+rb) of one slice: online softmax over key tiles; ws: S tile
 * (rb x ATTN_BK at most), running max m and sum l per row.  O accumulates in o. */
static void attn_tiled_fwd(float *o, float *lse, const float *q, const float *k, const float *v,
                           const attn_slice *a, int64_t i0, int64_t rb, float *S, float *m, float *l) {
    const port_attention_params *p = a->p;
    int64_t tq = p->tq, tk = p->tk, dh = p->dh, off = tk - tq;
    int64_t bk = PORT_MIN(ATTN_BK, tk);
    float *O = o + i0 * dh;
    for (int64_t r = 0; r < rb; r++) { m[r] = -PORT__INF; l[r] = 0.0f; }
    /* keys past the last visible one of the block's last query are skipped */
    int64_t jend = p->causal ? PORT_MIN(tk, i0 + rb - 1 + off + 1) : tk;
    if (jend <= 0) memset(O, 0, (size_t)(rb * dh) * sizeof(float));
    for (int64_t j0 = 0; j0 < jend; j0 += bk) {
        int64_t cb = PORT_MIN(bk, jend - j0);
        port__gemm(0, 1, rb, cb, dh, p->scale, q + i0 * dh, dh, k + j0 * dh, dh, 0.0f, S, cb);
        online_softmax_tile(S, m, l, O, rb, cb, i0, j0, a);
        /* the first tile overwrites O (rows without a visible key there have S = 0: O = 0) */
        port__gemm(0, 0, rb, dh, cb, 1.0f, S, cb, v + j0 * dh, dh, j0 == 0 ? 0.0f : 1.0f, O, dh);
    }
    online_softmax_finish(O, lse + i0, m, l, rb, dh);
}

/* Tiled backward of one query slice: key tiles outer, query tiles inner, dQ / dK / dV accumulated in a fixed
 * order; first: dk, dv are overwritten (zeroed first), else added to (the later heads of a group); ws: P and dS
 * tiles, D of the slice. */
static void attn_tiled_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                           const float *v, const float *o, const float *lse, const attn_slice *a, int first,
                           float *P) {
    const port_attention_params *p = a->p;
    int64_t tq = p->tq, tk = p->tk, dh = p->dh, off = tk - tq;
    int64_t bq = PORT_MIN(ATTN_BQ, tq), bk = PORT_MIN(ATTN_BK, tk);
    float *dS = P + bq * bk, *D = dS + bq * bk;
    if (dq) memset(dq, 0, (size_t)(tq * dh) * sizeof(float));
    if (dk && first) memset(dk, 0, (size_t)(tk * dh) * sizeof(float));
    if (dv && first) memset(dv, 0, (size_t)(tk * dh) * sizeof(float));
    if (dq || dk) rowdots(D, dout, o, tq, dh);
    for (int64_t j0 = 0; j0 < tk; j0 += bk) {
        int64_t cbk = PORT_MIN(bk, tk - j0);
        /* causal: the first query that sees key j0 is j0 - off */
        int64_t ifirst = p->causal ? PORT_MAX(0, j0 - off) : 0;
        for (int64_t i0 = ifirst / bq * bq; i0 < tq; i0 += bq) {
            int64_t rb = PORT_MIN(bq, tq - i0);
            /* causal: keys past the block's last query's limit are masked for every row of the block */
            int64_t cb = p->causal ? PORT_MIN(cbk, i0 + rb + off - j0) : cbk;
            port__gemm(0, 1, rb, cb, dh, p->scale, q + i0 * dh, dh, k + j0 * dh, dh, 0.0f, P, cb);
            probs_tile(P, rb, cb, i0, j0, lse, a);
            if (dq || dk) {
                port__gemm(0, 1, rb, cb, dh, 1.0f, dout + i0 * dh, dh, v + j0 * dh, dh, 0.0f, dS, cb);
                ds_rows(P, dS, rb, cb, i0, j0, D, a);
            } else if (a->thr) {
                for (int64_t r = 0; r < rb; r++) drop_row(P + r * cb, NULL, cb, i0 + r, j0, 0.0f, a);
            }
            if (dv) port__gemm(1, 0, cb, dh, rb, 1.0f, P, cb, dout + i0 * dh, dh, 1.0f, dv + j0 * dh, dh);
            if (!dq && !dk) continue;
            if (dq) port__gemm(0, 0, rb, dh, cb, p->scale, dS, cb, k + j0 * dh, dh, 1.0f, dq + i0 * dh, dh);
            if (dk) port__gemm(1, 0, cb, dh, rb, p->scale, dS, cb, q + i0 * dh, dh, 1.0f, dk + j0 * dh, dh);
        }
    }
}

/* this thread's workspace slot (a call's team has at most `slots` threads) */
static inline int64_t attn_slot(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static inline int attn_team(int64_t slots) {
    return (int)PORT_MIN((int64_t)port_get_num_threads(), slots);
}

/* the key/value slice query slice b reads */
static inline int64_t attn_kv_of(const port_attention_params *p, int64_t b) {
    int64_t kvh = attn_kvh(p);
    return b / p->heads * kvh + (b % p->heads) / (p->heads / kvh);
}

static port_status attn_mask_check(const void *mask, const port_attention_params *p) {
    PORT_CHECK(mask != NULL || p->mask_kind == PORT_ATTN_MASK_KEYS, PORT_ERR_NULL);
    return PORT_OK;
}

port_status port_attention_forward(float *o, float *lse, const float *q, const float *k, const float *v,
                                   const void *mask, const port_attention_params *p, int algo, void *ws,
                                   size_t ws_bytes) {
    port_status st = attn_check(p, algo);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(o); PORT_NOTNULL(lse); PORT_NOTNULL(q); PORT_NOTNULL(k); PORT_NOTNULL(v);
    st = attn_mask_check(mask, p);
    if (st != PORT_OK) return st;
    int64_t bh = p->bh, tq = p->tq, tk = p->tk, dh = p->dh;
    size_t need = (size_t)attn_ws_floats(p, algo, 0) * sizeof(float);
    PORT_CHECK(ws_bytes >= need && (need == 0 || ws != NULL), PORT_ERR_WORKSPACE);
    size_t ob = (size_t)(bh * tq * dh) * sizeof(float), kb = (size_t)(attn_bkv(p) * tk * dh) * sizeof(float);
    PORT_CHECK(!port__ranges_overlap(o, ob, q, ob) && !port__ranges_overlap(o, ob, k, kb) &&
                   !port__ranges_overlap(o, ob, v, kb) && !port__ranges_overlap(lse, (size_t)(bh * tq) * sizeof(float), o, ob),
               PORT_ERR_ALIAS);
    float *w = (float *)ws;
    double work = (double)bh * (double)tq * (double)tk * (double)dh;
    (void)work;   /* read by the OpenMP pragmas only */
    if (algo == PORT_ATTN_PLAIN) {
#pragma omp parallel for schedule(static) if (bh > 1 && work >= PORT_PAR_MIN_MACS)
        for (int64_t b = 0; b < bh; b++) {
            attn_slice a = attn_slice_of(mask, p, b);
            int64_t c = attn_kv_of(p, b);
            attn_plain_fwd(o + b * tq * dh, lse + b * tq, q + b * tq * dh, k + c * tk * dh, v + c * tk * dh, &a,
                           w + b * tq * tk);
        }
        return PORT_OK;
    }
    int64_t bq = PORT_MIN(ATTN_BQ, tq), bk = PORT_MIN(ATTN_BK, tk), nqb = ceil_div(tq, bq);
    int64_t per = attn_slot_floats(p, 0), tasks = attn_tasks(p, 0);
    int team = attn_team(attn_slots(p, 0));
    (void)team;
#pragma omp parallel for schedule(dynamic, 1) num_threads(team) if (tasks > 1 && work >= PORT_PAR_MIN_MACS)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t b = t / nqb, i0 = (t % nqb) * bq, c = attn_kv_of(p, b);
        float *S = w + attn_slot() * per;
        attn_slice a = attn_slice_of(mask, p, b);
        attn_tiled_fwd(o + b * tq * dh, lse + b * tq, q + b * tq * dh, k + c * tk * dh, v + c * tk * dh, &a, i0,
                       PORT_MIN(bq, tq - i0), S, S + bq * bk, S + bq * bk + bq);
    }
    return PORT_OK;
}

port_status port_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                    const float *k, const float *v, const float *o, const float *lse,
                                    const void *mask, const port_attention_params *p, int algo, void *ws,
                                    size_t ws_bytes) {
    port_status st = attn_check(p, algo);
    if (st != PORT_OK) return st;
    PORT_CHECK(dq || dk || dv, PORT_ERR_NULL);
    PORT_NOTNULL(dout); PORT_NOTNULL(q);
    PORT_NOTNULL(k); PORT_NOTNULL(v); PORT_NOTNULL(o); PORT_NOTNULL(lse);
    st = attn_mask_check(mask, p);
    if (st != PORT_OK) return st;
    int64_t tq = p->tq, tk = p->tk, dh = p->dh, bkv = attn_bkv(p), g = p->heads / attn_kvh(p);
    size_t need = (size_t)attn_ws_floats(p, algo, 1) * sizeof(float);
    PORT_CHECK(ws_bytes >= need && (need == 0 || ws != NULL), PORT_ERR_WORKSPACE);
    size_t qb = (size_t)(p->bh * tq * dh) * sizeof(float), kb = (size_t)(bkv * tk * dh) * sizeof(float);
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
    double work = (double)p->bh * (double)tq * (double)tk * (double)dh;
    (void)work;   /* read by the OpenMP pragmas only */
    int64_t per = algo == PORT_ATTN_PLAIN ? 2 * tq * tk : attn_slot_floats(p, 1);
    int team = algo == PORT_ATTN_PLAIN ? port_get_num_threads() : attn_team(attn_slots(p, 1));
    (void)team;
    /* one task per key/value slice c: the heads of its group in order (dk, dv summed over them) */
#pragma omp parallel for schedule(dynamic, 1) num_threads(team) if (bkv > 1 && work >= PORT_PAR_MIN_MACS)
    for (int64_t c = 0; c < bkv; c++) {
        float *W = w + (algo == PORT_ATTN_PLAIN ? c : attn_slot()) * per;
        float *dkc = dk ? dk + c * tk * dh : NULL, *dvc = dv ? dv + c * tk * dh : NULL;
        const float *kc = k + c * tk * dh, *vc = v + c * tk * dh;
        for (int64_t t = 0; t < g; t++) {
            int64_t b = c / attn_kvh(p) * p->heads + (c % attn_kvh(p)) * g + t;
            attn_slice a = attn_slice_of(mask, p, b);
            float *dqb = dq ? dq + b * tq * dh : NULL;
            if (algo == PORT_ATTN_PLAIN)
                attn_plain_bwd(dqb, dkc, dvc, dout + b * tq * dh, q + b * tq * dh, kc, vc, o + b * tq * dh,
                               lse + b * tq, &a, t ? 1.0f : 0.0f, W);
            else
                attn_tiled_bwd(dqb, dkc, dvc, dout + b * tq * dh, q + b * tq * dh, kc, vc, o + b * tq * dh,
                               lse + b * tq, &a, t == 0, W);
        }
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

/* Rotary position embedding (Llama's apply_rotary_pos_emb on q or k, issue 54): y = x cos + rotate_half(x) sin,
 * rotate_half(x) = cat(-x[..., h:], x[..., :h]), h = d / 2.  x, y [n, heads, seq, d]; the tables cos, sin
 * [table_n, 1, seq, d] with table_n 1 (one table for the batch) or n.  Each output element takes the plain chain's
 * roundings (x cos and rotate_half(x) sin each rounded to float, then their sum), so the fused call gives the bits
 * of mul -> narrow/neg/cat -> mul -> add.  The backward: dx = dy cos + rotate_half^T(dy sin), rotate_half^T(v) =
 * cat(v[..., h:], -v[..., :h]).  Each pair (j, j + h) is read before it is written: y may be x, dx may be dy. */
static port_status rotary(float *y, const float *x, const float *c, const float *s, int64_t n, int64_t heads,
                          int64_t seq, int64_t d, int64_t table_n, int bwd) {
    PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(c); PORT_NOTNULL(s);
    PORT_CHECK(n > 0 && heads > 0 && seq > 0 && d > 0 && d % 2 == 0, PORT_ERR_SHAPE);
    PORT_CHECK(table_n == 1 || table_n == n, PORT_ERR_SHAPE);
    int64_t h = d / 2, rows = n * heads * seq;
#pragma omp parallel for schedule(static) if (rows * d > PORT_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t b = r / (heads * seq), t = r % seq;
        int64_t at = ((table_n == 1 ? 0 : b) * seq + t) * d;
        const float *cr = c + at, *sr = s + at;
        const float *xr = x + r * d;
        float *yr = y + r * d;
        for (int64_t j = 0; j < h; j++) {
            float lo = xr[j], hi = xr[j + h];
            float a0 = lo * cr[j], a1 = hi * cr[j + h];
            float b0 = bwd ? hi * sr[j + h] : -hi * sr[j];
            float b1 = bwd ? -(lo * sr[j]) : lo * sr[j + h];
            yr[j] = a0 + b0;
            yr[j + h] = a1 + b1;
        }
    }
    return PORT_OK;
}

port_status port_rotary_forward(float *y, const float *x, const float *cos_t, const float *sin_t, int64_t n,
                                int64_t heads, int64_t seq, int64_t d, int64_t table_n) {
    return rotary(y, x, cos_t, sin_t, n, heads, seq, d, table_n, 0);
}

port_status port_rotary_backward(float *dx, const float *dy, const float *cos_t, const float *sin_t, int64_t n,
                                 int64_t heads, int64_t seq, int64_t d, int64_t table_n) {
    return rotary(dx, dy, cos_t, sin_t, n, heads, seq, d, table_n, 1);
}
