/* issue 54: kernels for input-dependent attention masks (HF's attention_mask -> a boolean [B, 1, Q, K] mask):
 * casts between float32, bool (one byte per element, 0/1) and int64; logical and/or/xor of two masks with full
 * broadcasting (and not); compares of float32 tensors or a tensor and a scalar into a mask; the expand of a mask;
 * the gather of a 2-D mask by two broadcast int64 index tensors (mask[batch_idx, kv_idx]); where(cond, a, b) of
 * float32 tensors or numbers and its gradient.  Pure selects and copies (the gradient sums each element in one
 * fixed order): the same bits at any thread count. */
#include "internal.h"

#include <math.h>
#include <string.h>

static size_t dt_size(int64_t dt) { return dt == PORT_DT_F32 || dt == PORT_DT_I32 ? 4 : dt == PORT_DT_BOOL ? 1 : 8; }

/* element i of x (dtype dt) as a double (int64 beyond 2^53 rounded: only compared with 0 or cast to float32) */
static inline double elem(const void *x, int64_t dt, int64_t i) {
    switch (dt) {
    case PORT_DT_F32: return ((const float *)x)[i];
    case PORT_DT_BOOL: return ((const uint8_t *)x)[i] != 0;
    case PORT_DT_I32: return ((const int32_t *)x)[i];
    default: return (double)((const int64_t *)x)[i];
    }
}

port_status port_mask_cast(void *y, int64_t y_dtype, const void *x, int64_t x_dtype, int64_t count) {
    PORT_NOTNULL(y); PORT_NOTNULL(x);
    PORT_CHECK(y_dtype >= PORT_DT_F32 && y_dtype <= PORT_DT_I32 && x_dtype >= PORT_DT_F32 && x_dtype <= PORT_DT_I32,
               PORT_ERR_ARG);
    PORT_CHECK(y_dtype != PORT_DT_I64, PORT_ERR_ARG);                     /* int64 outputs: not a mask */
    PORT_CHECK(y_dtype != PORT_DT_I32 || x_dtype == PORT_DT_BOOL, PORT_ERR_ARG);    /* int32: 0/1 of a mask */
    PORT_CHECK(count >= 0 && count <= (INT64_C(1) << 40), PORT_ERR_SHAPE);
    PORT_CHECK(!port__ranges_overlap(y, (size_t)count * dt_size(y_dtype), x, (size_t)count * dt_size(x_dtype)),
               PORT_ERR_ALIAS);
    const float *xf = x;
    const int64_t *xi = x;
    float *yf = y;
    uint8_t *yb = y;
    int32_t *yi = y;
#pragma omp parallel for schedule(static) if (count > PORT_PAR_MIN)
    for (int64_t i = 0; i < count; i++) {
        if (y_dtype == PORT_DT_BOOL)    /* (an int64 compared as itself: no rounding of a large id to 0) */
            yb[i] = (uint8_t)(x_dtype == PORT_DT_F32 ? xf[i] != 0.0f : x_dtype == PORT_DT_I64 ? xi[i] != 0
                              : elem(x, x_dtype, i) != 0.0);
        else if (y_dtype == PORT_DT_I32)
            yi[i] = elem(x, x_dtype, i) != 0.0;
        else
            yf[i] = x_dtype == PORT_DT_I64 ? (float)xi[i] : (float)elem(x, x_dtype, i);
    }
    return PORT_OK;
}

