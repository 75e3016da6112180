/* The call rule: what a well-formed port_rt_call is (port_rt.h, port_rt_call_check).  The one definition that
 * the bundle loader (rt_bundle.c) applies to every call before anything runs, and that Python's program check
 * (port.lower.arena.check_program, through port.exec.capi) applies to every encoded C call of a program.
 *
 * For each kernel id: the operands its integer parameters imply (bytes from each pointer, computed with
 * saturating products so a huge parameter cannot wrap to a small extent), the parameters' ranges (counts and
 * dimensions >= 1, enums and flags, finite floats), its workspace query, and which outputs may be which inputs
 * in place.  port_rt_call_check then holds every operand, the workspace and the zero ranges inside the arena.
 * Argument layouts: port_rt_exec (rt_exec.c) and the encoders of port/ops. */
#include "port_rt.h"

#include <limits.h>
#include <math.h>
#include <string.h>

/* Every kernel id of PORT_RT_KERNELS (port_rt.h) names its rule here (the table RULES below): an id cannot be
 * added without one (the build stops at the undefined name), and an id the list lacks is refused. */

#define BAD PORT_RT_ERR_BUNDLE

static const char *const PTR_NAMES[PORT_RT_MAX_PTRS] = {"ptr[0]", "ptr[1]", "ptr[2]", "ptr[3]", "ptr[4]",
                                                        "ptr[5]", "ptr[6]", "ptr[7]", "ptr[8]", "ptr[9]"};
static const char *const IV_NAMES[PORT_RT_MAX_INTS] = {"iv[0]", "iv[1]", "iv[2]",  "iv[3]",  "iv[4]",  "iv[5]",
                                                       "iv[6]", "iv[7]", "iv[8]",  "iv[9]",  "iv[10]", "iv[11]",
                                                       "iv[12]", "iv[13]", "iv[14]", "iv[15]"};
static const char *const FV_NAMES[PORT_RT_MAX_FLOATS] = {"fv[0]", "fv[1]"};

static int fail(port_rt_call_problem *why, const char *field, const char *what, int64_t value, int64_t bytes,
                int64_t limit) {
    if (why) {
        why->field = field;
        why->what = what;
        why->value = value;
        why->bytes = bytes;
        why->limit = limit;
    }
    return BAD;
}

/* a * b for non-negative a, b; INT64_MAX where the product does not fit */
static int64_t smul(int64_t a, int64_t b) {
    if (a == 0 || b == 0) return 0;
    if (a > INT64_MAX / b) return INT64_MAX;
    return a * b;
}
static int64_t smul3(int64_t a, int64_t b, int64_t c) { return smul(smul(a, b), c); }
static int64_t smul4(int64_t a, int64_t b, int64_t c, int64_t d) { return smul(smul(a, b), smul(c, d)); }

typedef struct {
    const port_rt_call *c;
    port_rt_call_shape *s;
    port_rt_call_problem *why;
} ctx;

/* the kernel takes np pointers, ni ints, nf floats */
static void args(ctx *x, int np, int ni, int nf) {
    x->s->nptrs = np;
    x->s->nints = ni;
    x->s->nfloats = nf;
}
/* operand i: elems elements of esz bytes; out: the kernel writes it */
static void op(ctx *x, int i, int64_t elems, int esz, int out) {
    x->s->bytes[i] = smul(elems, esz);
    x->s->elem[i] = esz;
    if (out) x->s->writes |= 1 << i;
}
static void inplace(ctx *x, int out, int in) { x->s->may_alias[out] |= 1 << in; }

/* iv[i] in [lo, hi] */
static int iv_in(ctx *x, int i, int64_t lo, int64_t hi, const char *what) {
    int64_t v = x->c->iv[i];
    return v < lo || v > hi ? fail(x->why, IV_NAMES[i], what, v, 0, v < lo ? lo : hi) : PORT_OK;
}
static int pos(ctx *x, int i) { return iv_in(x, i, 1, INT64_MAX, "a count or dimension must be at least 1"); }
/* iv[a..b] all >= 1 */
static int pos_range(ctx *x, int a, int b) {
    for (int i = a; i <= b; i++)
        if (pos(x, i)) return BAD;
    return PORT_OK;
}
/* fv[i] finite and in [lo, hi] (hi_open: below hi) */
static int fv_in(ctx *x, int i, double lo, double hi, int hi_open, const char *what) {
    double v = x->c->fv[i];
    if (!isfinite(v) || v < lo || v > hi || (hi_open && v == hi))
        return fail(x->why, FV_NAMES[i], what, isfinite(v) ? (int64_t)v : 0, 0, 0);
    return PORT_OK;
}
static int fv_finite(ctx *x, int i) { return fv_in(x, i, -HUGE_VAL, HUGE_VAL, 0, "must be finite"); }

/* ---------------------------------------------------------------- convolutions */
static int conv_params(ctx *x, port_conv2d_params *p) {
    const int64_t *v = x->c->iv;
    if (pos_range(x, 0, 8) || iv_in(x, 9, 0, INT64_MAX, "padding must be >= 0") ||
        iv_in(x, 10, 0, INT64_MAX, "padding must be >= 0") || pos(x, 11) ||
        iv_in(x, 12, 0, INT64_MAX, "output height must be >= 0 (0: not given)") ||
        iv_in(x, 13, 0, INT64_MAX, "output width must be >= 0 (0: not given)"))
        return BAD;
    port_conv2d_params q = port_rt_conv2d_params(v);
    /* bound the dimensions first: port_conv2d_check's own products must not overflow */
    for (int i = 0; i < 14; i++)
        if (v[i] > ((int64_t)1 << 31)) return fail(x->why, IV_NAMES[i], "a convolution parameter above 2^31", v[i], 0,
                                                   (int64_t)1 << 31);
    if (port_conv2d_check(&q) != PORT_OK)
        return fail(x->why, "iv[0..13]", "inconsistent convolution parameters (port_conv2d_check refuses them)",
                    0, 0, 0);
    *p = q;
    return PORT_OK;
}

/* conv operands: x, y, w sizes */
static void conv_sizes(const port_conv2d_params *p, int64_t *xs, int64_t *ys, int64_t *ws) {
    *xs = smul4(p->n, p->c_in, p->h, p->w);
    *ys = smul4(p->n, p->c_out, port_conv2d_out_h(p), port_conv2d_out_w(p));
    *ws = smul4(p->c_out, p->c_in / p->groups, p->kh, p->kw);
}

static int conv(ctx *x, int k) {
    port_conv2d_params p;
    if (conv_params(x, &p)) return BAD;
    const int64_t *v = x->c->iv;
    int64_t xs, ys, ws;
    conv_sizes(&p, &xs, &ys, &ws);
    int patch = k == PORT_RT_CONV2D_PATCH_FORWARD || k == PORT_RT_CONV2D_PATCH_BACKWARD_INPUT ||
                k == PORT_RT_CONV2D_PATCH_BACKWARD_WEIGHT;
    if (patch) {   /* iv[15] tile height, iv[14] tile width (0: square tiles) */
        if (pos(x, 15) || iv_in(x, 14, 0, INT64_MAX, "tile width must be >= 0 (0: the tile height)")) return BAD;
        x->s->ws_bytes = (int64_t)port_conv2d_patch_workspace_bytes(&p, v[15], v[14] > 0 ? v[14] : v[15]);
    } else {
        if (iv_in(x, 14, PORT_CONV_AUTO, PORT_CONV_WINOGRAD, "convolution algorithm (0 auto .. 3 winograd)") ||
            iv_in(x, 15, 0, 0, "must be 0 outside patch convolutions"))
            return BAD;
        if (port_conv2d_resolve_algo(&p, (int)v[14]) < 0)
            return fail(x->why, "iv[14]", "the convolution algorithm does not apply to these parameters", v[14], 0,
                        0);
        x->s->ws_bytes = (int64_t)port_conv2d_workspace_bytes(&p, (int)v[14]);
    }
    switch (k) {
    case PORT_RT_CONV2D_FORWARD:
    case PORT_RT_CONV2D_PATCH_FORWARD:   /* y, x, w, b */
        args(x, 4, 16, 0);
        op(x, 0, ys, 4, 1), op(x, 1, xs, 4, 0), op(x, 2, ws, 4, 0), op(x, 3, p.c_out, 4, 0);
        return PORT_OK;
    case PORT_RT_CONV2D_BACKWARD_INPUT:
    case PORT_RT_CONV2D_PATCH_BACKWARD_INPUT:   /* dx, dy, w */
        args(x, 3, 16, 0);
        op(x, 0, xs, 4, 1), op(x, 1, ys, 4, 0), op(x, 2, ws, 4, 0);
        return PORT_OK;
    case PORT_RT_CONV2D_BN_RELU_FORWARD_TRAIN:   /* y, z, mean, invstd, rm, rv, x, w, gamma, beta */
        args(x, 10, 16, 2);
        op(x, 0, ys, 4, 1), op(x, 1, ys, 4, 1);
        for (int i = 2; i < 6; i++) op(x, i, p.c_out, 4, 1);
        op(x, 6, xs, 4, 0), op(x, 7, ws, 4, 0), op(x, 8, p.c_out, 4, 0), op(x, 9, p.c_out, 4, 0);
        if (fv_in(x, 0, 1e-30, HUGE_VAL, 0, "batch-norm eps must be > 0 and finite") ||
            fv_in(x, 1, 0.0, 1.0, 0, "batch-norm momentum must lie in [0, 1]"))
            return BAD;
        return PORT_OK;
    default:   /* backward weight (plain, overwrite, patch): dw, db, dy, x */
        args(x, 4, 16, 0);
        op(x, 0, ws, 4, 1), op(x, 1, p.c_out, 4, 1), op(x, 2, ys, 4, 0), op(x, 3, xs, 4, 0);
        return PORT_OK;
    }
}

