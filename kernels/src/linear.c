/* Linear layer y = x W^T + b via GEMM. */
#include "internal.h"
#include <limits.h>

/* Weight gradients of at most LIN_KSPLIT_MAX floats (a 64 KiB partial on each thread's stack) from at least
 * 2 x LIN_KSPLIT_ROWS rows run split over the rows (port_linear_backward_weight).  PORT_LIN_KSPLIT=0 (small
 * stacks: microcontrollers) turns it off. */
#ifndef PORT_LIN_KSPLIT
#define PORT_LIN_KSPLIT 1
#endif
#define LIN_KSPLIT_MAX (PORT_LIN_KSPLIT ? 16384 : 0)
#define LIN_KSPLIT_ROWS 1024

static port_status lin_check(const port_linear_params *p) {
    PORT_NOTNULL(p);
    PORT_CHECK(p->n > 0 && p->in_features > 0 && p->out_features > 0, PORT_ERR_SHAPE);
    PORT_CHECK(p->n <= INT_MAX && p->in_features <= INT_MAX && p->out_features <= INT_MAX,
               PORT_ERR_SHAPE);
    return PORT_OK;
}

/* rows [r0, r1) of y = x W^T + b (wt: y = x W + b, W stored [in, out]): the rows set to b, then a GEMM with
 * beta = 1 */
static void linear_bias_block(float *y, const float *x, const float *w, const float *b, int64_t r0, int64_t r1,
                              int64_t I, int64_t O, int wt) {
    for (int64_t i = r0; i < r1; i++) memcpy(y + i * O, b, (size_t)O * sizeof(float));
    port__gemm(0, !wt, r1 - r0, O, I, 1.0f, x + r0 * I, I, w, wt ? O : I, 1.0f, y + r0 * O, O);
}

static port_status linear_forward(float *y, const float *x, const float *w, const float *b,
                                  const port_linear_params *p, int wt) {
    port_status st = lin_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(w);
    int64_t N = p->n, I = p->in_features, O = p->out_features;
    if (!b) {
        port__gemm(0, !wt, N, O, I, 1.0f, x, I, w, wt ? O : I, 0.0f, y, O);
        return PORT_OK;
    }
    /* With a bias: blocks of rows (about 64 K floats of y each, a block count fixed by the shape), each one's
     * rows set to b and then accumulated by a one-thread GEMM (beta = 1) while they are still in the cache; the
     * blocks over the threads.  (b written over the whole of y first, then one GEMM reading it back from
     * memory, cost 0.7 ms of 2.7 on a 4096 x 128 -> 512 layer, 2 threads.) */
    int64_t rb = PORT_MAX((int64_t)16, (65536 / O + 15) / 16 * 16), nb = (N + rb - 1) / rb;
    if (nb == 1 || (double)N * (double)O * (double)I < PORT_GEMM_PAR_MIN || port__in_parallel()) {
        for (int64_t t = 0; t < nb; t++)   /* one block, or too little work to split: the GEMM threads itself */
            linear_bias_block(y, x, w, b, t * rb, PORT_MIN(N, (t + 1) * rb), I, O, wt);
        return PORT_OK;
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < nb; t++) linear_bias_block(y, x, w, b, t * rb, PORT_MIN(N, (t + 1) * rb), I, O, wt);
    return PORT_OK;
}

static port_status linear_backward_input(float *dx, const float *dy, const float *w, const port_linear_params *p,
                                         int wt) {
    port_status st = lin_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(w);
    int64_t N = p->n, I = p->in_features, O = p->out_features;
    port__gemm(0, wt, N, I, O, 1.0f, dy, O, w, wt ? O : I, 0.0f, dx, I);
    return PORT_OK;
}

/* dW[O, I] += dy^T x, or (wt) dW[I, O] += x^T dy: one product of rows [r0, r0 + rows), beta = 1 into c */
static void weight_grad(float *c, const float *dy, const float *x, int64_t r0, int64_t rows, int64_t I, int64_t O,
                        float beta, int wt) {
    if (wt)
        port__gemm(1, 0, I, O, rows, 1.0f, x + r0 * I, I, dy + r0 * O, O, beta, c, O);
    else
        port__gemm(1, 0, O, I, rows, 1.0f, dy + r0 * O, O, x + r0 * I, I, beta, c, I);
}