port_status port_mask_logic(uint8_t *y, const uint8_t *a, const uint8_t *b, int64_t op, int64_t rank,
                            int64_t a_bcast, int64_t b_bcast, const int64_t *dims) {
    PORT_NOTNULL(y); PORT_NOTNULL(a); PORT_NOTNULL(b); PORT_NOTNULL(dims);
    PORT_CHECK(op >= PORT_MASK_AND && op <= PORT_MASK_NOT, PORT_ERR_ARG);
    int64_t sa[PORT_BINARY_MAX_RANK], sb[PORT_BINARY_MAX_RANK], na, nb, ny;
    PORT_CHECK(port__bstrides(rank, a_bcast, dims, sa, &na, &ny) && port__bstrides(rank, b_bcast, dims, sb, &nb, &ny),
               PORT_ERR_SHAPE);
    PORT_CHECK((y == a && !a_bcast) || !port__ranges_overlap(y, (size_t)ny, a, (size_t)na), PORT_ERR_ALIAS);
    PORT_CHECK((y == b && !b_bcast) || !port__ranges_overlap(y, (size_t)ny, b, (size_t)nb), PORT_ERR_ALIAS);
    const int64_t inner = dims[rank - 1], ia = sa[rank - 1], ib = sb[rank - 1], outer = ny / inner;
#pragma omp parallel for schedule(static) if (ny > PORT_PAR_MIN && outer > 1)
    for (int64_t o = 0; o < outer; o++) {
        int64_t oa = 0, ob = 0, rest = o;
        for (int64_t i = rank - 2; i >= 0; i--) {
            oa += (rest % dims[i]) * sa[i];
            ob += (rest % dims[i]) * sb[i];
            rest /= dims[i];
        }
        uint8_t *yo = y + o * inner;
        for (int64_t j = 0; j < inner; j++) {
            int p = a[oa + j * ia] != 0, q = b[ob + j * ib] != 0;
            yo[j] = (uint8_t)(op == PORT_MASK_AND ? p & q : op == PORT_MASK_OR ? p | q : op == PORT_MASK_XOR ? p ^ q : !p);
        }
    }
    return PORT_OK;
}

port_status port_expand_mask(uint8_t *y, const uint8_t *x, int64_t rank, int64_t x_bcast, const int64_t *dims) {
    PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(dims);
    int64_t sx[PORT_BINARY_MAX_RANK], nx, ny;
    PORT_CHECK(port__bstrides(rank, x_bcast, dims, sx, &nx, &ny), PORT_ERR_SHAPE);
    PORT_CHECK(!port__ranges_overlap(y, (size_t)ny, x, (size_t)nx), PORT_ERR_ALIAS);
    const int64_t inner = dims[rank - 1], ix = sx[rank - 1], outer = ny / inner;
#pragma omp parallel for schedule(static) if (ny > PORT_PAR_MIN && outer > 1)
    for (int64_t o = 0; o < outer; o++) {
        const uint8_t *xo = x + port__offset_of(o, rank - 1, dims, sx);
        uint8_t *yo = y + o * inner;
        if (ix) memcpy(yo, xo, (size_t)inner);
        else memset(yo, xo[0] != 0, (size_t)inner);
    }
    return PORT_OK;
}

port_status port_mask_index2(uint8_t *y, const uint8_t *x, const int64_t *i0, const int64_t *i1, int64_t rows,
                             int64_t cols, int64_t rank, int64_t i0_bcast, int64_t i1_bcast, const int64_t *dims) {
    PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(i0); PORT_NOTNULL(i1); PORT_NOTNULL(dims);
    PORT_CHECK(rows >= 1 && cols >= 1 && rows <= (INT64_C(1) << 40) / cols, PORT_ERR_SHAPE);
    int64_t s0[PORT_BINARY_MAX_RANK], s1[PORT_BINARY_MAX_RANK], n0, n1, ny;
    PORT_CHECK(port__bstrides(rank, i0_bcast, dims, s0, &n0, &ny) && port__bstrides(rank, i1_bcast, dims, s1, &n1, &ny),
               PORT_ERR_SHAPE);
    PORT_CHECK(!port__ranges_overlap(y, (size_t)ny, x, (size_t)(rows * cols)), PORT_ERR_ALIAS);
    for (int64_t k = 0; k < n0; k++) PORT_CHECK(i0[k] >= -rows && i0[k] < rows, PORT_ERR_ARG);
    for (int64_t k = 0; k < n1; k++) PORT_CHECK(i1[k] >= -cols && i1[k] < cols, PORT_ERR_ARG);
#pragma omp parallel for schedule(static) if (ny > PORT_PAR_MIN)
    for (int64_t e = 0; e < ny; e++) {
        int64_t r = i0[port__offset_of(e, rank, dims, s0)], c = i1[port__offset_of(e, rank, dims, s1)];
        y[e] = x[(r < 0 ? r + rows : r) * cols + (c < 0 ? c + cols : c)] != 0;
    }
    return PORT_OK;
}

