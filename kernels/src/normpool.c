/* Norms, pooling and resize for the ops published models use (issue 54): RMS norm (Llama), group norm,
 * nearest / bilinear resize (F.interpolate) and adaptive average pooling to any size.
 *
 * Plain loops (these ops are a small share of a step): every sum runs in double in one fixed order by one
 * thread, and every parallel loop splits over independent rows, groups, channels or planes, so the results are
 * the same bits at any thread count. */
#include "internal.h"
#include <math.h>

/* ------------------------------------------------------------------ RMS norm */
/* One row's rstd (its squares summed in double, in order) and its normalised row y = x rstd gamma: the one
 * definition of the norm's arithmetic, shared with the fused RMSNorm + linear kernels (rmslinear.c: their bits). */
float port__rmsnorm_rstd(const float *xr, int64_t d, float eps) {
    double s = 0.0;
    for (int64_t j = 0; j < d; j++) s += (double)xr[j] * (double)xr[j];
    return (float)(1.0 / sqrt(s / (double)d + (double)eps));
}

void port__rmsnorm_row(float *yr, const float *xr, float rs, const float *gamma, int64_t d) {
    if (gamma)
        for (int64_t j = 0; j < d; j++) yr[j] = xr[j] * rs * gamma[j];
    else
        for (int64_t j = 0; j < d; j++) yr[j] = xr[j] * rs;
}

port_status port_rmsnorm_forward(float *y, float *rstd, const float *x, const float *gamma, int64_t rows, int64_t d,
                                 float eps) {
    PORT_NOTNULL(y); PORT_NOTNULL(rstd); PORT_NOTNULL(x);
    PORT_CHECK(rows > 0 && d > 0, PORT_ERR_SHAPE);
    PORT_CHECK(eps >= 0.0f && isfinite(eps), PORT_ERR_ARG);
    PORT_CHECK(y != x, PORT_ERR_ALIAS);
#pragma omp parallel for schedule(static) if (rows * d > PORT_PAR_MIN && rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        rstd[r] = port__rmsnorm_rstd(x + r * d, d, eps);
        port__rmsnorm_row(y + r * d, x + r * d, rstd[r], gamma, d);
    }
    return PORT_OK;
}

port_status port_rmsnorm_backward_input(float *dx, const float *dy, const float *x, const float *rstd,
                                        const float *gamma, int64_t rows, int64_t d) {
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(rstd);
    PORT_CHECK(rows > 0 && d > 0, PORT_ERR_SHAPE);
    PORT_CHECK(dx != x, PORT_ERR_ALIAS);
#pragma omp parallel for schedule(static) if (rows * d > PORT_PAR_MIN && rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *gr = dy + r * d;
        float *dr = dx + r * d;
        double s = 0.0;
        for (int64_t j = 0; j < d; j++) s += (double)(gamma ? gr[j] * gamma[j] : gr[j]) * (double)xr[j];
        float rs = rstd[r], k = (float)(s / (double)d) * rs * rs;
        for (int64_t j = 0; j < d; j++) {
            float g = gamma ? gr[j] * gamma[j] : gr[j];
            dr[j] = rs * (g - xr[j] * k);
        }
    }
    return PORT_OK;
}

port_status port_rmsnorm_backward_weight(float *dgamma, const float *dy, const float *x, const float *rstd,
                                         int64_t rows, int64_t d) {
    PORT_NOTNULL(dgamma); PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(rstd);
    PORT_CHECK(rows > 0 && d > 0, PORT_ERR_SHAPE);
    const int64_t B = 64, nb = (d + B - 1) / B;   /* column blocks of 64: each column summed over rows in order */
#pragma omp parallel for schedule(static) if (rows * d > PORT_PAR_MIN && nb > 1)
    for (int64_t b = 0; b < nb; b++) {
        int64_t j0 = b * B, w = PORT_MIN(B, d - j0);
        double acc[64] = {0};
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * d + j0, *gr = dy + r * d + j0;
            float rs = rstd[r];
            for (int64_t j = 0; j < w; j++) acc[j] += (double)(gr[j] * (xr[j] * rs));
        }
        for (int64_t j = 0; j < w; j++) dgamma[j0 + j] += (float)acc[j];
    }
    return PORT_OK;
}

/* ------------------------------------------------------------------ group norm */
static port_status gn_check(int64_t n, int64_t c, int64_t hw, int64_t groups) {
    PORT_CHECK(n > 0 && c > 0 && hw > 0 && groups > 0 && c % groups == 0, PORT_ERR_SHAPE);
    return PORT_OK;
}