/* ---------------------------------------------------------------- batch norm */
static int batchnorm(ctx *x, int k) {
    if (pos_range(x, 0, 3) || fv_in(x, 0, 1e-30, HUGE_VAL, 0, "batch-norm eps must be > 0 and finite") ||
        fv_in(x, 1, 0.0, 1.0, 0, "batch-norm momentum must lie in [0, 1]"))
        return BAD;
    /* (float)eps must stay > 0 too: the kernels check the float */
    if (!((float)x->c->fv[0] > 0.0f) || !isfinite((float)x->c->fv[0]))
        return fail(x->why, "fv[0]", "batch-norm eps must be > 0 and finite as a float", 0, 0, 0);
    const int64_t *v = x->c->iv;
    int64_t t = smul4(v[0], v[1], v[2], v[3]), c = v[1];
    switch (k) {
    case PORT_RT_BATCHNORM2D_FORWARD_TRAIN:   /* y, mean, invstd, rm, rv, x, gamma, beta */
        args(x, 8, 4, 2);
        op(x, 0, t, 4, 1);
        for (int i = 1; i < 5; i++) op(x, i, c, 4, 1);
        op(x, 5, t, 4, 0), op(x, 6, c, 4, 0), op(x, 7, c, 4, 0);
        inplace(x, 0, 5);
        return PORT_OK;
    case PORT_RT_BATCHNORM2D_FORWARD_EVAL:   /* y, x, gamma, beta, rm, rv */
        args(x, 6, 4, 2);
        op(x, 0, t, 4, 1), op(x, 1, t, 4, 0);
        for (int i = 2; i < 6; i++) op(x, i, c, 4, 0);
        inplace(x, 0, 1);
        return PORT_OK;
    case PORT_RT_BATCHNORM2D_BACKWARD_INPUT:               /* dx, dy, x, gamma, mean, invstd */
    case PORT_RT_BATCHNORM2D_BACKWARD_INPUT_FROM_OUTPUT:   /* dx, dy, y, gamma, beta, invstd */
        args(x, 6, 4, 2);
        op(x, 0, t, 4, 1), op(x, 1, t, 4, 0), op(x, 2, t, 4, 0);
        for (int i = 3; i < 6; i++) op(x, i, c, 4, 0);
        inplace(x, 0, 1);
        return PORT_OK;
    case PORT_RT_BATCHNORM2D_BACKWARD_INPUT_EVAL:   /* dx, dy, gamma, rv */
        args(x, 4, 4, 2);
        op(x, 0, t, 4, 1), op(x, 1, t, 4, 0), op(x, 2, c, 4, 0), op(x, 3, c, 4, 0);
        inplace(x, 0, 1);
        return PORT_OK;
    default:   /* backward weight (train: dy, x, mean, invstd; from output: dy, y, gamma, beta; eval: dy, x, rm, rv) */
        args(x, 6, 4, 2);
        op(x, 0, c, 4, 1), op(x, 1, c, 4, 1), op(x, 2, t, 4, 0), op(x, 3, t, 4, 0), op(x, 4, c, 4, 0),
            op(x, 5, c, 4, 0);
        return PORT_OK;
    }
}

/* ---------------------------------------------------------------- pooling */
static int pooling(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    int maxp = k == PORT_RT_MAXPOOL2D_FORWARD || k == PORT_RT_MAXPOOL2D_BACKWARD_INPUT;
    if (pos_range(x, 0, 7) || iv_in(x, 8, 0, INT64_MAX, "padding must be >= 0") ||
        iv_in(x, 9, 0, INT64_MAX, "padding must be >= 0") ||
        iv_in(x, 10, 0, INT64_MAX, "output height must be >= 0 (0: not given)") ||
        iv_in(x, 11, 0, INT64_MAX, "output width must be >= 0 (0: not given)"))
        return BAD;
    /* iv[14] ceil_mode; max pools: iv[12], iv[13] dilation (0 or 1: none); average pools: no dilation (iv[12],
     * iv[13] 0), iv[15] exclude_pad (count_include_pad=False) */
    if (iv_in(x, 14, 0, 1, "ceil_mode must be 0 or 1") ||
        (maxp ? iv_in(x, 12, 0, INT64_MAX, "dilation must be >= 0 (0: 1)") ||
                    iv_in(x, 13, 0, INT64_MAX, "dilation must be >= 0 (0: 1)")
              : iv_in(x, 12, 0, 0, "an average pool takes no dilation") ||
                    iv_in(x, 13, 0, 0, "an average pool takes no dilation") ||
                    iv_in(x, 15, 0, 1, "exclude_pad must be 0 or 1")))
        return BAD;
    for (int i = 0; i < 14; i++)
        if (v[i] > ((int64_t)1 << 31)) return fail(x->why, IV_NAMES[i], "a pooling parameter above 2^31", v[i], 0,
                                                   (int64_t)1 << 31);
    if (maxp && v[15]) return fail(x->why, "iv[15]", "a max pool takes no exclude_pad", v[15], 0, 0);
    port_pool2d_params p = port_rt_pool2d_params(v);   /* the struct port_rt_exec passes */
    int64_t ho = port_pool2d_out_h(&p), wo = port_pool2d_out_w(&p);
    int64_t dh = p.dilation_h > 1 ? p.dilation_h : 1, dw = p.dilation_w > 1 ? p.dilation_w : 1;
    if (2 * p.pad_h > p.kh || 2 * p.pad_w > p.kw || p.h + 2 * p.pad_h < dh * (p.kh - 1) + 1 ||
        p.w + 2 * p.pad_w < dw * (p.kw - 1) + 1 || ho < 1 || wo < 1 || (p.h_out && p.h_out != ho) ||
        (p.w_out && p.w_out != wo))
        return fail(x->why, "iv[0..14]",
                    "inconsistent pooling parameters (window, dilation, padding, ceil mode and output size)", 0, 0, 0);
    int64_t xs = smul4(p.n, p.c, p.h, p.w), ys = smul4(p.n, p.c, ho, wo);
    switch (k) {
    case PORT_RT_MAXPOOL2D_FORWARD:   /* y, indices, x */
        args(x, 3, 15, 0);
        op(x, 0, ys, 4, 1), op(x, 1, ys, 8, 1), op(x, 2, xs, 4, 0);
        return PORT_OK;
    case PORT_RT_MAXPOOL2D_BACKWARD_INPUT:   /* dx, dy, indices */
        args(x, 3, 15, 0);
        op(x, 0, xs, 4, 1), op(x, 1, ys, 4, 0), op(x, 2, ys, 8, 0);
        return PORT_OK;
    case PORT_RT_AVGPOOL2D_FORWARD:   /* y, x */
        args(x, 2, 16, 0);
        op(x, 0, ys, 4, 1), op(x, 1, xs, 4, 0);
        return PORT_OK;
    default:   /* avg pool backward: dx, dy */
        args(x, 2, 16, 0);
        op(x, 0, xs, 4, 1), op(x, 1, ys, 4, 0);
        return PORT_OK;
    }
}

