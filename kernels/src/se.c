/* Squeeze-excitation fused (issue 54): y = x * gate(fc2(act(fc1(mean_hw(x))))) per (n, c), the chain of
 * MobileNetV3 (relu, hardsigmoid), EfficientNet (silu, sigmoid) and RegNet-Y (relu, sigmoid).
 *
 * Storage: the forward writes y and the small per-sample vectors h = fc1 output and z = fc2 output; the pooled
 * mean, act(h) and the gate are rebuilt where needed (the pool in the backward's pass over dy and x, the same sum in
 * the same order, so the same bits).  Roundings: the sums over H*W and the fc dot products run in double, rounded
 * to float once; act(h) and the gate are rounded to float as the plain activation kernels round them (eltwise.c),
 * y = x * gate and dx = dy * gate + dm / hw are the plain mul / pool / accumulate float operations.  Every output
 * element is computed by one thread in an order fixed by the shapes: the same bits at any thread count.
 * Weight gradients accumulate (dw += ...; port_se_backward_weight_overwrite writes them: the step's only writer of
 * the fcs' gradients, which then need no zeroing first), dx overwrites. */
#include "internal.h"

#define SE_BLOCK 128   /* outputs per accumulator block of the backward's transposed products */

static inline double se_sigm(double v) { return 1.0 / (1.0 + port__exp_inline(-v)); }

static inline float se_act(float v, int act) {
    if (act == PORT_SE_SILU) return (float)((double)v * se_sigm(v));
    return v <= 0.0f ? 0.0f : v;                       /* relu */
}

/* the gradient through act at its input v (as port_relu_backward / port_silu_backward) */
static inline float se_act_grad(float g, float v, int act) {
    if (act == PORT_SE_SILU) {
        double s = se_sigm(v);
        return (float)((double)g * s * (1.0 + (double)v * (1.0 - s)));
    }
    return v <= 0.0f ? 0.0f : g;
}

static inline float se_gate(float v, int gate) {
    if (gate == PORT_SE_HARDSIGMOID) {
        float t = v + 3.0f;
        t = t <= 0.0f ? 0.0f : t;
        t = t >= 6.0f ? 6.0f : t;
        return t / 6.0f;
    }
    return (float)se_sigm(v);                          /* sigmoid */
}

/* the gradient through the gate at its input v (as port_sigmoid_backward / port_hardsigmoid_backward) */
static inline float se_gate_grad(float g, float v, int gate) {
    if (gate == PORT_SE_HARDSIGMOID) return (v > -3.0f) & (v < 3.0f) ? g / 6.0f : 0.0f;
    float t = se_gate(v, gate);
    return g * (1.0f - t) * t;
}

/* sum_k a[k] b[k] in double, in 4 lanes (k % 4) combined (0 + 1) + (2 + 3), then the tail: a fixed order */
static inline double se_dot(const float *a, const float *b, int64_t n) {
    double l0 = 0.0, l1 = 0.0, l2 = 0.0, l3 = 0.0;
    int64_t k = 0;
    for (; k + 4 <= n; k += 4) {
        l0 += (double)a[k] * b[k];
        l1 += (double)a[k + 1] * b[k + 1];
        l2 += (double)a[k + 2] * b[k + 2];
        l3 += (double)a[k + 3] * b[k + 3];
    }
    double acc = (l0 + l1) + (l2 + l3);
    for (; k < n; k++) acc += (double)a[k] * b[k];
    return acc;
}

/* acc[t] = sum_r v[r vs] w[r ld + t] for t < nb, r ascending from 0, in double (w's rows read in order) */
static void se_tmul(double *acc, const float *w, int64_t ld, const float *v, int64_t vs, int64_t rows, int64_t nb) {
    for (int64_t t = 0; t < nb; t++) acc[t] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const float *wr = w + r * ld;
        double d = v[r * vs];
        for (int64_t t = 0; t < nb; t++) acc[t] += (double)wr[t] * d;
    }
}

/* an fc's weight and bias gradients from its output gradient g [n, rows] and input v [n, cols]:
 * dw[r, t] += sum_i g[i, r] v[i, t], db[r] += sum_i g[i, r], i ascending in double (dw: blocks of SE_BLOCK t's, v's
 * rows read in order); each element by one thread.  overwrite: = instead of += */
