/* RMSNorm + linear fused (issue 54): the norm's output y = x rstd gamma is never stored; each linear reading it
 * normalises row blocks of x into its workspace and multiplies them (forward), and its weight gradient rebuilds
 * the same rows block by block.  The rows are normalised exactly as port_rmsnorm_forward does (x rstd, then
 * gamma: the same float roundings) and each block runs the plain linear kernels on them, so with one block (block
 * rows >= n) the results are the plain rms_norm -> linear chain's bits; with smaller blocks the forward rows are
 * the same GEMM on fewer rows and the weight gradient adds the blocks' products in row order (within float
 * rounding of the plain sum). */
#include "internal.h"
#include <math.h>

static port_status rl_check(int64_t n, int64_t in, int64_t out, int64_t block_rows, const void *ws, size_t ws_bytes) {
    PORT_CHECK(n > 0 && in > 0 && out > 0 && block_rows > 0, PORT_ERR_SHAPE);
    PORT_CHECK(n <= INT32_MAX && in <= INT32_MAX && out <= INT32_MAX, PORT_ERR_SHAPE);
    PORT_CHECK(ws_bytes >= port_rmsnorm_linear_workspace_bytes(n, in, block_rows), PORT_ERR_WORKSPACE);
    PORT_NOTNULL(ws);
    return PORT_OK;
}

size_t port_rmsnorm_linear_workspace_bytes(int64_t n, int64_t in, int64_t block_rows) {
    if (n <= 0 || in <= 0 || block_rows <= 0) return 0;
    return (size_t)PORT_MIN(n, block_rows) * (size_t)in * sizeof(float);
}

port_status port_rmsnorm_stats(float *rstd, const float *x, int64_t rows, int64_t d, float eps) {
    PORT_NOTNULL(rstd); PORT_NOTNULL(x);
    PORT_CHECK(rows > 0 && d > 0, PORT_ERR_SHAPE);
    PORT_CHECK(eps >= 0.0f && isfinite(eps), PORT_ERR_ARG);
#pragma omp parallel for schedule(static) if (rows * d > PORT_PAR_MIN && rows > 1)
    for (int64_t r = 0; r < rows; r++) rstd[r] = port__rmsnorm_rstd(x + r * d, d, eps);   /* the norm's rstd */
    return PORT_OK;
}

/* rows [r0, r0 + m) of y = x rstd gamma into yb [m, d] (port_rmsnorm_forward's products, in its order): over the
 * threads where the block is large, else a plain loop (no parallel region: its start costs as much as a small
 * block's rows) */
static void normalise_rows(float *yb, const float *x, const float *rstd, const float *gamma, int64_t r0, int64_t m,
                           int64_t d) {
    if (m * d > PORT_PAR_MIN && m > 1 && !port__in_parallel()) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < m; i++) port__rmsnorm_row(yb + i * d, x + (r0 + i) * d, rstd[r0 + i], gamma, d);
    } else {
        for (int64_t i = 0; i < m; i++) port__rmsnorm_row(yb + i * d, x + (r0 + i) * d, rstd[r0 + i], gamma, d);
    }
}

/* the blocks of rows in order: each normalised into ws, then the linear kernel on it (out: y [n, out], or dw and db;
 * b: the bias (forward); dy: the output gradient (weight gradient, when not NULL)) */
static port_status blocks(float *out, float *db, const float *x, const float *rstd, const float *gamma, const float *w,
                          const float *b, const float *dy, int64_t n, int64_t in, int64_t o, int64_t block_rows, int wt,
                          void *ws, size_t ws_bytes) {
    port_status st = rl_check(n, in, o, block_rows, ws, ws_bytes);
    float *yb = (float *)ws;
    for (int64_t r0 = 0; r0 < n && st == PORT_OK; r0 += block_rows) {
        int64_t m = PORT_MIN(block_rows, n - r0);
        normalise_rows(yb, x, rstd, gamma, r0, m, in);
        port_linear_params p = {m, in, o};
        if (dy)
            st = wt ? port_linear_t_backward_weight(out, db, dy + r0 * o, yb, &p)
                    : port_linear_backward_weight(out, db, dy + r0 * o, yb, &p);
        else
            st = wt ? port_linear_t_forward(out + r0 * o, yb, w, b, &p)
                    : port_linear_forward(out + r0 * o, yb, w, b, &p);
    }
    return st;
}

