/* Binary element-wise ops with full broadcasting: y = a op b (op: add, sub, mul, div) and their gradients,
 * each summed to its operand's shape.  Operands are contiguous; p->dims is the output's shape after the caller
 * merged neighbouring dims that broadcast alike (rank <= PORT_BINARY_MAX_RANK), bit i of a_bcast / b_bcast says
 * that operand has size 1 along dim i.  Every gradient element is summed in one fixed order (double accumulator)
 * by one thread: the same bits at any thread count. */
#include "internal.h"

static int binary_check(const port_binary_params *p) {
    if (!p || p->rank < 1 || p->rank > PORT_BINARY_MAX_RANK || p->op < PORT_BINARY_ADD || p->op > PORT_BINARY_DIV)
        return 0;
    int64_t mask = ((int64_t)1 << p->rank) - 1;
    if ((p->a_bcast & ~mask) || (p->b_bcast & ~mask) || p->a_bcast < 0 || p->b_bcast < 0) return 0;
    int64_t n = 1;
    for (int64_t i = 0; i < p->rank; i++) {
        if (p->dims[i] < 1 || n > (INT64_C(1) << 40) / p->dims[i]) return 0;
        n *= p->dims[i];
    }
    return 1;
}

int64_t port_binary_numel(const port_binary_params *p, int operand) {
    if (!binary_check(p)) return -1;
    int64_t m = operand == 0 ? p->a_bcast : operand == 1 ? p->b_bcast : 0, n = 1;
    for (int64_t i = 0; i < p->rank; i++)
        if (!((m >> i) & 1)) n *= p->dims[i];
    return n;
}

/* element strides of a contiguous operand of the output's rank whose dims in `bcast` are 1 (stride 0) */
static void strides(int64_t *s, const port_binary_params *p, int64_t bcast) {
    int64_t st = 1;
    for (int64_t i = p->rank - 1; i >= 0; i--) {
        int b = (int)((bcast >> i) & 1);
        s[i] = b ? 0 : st;
        st *= b ? 1 : p->dims[i];
    }
}

static inline float apply(int64_t op, float a, float b) {
    switch (op) {
    case PORT_BINARY_ADD: return a + b;
    case PORT_BINARY_SUB: return a - b;
    case PORT_BINARY_MUL: return a * b;
    default: return a / b;
    }
}

port_status port_binary_forward(float *y, const float *a, const float *b, const port_binary_params *p) {
    PORT_NOTNULL(y); PORT_NOTNULL(a); PORT_NOTNULL(b);
    PORT_CHECK(binary_check(p), PORT_ERR_SHAPE);
    int64_t sa[PORT_BINARY_MAX_RANK] = {0}, sb[PORT_BINARY_MAX_RANK] = {0};
    strides(sa, p, p->a_bcast);
    strides(sb, p, p->b_bcast);
    const int64_t r = p->rank, inner = p->dims[r - 1], ia = sa[r - 1], ib = sb[r - 1], op = p->op;
    int64_t outer = 1;
    for (int64_t i = 0; i < r - 1; i++) outer *= p->dims[i];
#pragma omp parallel for schedule(static) if (outer * inner > PORT_PAR_MIN && outer > 1)
    for (int64_t o = 0; o < outer; o++) {
        int64_t oa = 0, ob = 0, rest = o;
        for (int64_t i = r - 2; i >= 0; i--) {
            int64_t k = rest % p->dims[i];
            rest /= p->dims[i];
            oa += k * sa[i];
            ob += k * sb[i];
        }
        float *yo = y + o * inner;
        const float *ao = a + oa, *bo = b + ob;
        switch (op) {     /* one loop per op and stride pattern: the common ones vectorise */
        case PORT_BINARY_MUL:
            if (ia && ib) { for (int64_t j = 0; j < inner; j++) yo[j] = ao[j] * bo[j]; }
            else if (ia) { float v = bo[0]; for (int64_t j = 0; j < inner; j++) yo[j] = ao[j] * v; }
            else if (ib) { float v = ao[0]; for (int64_t j = 0; j < inner; j++) yo[j] = v * bo[j]; }
            else { float v = ao[0] * bo[0]; for (int64_t j = 0; j < inner; j++) yo[j] = v; }
            break;
        default:
            for (int64_t j = 0; j < inner; j++) yo[j] = apply(op, ao[j * ia], bo[j * ib]);
        }
    }
    return PORT_OK;
}

