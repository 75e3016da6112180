/* Pooling: max (with int64 indices), average (ceil_mode, count_include_pad), global avg. */
#include "internal.h"
#include <math.h>

/* PyTorch's pooling_output_shape: (size + 2 pad - dil (k - 1) - 1 (+ stride - 1 in ceil mode)) / stride + 1, and
 * in ceil mode one less where the last window would start past the input and its left padding */
static int64_t out_size(int64_t size, int64_t k, int64_t s, int64_t pad, int64_t dil, int64_t ceil) {
    int64_t d = dil > 1 ? dil : 1, span = size + 2 * pad - d * (k - 1) - 1;
    if (span < 0) return -1;
    int64_t o = (span + (ceil ? s - 1 : 0)) / s + 1;
    if (ceil && (o - 1) * s >= size + pad) o--;
    return o;
}
int64_t port_pool2d_out_h(const port_pool2d_params *p) {
    if (!p || p->stride_h < 1) return -1;
    return out_size(p->h, p->kh, p->stride_h, p->pad_h, p->dilation_h, p->ceil_mode);
}
int64_t port_pool2d_out_w(const port_pool2d_params *p) {
    if (!p || p->stride_w < 1) return -1;
    return out_size(p->w, p->kw, p->stride_w, p->pad_w, p->dilation_w, p->ceil_mode);
}

static int64_t dil(int64_t d) { return d > 1 ? d : 1; }

static port_status pool_check(const port_pool2d_params *p) {
    PORT_NOTNULL(p);
    PORT_CHECK(p->n > 0 && p->c > 0 && p->h > 0 && p->w > 0 && p->kh > 0 && p->kw > 0,
               PORT_ERR_SHAPE);
    PORT_CHECK(p->stride_h > 0 && p->stride_w > 0 && p->pad_h >= 0 && p->pad_w >= 0,
               PORT_ERR_ARG);
    PORT_CHECK(p->dilation_h >= 0 && p->dilation_w >= 0 && (p->ceil_mode == 0 || p->ceil_mode == 1), PORT_ERR_ARG);
    /* PyTorch: pad must be at most half the kernel size */
    PORT_CHECK(2 * p->pad_h <= p->kh && 2 * p->pad_w <= p->kw, PORT_ERR_ARG);
    PORT_CHECK(p->h + 2 * p->pad_h >= dil(p->dilation_h) * (p->kh - 1) + 1 &&
                   p->w + 2 * p->pad_w >= dil(p->dilation_w) * (p->kw - 1) + 1,
               PORT_ERR_SHAPE);
    PORT_CHECK(p->h_out >= 0 && p->w_out >= 0, PORT_ERR_SHAPE);
    PORT_CHECK(port_pool2d_out_h(p) >= 1 && port_pool2d_out_w(p) >= 1, PORT_ERR_SHAPE);
    PORT_CHECK((p->h_out == 0 || p->h_out == port_pool2d_out_h(p)) &&
                   (p->w_out == 0 || p->w_out == port_pool2d_out_w(p)),
               PORT_ERR_SHAPE);
    return PORT_OK;
}

/* max pools: no exclude_pad */
static port_status max_check(const port_pool2d_params *p) {
    port_status st = pool_check(p);
    if (st != PORT_OK) return st;
    PORT_CHECK(p->exclude_pad == 0, PORT_ERR_ARG);
    return PORT_OK;
}

/* average pools: no dilation; exclude_pad 0 or 1 */
static port_status avg_check(const port_pool2d_params *p) {
    port_status st = pool_check(p);
    if (st != PORT_OK) return st;
    PORT_CHECK(dil(p->dilation_h) == 1 && dil(p->dilation_w) == 1 && (p->exclude_pad == 0 || p->exclude_pad == 1),
               PORT_ERR_ARG);
    return PORT_OK;
}

/* One average-pool window along a dim: [*s, *e) inside the input; its extent inside the padded input (PyTorch:
 * min(start + k, size + pad) - start) is returned. */
static int64_t avg_span(int64_t o, int64_t stride, int64_t pad, int64_t k, int64_t size, int64_t *s, int64_t *e) {
    int64_t a = o * stride - pad, b = PORT_MIN(a + k, size + pad);
    *s = PORT_MAX(a, 0);
    *e = PORT_MIN(b, size);
    return b - a;
}