port_status port_rmsnorm_linear_forward(float *y, const float *x, const float *rstd, const float *gamma,
                                        const float *w, const float *b, int64_t n, int64_t in, int64_t out,
                                        int64_t block_rows, int wt, void *ws, size_t ws_bytes) {
    PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(rstd); PORT_NOTNULL(w);
    return blocks(y, NULL, x, rstd, gamma, w, b, NULL, n, in, out, block_rows, wt, ws, ws_bytes);
}

port_status port_rmsnorm_linear_backward_weight(float *dw, float *db, const float *dy, const float *x,
                                                const float *rstd, const float *gamma, int64_t n, int64_t in,
                                                int64_t out, int64_t block_rows, int wt, void *ws, size_t ws_bytes) {
    PORT_NOTNULL(dw); PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(rstd);
    return blocks(dw, db, x, rstd, gamma, NULL, NULL, dy, n, in, out, block_rows, wt, ws, ws_bytes);
}

/* ---- all the linears reading one norm (ids 119, 131): each block of rows normalised once for k linears ---- */

static port_status rls_check(const int64_t *out, int64_t k, int64_t n, int64_t in, int64_t block_rows, const void *ws,
                             size_t ws_bytes) {
    PORT_NOTNULL(out);
    PORT_CHECK(k >= 1 && k <= PORT_RMSLIN_MAX_LINEARS, PORT_ERR_ARG);
    for (int64_t i = 0; i < k; i++) {
        port_status st = rl_check(n, in, out[i], block_rows, ws, ws_bytes);
        if (st != PORT_OK) return st;
    }
    return PORT_OK;
}

/* rows [0, m) of x (offset to the block): rstd and y = x rstd gamma into yb, one pass over each row (the norm's
 * arithmetic, port__rmsnorm_*: port_rmsnorm_forward's bits); threads as normalise_rows */
static void stats_normalise_rows(float *yb, float *rstd, const float *x, const float *gamma, int64_t m, int64_t d,
                                 float eps) {
    if (m * d > PORT_PAR_MIN && m > 1 && !port__in_parallel()) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < m; i++) {
            rstd[i] = port__rmsnorm_rstd(x + i * d, d, eps);
            port__rmsnorm_row(yb + i * d, x + i * d, rstd[i], gamma, d);
        }
    } else {
        for (int64_t i = 0; i < m; i++) {
            rstd[i] = port__rmsnorm_rstd(x + i * d, d, eps);
            port__rmsnorm_row(yb + i * d, x + i * d, rstd[i], gamma, d);
        }
    }
}

static port_status lin_fwd(float *y, const float *yb, const float *w, const float *b, int64_t m, int64_t in,
                           int64_t o, int wt) {
    port_linear_params p = {m, in, o};
    return wt ? port_linear_t_forward(y, yb, w, b, &p) : port_linear_forward(y, yb, w, b, &p);
}

static port_status lin_bwd_w(float *dw, float *db, const float *dy, const float *yb, int64_t m, int64_t in, int64_t o,
                             int wt) {
    port_linear_params p = {m, in, o};
    return wt ? port_linear_t_backward_weight(dw, db, dy, yb, &p) : port_linear_backward_weight(dw, db, dy, yb, &p);
}

static port_status rls_fwd_args(float *rstd, float *const *y, const float *x, const float *const *w,
                                const int64_t *out, int64_t k, int64_t n, int64_t in, float eps, int64_t block_rows,
                                const void *ws, size_t ws_bytes) {
    PORT_NOTNULL(rstd); PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(w);
    PORT_CHECK(eps >= 0.0f && isfinite(eps), PORT_ERR_ARG);
    port_status st = rls_check(out, k, n, in, block_rows, ws, ws_bytes);
    for (int64_t i = 0; i < k && st == PORT_OK; i++)
        if (!y[i] || !w[i]) st = PORT_ERR_NULL;
    return st;
}