/* the gradient of operand k at one full-index position: dy times d(a op b)/d(operand k) */
static inline double term(int64_t op, int k, double g, const float *a, const float *b) {
    switch (op) {
    case PORT_BINARY_ADD: return g;
    case PORT_BINARY_SUB: return k ? -g : g;
    case PORT_BINARY_MUL: return k ? g * (double)*a : g * (double)*b;
    default: {
        float bv = *b;
        if (!k) return (double)((float)g / bv);
        return -(double)((float)g * *a / (bv * bv));
    }
    }
}

static int needs(int64_t op, int k, int other) {   /* does operand k's gradient read operand `other`? */
    if (op == PORT_BINARY_MUL) return other != k;
    if (op == PORT_BINARY_DIV) return other == 1 || k == 1;
    return 0;
}

/* adds to *oy, *oa, *ob the offsets of the flat index `idx` over the dims dim[0..n) (the last one fastest) */
static inline void add_offsets(int64_t idx, const int64_t *dim, int64_t n, const port_binary_params *p,
                               const int64_t *sy, const int64_t *sa, const int64_t *sb, int64_t *oy, int64_t *oa,
                               int64_t *ob) {
    for (int64_t j = n - 1; j >= 0; j--) {
        int64_t i = dim[j], c = idx % p->dims[i];
        idx /= p->dims[i];
        *oy += c * sy[i];
        *oa += c * sa[i];
        *ob += c * sb[i];
    }
}

/* the next index of an odometer over the dims dim[0..n) (the last one fastest): its counters c[0..n) and the
 * offsets into y, a and b move by one position (the gradient loops' per-element divisions were their cost) */
static inline void step_offsets(int64_t *c, const int64_t *dim, int64_t n, const port_binary_params *p,
                                const int64_t *sy, const int64_t *sa, const int64_t *sb, int64_t *oy, int64_t *oa,
                                int64_t *ob) {
    for (int64_t j = n - 1; j >= 0; j--) {
        int64_t i = dim[j];
        if (++c[j] < p->dims[i]) {
            *oy += sy[i];
            *oa += sa[i];
            *ob += sb[i];
            return;
        }
        c[j] = 0;
        *oy -= (p->dims[i] - 1) * sy[i];
        *oa -= (p->dims[i] - 1) * sa[i];
        *ob -= (p->dims[i] - 1) * sb[i];
    }
}

/* the odometer's counters at flat index idx */
static inline void set_counters(int64_t *c, int64_t idx, const int64_t *dim, int64_t n, const port_binary_params *p) {
    for (int64_t j = n - 1; j >= 0; j--) {
        c[j] = idx % p->dims[dim[j]];
        idx /= p->dims[dim[j]];
    }
}

#define GRAD_BLOCK 256   /* kept positions per task: each starts its odometer from one division per dim */

/* The plain reference: any broadcast pattern.  Each kept position's sum runs over the reduced positions in index
 * order from its first term (one reduced position: the term itself, a -0 kept), whatever the blocks and threads. */
