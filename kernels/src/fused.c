/* Fused conv2d + batch norm + ReLU (training and frozen-BN variants). */
#include "internal.h"
#include <math.h>

#define ALIGN64(x) (((x) + 63) & ~(size_t)63)

static size_t out_elems(const port_conv2d_params *p) {
    return (size_t)(p->n * p->c_out * port_conv2d_out_h(p) * port_conv2d_out_w(p));
}

port_status port_conv2d_bn_relu_forward_train(float *y, float *z, float *save_mean,
                                              float *save_invstd, float *running_mean,
                                              float *running_var, const float *x, const float *w,
                                              const float *gamma, const float *beta,
                                              const port_conv2d_params *p, float eps,
                                              float momentum, int algo, void *ws,
                                              size_t ws_bytes) {
    port_status st = port__conv_validate(p, &algo, ws, ws_bytes);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(y); PORT_NOTNULL(z); PORT_NOTNULL(x); PORT_NOTNULL(w);
    PORT_NOTNULL(save_mean); PORT_NOTNULL(save_invstd);
    PORT_CHECK(eps > 0.0f && momentum >= 0.0f && momentum <= 1.0f, PORT_ERR_ARG);
    int64_t P = port_conv2d_out_h(p) * port_conv2d_out_w(p);
    PORT_CHECK(p->n * P > 1, PORT_ERR_SHAPE);
    PORT_CHECK(y != z, PORT_ERR_ALIAS);
    port__conv_fwd(z, x, w, NULL, p, algo, (float *)ws);
    port__bn_train_forward(y, save_mean, save_invstd, running_mean, running_var, z, gamma, beta,
                           p->n, p->c_out, P, eps, momentum, 1);
    return PORT_OK;
}

size_t port_conv2d_bn_relu_backward_workspace_bytes(const port_conv2d_params *p, int algo) {
    if (port_conv2d_check(p) != PORT_OK) return 0;
    return ALIGN64(out_elems(p) * sizeof(float)) + port_conv2d_workspace_bytes(p, algo);
}

static port_status fused_bwd_ws(const port_conv2d_params *p, int *algo, void *ws,
                                size_t ws_bytes, float **dz, float **cws) {
    port_status st = port_conv2d_check(p);
    if (st != PORT_OK) return st;
    int a = port__conv_resolve_algo(p, *algo);
    if (a < 0) return *algo == PORT_CONV_DIRECT ? PORT_ERR_UNSUPPORTED : PORT_ERR_ARG;
    size_t off = ALIGN64(out_elems(p) * sizeof(float));
    PORT_CHECK(ws != NULL && ws_bytes >= port_conv2d_bn_relu_backward_workspace_bytes(p, a),
               PORT_ERR_WORKSPACE);
    *algo = a;
    *dz = (float *)ws;
    *cws = (float *)((char *)ws + off);
    return PORT_OK;
}

port_status port_conv2d_bn_relu_backward(float *dx, float *dw, float *dgamma, float *dbeta,
                                         const float *dy, const float *x, const float *w,
                                         const float *z, const float *gamma, const float *beta,
                                         const float *save_mean, const float *save_invstd,
                                         const port_conv2d_params *p, int algo, void *ws,
                                         size_t ws_bytes) {
    float *dz, *cws;
    port_status st = fused_bwd_ws(p, &algo, ws, ws_bytes, &dz, &cws);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(w); PORT_NOTNULL(z);
    PORT_NOTNULL(save_mean); PORT_NOTNULL(save_invstd);
    int64_t P = port_conv2d_out_h(p) * port_conv2d_out_w(p);
    port__bn_train_backward(dz, dgamma, dbeta, dy, z, gamma, beta, save_mean, save_invstd, p->n,
                            p->c_out, P, 1);
    if (dx) port__conv_bwd_in(dx, dz, w, p, algo, cws);
    if (dw) port__conv_bwd_w(dw, NULL, dz, x, p, algo, cws);
    return PORT_OK;
}

