/* Plain reference convolution: direct nested loops over the definition, double accumulators, no workspace, no
 * threads.  The in-C oracle for the fast kernels (im2col + GEMM with batch folding, direct depthwise/pointwise,
 * patch tiles), as the vendored GEMM is for BLAS; tests compare every fast path against it and it against
 * PyTorch in float64. */
#include "internal.h"

#define REF_PARAMS                                                                               \
    int64_t N = p->n, C = p->c_in, H = p->h, W = p->w, CO = p->c_out, KH = p->kh, KW = p->kw;    \
    int64_t SH = p->stride_h, SW = p->stride_w, PH = p->pad_h, PW = p->pad_w, G = p->groups;     \
    int64_t CIG = C / G, COG = CO / G;                                                           \
    int64_t HO = port_conv2d_out_h(p), WO = port_conv2d_out_w(p);                                \
    (void)N; (void)CIG; (void)COG; (void)HO; (void)WO

port_status port_conv2d_reference_forward(float *y, const float *x, const float *w, const float *b,
                                          const port_conv2d_params *p) {
    port_status st = port_conv2d_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(w);
    REF_PARAMS;
    for (int64_t n = 0; n < N; n++)
        for (int64_t co = 0; co < CO; co++) {
            int64_t g = co / COG;
            for (int64_t oh = 0; oh < HO; oh++)
                for (int64_t ow = 0; ow < WO; ow++) {
                    double acc = b ? (double)b[co] : 0.0;
                    for (int64_t c = 0; c < CIG; c++)
                        for (int64_t i = 0; i < KH; i++)
                            for (int64_t j = 0; j < KW; j++) {
                                int64_t ih = oh * SH - PH + i, iw = ow * SW - PW + j;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                acc += (double)x[((n * C + g * CIG + c) * H + ih) * W + iw] *
                                       (double)w[((co * CIG + c) * KH + i) * KW + j];
                            }
                    y[((n * CO + co) * HO + oh) * WO + ow] = (float)acc;
                }
        }
    return PORT_OK;
}

port_status port_conv2d_reference_backward_input(float *dx, const float *dy, const float *w,
                                                 const port_conv2d_params *p) {
    port_status st = port_conv2d_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(w);
    REF_PARAMS;
    /* dx[n, c, ih, iw] = sum over (co in c's group, i, j) with ih = oh*SH - PH + i, iw = ow*SW - PW + j */
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            int64_t g = c / CIG, cl = c % CIG;
            for (int64_t ih = 0; ih < H; ih++)
                for (int64_t iw = 0; iw < W; iw++) {
                    double acc = 0.0;
                    for (int64_t co = g * COG; co < (g + 1) * COG; co++)
                        for (int64_t i = 0; i < KH; i++) {
                            int64_t t = ih + PH - i;
                            if (t < 0 || t % SH) continue;
                            int64_t oh = t / SH;
                            if (oh >= HO) continue;
                            for (int64_t j = 0; j < KW; j++) {
                                int64_t u = iw + PW - j;
                                if (u < 0 || u % SW) continue;
                                int64_t ow = u / SW;
                                if (ow >= WO) continue;
                                acc += (double)dy[((n * CO + co) * HO + oh) * WO + ow] *
                                       (double)w[((co * CIG + cl) * KH + i) * KW + j];
                            }
                        }
                    dx[((n * C + c) * H + ih) * W + iw] = (float)acc;
                }
        }
    return PORT_OK;
}

port_status port_conv2d_reference_backward_weight(float *dw, float *db, const float *dy,
                                                  const float *x, const port_conv2d_params *p) {
    port_status st = port_conv2d_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dw); PORT_NOTNULL(dy); PORT_NOTNULL(x);
    REF_PARAMS;
    for (int64_t co = 0; co < CO; co++) {
        int64_t g = co / COG;
        for (int64_t c = 0; c < CIG; c++)
            for (int64_t i = 0; i < KH; i++)
                for (int64_t j = 0; j < KW; j++) {
                    double acc = 0.0;
                    for (int64_t n = 0; n < N; n++)
                        for (int64_t oh = 0; oh < HO; oh++)
                            for (int64_t ow = 0; ow < WO; ow++) {
                                int64_t ih = oh * SH - PH + i, iw = ow * SW - PW + j;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                acc += (double)dy[((n * CO + co) * HO + oh) * WO + ow] *
                                       (double)x[((n * C + g * CIG + c) * H + ih) * W + iw];
                            }
                    dw[((co * CIG + c) * KH + i) * KW + j] += (float)acc;
                }
        if (db) {
            double s = 0.0;
            for (int64_t n = 0; n < N; n++)
                for (int64_t q = 0; q < HO * WO; q++) s += (double)dy[(n * CO + co) * HO * WO + q];
            db[co] += (float)s;
        }
    }
    return PORT_OK;
}