static void grad_ref(float *d, int k, const float *dy, const float *a, const float *b, const port_binary_params *p,
                     int accumulate) {
    const int64_t r = p->rank, op = p->op, m = k ? p->b_bcast : p->a_bcast;
    int64_t sa[PORT_BINARY_MAX_RANK], sb[PORT_BINARY_MAX_RANK], sy[PORT_BINARY_MAX_RANK];
    int64_t kept[PORT_BINARY_MAX_RANK], red[PORT_BINARY_MAX_RANK], nk = 0, nr = 0, n_kept = 1, n_red = 1;
    strides(sa, p, p->a_bcast);
    strides(sb, p, p->b_bcast);
    strides(sy, p, 0);
    for (int64_t i = 0; i < r; i++) {
        if ((m >> i) & 1) { red[nr++] = i; n_red *= p->dims[i]; }
        else { kept[nk++] = i; n_kept *= p->dims[i]; }
    }
    static const float zero = 0.0f;
    const float *A = a ? a : &zero, *B = b ? b : &zero;
    const int64_t da_ = a ? 1 : 0, db_ = b ? 1 : 0;     /* an operand not read: its pointer stays on a zero */
    const int64_t nblk = (n_kept + GRAD_BLOCK - 1) / GRAD_BLOCK;
#pragma omp parallel for schedule(static) if (n_kept * n_red > PORT_PAR_MIN && n_kept > 1)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t e0 = blk * GRAD_BLOCK, e1 = e0 + GRAD_BLOCK < n_kept ? e0 + GRAD_BLOCK : n_kept;
        int64_t ck[PORT_BINARY_MAX_RANK], cr[PORT_BINARY_MAX_RANK];
        int64_t oy = 0, oa = 0, ob = 0;
        add_offsets(e0, kept, nk, p, sy, sa, sb, &oy, &oa, &ob);
        set_counters(ck, e0, kept, nk, p);
        for (int64_t e = e0; e < e1; e++) {
            int64_t ry = oy, ra = oa, rb = ob;
            for (int64_t j = 0; j < nr; j++) cr[j] = 0;
            double s = term(op, k, (double)dy[ry], A + ra * da_, B + rb * db_);
            for (int64_t t = 1; t < n_red; t++) {
                step_offsets(cr, red, nr, p, sy, sa, sb, &ry, &ra, &rb);
                s += term(op, k, (double)dy[ry], A + ra * da_, B + rb * db_);
            }
            d[e] = accumulate ? d[e] + (float)s : (float)s;
            if (e + 1 < e1) step_offsets(ck, kept, nk, p, sy, sa, sb, &oy, &oa, &ob);
        }
    }
}

/* ---- fast paths (binary_grad_path says which applies; grad_ref is their reference, tests/kernels check both) ----
 * ELEMENTWISE (nothing reduced): the gradient is one term per position, as the reference's (the same bits: a
 * float product is exact in double, so rounding it once is the float product).  ROWS (the reduced dims are the
 * trailing ones, and every operand the term reads is either whole or broadcast along all of them): each kept
 * position's sum runs over one contiguous row of dy, in ROW_LANES double partial sums (element j into lane
 * j % ROW_LANES) combined pairwise at the end (lanes_total): a fixed order, the same on every ISA and at any thread
 * count, but not the reference's sequential order (the two agree to double rounding before the final float
 * rounding: tests/kernels/test_eltwise_pool.py holds them to 1e-6 relative). */
#define ROW_LANES 8
#define FAST_CHUNK 16384  /* elements per task */

static inline double lanes_total(const double *l) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* one row of the ELEMENTWISE path: d[j] (+)= term over n positions; ia / ib: a's and b's step (0 or 1) */
static inline void elt_row(float *restrict d, const float *g, const float *a, const float *b, int64_t n, int64_t ia,
                           int64_t ib, int64_t op, int k, int acc) {
    const float *o = k ? a : b;            /* mul: the other operand */
    const int64_t io = k ? ia : ib;
    if (op == PORT_BINARY_MUL && io) {
        if (acc) { for (int64_t j = 0; j < n; j++) d[j] += g[j] * o[j]; }
        else { for (int64_t j = 0; j < n; j++) d[j] = g[j] * o[j]; }
    } else if (op == PORT_BINARY_MUL) {
        const float v = o[0];
        if (acc) { for (int64_t j = 0; j < n; j++) d[j] += g[j] * v; }
        else { for (int64_t j = 0; j < n; j++) d[j] = g[j] * v; }
    } else if (op == PORT_BINARY_ADD || (op == PORT_BINARY_SUB && !k)) {
        if (acc) { for (int64_t j = 0; j < n; j++) d[j] += g[j]; }
        else { for (int64_t j = 0; j < n; j++) d[j] = g[j]; }
    } else if (op == PORT_BINARY_SUB) {
        if (acc) { for (int64_t j = 0; j < n; j++) d[j] += -g[j]; }
        else { for (int64_t j = 0; j < n; j++) d[j] = -g[j]; }
    } else {
        for (int64_t j = 0; j < n; j++) {
            float t = (float)term(op, k, (double)g[j], a + j * ia, b + j * ib);
            d[j] = acc ? d[j] + t : t;
        }
    }
}

