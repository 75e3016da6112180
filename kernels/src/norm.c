/* Batch norm 2d: training (batch stats) and frozen (running stats). */
#include "internal.h"
#include <math.h>

/* Per-channel loops over a channel's n segments of hw floats (segment i at i * stride), in 16-float vectors
 * (port_v16 of internal.h: one AVX-512 register, two AVX or four SSE/NEON registers, scalars elsewhere).  A
 * segment's sum runs in 32 lanes (element q into lane q % 32, two vectors), combined by a fixed tree at the
 * segment's end, the rest (< 16 floats) added in order; segments are summed in double in image order.  Every
 * ISA performs the same operations per lane (no FMA contraction under -std=c11), so the same bits; the ISA
 * clones (PORT_ISA_CLONES) only widen the registers.  (With 8 lanes of 4-float vectors, the batch-norm kernels
 * were compute-bound: 15 GB/s against 25 GB/s for an add of the same tensors.) */
static port_status bn_check(const port_batchnorm_params *p) {
    PORT_NOTNULL(p);
    PORT_CHECK(p->n > 0 && p->c > 0 && p->h > 0 && p->w > 0, PORT_ERR_SHAPE);
    PORT_CHECK(p->eps > 0.0f && isfinite(p->eps), PORT_ERR_ARG);
    PORT_CHECK(p->momentum >= 0.0f && p->momentum <= 1.0f, PORT_ERR_ARG);
    return PORT_OK;
}

/* sum of the channel's values: each segment in 32 lanes (port__v16_sum), the segments in double */
PORT_ISA_CLONES static double bn_sum(const float *x, int64_t n, int64_t stride, int64_t hw) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += port__v16_sum(x + i * stride, hw);
    return s;
}

/* sum of the channel's squared deviations from fm, the same way */
PORT_ISA_CLONES static double bn_sqdev(const float *x, int64_t n, int64_t stride, int64_t hw, float fm) {
    double v = 0.0;
    for (int64_t i = 0; i < n; i++) v += port__v16_sqdev(x + i * stride, hw, fm);
    return v;
}

/* y = (x - fm) * scale + b, then relu (t <= 0 -> 0: NaN propagates, as torch.relu) */
PORT_ISA_CLONES static void bn_normalize(float *y, const float *x, int64_t n, int64_t stride, int64_t hw, float fm,
                                         float scale, float b, int relu) {
    port_v16 vm = PORT_V16_SPLAT(fm), vs = PORT_V16_SPLAT(scale), vb = PORT_V16_SPLAT(b), z = {0};
    for (int64_t i = 0; i < n; i++) {
        const float *xp = x + i * stride;
        float *yp = y + i * stride;
        int64_t q = 0;
        for (; q + PORT_V16_W <= hw; q += PORT_V16_W) {
            port_v16 t = (PORT_V16_LD(xp + q) - vm) * vs + vb;
            PORT_V16_ST(yp + q, relu ? PORT_V16_ZERO_WHERE(t, t <= z) : t);
        }
        for (; q < hw; q++) {
            float t = (xp[q] - fm) * scale + b;
            yp[q] = relu && t <= 0.0f ? 0.0f : t;
        }
    }
}

void port__bn_train_forward(float *y, float *save_mean, float *save_invstd, float *running_mean,
                            float *running_var, const float *x, const float *gamma,
                            const float *beta, int64_t n, int64_t c, int64_t hw, float eps,
                            float momentum, int relu) {
    int64_t M = n * hw;
#pragma omp parallel for schedule(static) if (M * c > PORT_PAR_MIN)
    for (int64_t ch = 0; ch < c; ch++) {
        const float *xc = x + ch * hw;
        double mean = bn_sum(xc, n, c * hw, hw) / (double)M;
        float fm = (float)mean;
        double var = bn_sqdev(xc, n, c * hw, hw, fm) / (double)M;
        float invstd = (float)(1.0 / sqrt(var + (double)eps));
        save_mean[ch] = fm;
        save_invstd[ch] = invstd;
        if (running_mean)
            running_mean[ch] = (1.0f - momentum) * running_mean[ch] + momentum * fm;
        if (running_var)
            running_var[ch] = (1.0f - momentum) * running_var[ch] +
                              momentum * (float)(var * (double)M / (double)(M - 1));
        float g = gamma ? gamma[ch] : 1.0f, b = beta ? beta[ch] : 0.0f;
        bn_normalize(y + ch * hw, xc, n, c * hw, hw, fm, g * invstd, b, relu);
    }
}