port_status port_conv2d_bn_fold(float *w_fold, float *b_fold, const float *w, const float *b,
                                const float *gamma, const float *beta,
                                const float *running_mean, const float *running_var,
                                const port_conv2d_params *p, float eps) {
    port_status st = port_conv2d_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(w_fold); PORT_NOTNULL(b_fold); PORT_NOTNULL(w);
    PORT_NOTNULL(running_mean); PORT_NOTNULL(running_var);
    PORT_CHECK(eps > 0.0f, PORT_ERR_ARG);
    int64_t per = p->c_in / p->groups * p->kh * p->kw;
    for (int64_t co = 0; co < p->c_out; co++) {
        float s = (gamma ? gamma[co] : 1.0f) *
                  (float)(1.0 / sqrt((double)running_var[co] + (double)eps));
        for (int64_t i = 0; i < per; i++) w_fold[co * per + i] = w[co * per + i] * s;
        b_fold[co] = (beta ? beta[co] : 0.0f) + ((b ? b[co] : 0.0f) - running_mean[co]) * s;
    }
    return PORT_OK;
}

port_status port_conv2d_bn_relu_forward_frozen(float *y, const float *x, const float *w_fold,
                                               const float *b_fold, const port_conv2d_params *p,
                                               int relu, int algo, void *ws, size_t ws_bytes) {
    port_status st = port_conv2d_forward(y, x, w_fold, b_fold, p, algo, ws, ws_bytes);
    if (st != PORT_OK || !relu) return st;
    int64_t cnt = (int64_t)out_elems(p);
#pragma omp parallel for simd schedule(static) if (cnt > PORT_PAR_MIN)
    for (int64_t i = 0; i < cnt; i++) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
    return PORT_OK;
}

port_status port_conv2d_bn_relu_backward_frozen(float *dx, float *dw, float *dgamma,
                                                float *dbeta, const float *dy, const float *x,
                                                const float *y, const float *w,
                                                const float *gamma, const float *beta,
                                                const float *running_var,
                                                const port_conv2d_params *p, float eps, int relu,
                                                int algo, void *ws, size_t ws_bytes) {
    float *gs, *cws;
    port_status st = fused_bwd_ws(p, &algo, ws, ws_bytes, &gs, &cws);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(y); PORT_NOTNULL(w);
    PORT_NOTNULL(running_var);
    PORT_CHECK(eps > 0.0f, PORT_ERR_ARG);
    if (dgamma) {
        PORT_NOTNULL(gamma);
        for (int64_t c = 0; c < p->c_out; c++) PORT_CHECK(gamma[c] != 0.0f, PORT_ERR_ARG);
    }
    int64_t n = p->n, C = p->c_out, P = port_conv2d_out_h(p) * port_conv2d_out_w(p);
#pragma omp parallel for schedule(static) if (n * C * P > PORT_PAR_MIN)
    for (int64_t c = 0; c < C; c++) {
        float g = gamma ? gamma[c] : 1.0f, b = beta ? beta[c] : 0.0f;
        float s = g * (float)(1.0 / sqrt((double)running_var[c] + (double)eps));
        float rg = dgamma ? 1.0f / g : 0.0f;
        double sg = 0.0, sgx = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const float *dp = dy + (i * C + c) * P, *yp = y + (i * C + c) * P;
            float *gp = gs + (i * C + c) * P;
            float a = 0.0f, bb = 0.0f;
            for (int64_t q = 0; q < P; q++) {
                float gi = (!relu || yp[q] > 0.0f) ? dp[q] : 0.0f;
                a += gi;
                bb += gi * ((yp[q] - b) * rg);
                gp[q] = gi * s;
            }
            sg += a;
            sgx += bb;
        }
        if (dbeta) dbeta[c] += (float)sg;
        if (dgamma) dgamma[c] += (float)sgx;
    }
    if (dx) port__conv_bwd_in(dx, gs, w, p, algo, cws);
    if (dw) port__conv_bwd_w(dw, NULL, gs, x, p, algo, cws);
    return PORT_OK;
}