/* ---------------------------------------------------------------- attention */
static int attention(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    if (pos_range(x, 0, 4) || iv_in(x, 5, 0, 1, "causal flag must be 0 or 1") ||
        iv_in(x, 6, PORT_ATTN_PLAIN, PORT_ATTN_TILED, "attention algorithm (0 plain, 1 tiled)") ||
        iv_in(x, 7, 0, v[1], "key/value heads must lie in 0..heads (0: heads)") ||
        iv_in(x, 8, PORT_ATTN_MASK_KEYS, PORT_ATTN_MASK_ADD, "mask kind (0 key padding, 1 boolean, 2 additive)") ||
        iv_in(x, 13, 0, INT32_MAX, "the forward op id (dropout stream) must lie in 0..2^31-1") ||
        fv_finite(x, 0) || fv_in(x, 1, 0.0, 1.0, 1, "attention dropout p must lie in [0, 1)"))
        return BAD;
    if (v[0] % v[1]) return fail(x->why, "iv[1]", "heads must divide the batch x heads count iv[0]", v[1], 0, v[0]);
    if (v[7] && v[1] % v[7]) return fail(x->why, "iv[7]", "key/value heads must divide the heads iv[1]", v[7], 0, v[1]);
    for (int i = 0; i < 5; i++)
        if (v[i] > ((int64_t)1 << 31)) return fail(x->why, IV_NAMES[i], "an attention dimension above 2^31", v[i], 0,
                                                   (int64_t)1 << 31);
    int kind = (int)v[8];
    const int64_t full[4] = {v[0] / v[1], v[1], v[2], v[3]};
    for (int i = 0; i < 4; i++) {
        int64_t d = v[9 + i];
        if (kind == PORT_ATTN_MASK_KEYS ? d != 0 : d != 1 && d != full[i])
            return fail(x->why, IV_NAMES[9 + i],
                        kind == PORT_ATTN_MASK_KEYS ? "a mask extent must be 0 with a key-padding mask"
                                                    : "a mask extent must be 1 or the extent it broadcasts to",
                        d, 0, full[i]);
    }
    port_attention_params p = port_rt_attention_params(v, x->c->fv, 0, 0);
    int back = k == PORT_RT_ATTENTION_BACKWARD;
    int64_t bkv = v[0] / v[1] * (v[7] ? v[7] : v[1]);
    int64_t qs = smul3(p.bh, p.tq, p.dh), ks = smul3(bkv, p.tk, p.dh), lse = smul(p.bh, p.tq),
            mask = port_attention_mask_numel(&p);
    int msz = kind == PORT_ATTN_MASK_ADD ? 4 : 1;
    size_t need = port_attention_workspace_bytes(&p, (int)v[6], back);   /* 0: parameters it refuses */
    if (need == 0)
        return fail(x->why, "iv[0..12]", "attention parameters the kernel refuses", 0, 0, 0);
    if (kind != PORT_ATTN_MASK_KEYS && x->c->ptr[back ? 9 : 5] == -1)
        return fail(x->why, back ? "ptr[9]" : "ptr[5]", "a boolean or additive mask needs its operand", -1, 0, 0);
    x->s->ws_bytes = (int64_t)need;
    if (!back) {   /* o, lse, q, k, v, mask */
        args(x, 6, 14, 2);
        op(x, 0, qs, 4, 1), op(x, 1, lse, 4, 1), op(x, 2, qs, 4, 0), op(x, 3, ks, 4, 0), op(x, 4, ks, 4, 0),
            op(x, 5, mask, msz, 0);
        return PORT_OK;
    }
    /* dq, dk, dv, dout, q, k, v, o, lse, mask */
    args(x, 10, 14, 2);
    op(x, 0, qs, 4, 1), op(x, 1, ks, 4, 1), op(x, 2, ks, 4, 1), op(x, 3, qs, 4, 0), op(x, 4, qs, 4, 0),
        op(x, 5, ks, 4, 0), op(x, 6, ks, 4, 0), op(x, 7, qs, 4, 0), op(x, 8, lse, 4, 0), op(x, 9, mask, msz, 0);
    return PORT_OK;
}

/* ---------------------------------------------------------------- permute */
static int permute(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    if (iv_in(x, 0, 1, 6, "permute rank must lie in 1..6")) return BAD;
    int64_t r = v[0], total = 1;
    int seen = 0;
    for (int i = 0; i < 6; i++) {
        if (i < r ? pos(x, 1 + i) : iv_in(x, 1 + i, 1, 1, "a permute dimension past the rank must be 1"))
            return BAD;
        if (iv_in(x, 7 + i, i < r ? 0 : i, i < r ? r - 1 : i, "permute axes: a permutation of 0..rank-1 (then i)"))
            return BAD;
        if (i < r && (seen & (1 << v[7 + i])))
            return fail(x->why, IV_NAMES[7 + i], "permute axes repeat an axis", v[7 + i], 0, 0);
        if (i < r) seen |= 1 << v[7 + i];
        total = smul(total, v[1 + i]);
    }
    args(x, 2, 13, 0);
    op(x, 0, total, 4, 1), op(x, 1, total, 4, 0);
    return PORT_OK;
}

/* ---------------------------------------------------------------- broadcast binary (ids 72, 73) */
/* iv: op (0 add .. 3 div), rank 1..6, a_bcast, b_bcast (bit i: size 1 along dim i), dims[6] (1 past the rank);
 * backward: then accumulate (0/1).  Forward (y, a, b): y may be a full-shape operand; backward (da, db, dy, a, b):
 * no gradient overlaps anything. */
static int binary(ctx *x, int backward) {
    const int64_t *v = x->c->iv;
    if (iv_in(x, 0, 0, 3, "binary op (0 add, 1 sub, 2 mul, 3 div)") ||
        iv_in(x, 1, 1, 6, "binary rank must lie in 1..6"))
        return BAD;
    int64_t r = v[1], mask = ((int64_t)1 << r) - 1, ny = 1, na = 1, nb = 1;
    if (iv_in(x, 2, 0, mask, "a's broadcast mask: bits below the rank") ||
        iv_in(x, 3, 0, mask, "b's broadcast mask: bits below the rank"))
        return BAD;
    for (int i = 0; i < 6; i++) {
        if (i < r ? pos(x, 4 + i) : iv_in(x, 4 + i, 1, 1, "a binary dimension past the rank must be 1")) return BAD;
        ny = smul(ny, v[4 + i]);
        na = smul(na, (v[2] >> i) & 1 ? 1 : v[4 + i]);
        nb = smul(nb, (v[3] >> i) & 1 ? 1 : v[4 + i]);
    }
    if (!backward) {
        args(x, 3, 10, 0);
        op(x, 0, ny, 4, 1), op(x, 1, na, 4, 0), op(x, 2, nb, 4, 0);
        if (!v[2]) inplace(x, 0, 1);
        if (!v[3]) inplace(x, 0, 2);
        return PORT_OK;
    }
    if (iv_in(x, 10, 0, 1, "accumulate must be 0 or 1")) return BAD;
    args(x, 5, 11, 0);
    op(x, 0, na, 4, 1), op(x, 1, nb, 4, 1), op(x, 2, ny, 4, 0), op(x, 3, na, 4, 0), op(x, 4, nb, 4, 0);
    return PORT_OK;
}

/* ---------------------------------------------------------------- norms, pooling and resize (ids 90-99) */
/* rms norm, iv: rows, d (fv[0] eps >= 0 in the forward); group norm, iv: n, c, hw, groups (fv[0] eps > 0) */
static int norms(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    if (k <= PORT_RT_RMSNORM_BACKWARD_WEIGHT) {
        if (pos_range(x, 0, 1)) return BAD;
        int64_t t = smul(v[0], v[1]);
        if (k == PORT_RT_RMSNORM_FORWARD) {   /* y, rstd [rows], x, gamma [d] */
            if (fv_in(x, 0, 0.0, HUGE_VAL, 0, "rms-norm eps must be >= 0 and finite") ||
                !isfinite((float)x->c->fv[0]))
                return fail(x->why, "fv[0]", "rms-norm eps must be >= 0 and finite as a float", 0, 0, 0);
            args(x, 4, 2, 1);
            op(x, 0, t, 4, 1), op(x, 1, v[0], 4, 1), op(x, 2, t, 4, 0), op(x, 3, v[1], 4, 0);
        } else if (k == PORT_RT_RMSNORM_BACKWARD_INPUT) {   /* dx, dy, x, rstd, gamma: dx may be dy */
            args(x, 5, 2, 0);
            op(x, 0, t, 4, 1), op(x, 1, t, 4, 0), op(x, 2, t, 4, 0), op(x, 3, v[0], 4, 0), op(x, 4, v[1], 4, 0);
            inplace(x, 0, 1);
        } else {   /* dgamma, dy, x, rstd */
            args(x, 4, 2, 0);
            op(x, 0, v[1], 4, 1), op(x, 1, t, 4, 0), op(x, 2, t, 4, 0), op(x, 3, v[0], 4, 0);
        }
        return PORT_OK;
    }
    if (pos_range(x, 0, 3)) return BAD;
    if (v[1] % v[3]) return fail(x->why, "iv[3]", "groups must divide the channels iv[1]", v[3], 0, v[1]);
    int64_t t = smul3(v[0], v[1], v[2]), st = smul3(2, v[0], v[3]);
    if (k == PORT_RT_GROUPNORM_FORWARD) {   /* y, stats [2 n groups], x, gamma [c], beta [c]: y may be x */
        if (fv_in(x, 0, 1e-30, HUGE_VAL, 0, "group-norm eps must be > 0 and finite") ||
            !((float)x->c->fv[0] > 0.0f) || !isfinite((float)x->c->fv[0]))
            return fail(x->why, "fv[0]", "group-norm eps must be > 0 and finite as a float", 0, 0, 0);
        args(x, 5, 4, 1);
        op(x, 0, t, 4, 1), op(x, 1, st, 4, 1), op(x, 2, t, 4, 0), op(x, 3, v[1], 4, 0), op(x, 4, v[1], 4, 0);
        inplace(x, 0, 2);
    } else if (k == PORT_RT_GROUPNORM_BACKWARD_INPUT) {   /* dx, dy, x, stats, gamma: dx may be dy */
        args(x, 5, 4, 0);
        op(x, 0, t, 4, 1), op(x, 1, t, 4, 0), op(x, 2, t, 4, 0), op(x, 3, st, 4, 0), op(x, 4, v[1], 4, 0);
        inplace(x, 0, 1);
    } else {   /* dgamma, dbeta, dy, x, stats */
        args(x, 5, 4, 0);
        op(x, 0, v[1], 4, 1), op(x, 1, v[1], 4, 1), op(x, 2, t, 4, 0), op(x, 3, t, 4, 0), op(x, 4, st, 4, 0);
    }
    return PORT_OK;
}