static inline uint8_t cmp(int64_t op, float a, float b) {
    switch (op) {
    case PORT_CMP_EQ: return a == b;
    case PORT_CMP_NE: return a != b;
    case PORT_CMP_LT: return a < b;
    case PORT_CMP_LE: return a <= b;
    case PORT_CMP_GT: return a > b;
    default: return a >= b;
    }
}

port_status port_mask_compare(uint8_t *y, const float *a, const float *b, int64_t op, int64_t rank, int64_t a_bcast,
                              int64_t b_bcast, const int64_t *dims) {
    PORT_NOTNULL(y); PORT_NOTNULL(a); PORT_NOTNULL(b); PORT_NOTNULL(dims);
    PORT_CHECK(op >= PORT_CMP_EQ && op <= PORT_CMP_GE, PORT_ERR_ARG);
    int64_t sa[PORT_BINARY_MAX_RANK], sb[PORT_BINARY_MAX_RANK], na, nb, ny;
    PORT_CHECK(port__bstrides(rank, a_bcast, dims, sa, &na, &ny) && port__bstrides(rank, b_bcast, dims, sb, &nb, &ny),
               PORT_ERR_SHAPE);
    PORT_CHECK(!port__ranges_overlap(y, (size_t)ny, a, (size_t)na * sizeof(float)) &&
               !port__ranges_overlap(y, (size_t)ny, b, (size_t)nb * sizeof(float)), PORT_ERR_ALIAS);
    const int64_t inner = dims[rank - 1], ia = sa[rank - 1], ib = sb[rank - 1], outer = ny / inner;
#pragma omp parallel for schedule(static) if (ny > PORT_PAR_MIN && outer > 1)
    for (int64_t o = 0; o < outer; o++) {
        const float *ao = a + port__offset_of(o, rank - 1, dims, sa), *bo = b + port__offset_of(o, rank - 1, dims, sb);
        uint8_t *yo = y + o * inner;
        for (int64_t j = 0; j < inner; j++) yo[j] = cmp(op, ao[j * ia], bo[j * ib]);
    }
    return PORT_OK;
}

port_status port_mask_compare_scalar(uint8_t *y, const float *x, int64_t op, int64_t count, float scalar) {
    PORT_NOTNULL(y); PORT_NOTNULL(x);
    PORT_CHECK(op >= PORT_CMP_EQ && op <= PORT_CMP_GE, PORT_ERR_ARG);
    PORT_CHECK(count >= 1 && count <= (INT64_C(1) << 40), PORT_ERR_SHAPE);
    PORT_CHECK(!port__ranges_overlap(y, (size_t)count, x, (size_t)count * sizeof(float)), PORT_ERR_ALIAS);
#pragma omp parallel for schedule(static) if (count > PORT_PAR_MIN)
    for (int64_t i = 0; i < count; i++) y[i] = cmp(op, x[i], scalar);
    return PORT_OK;
}

/* ---- where: y = cond ? a : b, three operands broadcast on every axis, a and b tensors or numbers ---------- */
static int where_shape(int64_t rank, int64_t c_bcast, int64_t a_bcast, int64_t b_bcast, const int64_t *dims,
                       int64_t *sc, int64_t *sa, int64_t *sb, int64_t *nc, int64_t *na, int64_t *nb, int64_t *ny) {
    return port__bstrides(rank, c_bcast, dims, sc, nc, ny) && port__bstrides(rank, a_bcast, dims, sa, na, ny) &&
           port__bstrides(rank, b_bcast, dims, sb, nb, ny);
}