PORT_ISA_CLONES static void elt_seg(float *restrict d, const float *g, const float *a, const float *b, int64_t n,
                                    int64_t ia, int64_t ib, int64_t op, int k, int acc) {
    elt_row(d, g, a, b, n, ia, ib, op, k, acc);
}

/* short rows (a broadcast over a small inner dim): rows e of n positions at d + e n, g + e n, a + oa[e], b + ob[e] */
/* mul's rows of a length n (SMALL_N) known at compile time (each call site a constant): unrolled, as the
 * loops' set-up per row of a 2x2 or 4x4 map cost more than the row.  o: the other operand, oo its row offsets,
 * io its step. */
PORT_ALWAYS_INLINE void mul_rows_small(float *restrict d, const float *g, const float *o, const int64_t *oo,
                                       int64_t io, int64_t rows, const int n, int acc) {
    for (int64_t e = 0; e < rows; e++)
        for (int j = 0; j < n; j++) {
            float t = g[e * n + j] * o[oo[e] + j * io];
            d[e * n + j] = acc ? d[e * n + j] + t : t;
        }
}

PORT_ALWAYS_INLINE void dot_rows_small(float *restrict d, const float *g, const float *o, const int64_t *oo,
                                       int64_t rows, const int n, int acc) {
    for (int64_t e = 0; e < rows; e++) {
        double l[ROW_LANES] = {0};
        for (int q = 0; q < n; q++) l[q] += (double)g[e * n + q] * (double)o[oo[e] + q];
        float s = (float)lanes_total(l);
        d[e] = acc ? d[e] + s : s;
    }
}

#define SMALL_N(n) ((n) <= ROW_LANES)   /* unrolled lengths (16, as for a 4x4 map, measured slower unrolled) */
#define SMALL_N_CASES(call) \
    case 1: call(1); break; case 2: call(2); break; case 3: call(3); break; case 4: call(4); break; \
    case 5: call(5); break; case 6: call(6); break; case 7: call(7); break; case 8: call(8); break

PORT_ISA_CLONES static void elt_rows(float *restrict d, const float *g, const float *a, const float *b,
                                     const int64_t *oa, const int64_t *ob, int64_t rows, int64_t n, int64_t ia,
                                     int64_t ib, int64_t op, int k, int acc) {
    if (op == PORT_BINARY_MUL && SMALL_N(n)) {
#define MUL_N(c) mul_rows_small(d, g, k ? a : b, k ? oa : ob, k ? ia : ib, rows, c, acc)
        switch (n) { SMALL_N_CASES(MUL_N); }
#undef MUL_N
        return;
    }
    for (int64_t e = 0; e < rows; e++) elt_row(d + e * n, g + e * n, a + oa[e], b + ob[e], n, ia, ib, op, k, acc);
}

/* rows of the ROWS path: d[e] (+)= the sum of row e's terms; row e of dy starts at g + e * n, a's and b's at
 * a + oa[e], b + ob[e], stepping ia / ib (0 or 1) along it */