/* Channel ch's sum(dy) and sum(dy * x-hat) with x-hat = (v - shift) * scale: v is the input (shift = mean,
 * scale = 1/std) or, for a batch norm that ran in place, the output (shift = beta, scale = 1/gamma).  relu: dy
 * counts only where the fused relu's output x-hat * g + b is positive (v the input). */
PORT_ISA_CLONES static void bn_grad_sums(double *sdy, double *sdyx, const float *dy, const float *v, int64_t n,
                                         int64_t stride, int64_t hw, float shift, float scale, int relu, float g,
                                         float b) {
    double s0 = 0.0, s1 = 0.0;
    port_v16 vsh = PORT_V16_SPLAT(shift), vk = PORT_V16_SPLAT(scale), vg = PORT_V16_SPLAT(g), vb = PORT_V16_SPLAT(b), z = {0};
    for (int64_t i = 0; i < n; i++) {
        const float *vp = v + i * stride, *dp = dy + i * stride;
        port_v16 a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0};
        int64_t q = 0;
        for (; q + 2 * PORT_V16_W <= hw; q += 2 * PORT_V16_W) {
            port_v16 x0 = (PORT_V16_LD(vp + q) - vsh) * vk, x1 = (PORT_V16_LD(vp + q + PORT_V16_W) - vsh) * vk;
            port_v16 d0 = PORT_V16_LD(dp + q), d1 = PORT_V16_LD(dp + q + PORT_V16_W);
            if (relu) {
                d0 = PORT_V16_ZERO_WHERE(d0, (x0 * vg + vb) <= z);
                d1 = PORT_V16_ZERO_WHERE(d1, (x1 * vg + vb) <= z);
            }
            a0 += d0;
            a1 += d1;
            b0 += d0 * x0;
            b1 += d1 * x1;
        }
        if (q + PORT_V16_W <= hw) {
            port_v16 x0 = (PORT_V16_LD(vp + q) - vsh) * vk, d0 = PORT_V16_LD(dp + q);
            if (relu) d0 = PORT_V16_ZERO_WHERE(d0, (x0 * vg + vb) <= z);
            a0 += d0;
            b0 += d0 * x0;
            q += PORT_V16_W;
        }
        float a, bb;
        PORT_V16_HSUM(a, a0, a1);
        PORT_V16_HSUM(bb, b0, b1);
        for (; q < hw; q++) {
            float xh = (vp[q] - shift) * scale;
            float d = relu && (xh * g + b) <= 0.0f ? 0.0f : dp[q];
            a += d;
            bb += d * xh;
        }
        s0 += a;
        s1 += bb;
    }
    *sdy = s0;
    *sdyx = s1;
}
static void channel_sums(double *sdy, double *sdyx, const float *dy, const float *v, float shift, float scale,
                         int64_t n, int64_t c, int64_t hw, int64_t ch) {
    bn_grad_sums(sdy, sdyx, dy + ch * hw, v + ch * hw, n, c * hw, hw, shift, scale, 0, 1.0f, 0.0f);
}

/* dx = k * (dy' - mdy - x-hat * mdyx), x-hat = (v - shift) * scale, dy' = dy masked by the fused relu (relu) */
PORT_ISA_CLONES static void bn_grad_dx(float *dx, const float *dy, const float *v, int64_t n, int64_t stride,
                                       int64_t hw, float shift, float scale, float k, float mdy, float mdyx,
                                       int relu, float g, float b) {
    port_v16 vsh = PORT_V16_SPLAT(shift), vk = PORT_V16_SPLAT(scale), vkk = PORT_V16_SPLAT(k), vmdy = PORT_V16_SPLAT(mdy);
    port_v16 vmdyx = PORT_V16_SPLAT(mdyx), vg = PORT_V16_SPLAT(g), vb = PORT_V16_SPLAT(b), z = {0};
    for (int64_t i = 0; i < n; i++) {
        const float *vp = v + i * stride, *dp = dy + i * stride;
        float *dxp = dx + i * stride;
        int64_t q = 0;
        for (; q + PORT_V16_W <= hw; q += PORT_V16_W) {
            port_v16 xh = (PORT_V16_LD(vp + q) - vsh) * vk, d = PORT_V16_LD(dp + q);
            if (relu) d = PORT_V16_ZERO_WHERE(d, (xh * vg + vb) <= z);
            PORT_V16_ST(dxp + q, vkk * (d - vmdy - xh * vmdyx));
        }
        for (; q < hw; q++) {
            float xh = (vp[q] - shift) * scale;
            float d = dp[q];
            if (relu && (xh * g + b) <= 0.0f) d = 0.0f;
            dxp[q] = k * (d - mdy - xh * mdyx);
        }
    }
}