/* a scalar operand: its pointer NULL and its value not NaN; a tensor operand: its pointer set */
static int where_operand(const float *p, int scalar, float value) {
    if (scalar) return p || isnan(value) ? PORT_ERR_ARG : PORT_OK;
    return p ? PORT_OK : PORT_ERR_NULL;
}

static int where_operands(const float *a, const float *b, int64_t scalars, float a_value, float b_value) {
    if (scalars < 0 || scalars > 3) return PORT_ERR_ARG;
    int st = where_operand(a, (int)(scalars & 1), a_value);
    return st != PORT_OK ? st : where_operand(b, (int)((scalars >> 1) & 1), b_value);
}

port_status port_where_forward_reference(float *y, const uint8_t *cond, const float *a, const float *b,
                                         int64_t rank, int64_t c_bcast, int64_t a_bcast, int64_t b_bcast,
                                         const int64_t *dims, int64_t scalars, float a_value, float b_value) {
    PORT_NOTNULL(y); PORT_NOTNULL(cond); PORT_NOTNULL(dims);
    int st = where_operands(a, b, scalars, a_value, b_value);
    PORT_CHECK(st == PORT_OK, st);
    int64_t sc[PORT_BINARY_MAX_RANK], sa[PORT_BINARY_MAX_RANK], sb[PORT_BINARY_MAX_RANK], nc, na, nb, ny;
    PORT_CHECK(where_shape(rank, c_bcast, a_bcast, b_bcast, dims, sc, sa, sb, &nc, &na, &nb, &ny), PORT_ERR_SHAPE);
    for (int64_t e = 0; e < ny; e++) {
        float av = scalars & 1 ? a_value : a[port__offset_of(e, rank, dims, sa)];
        float bv = scalars & 2 ? b_value : b[port__offset_of(e, rank, dims, sb)];
        y[e] = cond[port__offset_of(e, rank, dims, sc)] ? av : bv;
    }
    return PORT_OK;
}

port_status port_where_forward(float *y, const uint8_t *cond, const float *a, const float *b, int64_t rank,
                               int64_t c_bcast, int64_t a_bcast, int64_t b_bcast, const int64_t *dims,
                               int64_t scalars, float a_value, float b_value) {
    PORT_NOTNULL(y); PORT_NOTNULL(cond); PORT_NOTNULL(dims);
    int st = where_operands(a, b, scalars, a_value, b_value);
    PORT_CHECK(st == PORT_OK, st);
    int64_t sc[PORT_BINARY_MAX_RANK], sa[PORT_BINARY_MAX_RANK], sb[PORT_BINARY_MAX_RANK], nc, na, nb, ny;
    PORT_CHECK(where_shape(rank, c_bcast, a_bcast, b_bcast, dims, sc, sa, sb, &nc, &na, &nb, &ny), PORT_ERR_SHAPE);
    const size_t by = (size_t)ny * sizeof(float);
    PORT_CHECK(!port__ranges_overlap(y, by, cond, (size_t)nc), PORT_ERR_ALIAS);
    PORT_CHECK(!a || (y == a && !a_bcast) || !port__ranges_overlap(y, by, a, (size_t)na * sizeof(float)),
               PORT_ERR_ALIAS);
    PORT_CHECK(!b || (y == b && !b_bcast) || !port__ranges_overlap(y, by, b, (size_t)nb * sizeof(float)),
               PORT_ERR_ALIAS);
    const int64_t inner = dims[rank - 1], outer = ny / inner;
    /* a scalar operand: a one-element tensor of stride 0 */
    const float *A = scalars & 1 ? &a_value : a, *B = scalars & 2 ? &b_value : b;
    const int64_t ia = scalars & 1 ? 0 : sa[rank - 1], ib = scalars & 2 ? 0 : sb[rank - 1], ic = sc[rank - 1];
#pragma omp parallel for schedule(static) if (ny > PORT_PAR_MIN && outer > 1)
    for (int64_t o = 0; o < outer; o++) {
        const uint8_t *co = cond + port__offset_of(o, rank - 1, dims, sc);
        const float *ao = scalars & 1 ? A : A + port__offset_of(o, rank - 1, dims, sa);
        const float *bo = scalars & 2 ? B : B + port__offset_of(o, rank - 1, dims, sb);
        float *yo = y + o * inner;
        for (int64_t j = 0; j < inner; j++) yo[j] = co[j * ic] ? ao[j * ia] : bo[j * ib];
    }
    return PORT_OK;
}