/* resize, iv: n, c, h, w, ho, wo, mode, align_corners, fv: rh, rw; adaptive average pool, iv: n, c, h, w, ho, wo.
 * Forward (y, x), backward (dx, dy): never in place. */
static int resize(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    if (pos_range(x, 0, 5)) return BAD;
    for (int i = 0; i < 6; i++)
        if (v[i] > ((int64_t)1 << 31)) return fail(x->why, IV_NAMES[i], "a resize dimension above 2^31", v[i], 0,
                                                   (int64_t)1 << 31);
    int up = k == PORT_RT_UPSAMPLE2D_FORWARD || k == PORT_RT_UPSAMPLE2D_BACKWARD_INPUT;
    if (up) {
        if (iv_in(x, 6, PORT_UPSAMPLE_NEAREST, PORT_UPSAMPLE_BILINEAR, "resize mode (0 nearest, 1 bilinear)") ||
            iv_in(x, 7, 0, v[6] == PORT_UPSAMPLE_BILINEAR, "align_corners must be 0 or 1 (0 for nearest)") ||
            fv_in(x, 0, 0.0, 3.0e38, 0, "the resize step must be >= 0 and finite as a float (0: from the sizes)") ||
            fv_in(x, 1, 0.0, 3.0e38, 0, "the resize step must be >= 0 and finite as a float (0: from the sizes)"))
            return BAD;
        args(x, 2, 8, 2);
    } else {
        args(x, 2, 6, 0);
    }
    int64_t xs = smul4(v[0], v[1], v[2], v[3]), ys = smul4(v[0], v[1], v[4], v[5]);
    int fw = k == PORT_RT_UPSAMPLE2D_FORWARD || k == PORT_RT_ADAPTIVE_AVGPOOL2D_FORWARD;
    op(x, 0, fw ? ys : xs, 4, 1), op(x, 1, fw ? xs : ys, 4, 0);
    return PORT_OK;
}

/* ---------------------------------------------------------------- unary math, shape copies (ids 74-77) */
/* unary (74: y, x; 75: dx, dy, s): iv count, op (0 neg .. 7 shift); fv[0] the scalar (finite).  y may be x, dx
 * may be dy; the backward's s is x or y (or NULL where the op reads neither). */
static int unary(ctx *x, int backward) {
    const int64_t *v = x->c->iv;
    if (pos(x, 0) || iv_in(x, 1, 0, 7, "unary op (0 neg, 1 exp, 2 rsqrt, 3 cos, 4 sin, 5 pow, 6 abs, 7 shift)") ||
        fv_finite(x, 0))
        return BAD;
    args(x, backward ? 3 : 2, 2, 1);
    op(x, 0, v[0], 4, 1), op(x, 1, v[0], 4, 0);
    if (backward) op(x, 2, v[0], 4, 0);
    inplace(x, 0, 1);
    return PORT_OK;
}

/* slice copy (76: y [outer, ny, inner], x [outer, nx, inner]): iv outer, inner, ny, nx, len, y_start, x_start,
 * fill; the range inside both; y overlaps nothing */
static int slice_copy(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    if (pos_range(x, 0, 4) || iv_in(x, 5, 0, v[2] - v[4], "y_start + len must not pass ny") ||
        iv_in(x, 6, 0, v[3] - v[4], "x_start + len must not pass nx") || iv_in(x, 7, 0, 1, "fill must be 0 or 1"))
        return BAD;
    args(x, 2, 8, 0);
    op(x, 0, smul3(v[0], v[2], v[1]), 4, 1), op(x, 1, smul3(v[0], v[3], v[1]), 4, 0);
    return PORT_OK;
}

/* broadcasting kernels (expand, masked_fill, masks 122-127): the full shape dims[6] at iv[d..d+5] with up to two broadcast masks at iv[b0], iv[b1] (-1: none);
 * the element counts of the full shape and of each broadcast operand */
static int mask_dims(ctx *x, int r, int d, int b0, int b1, int64_t *ny, int64_t *n0, int64_t *n1) {
    const int64_t *v = x->c->iv;
    if (iv_in(x, r, 1, 6, "a broadcasting kernel's rank must lie in 1..6") ||
        iv_in(x, b0, 0, ((int64_t)1 << v[r]) - 1, "broadcast bits: below the rank") ||
        (b1 >= 0 && iv_in(x, b1, 0, ((int64_t)1 << v[r]) - 1, "broadcast bits: below the rank")))
        return BAD;
    *ny = *n0 = *n1 = 1;
    for (int i = 0; i < 6; i++) {
        if (i < v[r] ? pos(x, d + i) : iv_in(x, d + i, 1, 1, "a dimension past the rank must be 1"))
            return BAD;
        *ny = smul(*ny, v[d + i]);
        *n0 = smul(*n0, (v[b0] >> i) & 1 ? 1 : v[d + i]);
        if (b1 >= 0) *n1 = smul(*n1, (v[b1] >> i) & 1 ? 1 : v[d + i]);
    }
    return PORT_OK;
}

/* expand (77: y, x): iv rank 1..6, x_bcast (bits below the rank), dims[6] (1 past the rank); y overlaps nothing */
static int expand(ctx *x, int k) {
    int64_t ny, nx, unused;
    if (mask_dims(x, 0, 2, 1, -1, &ny, &nx, &unused)) return BAD;
    args(x, 2, 8, 0);
    op(x, 0, ny, 4, 1), op(x, 1, nx, 4, 0);
    return PORT_OK;
}

/* masked_fill (121: y, x, mask): iv rank 1..6, m_bcast (bits below the rank), dims[6] (1 past the rank); fv
 * value not NaN (infinite allowed: -inf masks a score); y may be x */
static int masked_fill(ctx *x, int k) {
    int64_t ny, nm, unused;
    if (mask_dims(x, 0, 2, 1, -1, &ny, &nm, &unused)) return BAD;
    if (isnan(x->c->fv[0]) || isnan((float)x->c->fv[0]))
        return fail(x->why, "fv[0]", "the fill value must not be NaN", 0, 0, 0);
    args(x, 3, 8, 1);
    op(x, 0, ny, 4, 1), op(x, 1, ny, 4, 0), op(x, 2, nm, 1, 0);
    inplace(x, 0, 1);
    return PORT_OK;
}

/* mask_cast (122: y, x): iv y_dtype (0 float32, 1 bool), x_dtype (0..2: float32, bool, int64), count;
 * mask_logic (123: y, a, b): iv op (0 and, 1 or, 2 xor, 3 not a), rank, a_bcast, b_bcast, dims[6]; y may be
 * a full-shape operand; expand_mask (124: y, x): iv rank, x_bcast, dims[6]; mask_index2 (125: y, x, i0, i1): iv rows, cols,
 * rank, i0_bcast, i1_bcast, dims[6]; mask_compare (126: y, a, b): iv op (0 eq .. 5 ge), rank, a_bcast, b_bcast,
 * dims[6]; mask_compare_scalar (127: y, x): iv op, count; fv the scalar (NaN and inf allowed, as torch) */
static int masks(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    static const int ESZ[4] = {4, 1, 8, 4};
    int64_t ny, n0, n1;
    switch (k) {
    case PORT_RT_MASK_CAST:
        if (iv_in(x, 0, 0, 3, "the cast's output dtype (0 float32, 1 bool, 3 int32)") ||
            (v[0] == 2 && fail(x->why, "iv[0]", "the cast's output dtype: int64 is not a mask", 2, 0, 0)) ||
            iv_in(x, 1, 0, 3, "the cast's input dtype (0 float32, 1 bool, 2 int64, 3 int32)") ||
            (v[0] == 3 && iv_in(x, 1, 1, 1, "an int32 cast's input must be a bool mask")) || pos(x, 2))
            return BAD;
        args(x, 2, 3, 0);
        op(x, 0, v[2], ESZ[v[0]], 1), op(x, 1, v[2], ESZ[v[1]], 0);
        return PORT_OK;
    case PORT_RT_MASK_LOGIC:
        if (iv_in(x, 0, 0, 3, "mask op (0 and, 1 or, 2 xor, 3 not)") || mask_dims(x, 1, 4, 2, 3, &ny, &n0, &n1))
            return BAD;
        args(x, 3, 10, 0);
        op(x, 0, ny, 1, 1), op(x, 1, n0, 1, 0), op(x, 2, n1, 1, 0);
        if (!v[2]) inplace(x, 0, 1);
        if (!v[3]) inplace(x, 0, 2);
        return PORT_OK;
    case PORT_RT_MASK_COMPARE:
        if (iv_in(x, 0, 0, 5, "compare op (0 eq, 1 ne, 2 lt, 3 le, 4 gt, 5 ge)") ||
            mask_dims(x, 1, 4, 2, 3, &ny, &n0, &n1))
            return BAD;
        args(x, 3, 10, 0);
        op(x, 0, ny, 1, 1), op(x, 1, n0, 4, 0), op(x, 2, n1, 4, 0);
        return PORT_OK;
    case PORT_RT_MASK_COMPARE_SCALAR:
        if (iv_in(x, 0, 0, 5, "compare op (0 eq, 1 ne, 2 lt, 3 le, 4 gt, 5 ge)") || pos(x, 1)) return BAD;
        args(x, 2, 2, 1);
        op(x, 0, v[1], 1, 1), op(x, 1, v[1], 4, 0);
        return PORT_OK;
    case PORT_RT_EXPAND_MASK:
        if (mask_dims(x, 0, 2, 1, -1, &ny, &n0, &n1)) return BAD;
        args(x, 2, 8, 0);
        op(x, 0, ny, 1, 1), op(x, 1, n0, 1, 0);
        return PORT_OK;
    default:   /* PORT_RT_MASK_INDEX2 */
        if (pos_range(x, 0, 1) || mask_dims(x, 2, 5, 3, 4, &ny, &n0, &n1)) return BAD;
        args(x, 4, 11, 0);
        op(x, 0, ny, 1, 1), op(x, 1, smul(v[0], v[1]), 1, 0), op(x, 2, n0, 8, 0), op(x, 3, n1, 8, 0);
        return PORT_OK;
    }
}

