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
    int64_t sa[PORT_BINARY_MAX_RANK], sb[PORT_BINARY_MAX_RANK];
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

static void grad_of(float *d, int k, const float *dy, const float *a, const float *b, const port_binary_params *p,
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
    /* each kept position's sum runs over the reduced positions in index order, whatever the blocks and threads:
     * the same bits as one loop over the flat indices */
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
            double s = 0.0;
            for (int64_t t = 0; t < n_red; t++) {
                s += term(op, k, (double)dy[ry], A + ra * da_, B + rb * db_);
                if (t + 1 < n_red) step_offsets(cr, red, nr, p, sy, sa, sb, &ry, &ra, &rb);
            }
            d[e] = accumulate ? d[e] + (float)s : (float)s;
            if (e + 1 < e1) step_offsets(ck, kept, nk, p, sy, sa, sb, &oy, &oa, &ob);
        }
    }
}

port_status port_binary_backward(float *da, float *db, const float *dy, const float *a, const float *b,
                                 const port_binary_params *p, int accumulate) {
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
    if (da) grad_of(da, 0, dy, a, b, p, accumulate);
    if (db) grad_of(db, 1, dy, a, b, p, accumulate);
    return PORT_OK;
}
