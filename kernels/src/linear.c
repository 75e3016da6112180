/* Linear layer y = x W^T + b via GEMM. */
#include "internal.h"
#include <limits.h>

static port_status lin_check(const port_linear_params *p) {
    PORT_NOTNULL(p);
    PORT_CHECK(p->n > 0 && p->in_features > 0 && p->out_features > 0, PORT_ERR_SHAPE);
    PORT_CHECK(p->n <= INT_MAX && p->in_features <= INT_MAX && p->out_features <= INT_MAX,
               PORT_ERR_SHAPE);
    return PORT_OK;
}

port_status port_linear_forward(float *y, const float *x, const float *w, const float *b,
                                const port_linear_params *p) {
    port_status st = lin_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(w);
    int64_t N = p->n, I = p->in_features, O = p->out_features;
    float beta = 0.0f;
    if (b) {
        for (int64_t i = 0; i < N; i++) memcpy(y + i * O, b, (size_t)O * sizeof(float));
        beta = 1.0f;
    }
    port__gemm(0, 1, N, O, I, 1.0f, x, I, w, I, beta, y, O);
    return PORT_OK;
}

port_status port_linear_backward_input(float *dx, const float *dy, const float *w,
                                       const port_linear_params *p) {
    port_status st = lin_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(w);
    int64_t N = p->n, I = p->in_features, O = p->out_features;
    port__gemm(0, 0, N, I, O, 1.0f, dy, O, w, I, 0.0f, dx, I);
    return PORT_OK;
}

port_status port_linear_backward_weight(float *dw, float *db, const float *dy, const float *x,
                                        const port_linear_params *p) {
    port_status st = lin_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dw); PORT_NOTNULL(dy); PORT_NOTNULL(x);
    int64_t N = p->n, I = p->in_features, O = p->out_features;
    port__gemm(1, 0, O, I, N, 1.0f, dy, O, x, I, 1.0f, dw, I);
    if (db) {   /* column sums in row order (each column's additions in i order, as a column-wise loop), a
                 * block of columns at a time so that dy is read along its rows */
        enum { BLK = 256 };
        double acc[BLK];
        for (int64_t o0 = 0; o0 < O; o0 += BLK) {
            int64_t nb = PORT_MIN((int64_t)BLK, O - o0);
            for (int64_t j = 0; j < nb; j++) acc[j] = 0.0;
            for (int64_t i = 0; i < N; i++) {
                const float *row = dy + i * O + o0;
                for (int64_t j = 0; j < nb; j++) acc[j] += row[j];
            }
            for (int64_t j = 0; j < nb; j++) db[o0 + j] += (float)acc[j];
        }
    }
    return PORT_OK;
}

port_status port_bias_backward(float *db, const float *dy, int64_t n, int64_t c, int64_t inner) {
    PORT_NOTNULL(db); PORT_NOTNULL(dy);
    PORT_CHECK(n > 0 && c > 0 && inner > 0, PORT_ERR_SHAPE);
    for (int64_t j = 0; j < c; j++) {
        double s = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const float *row = dy + (i * c + j) * inner;
            for (int64_t k = 0; k < inner; k++) s += row[k];
        }
        db[j] += (float)s;
    }
    return PORT_OK;
}