void port__bn_train_backward(float *dx, float *dgamma, float *dbeta, const float *dy,
                             const float *x, const float *gamma, const float *beta,
                             const float *mean, const float *invstd, int64_t n, int64_t c,
                             int64_t hw, int relu) {
    int64_t M = n * hw;
#pragma omp parallel for schedule(static) if (M * c > PORT_PAR_MIN)
    for (int64_t ch = 0; ch < c; ch++) {
        float m = mean[ch], is = invstd[ch];
        float g = gamma ? gamma[ch] : 1.0f, b = beta ? beta[ch] : 0.0f;
        double sdy = 0.0, sdyx = 0.0;
        bn_grad_sums(&sdy, &sdyx, dy + ch * hw, x + ch * hw, n, c * hw, hw, m, is, relu, g, b);
        if (dgamma) dgamma[ch] += (float)sdyx;
        if (dbeta) dbeta[ch] += (float)sdy;
        if (!dx) continue;
        float k = g * is, mdy = (float)(sdy / (double)M), mdyx = (float)(sdyx / (double)M);
        bn_grad_dx(dx + ch * hw, dy + ch * hw, x + ch * hw, n, c * hw, hw, m, is, k, mdy, mdyx, relu, g, b);
    }
}

port_status port_batchnorm2d_forward_train(float *y, float *save_mean, float *save_invstd,
                                           float *running_mean, float *running_var,
                                           const float *x, const float *gamma, const float *beta,
                                           const port_batchnorm_params *p) {
    port_status st = bn_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(save_mean); PORT_NOTNULL(save_invstd);
    PORT_CHECK(p->n * p->h * p->w > 1, PORT_ERR_SHAPE); /* like PyTorch */
    port__bn_train_forward(y, save_mean, save_invstd, running_mean, running_var, x, gamma, beta,
                           p->n, p->c, p->h * p->w, p->eps, p->momentum, 0);
    return PORT_OK;
}

port_status port_batchnorm2d_forward_eval(float *y, const float *x, const float *gamma,
                                          const float *beta, const float *running_mean,
                                          const float *running_var,
                                          const port_batchnorm_params *p) {
    port_status st = bn_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(running_mean); PORT_NOTNULL(running_var);
    int64_t n = p->n, c = p->c, hw = p->h * p->w;
#pragma omp parallel for schedule(static) if (n * c * hw > PORT_PAR_MIN)
    for (int64_t nc = 0; nc < n * c; nc++) {
        int64_t ch = nc % c;
        float is = (float)(1.0 / sqrt((double)running_var[ch] + (double)p->eps));
        float scale = (gamma ? gamma[ch] : 1.0f) * is, m = running_mean[ch];
        float b = beta ? beta[ch] : 0.0f;
        const float *xp = x + nc * hw;
        float *yp = y + nc * hw;
        for (int64_t q = 0; q < hw; q++) yp[q] = (xp[q] - m) * scale + b;
    }
    return PORT_OK;
}

port_status port_batchnorm2d_backward_input(float *dx, const float *dy, const float *x,
                                            const float *gamma, const float *save_mean,
                                            const float *save_invstd,
                                            const port_batchnorm_params *p) {
    port_status st = bn_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(save_mean);
    PORT_NOTNULL(save_invstd);
    PORT_CHECK(dx != x, PORT_ERR_ALIAS);
    port__bn_train_backward(dx, NULL, NULL, dy, x, gamma, NULL, save_mean, save_invstd, p->n,
                            p->c, p->h * p->w, 0);
    return PORT_OK;
}

port_status port_batchnorm2d_backward_weight(float *dgamma, float *dbeta, const float *dy,
                                             const float *x, const float *save_mean,
                                             const float *save_invstd,
                                             const port_batchnorm_params *p) {
    port_status st = bn_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(save_mean); PORT_NOTNULL(save_invstd);
    if (!dgamma && !dbeta) return PORT_OK;
    port__bn_train_backward(NULL, dgamma, dbeta, dy, x, NULL, NULL, save_mean, save_invstd, p->n,
                            p->c, p->h * p->w, 0);
    return PORT_OK;
}