/* one gradient: d[k] = sum over the full-shape elements e that read operand element k of dy[e] where cond[e] is
 * `when`; the elements of d split across threads, each summed in e order by one thread */
static void where_grad(float *d, int when, const float *dy, const uint8_t *cond, int64_t rank, const int64_t *dims,
                       const int64_t *sc, int64_t m) {
    int64_t kept[PORT_BINARY_MAX_RANK], red[PORT_BINARY_MAX_RANK], nk = 0, nr = 0, n_kept = 1, n_red = 1;
    int64_t sy[PORT_BINARY_MAX_RANK], st = 1;
    for (int64_t i = rank - 1; i >= 0; i--) sy[i] = st, st *= dims[i];
    for (int64_t i = 0; i < rank; i++) {
        if ((m >> i) & 1) red[nr++] = i, n_red *= dims[i];
        else kept[nk++] = i, n_kept *= dims[i];
    }
#pragma omp parallel for schedule(static) if (n_kept * n_red > PORT_PAR_MIN && n_kept > 1)
    for (int64_t e = 0; e < n_kept; e++) {
        int64_t oy = 0, oc = 0, rest = e;
        for (int64_t j = nk - 1; j >= 0; j--) {
            int64_t i = kept[j], c = rest % dims[i];
            rest /= dims[i];
            oy += c * sy[i], oc += c * sc[i];
        }
        double s = 0.0;
        for (int64_t t = 0; t < n_red; t++) {
            int64_t ry = oy, rc = oc, r2 = t;
            for (int64_t j = nr - 1; j >= 0; j--) {
                int64_t i = red[j], c = r2 % dims[i];
                r2 /= dims[i];
                ry += c * sy[i], rc += c * sc[i];
            }
            if ((cond[rc] != 0) == when) s += (double)dy[ry];
        }
        d[e] = (float)s;
    }
}

port_status port_where_backward(float *da, float *db, const float *dy, const uint8_t *cond, int64_t rank,
                                int64_t c_bcast, int64_t a_bcast, int64_t b_bcast, const int64_t *dims) {
    PORT_NOTNULL(dy); PORT_NOTNULL(cond); PORT_NOTNULL(dims);
    PORT_CHECK(da || db, PORT_ERR_NULL);
    int64_t sc[PORT_BINARY_MAX_RANK], sa[PORT_BINARY_MAX_RANK], sb[PORT_BINARY_MAX_RANK], nc, na, nb, ny;
    PORT_CHECK(where_shape(rank, c_bcast, a_bcast, b_bcast, dims, sc, sa, sb, &nc, &na, &nb, &ny), PORT_ERR_SHAPE);
    const size_t by = (size_t)ny * sizeof(float), ba = (size_t)na * sizeof(float), bb = (size_t)nb * sizeof(float);
    PORT_CHECK(!da || (!port__ranges_overlap(da, ba, dy, by) && !port__ranges_overlap(da, ba, cond, (size_t)nc)),
               PORT_ERR_ALIAS);
    PORT_CHECK(!db || (!port__ranges_overlap(db, bb, dy, by) && !port__ranges_overlap(db, bb, cond, (size_t)nc)),
               PORT_ERR_ALIAS);
    PORT_CHECK(!da || !db || !port__ranges_overlap(da, ba, db, bb), PORT_ERR_ALIAS);
    if (da) where_grad(da, 1, dy, cond, rank, dims, sc, a_bcast);
    if (db) where_grad(db, 0, dy, cond, rank, dims, sc, b_bcast);
    return PORT_OK;
}