port_status port_maxpool2d_forward(float *y, int64_t *indices, const float *x,
                                   const port_pool2d_params *p) {
    port_status st = max_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(y); PORT_NOTNULL(indices); PORT_NOTNULL(x);
    int64_t H = p->h, W = p->w, ho = port_pool2d_out_h(p), wo = port_pool2d_out_w(p);
    int64_t dh = dil(p->dilation_h), dw = dil(p->dilation_w);
#pragma omp parallel for schedule(static) if (p->n * p->c * ho * wo * p->kh * p->kw > PORT_PAR_MIN)
    for (int64_t nc = 0; nc < p->n * p->c; nc++) {
        const float *xp = x + nc * H * W;
        float *yp = y + nc * ho * wo;
        int64_t *ip = indices + nc * ho * wo;
        for (int64_t oh = 0; oh < ho; oh++) {
            /* window rows h0, h0 + dh, ... below h0 + (kh - 1) dh + 1, those inside the input */
            int64_t h0 = oh * p->stride_h - p->pad_h, he = PORT_MIN(h0 + (p->kh - 1) * dh + 1, H), hs = h0;
            while (hs < 0) hs += dh;
            for (int64_t ow = 0; ow < wo; ow++) {
                int64_t w0 = ow * p->stride_w - p->pad_w, we = PORT_MIN(w0 + (p->kw - 1) * dw + 1, W), ws = w0;
                while (ws < 0) ws += dw;
                float best = -INFINITY;
                int64_t bi = hs * W + ws;
                for (int64_t ih = hs; ih < he; ih += dh)
                    for (int64_t iw = ws; iw < we; iw += dw) {
                        float v = xp[ih * W + iw];
                        if (v > best || isnan(v)) {
                            best = v;
                            bi = ih * W + iw;
                            if (isnan(v)) goto done;
                        }
                    }
            done:
                yp[oh * wo + ow] = best;
                ip[oh * wo + ow] = bi;
            }
        }
    }
    return PORT_OK;
}

port_status port_maxpool2d_backward_input(float *dx, const float *dy, const int64_t *indices,
                                          const port_pool2d_params *p) {
    port_status st = max_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(indices);
    int64_t HW = p->h * p->w, P = port_pool2d_out_h(p) * port_pool2d_out_w(p);
    int bad = 0;
#pragma omp parallel for schedule(static) if (p->n * p->c * HW > PORT_PAR_MIN) reduction(|: bad)
    for (int64_t nc = 0; nc < p->n * p->c; nc++) {
        float *dxp = dx + nc * HW;
        const float *dyp = dy + nc * P;
        const int64_t *ip = indices + nc * P;
        memset(dxp, 0, (size_t)HW * sizeof(float));
        for (int64_t q = 0; q < P; q++) {
            int64_t i = ip[q];
            if (i < 0 || i >= HW) { bad = 1; continue; }
            dxp[i] += dyp[q];
        }
    }
    return bad ? PORT_ERR_ARG : PORT_OK;
}

port_status port_avgpool2d_forward(float *y, const float *x, const port_pool2d_params *p) {
    port_status st = avg_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(y); PORT_NOTNULL(x);
    int64_t H = p->h, W = p->w, ho = port_pool2d_out_h(p), wo = port_pool2d_out_w(p);
#pragma omp parallel for schedule(static) if (p->n * p->c * ho * wo * p->kh * p->kw > PORT_PAR_MIN)
    for (int64_t nc = 0; nc < p->n * p->c; nc++) {
        const float *xp = x + nc * H * W;
        float *yp = y + nc * ho * wo;
        for (int64_t oh = 0; oh < ho; oh++) {
            int64_t hs, he, ph = avg_span(oh, p->stride_h, p->pad_h, p->kh, H, &hs, &he);
            for (int64_t ow = 0; ow < wo; ow++) {
                int64_t ws, we, pw = avg_span(ow, p->stride_w, p->pad_w, p->kw, W, &ws, &we);
                float s = 0.0f;
                for (int64_t ih = hs; ih < he; ih++)
                    for (int64_t iw = ws; iw < we; iw++) s += xp[ih * W + iw];
                int64_t div = p->exclude_pad ? (he - hs) * (we - ws) : ph * pw;
                yp[oh * wo + ow] = div > 0 ? s * (1.0f / (float)div) : 0.0f;
            }
        }
    }
    return PORT_OK;
}