port_status port_groupnorm_forward(float *y, float *stats, const float *x, const float *gamma, const float *beta,
                                   int64_t n, int64_t c, int64_t hw, int64_t groups, float eps) {
    PORT_NOTNULL(y); PORT_NOTNULL(stats); PORT_NOTNULL(x);
    port_status st = gn_check(n, c, hw, groups);
    if (st != PORT_OK) return st;
    PORT_CHECK(eps > 0.0f && isfinite(eps), PORT_ERR_ARG);
    const int64_t cg = c / groups, m = cg * hw, rows = n * groups;
#pragma omp parallel for schedule(static) if (n * c * hw > PORT_PAR_MIN && rows > 1)
    for (int64_t r = 0; r < rows; r++) {      /* group r: m consecutive floats from r * m */
        const float *xr = x + r * m;
        float *yr = y + r * m;
        double s = 0.0;
        for (int64_t j = 0; j < m; j++) s += xr[j];
        float mean = (float)(s / (double)m);
        double v = 0.0;
        for (int64_t j = 0; j < m; j++) v += ((double)xr[j] - mean) * ((double)xr[j] - mean);
        float rs = (float)(1.0 / sqrt(v / (double)m + (double)eps));
        stats[r] = mean;
        stats[rows + r] = rs;
        int64_t c0 = (r % groups) * cg;
        for (int64_t k = 0; k < cg; k++) {
            float g = gamma ? gamma[c0 + k] : 1.0f, b = beta ? beta[c0 + k] : 0.0f;
            const float *xp = xr + k * hw;
            float *yp = yr + k * hw;
            for (int64_t q = 0; q < hw; q++) yp[q] = (xp[q] - mean) * rs * g + b;
        }
    }
    return PORT_OK;
}

port_status port_groupnorm_backward_input(float *dx, const float *dy, const float *x, const float *stats,
                                          const float *gamma, int64_t n, int64_t c, int64_t hw, int64_t groups) {
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(stats);
    port_status st = gn_check(n, c, hw, groups);
    if (st != PORT_OK) return st;
    PORT_CHECK(dx != x, PORT_ERR_ALIAS);
    const int64_t cg = c / groups, m = cg * hw, rows = n * groups;
#pragma omp parallel for schedule(static) if (n * c * hw > PORT_PAR_MIN && rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * m, *gr = dy + r * m;
        float *dr = dx + r * m;
        float mean = stats[r], rs = stats[rows + r];
        int64_t c0 = (r % groups) * cg;
        double s0 = 0.0, s1 = 0.0;
        for (int64_t k = 0; k < cg; k++) {
            float g = gamma ? gamma[c0 + k] : 1.0f;
            for (int64_t q = 0; q < hw; q++) {
                float gg = gr[k * hw + q] * g;
                s0 += gg;
                s1 += (double)gg * (double)((xr[k * hw + q] - mean) * rs);
            }
        }
        float mg = (float)(s0 / (double)m), mgx = (float)(s1 / (double)m);
        for (int64_t k = 0; k < cg; k++) {
            float g = gamma ? gamma[c0 + k] : 1.0f;
            for (int64_t q = 0; q < hw; q++) {
                int64_t i = k * hw + q;
                float xh = (xr[i] - mean) * rs;
                dr[i] = rs * (gr[i] * g - mg - xh * mgx);
            }
        }
    }
    return PORT_OK;
}

port_status port_groupnorm_backward_weight(float *dgamma, float *dbeta, const float *dy, const float *x,
                                           const float *stats, int64_t n, int64_t c, int64_t hw, int64_t groups) {
    PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(stats);
    PORT_CHECK(dgamma || dbeta, PORT_ERR_NULL);
    port_status st = gn_check(n, c, hw, groups);
    if (st != PORT_OK) return st;
    const int64_t cg = c / groups, rows = n * groups;
#pragma omp parallel for schedule(static) if (n * c * hw > PORT_PAR_MIN && c > 1)
    for (int64_t ch = 0; ch < c; ch++) {
        double sg = 0.0, sb = 0.0;
        for (int64_t i = 0; i < n; i++) {
            int64_t r = i * groups + ch / cg;
            float mean = stats[r], rs = stats[rows + r];
            const float *xp = x + (i * c + ch) * hw, *gp = dy + (i * c + ch) * hw;
            for (int64_t q = 0; q < hw; q++) {
                sg += (double)(gp[q] * ((xp[q] - mean) * rs));
                sb += gp[q];
            }
        }
        if (dgamma) dgamma[ch] += (float)sg;
        if (dbeta) dbeta[ch] += (float)sb;
    }
    return PORT_OK;
}

