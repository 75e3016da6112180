/* Batch norm 2d: training (batch stats) and frozen (running stats). */
#include "internal.h"
#include <math.h>

/* Reductions over a channel's hw values run in 8 independent partial sums (internal.h, PORT_LANES). */
#define LANES PORT_LANES

static port_status bn_check(const port_batchnorm_params *p) {
    PORT_NOTNULL(p);
    PORT_CHECK(p->n > 0 && p->c > 0 && p->h > 0 && p->w > 0, PORT_ERR_SHAPE);
    PORT_CHECK(p->eps > 0.0f && isfinite(p->eps), PORT_ERR_ARG);
    PORT_CHECK(p->momentum >= 0.0f && p->momentum <= 1.0f, PORT_ERR_ARG);
    return PORT_OK;
}

void port__bn_train_forward(float *y, float *save_mean, float *save_invstd, float *running_mean,
                            float *running_var, const float *x, const float *gamma,
                            const float *beta, int64_t n, int64_t c, int64_t hw, float eps,
                            float momentum, int relu) {
    int64_t M = n * hw;
#pragma omp parallel for schedule(static) if (M * c > PORT_PAR_MIN)
    for (int64_t ch = 0; ch < c; ch++) {
        double s = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const float *xp = x + (i * c + ch) * hw;
            port_v4f f0 = port_splat4(0.0f), f1 = port_splat4(0.0f);
            int64_t q = 0;
            for (; q + LANES <= hw; q += LANES) {
                f0 += port_ld4(xp + q);
                f1 += port_ld4(xp + q + 4);
            }
            float t = port_hsum8(f0, f1);
            for (; q < hw; q++) t += xp[q];
            s += t;
        }
        double mean = s / (double)M;
        float fm = (float)mean;
        double v = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const float *xp = x + (i * c + ch) * hw;
            port_v4f f0 = port_splat4(0.0f), f1 = port_splat4(0.0f), vm = port_splat4(fm);
            int64_t q = 0;
            for (; q + LANES <= hw; q += LANES) {
                port_v4f d0 = port_ld4(xp + q) - vm, d1 = port_ld4(xp + q + 4) - vm;
                f0 += d0 * d0;
                f1 += d1 * d1;
            }
            float t = port_hsum8(f0, f1);
            for (; q < hw; q++) {
                float d = xp[q] - fm;
                t += d * d;
            }
            v += t;
        }
        double var = v / (double)M;
        float invstd = (float)(1.0 / sqrt(var + (double)eps));
        save_mean[ch] = fm;
        save_invstd[ch] = invstd;
        if (running_mean)
            running_mean[ch] = (1.0f - momentum) * running_mean[ch] + momentum * fm;
        if (running_var)
            running_var[ch] = (1.0f - momentum) * running_var[ch] +
                              momentum * (float)(var * (double)M / (double)(M - 1));
        float g = gamma ? gamma[ch] : 1.0f, b = beta ? beta[ch] : 0.0f;
        float scale = g * invstd;
        for (int64_t i = 0; i < n; i++) {
            const float *xp = x + (i * c + ch) * hw;
            float *yp = y + (i * c + ch) * hw;
            if (relu) {
                for (int64_t q = 0; q < hw; q++) {
                    float t = (xp[q] - fm) * scale + b;
                    yp[q] = t <= 0.0f ? 0.0f : t;   /* NaN propagates, as torch.relu */
                }
            } else {
                for (int64_t q = 0; q < hw; q++) yp[q] = (xp[q] - fm) * scale + b;
            }
        }
    }
}

/* Channel ch's sum(dy) and sum(dy * x-hat) with x-hat = (v - shift) * scale: v is the input (shift = mean,
 * scale = 1/std) or, for a batch norm that ran in place, the output (shift = beta, scale = 1/gamma). */
static void channel_sums(double *sdy, double *sdyx, const float *dy, const float *v, float shift, float scale,
                         int64_t n, int64_t c, int64_t hw, int64_t ch) {
    double s0 = 0.0, s1 = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float *vp = v + (i * c + ch) * hw, *dp = dy + (i * c + ch) * hw;
        port_v4f a0 = port_splat4(0.0f), a1 = a0, b0 = a0, b1 = a0, vs = port_splat4(shift), vk = port_splat4(scale);
        int64_t q = 0;
        for (; q + LANES <= hw; q += LANES) {
            port_v4f d0 = port_ld4(dp + q), d1 = port_ld4(dp + q + 4);
            a0 += d0;
            a1 += d1;
            b0 += d0 * ((port_ld4(vp + q) - vs) * vk);
            b1 += d1 * ((port_ld4(vp + q + 4) - vs) * vk);
        }
        float a = port_hsum8(a0, a1), bb = port_hsum8(b0, b1);
        for (; q < hw; q++) {
            a += dp[q];
            bb += dp[q] * ((vp[q] - shift) * scale);
        }
        s0 += a;
        s1 += bb;
    }
    *sdy = s0;
    *sdyx = s1;
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
        if (!relu) {
            channel_sums(&sdy, &sdyx, dy, x, m, is, n, c, hw, ch);
        } else {
            for (int64_t i = 0; i < n; i++) { /* dy masked where the fused relu's output is 0 */
                const float *xp = x + (i * c + ch) * hw, *dp = dy + (i * c + ch) * hw;
                port_v4f a0 = port_splat4(0.0f), a1 = a0, b0 = a0, b1 = a0;
                port_v4f vm = port_splat4(m), vi = port_splat4(is), vg = port_splat4(g), vb = port_splat4(b), z = port_splat4(0.0f);
                int64_t q = 0;
                for (; q + LANES <= hw; q += LANES) {
                    port_v4f x0 = (port_ld4(xp + q) - vm) * vi, x1 = (port_ld4(xp + q + 4) - vm) * vi;
                    port_v4f d0 = port_zero_where(port_ld4(dp + q), (x0 * vg + vb) <= z);
                    port_v4f d1 = port_zero_where(port_ld4(dp + q + 4), (x1 * vg + vb) <= z);
                    a0 += d0;
                    a1 += d1;
                    b0 += d0 * x0;
                    b1 += d1 * x1;
                }
                float a = port_hsum8(a0, a1), bb = port_hsum8(b0, b1);
                for (; q < hw; q++) {
                    float xh = (xp[q] - m) * is;
                    float d = (xh * g + b) <= 0.0f ? 0.0f : dp[q];
                    a += d;
                    bb += d * xh;
                }
                sdy += a;
                sdyx += bb;
            }
        }
        if (dgamma) dgamma[ch] += (float)sdyx;
        if (dbeta) dbeta[ch] += (float)sdy;
        if (!dx) continue;
        float k = g * is, mdy = (float)(sdy / (double)M), mdyx = (float)(sdyx / (double)M);
        for (int64_t i = 0; i < n; i++) {
            const float *xp = x + (i * c + ch) * hw, *dp = dy + (i * c + ch) * hw;
            float *dxp = dx + (i * c + ch) * hw;
            for (int64_t q = 0; q < hw; q++) {
                float xh = (xp[q] - m) * is;
                float d = dp[q];
                if (relu && (xh * g + b) <= 0.0f) d = 0.0f;
                dxp[q] = k * (d - mdy - xh * mdyx);
            }
        }
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
        for (int64_t i = 0; i < n; i++) {
            const float *yp = y + (i * c + ch) * hw, *dp = dy + (i * c + ch) * hw;
            float *dxp = dx + (i * c + ch) * hw;
            for (int64_t q = 0; q < hw; q++) dxp[q] = k * (dp[q] - mdy - ((yp[q] - b) * rg) * mdyx);
        }
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