static port_status linear_backward_weight(float *dw, float *db, const float *dy, const float *x,
                                          const port_linear_params *p, int wt) {
    port_status st = lin_check(p);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dw); PORT_NOTNULL(dy); PORT_NOTNULL(x);
    int64_t N = p->n, I = p->in_features, O = p->out_features;
    if (O * I <= LIN_KSPLIT_MAX && N >= 2 * LIN_KSPLIT_ROWS) {
        /* A small weight from many rows (a transformer's 128 x 128 projection over 4096 tokens): split the rows,
         * each chunk's product into a partial on the stack, added to dw in chunk order (`ordered`).  Split by the
         * shape only, so the same bits at any thread count.  (Split over the output instead, both threads
         * packed the whole of dy: 182 GFLOP/s on 2 threads against 128 on one; torch.mm 230.) */
        int64_t nchunk = (N + LIN_KSPLIT_ROWS - 1) / LIN_KSPLIT_ROWS;
#pragma omp parallel for ordered schedule(static, 1) if (!port__in_parallel())
        for (int64_t t = 0; t < nchunk; t++) {
            float part[LIN_KSPLIT_MAX > 0 ? LIN_KSPLIT_MAX : 1];
            int64_t r0 = t * LIN_KSPLIT_ROWS, rows = PORT_MIN(LIN_KSPLIT_ROWS, N - r0);
            weight_grad(part, dy, x, r0, rows, I, O, 0.0f, wt);
#pragma omp ordered
            for (int64_t q = 0; q < O * I; q++) dw[q] += part[q];
        }
    } else {
        weight_grad(dw, dy, x, 0, N, I, O, 1.0f, wt);
    }
    if (db) port__colsum_acc(db, dy, N, O);
    return PORT_OK;
}

port_status port_linear_forward(float *y, const float *x, const float *w, const float *b,
                                const port_linear_params *p) {
    return linear_forward(y, x, w, b, p, 0);
}

port_status port_linear_backward_input(float *dx, const float *dy, const float *w,
                                       const port_linear_params *p) {
    return linear_backward_input(dx, dy, w, p, 0);
}

port_status port_linear_backward_weight(float *dw, float *db, const float *dy, const float *x,
                                        const port_linear_params *p) {
    return linear_backward_weight(dw, db, dy, x, p, 0);
}

/* W stored [in, out] (Hugging Face GPT-2's Conv1D: addmm(b, x, W)); the same blocking, splits and bits rules */
port_status port_linear_t_forward(float *y, const float *x, const float *w, const float *b,
                                  const port_linear_params *p) {
    return linear_forward(y, x, w, b, p, 1);
}

port_status port_linear_t_backward_input(float *dx, const float *dy, const float *w,
                                         const port_linear_params *p) {
    return linear_backward_input(dx, dy, w, p, 1);
}

port_status port_linear_t_backward_weight(float *dw, float *db, const float *dy, const float *x,
                                          const port_linear_params *p) {
    return linear_backward_weight(dw, db, dy, x, p, 1);
}

/* db[j] += sum of column j over rows [0, rows) for the 64 columns from j0 (w <= 64): rows in chunks of 32 summed
 * in float vectors, the chunks' sums added in double in row order */
PORT_ISA_CLONES static void colsum_block(float *db, const float *dy, int64_t rows, int64_t cols, int64_t j0,
                                         int64_t w) {
    double acc[64] = {0};
    for (int64_t r0 = 0; r0 < rows; r0 += 32) {
        float part[64] = {0};
        int64_t r1 = PORT_MIN(rows, r0 + 32);
        for (int64_t r = r0; r < r1; r++) {
            const float *row = dy + r * cols + j0;
            for (int64_t j = 0; j < w; j++) part[j] += row[j];
        }
        for (int64_t j = 0; j < w; j++) acc[j] += part[j];
    }
    for (int64_t j = 0; j < w; j++) db[j0 + j] += (float)acc[j];
}

void port__colsum_acc(float *db, const float *dy, int64_t rows, int64_t cols) {
    int64_t nb = (cols + 63) / 64;
#pragma omp parallel for schedule(static) if (nb > 1 && rows * cols > PORT_PAR_MIN && !port__in_parallel())
    for (int64_t t = 0; t < nb; t++) colsum_block(db, dy, rows, cols, t * 64, PORT_MIN((int64_t)64, cols - t * 64));
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