static port_status check_gamma_nonzero(const float *gamma, int64_t c) {
    PORT_NOTNULL(gamma);
    for (int64_t i = 0; i < c; i++) PORT_CHECK(gamma[i] != 0.0f, PORT_ERR_ARG);
    return PORT_OK;
}

port_status port_batchnorm2d_backward_input_from_output(float *dx, const float *dy,
                                                        const float *y, const float *gamma,
                                                        const float *beta,
                                                        const float *save_invstd,
                                                        const port_batchnorm_params *p) {
    port_status st = bn_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(y); PORT_NOTNULL(beta);
    PORT_NOTNULL(save_invstd);
    st = check_gamma_nonzero(gamma, p->c);
    if (st != PORT_OK) return st;
    PORT_CHECK(dx != y, PORT_ERR_ALIAS);
    int64_t n = p->n, c = p->c, hw = p->h * p->w, M = n * hw;
#pragma omp parallel for schedule(static) if (M * c > PORT_PAR_MIN)
    for (int64_t ch = 0; ch < c; ch++) {
        float g = gamma[ch], b = beta[ch], rg = 1.0f / g, is = save_invstd[ch];
        double sdy, sdyx;
        channel_sums(&sdy, &sdyx, dy, y, b, rg, n, c, hw, ch);
        float k = g * is, mdy = (float)(sdy / (double)M), mdyx = (float)(sdyx / (double)M);
        bn_grad_dx(dx + ch * hw, dy + ch * hw, y + ch * hw, n, c * hw, hw, b, rg, k, mdy, mdyx, 0, 1.0f, 0.0f);
    }
    return PORT_OK;
}

port_status port_batchnorm2d_backward_weight_from_output(float *dgamma, float *dbeta,
                                                         const float *dy, const float *y,
                                                         const float *gamma, const float *beta,
                                                         const port_batchnorm_params *p) {
    port_status st = bn_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dy); PORT_NOTNULL(y); PORT_NOTNULL(beta);
    st = check_gamma_nonzero(gamma, p->c);
    if (st != PORT_OK) return st;
    int64_t n = p->n, c = p->c, hw = p->h * p->w;
#pragma omp parallel for schedule(static) if (n * hw * c > PORT_PAR_MIN)
    for (int64_t ch = 0; ch < c; ch++) {
        float b = beta[ch], rg = 1.0f / gamma[ch];
        double sdy, sdyx;
        channel_sums(&sdy, &sdyx, dy, y, b, rg, n, c, hw, ch);
        if (dgamma) dgamma[ch] += (float)sdyx;
        if (dbeta) dbeta[ch] += (float)sdy;
    }
    return PORT_OK;
}

port_status port_batchnorm2d_backward_input_eval(float *dx, const float *dy, const float *gamma,
                                                 const float *running_var,
                                                 const port_batchnorm_params *p) {
    port_status st = bn_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(running_var);
    int64_t n = p->n, c = p->c, hw = p->h * p->w;
#pragma omp parallel for schedule(static) if (n * c * hw > PORT_PAR_MIN)
    for (int64_t nc = 0; nc < n * c; nc++) {
        int64_t ch = nc % c;
        float k = (gamma ? gamma[ch] : 1.0f) *
                  (float)(1.0 / sqrt((double)running_var[ch] + (double)p->eps));
        const float *dp = dy + nc * hw;
        float *dxp = dx + nc * hw;
        for (int64_t q = 0; q < hw; q++) dxp[q] = dp[q] * k;
    }
    return PORT_OK;
}

port_status port_batchnorm2d_backward_weight_eval(float *dgamma, float *dbeta, const float *dy,
                                                  const float *x, const float *running_mean,
                                                  const float *running_var,
                                                  const port_batchnorm_params *p) {
    port_status st = bn_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(running_mean); PORT_NOTNULL(running_var);
    int64_t n = p->n, c = p->c, hw = p->h * p->w;
#pragma omp parallel for schedule(static) if (n * hw * c > PORT_PAR_MIN)
    for (int64_t ch = 0; ch < c; ch++) {
        float m = running_mean[ch];
        float is = (float)(1.0 / sqrt((double)running_var[ch] + (double)p->eps));
        double sdy, sdyx;
        channel_sums(&sdy, &sdyx, dy, x, m, is, n, c, hw, ch);
        if (dgamma) dgamma[ch] += (float)sdyx;
        if (dbeta) dbeta[ch] += (float)sdy;
    }
    return PORT_OK;
}