/* where (128: y, cond, a, b): iv rank, c_bcast, a_bcast, b_bcast, dims[6], scalars (bit 0: a is fv[0] and ptr[2]
 * is -1, bit 1: b is fv[1] and ptr[3] is -1; a tensor operand's pointer set); a value not NaN, an unused one 0; y
 * may be a full-shape a or b.  Its gradient (129: da, db, dy, cond): the same iv[0..9]; da or db -1 (not wanted),
 * not both. */
static int where(ctx *x, int backward) {
    const int64_t *v = x->c->iv;
    int64_t ny, nc, na, nb = 1;
    if (mask_dims(x, 0, 4, 1, 2, &ny, &nc, &na) ||
        iv_in(x, 3, 0, ((int64_t)1 << v[0]) - 1, "broadcast bits: below the rank"))
        return BAD;
    for (int i = 0; i < 6; i++) nb = smul(nb, (v[3] >> i) & 1 ? 1 : v[4 + i]);
    if (backward) {
        if (x->c->ptr[0] == -1 && x->c->ptr[1] == -1)
            return fail(x->why, "ptr[0]", "where's gradient needs da or db", -1, 0, 0);
        args(x, 4, 10, 0);
        op(x, 0, na, 4, 1), op(x, 1, nb, 4, 1), op(x, 2, ny, 4, 0), op(x, 3, nc, 1, 0);
        return PORT_OK;
    }
    if (iv_in(x, 10, 0, 3, "where's scalar bits (1: a is fv[0], 2: b is fv[1])")) return BAD;
    for (int k = 0; k < 2; k++) {
        int scalar = (int)((v[10] >> k) & 1);
        double f = x->c->fv[k];
        if (scalar ? isnan(f) || isnan((float)f) : f != 0.0)
            return fail(x->why, FV_NAMES[k], scalar ? "where's value must not be NaN" : "an unused value must be 0",
                        0, 0, 0);
        if (scalar != (x->c->ptr[2 + k] == -1))
            return fail(x->why, PTR_NAMES[2 + k], scalar ? "a scalar operand's pointer must be -1" :
                        "a tensor operand needs its pointer", x->c->ptr[2 + k], 0, 0);
    }
    args(x, 4, 11, 2);
    op(x, 0, ny, 4, 1), op(x, 1, nc, 1, 0), op(x, 2, na, 4, 0), op(x, 3, nb, 4, 0);
    if (!v[2]) inplace(x, 0, 2);
    if (!v[3]) inplace(x, 0, 3);
    return PORT_OK;
}

/* last-token pooling (137-139).  int_binary (137: y, a, b): iv dtype (2 int64, 3 int32), op (0 add, 1 sub, 2 mul),
 * rank, a_bcast, b_bcast, dims[6]; y may be a full-shape operand.  argmax_rows (138: y int64 [rows], x): iv
 * x_dtype (0..3), rows, cols.  index2_rows (139: y, x, i0, i1): iv rows, cols, inner, rank, i0_bcast, i1_bcast,
 * dims[6], scatter (0: y [dims, inner] gathered from x [rows, cols, inner]; 1: the gradient, the two swapped) */
static int pooling_rows(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    static const int ESZ[4] = {4, 1, 8, 4};
    int64_t ny, n0, n1;
    if (k == PORT_RT_INT_BINARY) {
        if (iv_in(x, 0, 2, 3, "integer dtype (2 int64, 3 int32)") || iv_in(x, 1, 0, 2, "op (0 add, 1 sub, 2 mul)") ||
            mask_dims(x, 2, 5, 3, 4, &ny, &n0, &n1))
            return BAD;
        args(x, 3, 11, 0);
        op(x, 0, ny, ESZ[v[0]], 1), op(x, 1, n0, ESZ[v[0]], 0), op(x, 2, n1, ESZ[v[0]], 0);
        if (!v[3]) inplace(x, 0, 1);
        if (!v[4]) inplace(x, 0, 2);
        return PORT_OK;
    }
    if (k == PORT_RT_ARGMAX_ROWS) {
        if (iv_in(x, 0, 0, 3, "argmax's input dtype (0 float32, 1 bool, 2 int64, 3 int32)") || pos_range(x, 1, 2))
            return BAD;
        args(x, 2, 3, 0);
        op(x, 0, v[1], 8, 1), op(x, 1, smul(v[1], v[2]), ESZ[v[0]], 0);
        return PORT_OK;
    }
    if (pos_range(x, 0, 2) || mask_dims(x, 3, 6, 4, 5, &ny, &n0, &n1) ||
        iv_in(x, 12, 0, 1, "scatter must be 0 (gather) or 1 (its gradient)"))
        return BAD;
    int64_t big = smul3(v[0], v[1], v[2]), small = smul(ny, v[2]);
    args(x, 4, 13, 0);
    op(x, 0, v[12] ? big : small, 4, 1), op(x, 1, v[12] ? small : big, 4, 0), op(x, 2, n0, 8, 0), op(x, 3, n1, 8, 0);
    return PORT_OK;
}

/* ---------------------------------------------------------------- the rest, by kernel id */
/* element-wise: out, in (, in2): count v[0] floats */
static int eltwise(ctx *x, int nptr, int alias_in) {
    if (pos(x, 0)) return BAD;
    args(x, nptr, 1, 0);
    op(x, 0, x->c->iv[0], 4, 1);
    for (int i = 1; i < nptr; i++) op(x, i, x->c->iv[0], 4, 0);
    if (alias_in >= 0) inplace(x, 0, alias_in);
    return PORT_OK;
}

/* SwiGLU fused (issue 54): forward y, a, b; backward da, db, dy, a, b (da or db may be dy): count v[0] floats */
static int swiglu(ctx *x, int bwd) {
    if (bwd) {
        if (pos(x, 0)) return BAD;
        args(x, 5, 1, 0);
        for (int i = 0; i < 5; i++) op(x, i, x->c->iv[0], 4, i < 2);
        inplace(x, 0, 2), inplace(x, 1, 2);
        return PORT_OK;
    }
    return eltwise(x, 3, -1);
}

/* rotary embedding fused (issue 54): y|dx, x|dy [n, heads, seq, d]; cos, sin [table_n, seq, d]; iv: n, heads, seq,
 * d (even), table_n (1 or n); the output may be its input (in place) */
static int rotary(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    if (pos_range(x, 0, 4)) return BAD;
    if (v[3] % 2) return fail(x->why, "iv[3]", "the rotary dim must be even", v[3], 0, 0);
    if (v[4] != 1 && v[4] != v[0]) return fail(x->why, "iv[4]", "the tables' batch must be 1 or n", v[4], 0, v[0]);
    int64_t t = smul4(v[0], v[1], v[2], v[3]), tab = smul3(v[4], v[2], v[3]);
    args(x, 4, 5, 0);
    op(x, 0, t, 4, 1), op(x, 1, t, 4, 0), op(x, 2, tab, 4, 0), op(x, 3, tab, 4, 0);
    inplace(x, 0, 1);
    return PORT_OK;
}

/* Squeeze-excitation fused (issue 54), iv: n, c, s, hw, act (0 relu, 1 silu), gate (0 sigmoid, 1 hardsigmoid).
 * forward (111): y [n c hw], h [n s], z [n c], x, w1 [s c], b1 [s], w2 [c s], b2 [c]; _weight (112, and 132: its
 * overwriting form): dw1, db1, dw2, db2, dh [n s], dy, x, w2, h, z; _input (113): dx, dy, z, w1, dh (dx may be dy).
 * Workspace: the kernel's query (port_se_workspace_bytes, asked only where its products fit in int64 with room). */