/* ------------------------------------------------------------------ resize */
static port_status up_check(const port_upsample2d_params *p) {
    PORT_NOTNULL(p);
    PORT_CHECK(p->n > 0 && p->c > 0 && p->h > 0 && p->w > 0 && p->ho > 0 && p->wo > 0, PORT_ERR_SHAPE);
    PORT_CHECK(p->mode == PORT_UPSAMPLE_NEAREST || p->mode == PORT_UPSAMPLE_BILINEAR, PORT_ERR_ARG);
    PORT_CHECK(p->align_corners == 0 || (p->align_corners == 1 && p->mode == PORT_UPSAMPLE_BILINEAR), PORT_ERR_ARG);
    PORT_CHECK(isfinite(p->rh) && isfinite(p->rw) && p->rh >= 0.0f && p->rw >= 0.0f, PORT_ERR_ARG);
    return PORT_OK;
}

/* one axis of a resize: for output index o, the two source indices and their weights (nearest: i1 = i0,
 * l1 = 0).  PyTorch's rules (aten/src/ATen/native/UpSample.h), in float. */
typedef struct {
    int64_t i0, i1;
    float l0, l1;
} tap;

static tap axis_tap(int64_t o, int64_t in, int64_t out, float r, int64_t mode, int64_t align) {
    tap t;
    if (mode == PORT_UPSAMPLE_NEAREST) {
        float s = r > 0.0f ? r : (float)in / (float)out;
        int64_t i = (int64_t)floorf((float)o * s);
        t.i0 = t.i1 = i < in - 1 ? i : in - 1;
        t.l0 = 1.0f, t.l1 = 0.0f;
        return t;
    }
    if (in == out) {
        t.i0 = t.i1 = o;
        t.l0 = 1.0f, t.l1 = 0.0f;
        return t;
    }
    float s, src;
    if (align) {
        s = out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
        src = s * (float)o;
    } else {
        s = r > 0.0f ? r : (float)in / (float)out;
        src = s * ((float)o + 0.5f) - 0.5f;
        if (src < 0.0f) src = 0.0f;
    }
    int64_t i = (int64_t)floorf(src);
    if (i > in - 1) i = in - 1;
    float l = src - (float)i;
    l = l < 0.0f ? 0.0f : (l > 1.0f ? 1.0f : l);
    t.i0 = i;
    t.i1 = i + (i < in - 1 ? 1 : 0);
    t.l1 = l;
    t.l0 = 1.0f - l;
    return t;
}

port_status port_upsample2d_forward(float *y, const float *x, const port_upsample2d_params *p) {
    port_status st = up_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(y); PORT_NOTNULL(x);
    PORT_CHECK(y != x, PORT_ERR_ALIAS);
    const int64_t H = p->h, W = p->w, ho = p->ho, wo = p->wo, planes = p->n * p->c;
#pragma omp parallel for schedule(static) if (planes * ho * wo > PORT_PAR_MIN && planes > 1)
    for (int64_t pl = 0; pl < planes; pl++) {
        const float *xp = x + pl * H * W;
        float *yp = y + pl * ho * wo;
        for (int64_t oh = 0; oh < ho; oh++) {
            tap th = axis_tap(oh, H, ho, p->rh, p->mode, p->align_corners);
            const float *r0 = xp + th.i0 * W, *r1 = xp + th.i1 * W;
            for (int64_t ow = 0; ow < wo; ow++) {
                tap tw = axis_tap(ow, W, wo, p->rw, p->mode, p->align_corners);
                yp[oh * wo + ow] = p->mode == PORT_UPSAMPLE_NEAREST
                                       ? r0[tw.i0]
                                       : th.l0 * (tw.l0 * r0[tw.i0] + tw.l1 * r0[tw.i1]) +
                                             th.l1 * (tw.l0 * r1[tw.i0] + tw.l1 * r1[tw.i1]);
            }
        }
    }
    return PORT_OK;
}

port_status port_upsample2d_backward_input(float *dx, const float *dy, const port_upsample2d_params *p) {
    port_status st = up_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dx); PORT_NOTNULL(dy);
    PORT_CHECK(dx != dy, PORT_ERR_ALIAS);
    const int64_t H = p->h, W = p->w, ho = p->ho, wo = p->wo, planes = p->n * p->c;