PORT_ISA_CLONES static void row_sums(float *restrict d, const float *g, const float *a, const float *b,
                                     const int64_t *oa, const int64_t *ob, int64_t rows, int64_t n, int64_t ia,
                                     int64_t ib, int64_t op, int k, int acc) {
    if (op == PORT_BINARY_MUL && (k ? ia : ib) && SMALL_N(n)) {
#define DOT_N(c) dot_rows_small(d, g, k ? a : b, k ? oa : ob, rows, c, acc)
        switch (n) { SMALL_N_CASES(DOT_N); }
#undef DOT_N
        return;
    }
    for (int64_t e = 0; e < rows; e++) {
        const float *ge = g + e * n, *ae = a + oa[e], *be = b + ob[e];
        double l[ROW_LANES] = {0};
        int64_t j = 0;
        if (op == PORT_BINARY_MUL && (k ? ia : ib)) {
            const float *o = k ? ae : be;
            for (; j + ROW_LANES <= n; j += ROW_LANES)
                for (int q = 0; q < ROW_LANES; q++) l[q] += (double)ge[j + q] * (double)o[j + q];
        }
        for (; j + ROW_LANES <= n; j += ROW_LANES)
            for (int q = 0; q < ROW_LANES; q++) l[q] += term(op, k, (double)ge[j + q], ae + (j + q) * ia,
                                                             be + (j + q) * ib);
        for (int q = 0; j + q < n; q++) l[q] += term(op, k, (double)ge[j + q], ae + (j + q) * ia, be + (j + q) * ib);
        float s = (float)lanes_total(l);
        d[e] = acc ? d[e] + s : s;
    }
}

enum { PATH_REF = 0, PATH_ELEMENTWISE = 1, PATH_ROWS = 2 };

/* a's and b's offsets (times ka / kb: 0 for an operand not read) at the positions e0..e1-1 of the odometer over
 * dims dim[0..n); one dim (the usual case after merging): e times the stride, no odometer */
static void row_offsets(int64_t *oa, int64_t *ob, int64_t e0, int64_t e1, const int64_t *dim, int64_t n,
                        const port_binary_params *p, const int64_t *sy, const int64_t *sa, const int64_t *sb,
                        int64_t ka, int64_t kb) {
    if (n == 1) {
        const int64_t ta = sa[dim[0]] * ka, tb = sb[dim[0]] * kb;
        for (int64_t e = e0; e < e1; e++) {
            oa[e - e0] = e * ta;
            ob[e - e0] = e * tb;
        }
        return;
    }
    int64_t c[PORT_BINARY_MAX_RANK], oy = 0, xa = 0, xb = 0;
    add_offsets(e0, dim, n, p, sy, sa, sb, &oy, &xa, &xb);
    set_counters(c, e0, dim, n, p);
    for (int64_t e = e0; e < e1; e++) {
        oa[e - e0] = xa * ka;
        ob[e - e0] = xb * kb;
        if (e + 1 < e1) step_offsets(c, dim, n, p, sy, sa, sb, &oy, &xa, &xb);
    }
}

/* which path operand k's gradient takes (its reads: needs()) */
static int grad_path(int k, const port_binary_params *p) {
    const int64_t r = p->rank, m = k ? p->b_bcast : p->a_bcast;
    const int64_t ms[2] = {p->a_bcast, p->b_bcast};
    if (m == 0) return PATH_ELEMENTWISE;     /* along the last dim every operand is whole or broadcast */
    int64_t j0 = r;                  /* the reduced dims must be j0..r-1 */
    while (j0 > 0 && ((m >> (j0 - 1)) & 1)) j0--;
    const int64_t suffix = (((int64_t)1 << r) - 1) & ~(((int64_t)1 << j0) - 1);
    if (m != suffix) return PATH_REF;
    for (int o = 0; o < 2; o++) {
        if (!needs(p->op, k, o)) continue;
        int64_t t = ms[o] & suffix;
        if (t != 0 && t != suffix) return PATH_REF;
    }
    return PATH_ROWS;
}