static int se(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    if (pos_range(x, 0, 3) || iv_in(x, 4, 0, 1, "SE activation (0 relu, 1 silu)") ||
        iv_in(x, 5, 0, 1, "SE gate (0 sigmoid, 1 hardsigmoid)"))
        return BAD;
    for (int i = 0; i < 4; i++)
        if (v[i] > ((int64_t)1 << 31)) return fail(x->why, IV_NAMES[i], "an SE dimension above 2^31", v[i], 0,
                                                   (int64_t)1 << 31);
    int64_t n = v[0], c = v[1], s = v[2], big = smul3(n, c, v[3]), ns = smul(n, s), nc = smul(n, c), cs = smul(c, s);
    int wgt = k == PORT_RT_SE_BACKWARD_WEIGHT || k == PORT_RT_SE_BACKWARD_WEIGHT_OVERWRITE;
    args(x, k == PORT_RT_SE_FORWARD ? 8 : wgt ? 10 : 5, 6, 0);
    /* the query's products (n (2c + s) floats, c s the fcs' weights) far inside int64, else no workspace fits */
    int fits = smul3(n, 2 * c + s, 256) < INT64_MAX && smul(cs, 256) < INT64_MAX;
    x->s->ws_bytes = fits ? (int64_t)port_se_workspace_bytes(n, c, s, k == PORT_RT_SE_FORWARD ? 0 : wgt ? 1 : 2)
                          : INT64_MAX;
    if (k == PORT_RT_SE_FORWARD) {
        op(x, 0, big, 4, 1), op(x, 1, ns, 4, 1), op(x, 2, nc, 4, 1), op(x, 3, big, 4, 0);
        op(x, 4, cs, 4, 0), op(x, 5, s, 4, 0), op(x, 6, cs, 4, 0), op(x, 7, c, 4, 0);
    } else if (wgt) {
        op(x, 0, cs, 4, 1), op(x, 1, s, 4, 1), op(x, 2, cs, 4, 1), op(x, 3, c, 4, 1), op(x, 4, ns, 4, 1);
        op(x, 5, big, 4, 0), op(x, 6, big, 4, 0), op(x, 7, cs, 4, 0), op(x, 8, ns, 4, 0), op(x, 9, nc, 4, 0);
    } else {
        op(x, 0, big, 4, 1), op(x, 1, big, 4, 0), op(x, 2, nc, 4, 0), op(x, 3, cs, 4, 0), op(x, 4, ns, 4, 0);
        inplace(x, 0, 1);
    }
    return PORT_OK;
}

/* RMSNorm + linear fused (issue 54).  _stats (114): rstd [rows], x [rows d]; iv: rows, d; fv: eps.  _forward (117):
 * y [n out], x [n in], rstd [n], gamma [in], w [out in] (wt: [in out]), b [out]; _backward_weight (118): dw, db,
 * dy [n out], x, rstd, gamma; iv: n, in, out, block rows, wt (0 or 1).  Workspace: min(n, block rows) rows of x. */
static int rmsnorm_linear(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    if (k == PORT_RT_RMSNORM_STATS) {
        if (pos_range(x, 0, 1)) return BAD;
        if (fv_in(x, 0, 0.0, HUGE_VAL, 0, "rms-norm eps must be >= 0 and finite") || !isfinite((float)x->c->fv[0]))
            return fail(x->why, "fv[0]", "rms-norm eps must be >= 0 and finite as a float", 0, 0, 0);
        args(x, 2, 2, 1);
        op(x, 0, v[0], 4, 1), op(x, 1, smul(v[0], v[1]), 4, 0);
        return PORT_OK;
    }
    if (pos_range(x, 0, 3) || iv_in(x, 4, 0, 1, "wt must be 0 (w [out, in]) or 1 (w [in, out])")) return BAD;
    for (int i = 0; i < 3; i++)
        if (v[i] > INT32_MAX) return fail(x->why, IV_NAMES[i], "a linear dimension above 2^31 - 1", v[i], 0, INT32_MAX);
    int64_t n = v[0], in = v[1], out = v[2], xs = smul(n, in), ys = smul(n, out), ws = smul(in, out);
    args(x, 6, 5, 0);
    if (k == PORT_RT_RMSNORM_LINEAR_FORWARD)
        op(x, 0, ys, 4, 1), op(x, 1, xs, 4, 0), op(x, 2, n, 4, 0), op(x, 3, in, 4, 0), op(x, 4, ws, 4, 0),
            op(x, 5, out, 4, 0);
    else
        op(x, 0, ws, 4, 1), op(x, 1, out, 4, 1), op(x, 2, ys, 4, 0), op(x, 3, xs, 4, 0), op(x, 4, n, 4, 0),
            op(x, 5, in, 4, 0);
    x->s->ws_bytes = smul(smul(v[3] < n ? v[3] : n, in), 4);
    return PORT_OK;
}

/* All the linears reading one norm (issue 54).  iv: n, in, k (1..PORT_RMSLIN_MAX_LINEARS), block rows, wt (0 or 1),
 * bias mask (bit i: linear i has a bias, or a bias gradient), out[k].  _forward (119): rstd [n], y[k] [n out_i], x [n
 * in], gamma [in], w[k] ([out_i in], wt: [in out_i]), then b [out_i] of each linear in the mask; fv: eps.
 * _backward_weight (131): dw[k], then db [out_i] of each in the mask, dy[k] [n out_i], x, rstd, gamma.  3 + 2k +
 * (biases) pointers, at most PORT_RT_MAX_PTRS.  Workspace: min(n, block rows) rows of x. */
static int rmsnorm_linears(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    if (pos_range(x, 0, 1) || iv_in(x, 2, 1, PORT_RMSLIN_MAX_LINEARS, "the linears must number 1 to 3") || pos(x, 3) ||
        iv_in(x, 4, 0, 1, "wt must be 0 (w [out, in]) or 1 (w [in, out])"))
        return BAD;
    int kk = (int)v[2], nb = 0;
    if (iv_in(x, 5, 0, (1 << kk) - 1, "the bias mask has a bit for each linear only") || pos_range(x, 6, 5 + kk))
        return BAD;
    for (int i = 0; i < kk; i++) nb += (int)(v[5] >> i & 1);
    if (3 + 2 * kk + nb > PORT_RT_MAX_PTRS)
        return fail(x->why, "iv[5]", "more pointers than a call holds (3 + 2 linears + biases)", 3 + 2 * kk + nb, 0,
                    PORT_RT_MAX_PTRS);
    for (int i = 0; i < 2 + kk; i++) {
        int f = i < 2 ? i : 6 + i - 2;
        if (v[f] > INT32_MAX) return fail(x->why, IV_NAMES[f], "a linear dimension above 2^31 - 1", v[f], 0, INT32_MAX);
    }
    int64_t n = v[0], in = v[1], xs = smul(n, in);
    args(x, 3 + 2 * kk + nb, 6 + kk, k == PORT_RT_RMSNORM_LINEARS_FORWARD);
    if (k == PORT_RT_RMSNORM_LINEARS_FORWARD) {
        if (fv_in(x, 0, 0.0, HUGE_VAL, 0, "rms-norm eps must be >= 0 and finite") || !isfinite((float)x->c->fv[0]))
            return fail(x->why, "fv[0]", "rms-norm eps must be >= 0 and finite as a float", 0, 0, 0);
        op(x, 0, n, 4, 1), op(x, kk + 1, xs, 4, 0), op(x, kk + 2, in, 4, 0);
        for (int i = 0, b = 2 * kk + 3; i < kk; i++) {
            op(x, 1 + i, smul(n, v[6 + i]), 4, 1), op(x, kk + 3 + i, smul(in, v[6 + i]), 4, 0);
            if (v[5] >> i & 1) op(x, b++, v[6 + i], 4, 0);
        }
    } else {
        int x0 = 2 * kk + nb;
        for (int i = 0, b = kk; i < kk; i++) {
            op(x, i, smul(in, v[6 + i]), 4, 1), op(x, kk + nb + i, smul(n, v[6 + i]), 4, 0);
            if (v[5] >> i & 1) op(x, b++, v[6 + i], 4, 1);
        }
        op(x, x0, xs, 4, 0), op(x, x0 + 1, n, 4, 0), op(x, x0 + 2, in, 4, 0);
    }
    x->s->ws_bytes = smul(smul(v[3] < n ? v[3] : n, in), 4);
    return PORT_OK;
}

/* ---------------------------------------------------------------- the rules named by PORT_RT_KERNELS */
static int ew_fwd(ctx *x, int k) { return eltwise(x, 2, 1); }            /* y, x: y may be x */
static int ew_fwd_no_alias(ctx *x, int k) { return eltwise(x, 2, -1); }  /* y must not alias x (backward reads x) */
static int ew_bwd(ctx *x, int k) { return eltwise(x, 3, 1); }            /* dx, dy, y|x: dx may be dy */
static int binary_rule(ctx *x, int k) { return binary(x, k == PORT_RT_BINARY_BACKWARD); }
static int unary_rule(ctx *x, int k) { return unary(x, k == PORT_RT_UNARY_BACKWARD); }
static int where_rule(ctx *x, int k) { return where(x, k == PORT_RT_WHERE_BACKWARD); }
static int swiglu_rule(ctx *x, int k) { return swiglu(x, k == PORT_RT_SWIGLU_BACKWARD); }