port_status port_rmsnorm_linears_forward(float *rstd, float *const *y, const float *x, const float *gamma,
                                         const float *const *w, const float *const *b, const int64_t *out, int64_t k,
                                         int64_t n, int64_t in, float eps, int64_t block_rows, int wt, void *ws,
                                         size_t ws_bytes) {
    port_status st = rls_fwd_args(rstd, y, x, w, out, k, n, in, eps, block_rows, ws, ws_bytes);
    float *yb = (float *)ws;
    for (int64_t r0 = 0; r0 < n && st == PORT_OK; r0 += block_rows) {
        int64_t m = PORT_MIN(block_rows, n - r0);
        stats_normalise_rows(yb, rstd + r0, x + r0 * in, gamma, m, in, eps);
        for (int64_t i = 0; i < k && st == PORT_OK; i++)
            st = lin_fwd(y[i] + r0 * out[i], yb, w[i], b ? b[i] : NULL, m, in, out[i], wt);
    }
    return st;
}

port_status port_rmsnorm_linears_forward_ref(float *rstd, float *const *y, const float *x, const float *gamma,
                                             const float *const *w, const float *const *b, const int64_t *out,
                                             int64_t k, int64_t n, int64_t in, float eps, int64_t block_rows, int wt,
                                             void *ws, size_t ws_bytes) {
    (void)block_rows;     /* the plain members: the norm's whole output, then each linear on all rows */
    port_status st = rls_fwd_args(rstd, y, x, w, out, k, n, in, eps, n, ws, ws_bytes);
    if (st == PORT_OK) st = port_rmsnorm_forward((float *)ws, rstd, x, gamma, n, in, eps);
    for (int64_t i = 0; i < k && st == PORT_OK; i++) st = lin_fwd(y[i], (float *)ws, w[i], b ? b[i] : NULL, n, in,
                                                                  out[i], wt);
    return st;
}

static port_status rls_bwd_args(float *const *dw, const float *const *dy, const float *x, const float *rstd,
                                const int64_t *out, int64_t k, int64_t n, int64_t in, int64_t block_rows,
                                const void *ws, size_t ws_bytes) {
    PORT_NOTNULL(dw); PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(rstd);
    port_status st = rls_check(out, k, n, in, block_rows, ws, ws_bytes);
    for (int64_t i = 0; i < k && st == PORT_OK; i++)
        if (!dw[i] || !dy[i]) st = PORT_ERR_NULL;
    return st;
}

port_status port_rmsnorm_linears_backward_weight(float *const *dw, float *const *db, const float *const *dy,
                                                 const float *x, const float *rstd, const float *gamma,
                                                 const int64_t *out, int64_t k, int64_t n, int64_t in,
                                                 int64_t block_rows, int wt, void *ws, size_t ws_bytes) {
    port_status st = rls_bwd_args(dw, dy, x, rstd, out, k, n, in, block_rows, ws, ws_bytes);
    float *yb = (float *)ws;
    for (int64_t r0 = 0; r0 < n && st == PORT_OK; r0 += block_rows) {
        int64_t m = PORT_MIN(block_rows, n - r0);
        normalise_rows(yb, x, rstd, gamma, r0, m, in);
        for (int64_t i = 0; i < k && st == PORT_OK; i++)
            st = lin_bwd_w(dw[i], db ? db[i] : NULL, dy[i] + r0 * out[i], yb, m, in, out[i], wt);
    }
    return st;
}

port_status port_rmsnorm_linears_backward_weight_ref(float *const *dw, float *const *db, const float *const *dy,
                                                     const float *x, const float *rstd, const float *gamma,
                                                     const int64_t *out, int64_t k, int64_t n, int64_t in,
                                                     int64_t block_rows, int wt, void *ws, size_t ws_bytes) {
    (void)block_rows;     /* the norm's whole output rebuilt, then each weight gradient on all rows */
    port_status st = rls_bwd_args(dw, dy, x, rstd, out, k, n, in, n, ws, ws_bytes);
    if (st == PORT_OK) normalise_rows((float *)ws, x, rstd, gamma, 0, n, in);
    for (int64_t i = 0; i < k && st == PORT_OK; i++)
        st = lin_bwd_w(dw[i], db ? db[i] : NULL, dy[i], (float *)ws, n, in, out[i], wt);
    return st;
}