static void grad_elementwise(float *d, int k, const float *dy, const float *a, const float *b,
                             const port_binary_params *p, int accumulate) {
    const int64_t r = p->rank, inner = p->dims[r - 1];
    int64_t sa[PORT_BINARY_MAX_RANK], sb[PORT_BINARY_MAX_RANK], sy[PORT_BINARY_MAX_RANK], outer_dims[PORT_BINARY_MAX_RANK];
    strides(sa, p, p->a_bcast);
    strides(sb, p, p->b_bcast);
    strides(sy, p, 0);
    for (int64_t i = 0; i < r - 1; i++) outer_dims[i] = i;
    static const float zero = 0.0f;       /* an operand not read: its pointer stays on a zero */
    const int64_t ka = needs(p->op, k, 0), kb = needs(p->op, k, 1);
    const float *A = ka ? a : &zero, *B = kb ? b : &zero;
    const int64_t ia = ka ? sa[r - 1] : 0, ib = kb ? sb[r - 1] : 0;
    int64_t total = 1;
    for (int64_t i = 0; i < r; i++) total *= p->dims[i];
    if (inner <= FAST_CHUNK / 4) {   /* rows up to a quarter chunk: whole rows per task (up to GRAD_BLOCK), one call */
        const int64_t rows = total / inner, per = FAST_CHUNK / inner < GRAD_BLOCK ? FAST_CHUNK / inner : GRAD_BLOCK;
        const int64_t nblk = (rows + per - 1) / per;
#pragma omp parallel for schedule(static) if (total > PORT_PAR_MIN && nblk > 1)
        for (int64_t blk = 0; blk < nblk; blk++) {
            int64_t e0 = blk * per, e1 = e0 + per < rows ? e0 + per : rows;
            int64_t oa[GRAD_BLOCK], ob[GRAD_BLOCK];
            row_offsets(oa, ob, e0, e1, outer_dims, r - 1, p, sy, sa, sb, ka, kb);
            elt_rows(d + e0 * inner, dy + e0 * inner, A, B, oa, ob, e1 - e0, inner, ia, ib, p->op, k, accumulate);
        }
        return;
    }
    const int64_t nchunk = (total + FAST_CHUNK - 1) / FAST_CHUNK;
#pragma omp parallel for schedule(static) if (total > PORT_PAR_MIN)
    for (int64_t c = 0; c < nchunk; c++) {
        int64_t e = c * FAST_CHUNK, e1 = e + FAST_CHUNK < total ? e + FAST_CHUNK : total;
        int64_t row = e / inner, j = e % inner, cnt[PORT_BINARY_MAX_RANK], oy = 0, oa = 0, ob = 0;
        add_offsets(row, outer_dims, r - 1, p, sy, sa, sb, &oy, &oa, &ob);
        set_counters(cnt, row, outer_dims, r - 1, p);
        while (e < e1) {
            int64_t n = inner - j < e1 - e ? inner - j : e1 - e;
            elt_seg(d + e, dy + e, A + (oa + j * ia) * ka, B + (ob + j * ib) * kb, n, ia, ib, p->op, k, accumulate);
            e += n;
            j = 0;
            if (e < e1) step_offsets(cnt, outer_dims, r - 1, p, sy, sa, sb, &oy, &oa, &ob);
        }
    }
}