static int add_rule(ctx *x, int k) {
    if (eltwise(x, 3, 1)) return BAD;   /* y may be a or b */
    inplace(x, 0, 2);
    return PORT_OK;
}

static int scale_rule(ctx *x, int k) {
    if (eltwise(x, 2, 1) || fv_finite(x, 0)) return BAD;
    args(x, 2, 1, 1);
    return PORT_OK;
}

static int bernoulli_rule(ctx *x, int k) {   /* y [count]; prob in [0, 1] (issue 54) */
    if (pos(x, 0) || fv_in(x, 0, 0.0, 1.0, 0, "bernoulli probability must lie in [0, 1]")) return BAD;
    args(x, 1, 1, 1);
    op(x, 0, x->c->iv[0], 4, 1);
    return PORT_OK;
}

static int dropout_rule(ctx *x, int k) {   /* forward: y, mask, x; backward: dx, dy, mask */
    const int64_t *v = x->c->iv;
    if (pos(x, 0) || fv_in(x, 0, 0.0, 1.0, 1, "dropout p must lie in [0, 1)")) return BAD;
    args(x, 3, 1, 1);
    op(x, 0, v[0], 4, 1);
    if (k == PORT_RT_DROPOUT_FORWARD) {
        op(x, 1, v[0], 1, 1), op(x, 2, v[0], 4, 0);
        inplace(x, 0, 2);
    } else {
        op(x, 1, v[0], 4, 0), op(x, 2, v[0], 1, 0);
        inplace(x, 0, 1);
    }
    return PORT_OK;
}

/* global average pool: y [n, c], x [n, c, hw] (backward: dx, dy); mean_mid: y [o, i], x [o, m, i] (dx, dy) */
static int mean_rule(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    if (pos_range(x, 0, 2)) return BAD;
    int gap = k == PORT_RT_GLOBAL_AVGPOOL_FORWARD || k == PORT_RT_GLOBAL_AVGPOOL_BACKWARD_INPUT;
    int fw = k == PORT_RT_GLOBAL_AVGPOOL_FORWARD || k == PORT_RT_MEAN_MID_FORWARD;
    int64_t small = smul(v[0], v[gap ? 1 : 2]), big = smul3(v[0], v[1], v[2]);
    args(x, 2, 3, 0);
    op(x, 0, fw ? small : big, 4, 1), op(x, 1, fw ? big : small, 4, 0);
    return PORT_OK;
}

/* forward: y [n, out], x [n, in], w [out, in], b [out]; backward input: dx [n, in], dy [n, out], w; backward
 * weight: dw, db, dy, x.  The _T kernels: w (and dw) stored [in, out], the same extents. */
static int linear_rule(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    if (pos_range(x, 0, 2)) return BAD;
    int64_t xs = smul(v[0], v[1]), ys = smul(v[0], v[2]), ws = smul(v[2], v[1]);
    if (k == PORT_RT_LINEAR_FORWARD || k == PORT_RT_LINEAR_T_FORWARD) {
        args(x, 4, 3, 0);
        op(x, 0, ys, 4, 1), op(x, 1, xs, 4, 0), op(x, 2, ws, 4, 0), op(x, 3, v[2], 4, 0);
    } else if (k == PORT_RT_LINEAR_BACKWARD_INPUT || k == PORT_RT_LINEAR_T_BACKWARD_INPUT) {
        args(x, 3, 3, 0);
        op(x, 0, xs, 4, 1), op(x, 1, ys, 4, 0), op(x, 2, ws, 4, 0);
    } else {
        args(x, 4, 3, 0);
        op(x, 0, ws, 4, 1), op(x, 1, v[2], 4, 1), op(x, 2, ys, 4, 0), op(x, 3, xs, 4, 0);
    }
    return PORT_OK;
}

/* forward: loss, probs [n, k], logits [n, k], labels [n]; backward: dlogits [n, k], probs, labels, grad_loss [1] */
static int xent_rule(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    int ign = k == PORT_RT_SOFTMAX_XENT_IGNORE_FORWARD || k == PORT_RT_SOFTMAX_XENT_IGNORE_BACKWARD;
    if (pos_range(x, 0, 1) || fv_in(x, 0, 0.0, 1.0, 0, "label smoothing must lie in [0, 1]")) return BAD;
    int64_t z = smul(v[0], v[1]);
    args(x, 4, ign ? 3 : 2, 1);
    if (k == PORT_RT_SOFTMAX_XENT_FORWARD || k == PORT_RT_SOFTMAX_XENT_IGNORE_FORWARD) {
        op(x, 0, 1, 4, 1), op(x, 1, z, 4, 1), op(x, 2, z, 4, 0), op(x, 3, v[0], 8, 0);
    } else {
        op(x, 0, z, 4, 1), op(x, 1, z, 4, 0), op(x, 2, v[0], 8, 0), op(x, 3, 1, 4, 0);
        inplace(x, 0, 1);
    }
    return PORT_OK;
}

/* sgd: param, momentum buffer (NULL: no momentum), grad; adamw: param, exp_avg, exp_avg_sq, grad */
static int optim_rule(ctx *x, int k) {
    if (pos(x, 0)) return BAD;
    int n = k == PORT_RT_SGD_STEP ? 3 : 4;
    args(x, n, 1, 0);
    for (int i = 0; i < n; i++) op(x, i, x->c->iv[0], 4, i < n - 1);
    return PORT_OK;
}

static int bias_rule(ctx *x, int k) {   /* db [c], dy [n, c, inner] */
    const int64_t *v = x->c->iv;
    if (pos_range(x, 0, 2)) return BAD;
    args(x, 2, 3, 0);
    op(x, 0, v[1], 4, 1), op(x, 1, smul3(v[0], v[1], v[2]), 4, 0);
    return PORT_OK;
}

/* forward: y [n, d], idx [n], w [v, d]; backward weight: dw [v, d], dy [n, d], idx [n] (_PAD: iv[3] = pad in
 * [0, v)) */
static int embedding_rule(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    if (pos_range(x, 0, 2)) return BAD;
    if (k == PORT_RT_EMBEDDING_BACKWARD_WEIGHT_PAD) {
        if (iv_in(x, 3, 0, v[1] - 1, "embedding padding_idx must be in [0, v)")) return BAD;
        args(x, 3, 4, 0);
    } else {
        args(x, 3, 3, 0);
    }
    if (k == PORT_RT_EMBEDDING_FORWARD)
        op(x, 0, smul(v[0], v[2]), 4, 1), op(x, 1, v[0], 8, 0), op(x, 2, smul(v[1], v[2]), 4, 0);
    else
        op(x, 0, smul(v[1], v[2]), 4, 1), op(x, 1, smul(v[0], v[2]), 4, 0), op(x, 2, v[0], 8, 0);
    return PORT_OK;
}

/* forward: y, stats [2 rows], x, gamma [d], beta [d]; backward input: dx, dy, x, stats, gamma; backward weight:
 * dgamma, dbeta, dy, x, stats */
static int layernorm_rule(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    if (pos_range(x, 0, 1)) return BAD;
    int64_t t = smul(v[0], v[1]), st = smul(2, v[0]);
    if (k == PORT_RT_LAYERNORM_FORWARD) {
        if (fv_in(x, 0, 0.0, HUGE_VAL, 0, "layer-norm eps must be >= 0 and finite")) return BAD;
        args(x, 5, 2, 1);
        op(x, 0, t, 4, 1), op(x, 1, st, 4, 1), op(x, 2, t, 4, 0), op(x, 3, v[1], 4, 0), op(x, 4, v[1], 4, 0);
    } else if (k == PORT_RT_LAYERNORM_BACKWARD_INPUT) {
        args(x, 5, 2, 0);
        op(x, 0, t, 4, 1), op(x, 1, t, 4, 0), op(x, 2, t, 4, 0), op(x, 3, st, 4, 0), op(x, 4, v[1], 4, 0);
    } else {
        args(x, 5, 2, 0);
        op(x, 0, v[1], 4, 1), op(x, 1, v[1], 4, 1), op(x, 2, t, 4, 0), op(x, 3, t, 4, 0), op(x, 4, st, 4, 0);
    }
    return PORT_OK;
}

static int gelu_rule(ctx *x, int k) {   /* forward: y, x (no alias: the backward reads x); backward: dx, dy, x */
    int fw = k == PORT_RT_GELU_FORWARD;
    if (eltwise(x, fw ? 2 : 3, fw ? -1 : 1) || iv_in(x, 1, 0, 1, "gelu approximation (0 erf, 1 tanh)")) return BAD;
    args(x, fw ? 2 : 3, 2, 0);
    return PORT_OK;
}

static int softmax_rule(ctx *x, int k) {   /* forward: y, x [rows, d]; backward: dx, dy, y */
    const int64_t *v = x->c->iv;
    if (pos_range(x, 0, 1)) return BAD;
    int n = k == PORT_RT_SOFTMAX_FORWARD ? 2 : 3;
    args(x, n, 2, 0);
    for (int i = 0; i < n; i++) op(x, i, smul(v[0], v[1]), 4, i == 0);
    inplace(x, 0, 1);
    return PORT_OK;
}