/* ---- the last-token pooling of sequence classifiers: integer element-wise ops, argmax of rows, and the gather of
 * rows of a [rows, cols, inner] tensor by two index tensors with its scatter-add gradient --------------------- */
port_status port_int_binary(void *y, const void *a, const void *b, int64_t dtype, int64_t op, int64_t rank,
                            int64_t a_bcast, int64_t b_bcast, const int64_t *dims) {
    PORT_NOTNULL(y); PORT_NOTNULL(a); PORT_NOTNULL(b); PORT_NOTNULL(dims);
    PORT_CHECK(dtype == PORT_DT_I32 || dtype == PORT_DT_I64, PORT_ERR_ARG);
    PORT_CHECK(op >= PORT_BINARY_ADD && op <= PORT_BINARY_MUL, PORT_ERR_ARG);
    int64_t sa[PORT_BINARY_MAX_RANK], sb[PORT_BINARY_MAX_RANK], na, nb, ny;
    PORT_CHECK(port__bstrides(rank, a_bcast, dims, sa, &na, &ny) && port__bstrides(rank, b_bcast, dims, sb, &nb, &ny),
               PORT_ERR_SHAPE);
    const size_t es = dt_size(dtype);
    PORT_CHECK((y == a && !a_bcast) || !port__ranges_overlap(y, (size_t)ny * es, a, (size_t)na * es), PORT_ERR_ALIAS);
    PORT_CHECK((y == b && !b_bcast) || !port__ranges_overlap(y, (size_t)ny * es, b, (size_t)nb * es), PORT_ERR_ALIAS);
    const int32_t *a32 = a, *b32 = b;
    const int64_t *a64 = a, *b64 = b;
    const int64_t inner = dims[rank - 1], ia = sa[rank - 1], ib = sb[rank - 1], outer = ny / inner;
#pragma omp parallel for schedule(static) if (ny > PORT_PAR_MIN && outer > 1)
    for (int64_t o = 0; o < outer; o++) {
        const int64_t oa = port__offset_of(o, rank - 1, dims, sa), ob = port__offset_of(o, rank - 1, dims, sb);
        for (int64_t j = o * inner, k = 0; k < inner; j++, k++) {
            /* two's complement wrap-around (as torch), in unsigned arithmetic: no signed overflow */
            const int64_t pa = oa + k * ia, pb = ob + k * ib;
            uint64_t p = dtype == PORT_DT_I32 ? (uint64_t)(int64_t)a32[pa] : (uint64_t)a64[pa];
            uint64_t q = dtype == PORT_DT_I32 ? (uint64_t)(int64_t)b32[pb] : (uint64_t)b64[pb];
            uint64_t r = op == PORT_BINARY_ADD ? p + q : op == PORT_BINARY_SUB ? p - q : p * q;
            if (dtype == PORT_DT_I32) ((int32_t *)y)[j] = (int32_t)(uint32_t)r;
            else ((int64_t *)y)[j] = (int64_t)r;
        }
    }
    return PORT_OK;
}

port_status port_argmax_rows(int64_t *y, const void *x, int64_t x_dtype, int64_t rows, int64_t cols) {
    PORT_NOTNULL(y); PORT_NOTNULL(x);
    PORT_CHECK(x_dtype >= PORT_DT_F32 && x_dtype <= PORT_DT_I32, PORT_ERR_ARG);
    PORT_CHECK(rows >= 1 && cols >= 1 && rows <= (INT64_C(1) << 40) / cols, PORT_ERR_SHAPE);
    PORT_CHECK(!port__ranges_overlap(y, (size_t)rows * 8, x, (size_t)(rows * cols) * dt_size(x_dtype)),
               PORT_ERR_ALIAS);
#pragma omp parallel for schedule(static) if (rows * cols > PORT_PAR_MIN && rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        int64_t best = 0, base = r * cols;
        if (x_dtype == PORT_DT_I64) {      /* compared as int64 (a double would round ids above 2^53) */
            const int64_t *xi = (const int64_t *)x + base;
            for (int64_t j = 1; j < cols; j++)
                if (xi[j] > xi[best]) best = j;
        } else {                           /* float32 (NaN the largest, the first NaN wins, as torch), bool, int32 */
            double m = elem(x, x_dtype, base);
            for (int64_t j = 1; j < cols && !isnan(m); j++) {
                double v = elem(x, x_dtype, base + j);
                if (v > m || isnan(v)) m = v, best = j;
            }
        }
        y[r] = best;
    }
    return PORT_OK;
}