port_status port_avgpool2d_backward_input(float *dx, const float *dy,
                                          const port_pool2d_params *p) {
    port_status st = avg_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dx); PORT_NOTNULL(dy);
    int64_t H = p->h, W = p->w, ho = port_pool2d_out_h(p), wo = port_pool2d_out_w(p);
#pragma omp parallel for schedule(static) if (p->n * p->c * ho * wo * p->kh * p->kw > PORT_PAR_MIN)
    for (int64_t nc = 0; nc < p->n * p->c; nc++) {
        float *dxp = dx + nc * H * W;
        const float *dyp = dy + nc * ho * wo;
        memset(dxp, 0, (size_t)(H * W) * sizeof(float));
        for (int64_t oh = 0; oh < ho; oh++) {
            int64_t hs, he, ph = avg_span(oh, p->stride_h, p->pad_h, p->kh, H, &hs, &he);
            for (int64_t ow = 0; ow < wo; ow++) {
                int64_t ws, we, pw = avg_span(ow, p->stride_w, p->pad_w, p->kw, W, &ws, &we);
                int64_t div = p->exclude_pad ? (he - hs) * (we - ws) : ph * pw;
                if (div <= 0) continue;
                float g = dyp[oh * wo + ow] * (1.0f / (float)div);
                for (int64_t ih = hs; ih < he; ih++)
                    for (int64_t iw = ws; iw < we; iw++) dxp[ih * W + iw] += g;
            }
        }
    }
    return PORT_OK;
}

/* Each (n, c) mean is its row's float sum in index order, divided once.  GAP_ROWS rows are summed side by side:
 * a row's sum is one chain of dependent adds (latency-bound: about 4 cycles an element alone), GAP_ROWS chains in
 * flight run at the loads' rate; each row keeps its own order, so the same bits as one row at a time (the fused
 * squeeze-excitation, se.c, takes its pooled mean here twice: forward and backward). */
#define GAP_ROWS 8
port_status port_global_avgpool_forward(float *y, const float *x, int64_t n, int64_t c,
                                        int64_t hw) {
    PORT_NOTNULL(y); PORT_NOTNULL(x);
    PORT_CHECK(n > 0 && c > 0 && hw > 0, PORT_ERR_SHAPE);
    const int64_t rows = n * c, nb = (rows + GAP_ROWS - 1) / GAP_ROWS;
#pragma omp parallel for schedule(static) if (rows * hw > PORT_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t r0 = b * GAP_ROWS;
        const float *xp = x + r0 * hw;
        if (rows - r0 >= GAP_ROWS) {
            float s[GAP_ROWS] = {0.0f};
            for (int64_t q = 0; q < hw; q++)
                for (int r = 0; r < GAP_ROWS; r++) s[r] += xp[r * hw + q];
            for (int r = 0; r < GAP_ROWS; r++) y[r0 + r] = s[r] / (float)hw;
            continue;
        }
        for (int64_t r = 0; r < rows - r0; r++) {
            float s = 0.0f;
            for (int64_t q = 0; q < hw; q++) s += xp[r * hw + q];
            y[r0 + r] = s / (float)hw;
        }
    }
    return PORT_OK;
}

port_status port_global_avgpool_backward_input(float *dx, const float *dy, int64_t n, int64_t c,
                                               int64_t hw) {
    PORT_NOTNULL(dx); PORT_NOTNULL(dy);
    PORT_CHECK(n > 0 && c > 0 && hw > 0, PORT_ERR_SHAPE);
#pragma omp parallel for schedule(static) if (n * c * hw > PORT_PAR_MIN)
    for (int64_t nc = 0; nc < n * c; nc++) {
        float g = dy[nc] / (float)hw;
        float *dxp = dx + nc * hw;
        for (int64_t q = 0; q < hw; q++) dxp[q] = g;
    }
    return PORT_OK;
}