/* c [b, m, n], a [b, m, k], b [b, k, n]: batch, m, n, k, trans_a, trans_b; alpha, beta */
static int bmm_rule(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    if (pos_range(x, 0, 3) || iv_in(x, 4, 0, 1, "trans_a must be 0 or 1") ||
        iv_in(x, 5, 0, 1, "trans_b must be 0 or 1") || fv_finite(x, 0) || fv_finite(x, 1))
        return BAD;
    for (int i = 1; i < 4; i++)
        if (v[i] > INT_MAX) return fail(x->why, IV_NAMES[i], "a matrix dimension above INT_MAX", v[i], 0, INT_MAX);
    args(x, 3, 6, 2);
    op(x, 0, smul3(v[0], v[1], v[2]), 4, 1), op(x, 1, smul3(v[0], v[1], v[3]), 4, 0),
        op(x, 2, smul3(v[0], v[3], v[2]), 4, 0);
    return PORT_OK;
}

static int rows_rule(ctx *x, int k) {   /* add_broadcast: y [o, i], a [o, i], b [i]; sum_rows: db [i], dy [o, i] */
    const int64_t *v = x->c->iv;
    if (pos_range(x, 0, 1)) return BAD;
    if (k == PORT_RT_ADD_BROADCAST) {
        args(x, 3, 2, 0);
        op(x, 0, smul(v[0], v[1]), 4, 1), op(x, 1, smul(v[0], v[1]), 4, 0), op(x, 2, v[1], 4, 0);
        inplace(x, 0, 1);
    } else {
        args(x, 2, 2, 0);
        op(x, 0, v[1], 4, 1), op(x, 1, smul(v[0], v[1]), 4, 0);
    }
    return PORT_OK;
}

/* arange: y int64 [count]; start.  ne_scalar: y uint8 [count], x int64 [count]; value */
static int int_rule(ctx *x, int k) {
    const int64_t *v = x->c->iv;
    if (pos(x, 0)) return BAD;
    if (k == PORT_RT_ARANGE_I64) {
        args(x, 1, 2, 0);
        op(x, 0, v[0], 8, 1);
    } else {
        args(x, 2, 2, 0);
        op(x, 0, v[0], 1, 1), op(x, 1, v[0], 8, 0);
    }
    return PORT_OK;
}

static int page_rule(ctx *x, int k) {   /* ptr[0]: the bytes; iv[0] their count, iv[1] the spill file offset */
    if (pos(x, 0) || iv_in(x, 1, 0, INT64_MAX, "the spill file offset must be >= 0")) return BAD;
    if (x->c->ptr[0] == -1) return fail(x->why, "ptr[0]", "a page call needs its arena bytes", -1, 0, 0);
    args(x, 1, 2, 0);
    op(x, 0, x->c->iv[0], 1, k == PORT_RT_PAGE_IN);
    return PORT_OK;
}

/* The rule of each kernel id, from PORT_RT_KERNELS (the one list of runtime ops): an id the list lacks has none. */
typedef int (*rule_fn)(ctx *, int);
static const rule_fn RULES[PORT_RT_KERNEL_END] = {
#define PORT_RT_RULE_(id, NAME, fn, run, rule) [id] = rule,
    PORT_RT_KERNELS(PORT_RT_RULE_)
#undef PORT_RT_RULE_
};

static int shape_of(ctx *x) {
    int k = x->c->kernel;
    if (k < 1 || k >= PORT_RT_KERNEL_END || !RULES[k])
        return fail(x->why, "kernel", "unknown kernel id", k, 0, PORT_RT_KERNEL_END - 1);
    return RULES[k](x, k);
}

int port_rt_call_shape_of(const port_rt_call *c, port_rt_call_shape *shape, port_rt_call_problem *why) {
    if (!c || !shape) return PORT_ERR_NULL;
    memset(shape, 0, sizeof *shape);
    if (why) {
        why->kernel = c->kernel;
        why->field = why->what = NULL;
        why->value = why->bytes = why->limit = 0;
    }
    ctx x = {c, shape, why};
    return shape_of(&x);
}

/* [off, off + n) inside [lo, hi) */
static int within(int64_t off, int64_t n, uint64_t lo, uint64_t hi) {
    return off >= 0 && n >= 0 && (uint64_t)off >= lo && (uint64_t)off <= hi && (uint64_t)n <= hi - (uint64_t)off;
}
static int overlap(int64_t a, int64_t na, int64_t b, int64_t nb) {
    return na > 0 && nb > 0 && a < b + nb && b < a + na;
}

int port_rt_call_check(const port_rt_call *c, uint64_t A, uint64_t P, port_rt_call_problem *why) {
    if (!c) return PORT_ERR_NULL;
    port_rt_call_shape s;
    int st = port_rt_call_shape_of(c, &s, why);
    if (st != PORT_OK) return st;
    if (c->flags & ~PORT_RT_LATE_UPDATE)
        return fail(why, "flags", "unknown call flags", c->flags, 0, PORT_RT_LATE_UPDATE);
    if (c->reserved) return fail(why, "reserved", "must be 0", c->reserved, 0, 0);
    if (P > A) return fail(why, "header", "the persistent region is larger than the arena", (int64_t)P, 0, (int64_t)A);
    for (int i = s.nints; i < PORT_RT_MAX_INTS; i++)
        if (c->iv[i])
            return fail(why, IV_NAMES[i], "an integer parameter the kernel does not take must be 0", c->iv[i], 0, 0);
    for (int i = s.nfloats; i < PORT_RT_MAX_FLOATS; i++)
        if (c->fv[i] != 0.0)
            return fail(why, FV_NAMES[i], "a float parameter the kernel does not take must be 0", 0, 0, 0);
    for (int i = 0; i < PORT_RT_MAX_PTRS; i++) {
        int64_t p = c->ptr[i];
        if (p == -1) continue;
        if (i >= s.nptrs) return fail(why, PTR_NAMES[i], "a pointer the kernel does not take must be -1", p, 0, 0);
        if (!within(p, s.bytes[i], 0, A))
            return fail(why, PTR_NAMES[i],
                        "the operand's bytes (from the call's shape parameters) lie outside the arena", p, s.bytes[i],
                        (int64_t)A);
        if (p % s.elem[i])
            return fail(why, PTR_NAMES[i], "offset not a multiple of the operand's element size", p, 0, s.elem[i]);
    }
    if (c->ws_bytes < 0 || c->ws_bytes < s.ws_bytes)
        return fail(why, "ws", "workspace smaller than the kernel's query for these parameters", c->ws_bytes,
                    s.ws_bytes, 0);
    if (c->ws_bytes) {
        if (!within(c->ws_offset, c->ws_bytes, P, A))
            return fail(why, "ws", "the workspace lies outside the arena's scratch region", c->ws_offset,
                        c->ws_bytes, (int64_t)A);
        if (c->ws_offset % 64) return fail(why, "ws", "workspace offset not 64-byte aligned", c->ws_offset, 0, 64);
    } else if (c->ws_offset < 0) {
        return fail(why, "ws", "workspace offset must be >= 0", c->ws_offset, 0, 0);
    }
    for (int z = 0; z < 2; z++) {
        static const char *const names[2] = {"zero[0]", "zero[1]"};
        if (c->zero_bytes[z] < 0 || (c->zero_bytes[z] && !within(c->zero_offset[z], c->zero_bytes[z], 0, A)) ||
            (!c->zero_bytes[z] && c->zero_offset[z] < 0))
            return fail(why, names[z], "a zero range outside the arena", c->zero_offset[z], c->zero_bytes[z],
                        (int64_t)A);
    }
    /* outputs overlap nothing but the inputs they may be in place (the same bytes) */
    for (int i = 0; i < s.nptrs; i++) {
        if (!(s.writes & (1 << i)) || c->ptr[i] < 0) continue;
        for (int j = 0; j < s.nptrs; j++) {
            if (j == i || c->ptr[j] < 0 || !overlap(c->ptr[i], s.bytes[i], c->ptr[j], s.bytes[j])) continue;
            int same = c->ptr[i] == c->ptr[j] && s.bytes[i] == s.bytes[j];
            if (!(same && (s.may_alias[i] & (1 << j)) && !(s.writes & (1 << j))))
                return fail(why, PTR_NAMES[i], (s.writes & (1 << j)) ? "two outputs of the call overlap"
                                                                     : "an output overlaps an input it may not alias",
                            c->ptr[i], s.bytes[i], c->ptr[j]);
        }
    }
    for (int j = 0; j < s.nptrs; j++)   /* no operand overlaps the workspace: the kernel writes it */
        if (c->ptr[j] >= 0 && c->ws_bytes && overlap(c->ptr[j], s.bytes[j], c->ws_offset, c->ws_bytes))
            return fail(why, PTR_NAMES[j], "an operand overlaps the call's workspace", c->ptr[j], s.bytes[j],
                        c->ws_offset);
    return PORT_OK;
}