#pragma omp parallel for schedule(static) if (planes * ho * wo > PORT_PAR_MIN && planes > 1)
    for (int64_t pl = 0; pl < planes; pl++) {
        float *dp = dx + pl * H * W;
        const float *gp = dy + pl * ho * wo;
        memset(dp, 0, (size_t)(H * W) * sizeof(float));
        for (int64_t oh = 0; oh < ho; oh++) {
            tap th = axis_tap(oh, H, ho, p->rh, p->mode, p->align_corners);
            float *r0 = dp + th.i0 * W, *r1 = dp + th.i1 * W;
            for (int64_t ow = 0; ow < wo; ow++) {
                tap tw = axis_tap(ow, W, wo, p->rw, p->mode, p->align_corners);
                float g = gp[oh * wo + ow];
                if (p->mode == PORT_UPSAMPLE_NEAREST) {
                    r0[tw.i0] += g;
                    continue;
                }
                r0[tw.i0] += th.l0 * tw.l0 * g;
                r0[tw.i1] += th.l0 * tw.l1 * g;
                r1[tw.i0] += th.l1 * tw.l0 * g;
                r1[tw.i1] += th.l1 * tw.l1 * g;
            }
        }
    }
    return PORT_OK;
}

/* ------------------------------------------------------------------ adaptive average pool */
static int64_t win_start(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
static int64_t win_end(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

static port_status adaptive_check(int64_t n, int64_t c, int64_t h, int64_t w, int64_t ho, int64_t wo) {
    PORT_CHECK(n > 0 && c > 0 && h > 0 && w > 0 && ho > 0 && wo > 0, PORT_ERR_SHAPE);
    PORT_CHECK(h < (INT64_C(1) << 31) && w < (INT64_C(1) << 31) && ho < (INT64_C(1) << 31) &&
                   wo < (INT64_C(1) << 31),
               PORT_ERR_SHAPE);   /* (o + 1) * in stays far from overflow */
    return PORT_OK;
}

port_status port_adaptive_avgpool2d_forward(float *y, const float *x, int64_t n, int64_t c, int64_t h, int64_t w,
                                            int64_t ho, int64_t wo) {
    PORT_NOTNULL(y); PORT_NOTNULL(x);
    port_status st = adaptive_check(n, c, h, w, ho, wo);
    if (st != PORT_OK) return st;
    PORT_CHECK(y != x, PORT_ERR_ALIAS);
    const int64_t planes = n * c;
#pragma omp parallel for schedule(static) if (planes * h * w > PORT_PAR_MIN && planes > 1)
    for (int64_t pl = 0; pl < planes; pl++) {
        const float *xp = x + pl * h * w;
        float *yp = y + pl * ho * wo;
        for (int64_t oh = 0; oh < ho; oh++) {
            int64_t h0 = win_start(oh, h, ho), h1 = win_end(oh, h, ho);
            for (int64_t ow = 0; ow < wo; ow++) {
                int64_t w0 = win_start(ow, w, wo), w1 = win_end(ow, w, wo);
                float s = 0.0f;
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) s += xp[ih * w + iw];
                yp[oh * wo + ow] = s / (float)((h1 - h0) * (w1 - w0));
            }
        }
    }
    return PORT_OK;
}

port_status port_adaptive_avgpool2d_backward_input(float *dx, const float *dy, int64_t n, int64_t c, int64_t h,
                                                   int64_t w, int64_t ho, int64_t wo) {
    PORT_NOTNULL(dx); PORT_NOTNULL(dy);
    port_status st = adaptive_check(n, c, h, w, ho, wo);
    if (st != PORT_OK) return st;
    PORT_CHECK(dx != dy, PORT_ERR_ALIAS);
    const int64_t planes = n * c;
#pragma omp parallel for schedule(static) if (planes * h * w > PORT_PAR_MIN && planes > 1)
    for (int64_t pl = 0; pl < planes; pl++) {
        float *dp = dx + pl * h * w;
        const float *gp = dy + pl * ho * wo;
        memset(dp, 0, (size_t)(h * w) * sizeof(float));
        for (int64_t oh = 0; oh < ho; oh++) {
            int64_t h0 = win_start(oh, h, ho), h1 = win_end(oh, h, ho);
            for (int64_t ow = 0; ow < wo; ow++) {
                int64_t w0 = win_start(ow, w, wo), w1 = win_end(ow, w, wo);
                float g = gp[oh * wo + ow] / (float)((h1 - h0) * (w1 - w0));
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) dp[ih * w + iw] += g;
            }
        }
    }
    return PORT_OK;
}