static void se_grad_fc(float *dw, float *db, const float *g, const float *v, int64_t n, int64_t rows, int64_t cols,
                       int overwrite) {
    int64_t nbt = (cols + SE_BLOCK - 1) / SE_BLOCK;
#pragma omp parallel for schedule(static) if (n * rows * cols > PORT_PAR_MIN)
    for (int64_t rb = 0; rb < rows * nbt; rb++) {
        int64_t r = rb / nbt, t0 = rb % nbt * SE_BLOCK, nt = PORT_MIN(SE_BLOCK, cols - t0);
        double acc[SE_BLOCK];
        se_tmul(acc, v + t0, cols, g + r, rows, n, nt);
        float *d = dw + r * cols + t0;
        for (int64_t t = 0; t < nt; t++) d[t] = overwrite ? (float)acc[t] : d[t] + (float)acc[t];
    }
    for (int64_t r = 0; r < rows; r++) {
        double acc = 0.0;
        for (int64_t i = 0; i < n; i++) acc += g[i * rows + r];
        db[r] = overwrite ? (float)acc : db[r] + (float)acc;
    }
}

size_t port_se_workspace_bytes(int64_t n, int64_t c, int64_t s, int kernel) {
    if (n <= 0 || c <= 0 || s <= 0) return 0;
    switch (kernel) {
    case 0: return (size_t)(n * (c + s)) * sizeof(float);         /* forward: pooled, act(h) */
    case 1: return (size_t)(n * (2 * c + s)) * sizeof(float);     /* weight gradients: dz, pooled, act(h) */
    default: return 0;                                             /* input gradient */
    }
}

#define SE_CHECK_DIMS(n, c, s, hw, act, gate)                                              \
    PORT_CHECK((n) > 0 && (c) > 0 && (s) > 0 && (hw) > 0, PORT_ERR_SHAPE);                 \
    PORT_CHECK(((act) == PORT_SE_RELU || (act) == PORT_SE_SILU) &&                         \
               ((gate) == PORT_SE_SIGMOID || (gate) == PORT_SE_HARDSIGMOID), PORT_ERR_ARG)

port_status port_se_forward(float *y, float *h, float *z, const float *x, const float *w1, const float *b1,
                            const float *w2, const float *b2, int64_t n, int64_t c, int64_t s, int64_t hw, int act,
                            int gate, void *ws, size_t ws_bytes) {
    PORT_NOTNULL(y); PORT_NOTNULL(h); PORT_NOTNULL(z); PORT_NOTNULL(x);
    PORT_NOTNULL(w1); PORT_NOTNULL(b1); PORT_NOTNULL(w2); PORT_NOTNULL(b2);
    SE_CHECK_DIMS(n, c, s, hw, act, gate);
    PORT_CHECK(ws != NULL && ws_bytes >= port_se_workspace_bytes(n, c, s, 0), PORT_ERR_WORKSPACE);
    PORT_CHECK(y != x && h != z && (const float *)h != x && (const float *)z != x, PORT_ERR_ALIAS);
    float *pooled = (float *)ws, *a = pooled + n * c;
#pragma omp parallel for schedule(static) if (n * c * hw > PORT_PAR_MIN)
    for (int64_t nc = 0; nc < n * c; nc++) {
        const float *xp = x + nc * hw;
        double acc = 0.0;
        for (int64_t q = 0; q < hw; q++) acc += xp[q];
        pooled[nc] = (float)(acc / (double)hw);
    }
#pragma omp parallel for schedule(static) if (n * s * c > PORT_PAR_MIN)
    for (int64_t ij = 0; ij < n * s; ij++) {
        int64_t i = ij / s, j = ij % s;
        const float *wr = w1 + j * c, *pr = pooled + i * c;
        h[ij] = (float)((double)b1[j] + se_dot(wr, pr, c));
        a[ij] = se_act(h[ij], act);
    }
#pragma omp parallel for schedule(static) if (n * c * (hw + s) > PORT_PAR_MIN)
    for (int64_t nc = 0; nc < n * c; nc++) {
        int64_t i = nc / c, k = nc % c;
        const float *wr = w2 + k * s, *ar = a + i * s;
        z[nc] = (float)((double)b2[k] + se_dot(wr, ar, s));
        float g = se_gate(z[nc], gate);
        const float *xp = x + nc * hw;
        float *yp = y + nc * hw;
        for (int64_t q = 0; q < hw; q++) yp[q] = xp[q] * g;
    }
    return PORT_OK;
}