static void grad_rows(float *d, int k, const float *dy, const float *a, const float *b, const port_binary_params *p,
                      int accumulate) {
    const int64_t r = p->rank, m = k ? p->b_bcast : p->a_bcast;
    int64_t sa[PORT_BINARY_MAX_RANK], sb[PORT_BINARY_MAX_RANK], sy[PORT_BINARY_MAX_RANK];
    int64_t kept[PORT_BINARY_MAX_RANK], nk = 0, n_kept = 1, n_red = 1;
    strides(sa, p, p->a_bcast);
    strides(sb, p, p->b_bcast);
    strides(sy, p, 0);
    for (int64_t i = 0; i < r; i++) {
        if ((m >> i) & 1) n_red *= p->dims[i];
        else { kept[nk++] = i; n_kept *= p->dims[i]; }
    }
    static const float zero = 0.0f;       /* an operand not read: its pointer stays on a zero */
    const int64_t ka = needs(p->op, k, 0), kb = needs(p->op, k, 1);
    const float *A = ka ? a : &zero, *B = kb ? b : &zero;
    const int64_t ia = ka && !((p->a_bcast >> (r - 1)) & 1), ib = kb && !((p->b_bcast >> (r - 1)) & 1);
    int64_t rows_per = FAST_CHUNK / n_red;
    rows_per = rows_per < 1 ? 1 : rows_per > GRAD_BLOCK ? GRAD_BLOCK : rows_per;
    const int64_t nblk = (n_kept + rows_per - 1) / rows_per;
#pragma omp parallel for schedule(static) if (n_kept * n_red > PORT_PAR_MIN && n_kept > 1)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t e0 = blk * rows_per, e1 = e0 + rows_per < n_kept ? e0 + rows_per : n_kept;
        int64_t oa[GRAD_BLOCK], ob[GRAD_BLOCK];
        row_offsets(oa, ob, e0, e1, kept, nk, p, sy, sa, sb, ka, kb);
        row_sums(d + e0, dy + e0 * n_red, A, B, oa, ob, e1 - e0, n_red, ia, ib, p->op, k, accumulate);
    }
}

/* the gradient of operand k by path (PATH_REF: the reference whatever the pattern) */
static void grad_of(float *d, int k, const float *dy, const float *a, const float *b, const port_binary_params *p,
                    int accumulate, int path) {
    if (path == PATH_ELEMENTWISE) grad_elementwise(d, k, dy, a, b, p, accumulate);
    else if (path == PATH_ROWS) grad_rows(d, k, dy, a, b, p, accumulate);
    else grad_ref(d, k, dy, a, b, p, accumulate);
}

static port_status backward(float *da, float *db, const float *dy, const float *a, const float *b,
                            const port_binary_params *p, int accumulate, int reference) {
    PORT_NOTNULL(dy);
    PORT_CHECK(binary_check(p), PORT_ERR_SHAPE);
    PORT_CHECK(da || db, PORT_ERR_NULL);
    PORT_CHECK(accumulate == 0 || accumulate == 1, PORT_ERR_ARG);
    for (int k = 0; k < 2; k++) {
        if (!(k ? db : da)) continue;
        for (int o = 0; o < 2; o++)
            PORT_CHECK(!needs(p->op, k, o) || (o ? b : a), PORT_ERR_NULL);
    }
    /* no in-place form: a gradient never shares bytes with dy, a, b or the other gradient */
    for (int k = 0; k < 2; k++) {
        const float *d = k ? db : da;
        PORT_CHECK(!d || (d != dy && d != a && d != b), PORT_ERR_ALIAS);
    }
    PORT_CHECK(!da || da != db, PORT_ERR_ALIAS);
    if (da) grad_of(da, 0, dy, a, b, p, accumulate, reference ? PATH_REF : grad_path(0, p));
    if (db) grad_of(db, 1, dy, a, b, p, accumulate, reference ? PATH_REF : grad_path(1, p));
    return PORT_OK;
}

port_status port_binary_backward(float *da, float *db, const float *dy, const float *a, const float *b,
                                 const port_binary_params *p, int accumulate) {
    return backward(da, db, dy, a, b, p, accumulate, 0);
}

port_status port_binary_backward_reference(float *da, float *db, const float *dy, const float *a, const float *b,
                                           const port_binary_params *p, int accumulate) {
    return backward(da, db, dy, a, b, p, accumulate, 1);
}

int port_binary_backward_path(const port_binary_params *p, int operand) {
    if (!binary_check(p) || operand < 0 || operand > 1) return -1;
    return grad_path(operand, p);
}