static int index2_rows_check(int64_t rows, int64_t cols, int64_t inner, int64_t rank, int64_t i0_bcast,
                             int64_t i1_bcast, const int64_t *dims, int64_t *s0, int64_t *s1, int64_t *n0, int64_t *n1,
                             int64_t *ne) {
    return rows >= 1 && cols >= 1 && inner >= 1 && rows <= (INT64_C(1) << 40) / cols &&
           rows * cols <= (INT64_C(1) << 40) / inner && port__bstrides(rank, i0_bcast, dims, s0, n0, ne) &&
           port__bstrides(rank, i1_bcast, dims, s1, n1, ne) && *ne <= (INT64_C(1) << 40) / inner;
}

port_status port_index2_rows(float *y, const float *x, const int64_t *i0, const int64_t *i1, int64_t rows,
                             int64_t cols, int64_t inner, int64_t rank, int64_t i0_bcast, int64_t i1_bcast,
                             const int64_t *dims, int64_t scatter) {
    PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(i0); PORT_NOTNULL(i1); PORT_NOTNULL(dims);
    PORT_CHECK(scatter == 0 || scatter == 1, PORT_ERR_ARG);
    int64_t s0[PORT_BINARY_MAX_RANK], s1[PORT_BINARY_MAX_RANK], n0, n1, ne;
    PORT_CHECK(index2_rows_check(rows, cols, inner, rank, i0_bcast, i1_bcast, dims, s0, s1, &n0, &n1, &ne),
               PORT_ERR_SHAPE);
    const size_t big = (size_t)(rows * cols * inner) * sizeof(float), small = (size_t)(ne * inner) * sizeof(float);
    PORT_CHECK(!port__ranges_overlap(y, scatter ? big : small, x, scatter ? small : big), PORT_ERR_ALIAS);
    PORT_CHECK(!port__ranges_overlap(y, scatter ? big : small, i0, (size_t)n0 * 8) &&
               !port__ranges_overlap(y, scatter ? big : small, i1, (size_t)n1 * 8), PORT_ERR_ALIAS);
    for (int64_t k = 0; k < n0; k++) PORT_CHECK(i0[k] >= -rows && i0[k] < rows, PORT_ERR_ARG);
    for (int64_t k = 0; k < n1; k++) PORT_CHECK(i1[k] >= -cols && i1[k] < cols, PORT_ERR_ARG);
    if (!scatter) {
#pragma omp parallel for schedule(static) if (ne * inner > PORT_PAR_MIN && ne > 1)
        for (int64_t e = 0; e < ne; e++) {
            int64_t r = i0[port__offset_of(e, rank, dims, s0)], c = i1[port__offset_of(e, rank, dims, s1)];
            memcpy(y + e * inner, x + ((r < 0 ? r + rows : r) * cols + (c < 0 ? c + cols : c)) * inner,
                   (size_t)inner * sizeof(float));
        }
        return PORT_OK;
    }
    memset(y, 0, big);
    /* the gradient: each output element sums its rows in e order, the columns k split across threads */
#pragma omp parallel for schedule(static) if (ne * inner > PORT_PAR_MIN && inner > 1)
    for (int64_t k = 0; k < inner; k++)
        for (int64_t e = 0; e < ne; e++) {
            int64_t r = i0[port__offset_of(e, rank, dims, s0)], c = i1[port__offset_of(e, rank, dims, s1)];
            y[((r < 0 ? r + rows : r) * cols + (c < 0 ? c + cols : c)) * inner + k] += x[e * inner + k];
        }
    return PORT_OK;
}