static port_status se_backward_weight(float *dw1, float *db1, float *dw2, float *db2, float *dh, const float *dy,
                                      const float *x, const float *w2, const float *h, const float *z, int64_t n,
                                      int64_t c, int64_t s, int64_t hw, int act, int gate, void *ws, size_t ws_bytes,
                                      int overwrite) {
    PORT_NOTNULL(dw1); PORT_NOTNULL(db1); PORT_NOTNULL(dw2); PORT_NOTNULL(db2); PORT_NOTNULL(dh);
    PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(w2); PORT_NOTNULL(h); PORT_NOTNULL(z);
    SE_CHECK_DIMS(n, c, s, hw, act, gate);
    PORT_CHECK(ws != NULL && ws_bytes >= port_se_workspace_bytes(n, c, s, 1), PORT_ERR_WORKSPACE);
    PORT_CHECK(dh != h && dh != dw1 && dh != dw2 && dw1 != dw2 && db1 != db2, PORT_ERR_ALIAS);
    float *dz = (float *)ws, *pooled = dz + n * c, *a = pooled + n * c;
    /* one pass over dy and x: the gate's gradient sum_hw dy x and the pooled mean (the forward's sum) */
#pragma omp parallel for schedule(static) if (n * c * hw > PORT_PAR_MIN)
    for (int64_t nc = 0; nc < n * c; nc++) {
        const float *xp = x + nc * hw, *gp = dy + nc * hw;
        double acc = 0.0, dg = 0.0;
        for (int64_t q = 0; q < hw; q++) {
            acc += xp[q];
            dg += (double)gp[q] * xp[q];
        }
        pooled[nc] = (float)(acc / (double)hw);
        dz[nc] = se_gate_grad((float)dg, z[nc], gate);
    }
    for (int64_t ij = 0; ij < n * s; ij++) a[ij] = se_act(h[ij], act);
    se_grad_fc(dw2, db2, dz, a, n, c, s, overwrite);
    /* da[i, j] = sum_k w2[k, j] dz[i, k], k ascending, over blocks of SE_BLOCK j's (w2's rows read in order) */
    int64_t nbj = (s + SE_BLOCK - 1) / SE_BLOCK;
#pragma omp parallel for schedule(static) if (n * c * s > PORT_PAR_MIN)
    for (int64_t ib = 0; ib < n * nbj; ib++) {
        int64_t i = ib / nbj, j0 = ib % nbj * SE_BLOCK, nj = PORT_MIN(SE_BLOCK, s - j0);
        double acc[SE_BLOCK];
        se_tmul(acc, w2 + j0, s, dz + i * c, 1, c, nj);
        for (int64_t j = 0; j < nj; j++) dh[i * s + j0 + j] = se_act_grad((float)acc[j], h[i * s + j0 + j], act);
    }
    se_grad_fc(dw1, db1, dh, pooled, n, s, c, overwrite);
    return PORT_OK;
}

port_status port_se_backward_weight(float *dw1, float *db1, float *dw2, float *db2, float *dh, const float *dy,
                                    const float *x, const float *w2, const float *h, const float *z, int64_t n,
                                    int64_t c, int64_t s, int64_t hw, int act, int gate, void *ws, size_t ws_bytes) {
    return se_backward_weight(dw1, db1, dw2, db2, dh, dy, x, w2, h, z, n, c, s, hw, act, gate, ws, ws_bytes, 0);
}

port_status port_se_backward_weight_overwrite(float *dw1, float *db1, float *dw2, float *db2, float *dh,
                                              const float *dy, const float *x, const float *w2, const float *h,
                                              const float *z, int64_t n, int64_t c, int64_t s, int64_t hw, int act,
                                              int gate, void *ws, size_t ws_bytes) {
    return se_backward_weight(dw1, db1, dw2, db2, dh, dy, x, w2, h, z, n, c, s, hw, act, gate, ws, ws_bytes, 1);
}

port_status port_se_backward_input(float *dx, const float *dy, const float *z, const float *w1, const float *dh,
                                   int64_t n, int64_t c, int64_t s, int64_t hw, int gate) {
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(z); PORT_NOTNULL(w1); PORT_NOTNULL(dh);
    SE_CHECK_DIMS(n, c, s, hw, PORT_SE_RELU, gate);
    PORT_CHECK((const float *)dx != z && (const float *)dx != w1 && (const float *)dx != dh, PORT_ERR_ALIAS);
    /* dm[i, k] = sum_j w1[j, k] dh[i, j], j ascending, over blocks of SE_BLOCK k's (w1's rows read in order) */
    int64_t nbk = (c + SE_BLOCK - 1) / SE_BLOCK;
#pragma omp parallel for schedule(static) if (n * c * (hw + s) > PORT_PAR_MIN)
    for (int64_t ib = 0; ib < n * nbk; ib++) {
        int64_t i = ib / nbk, k0 = ib % nbk * SE_BLOCK, nk = PORT_MIN(SE_BLOCK, c - k0);
        double acc[SE_BLOCK];
        se_tmul(acc, w1 + k0, c, dh + i * s, 1, s, nk);
        for (int64_t k = 0; k < nk; k++) {
            int64_t nc = i * c + k0 + k;
            float gm = (float)acc[k] / (float)hw, g = se_gate(z[nc], gate);   /* the pool's gradient, the gate */
            const float *gp = dy + nc * hw;
            float *dp = dx + nc * hw;
            for (int64_t q = 0; q < hw; q++) dp[q] = gp[q] * g + gm;     /* dx may be dy: read before written */
        }
    }
    return PORT_OK;
}
