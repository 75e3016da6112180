/* conv2d: im2col + GEMM (any groups/stride/padding), direct depthwise,
 * direct 1x1 (GEMM straight on NCHW), and the patch-based (tiled) variant. */
#include "internal.h"
#include <limits.h>

static inline int64_t cdiv(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }
static inline int64_t fdiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

int64_t port_conv2d_out_h(const port_conv2d_params *p) {
    if (!p || p->stride_h < 1) return -1;
    return (p->h + 2 * p->pad_h - p->kh) / p->stride_h + 1;
}
int64_t port_conv2d_out_w(const port_conv2d_params *p) {
    if (!p || p->stride_w < 1) return -1;
    return (p->w + 2 * p->pad_w - p->kw) / p->stride_w + 1;
}

port_status port_conv2d_check(const port_conv2d_params *p) {
    PORT_NOTNULL(p);
    PORT_CHECK(p->n > 0 && p->c_in > 0 && p->h > 0 && p->w > 0 && p->c_out > 0 && p->kh > 0 &&
                   p->kw > 0 && p->groups > 0,
               PORT_ERR_SHAPE);
    PORT_CHECK(p->stride_h > 0 && p->stride_w > 0 && p->pad_h >= 0 && p->pad_w >= 0,
               PORT_ERR_ARG);
    PORT_CHECK(p->c_in % p->groups == 0 && p->c_out % p->groups == 0, PORT_ERR_SHAPE);
    PORT_CHECK(p->h + 2 * p->pad_h >= p->kh && p->w + 2 * p->pad_w >= p->kw, PORT_ERR_SHAPE);
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p);
    PORT_CHECK(p->h_out >= 0 && p->w_out >= 0, PORT_ERR_SHAPE);
    PORT_CHECK((p->h_out == 0 || p->h_out == ho) && (p->w_out == 0 || p->w_out == wo), PORT_ERR_SHAPE);
    int64_t K = p->c_in / p->groups * p->kh * p->kw;
    PORT_CHECK(ho * wo <= INT_MAX && K <= INT_MAX && p->h * p->w <= INT_MAX, PORT_ERR_SHAPE);
    PORT_CHECK((double)K * (double)(ho * wo) < (double)INT64_MAX / 8, PORT_ERR_SHAPE);
    return PORT_OK;
}

int port__conv_is_depthwise(const port_conv2d_params *p) {
    return p->groups == p->c_in && p->groups == p->c_out;
}
int port__conv_is_pointwise(const port_conv2d_params *p) {
    return p->kh == 1 && p->kw == 1 && p->stride_h == 1 && p->stride_w == 1 && p->pad_h == 0 &&
           p->pad_w == 0;
}

int port__conv_resolve_algo(const port_conv2d_params *p, int algo) {
    switch (algo) {
    case PORT_CONV_AUTO:
        if (port__conv_is_depthwise(p) || port__conv_is_pointwise(p)) return PORT_CONV_DIRECT;
        return port__conv_winograd_pays(p) ? PORT_CONV_WINOGRAD : PORT_CONV_IM2COL;
    case PORT_CONV_IM2COL: return PORT_CONV_IM2COL;
    case PORT_CONV_DIRECT:
        return (port__conv_is_depthwise(p) || port__conv_is_pointwise(p)) ? PORT_CONV_DIRECT : -1;
    case PORT_CONV_WINOGRAD: return port__conv_winograd_legal(p) ? PORT_CONV_WINOGRAD : -1;
    default: return -1;
    }
}

/* Images folded into one GEMM (the batch becomes GEMM columns): small output maps give skinny per-image
 * GEMMs that re-pack the whole weight matrix for a few columns each (a 4x4 map: 16 columns), far below the
 * GEMM's rate.  Images are folded until a GEMM has at least PORT_CONV_FOLD_COLS columns (forward and input
 * gradient) or PORT_CONV_FOLD_COLS_W (weight gradient, whose GEMM sums over the columns).  1 = per image
 * (depthwise direct never folds).  `a` is a resolved algorithm.  Measured (AVX-512 EPYC, 2 threads): the
 * vendored GEMM runs [256 x 2304] x [2304 x N] at 381 / 429 GFLOP/s for N = 64 / 256; folding to 256 columns
 * made ResNet-18's training step 4% faster at batch 8 and 32 (VGG-11 b8 2%) against 64, paired; the weight
 * gradient folded to 256 was slower at batch 32 (8x8 maps), so it stays at 64.  Workspace: the forward's fold. */
#ifndef PORT_CONV_FOLD_COLS
#define PORT_CONV_FOLD_COLS 256
#endif
#ifndef PORT_CONV_FOLD_COLS_W
#define PORT_CONV_FOLD_COLS_W 64
#endif
static int64_t fold_to(const port_conv2d_params *p, int a, int64_t cols) {
    if (a == PORT_CONV_DIRECT && port__conv_is_depthwise(p) && !port__conv_is_pointwise(p)) return 1;
    int64_t P = port_conv2d_out_h(p) * port_conv2d_out_w(p);
    if (P >= cols || p->n < 2) return 1;
    return PORT_MIN(p->n, (cols + P - 1) / P);
}
static int64_t conv_fold(const port_conv2d_params *p, int a) { return fold_to(p, a, PORT_CONV_FOLD_COLS); }
static int64_t conv_fold_w(const port_conv2d_params *p, int a) { return fold_to(p, a, PORT_CONV_FOLD_COLS_W); }

static int conv_grouped(const port_conv2d_params *p, int a);
static int slot_ok(const port_conv2d_params *p, int a);
static int64_t slot_ws_floats(const port_conv2d_params *p, int a);
static int group_par(const port_conv2d_params *p);
static int64_t group_slots(const port_conv2d_params *p);
static int64_t group_slot_floats(const port_conv2d_params *p, int a);

int port_conv2d_resolve_algo(const port_conv2d_params *p, int algo) {
    if (p == NULL || port_conv2d_check(p) != PORT_OK) return -1;
    return port__conv_resolve_algo(p, algo);
}

size_t port_conv2d_workspace_bytes(const port_conv2d_params *p, int algo) {
    if (port_conv2d_check(p) != PORT_OK) return 0;
    int a = port__conv_resolve_algo(p, algo);
    if (a < 0) return 0;
    if (a == PORT_CONV_WINOGRAD) return port__conv_winograd_ws_floats(p) * sizeof(float);
    if (conv_grouped(p, a)) return (size_t)(group_slots(p) * group_slot_floats(p, a)) * sizeof(float);
    if (slot_ok(p, a)) return (size_t)slot_ws_floats(p, a) * sizeof(float);
    int64_t K = p->c_in / p->groups * p->kh * p->kw, cog = p->c_out / p->groups;
    int64_t P = port_conv2d_out_h(p) * port_conv2d_out_w(p), nb = conv_fold(p, a);
    if (nb > 1) /* the chunk's im2col matrix [K, nb*P] and its output/gradient block [c_out/g, nb*P] */
        return (size_t)((K + cog) * nb * P) * sizeof(float);
    return a == PORT_CONV_IM2COL ? (size_t)(K * P) * sizeof(float) : 0;
}

port_status port__conv_validate(const port_conv2d_params *p, int *algo, void *ws,
                                size_t ws_bytes) {
    port_status st = port_conv2d_check(p);
    if (st != PORT_OK) return st;
    if (algo == NULL) return PORT_ERR_NULL;
    int a = port__conv_resolve_algo(p, *algo);
    if (a < 0)
        return (*algo == PORT_CONV_DIRECT || *algo == PORT_CONV_WINOGRAD) ? PORT_ERR_UNSUPPORTED
                                                                           : PORT_ERR_ARG;
    size_t need = port_conv2d_workspace_bytes(p, a);
    if (ws_bytes < need || (need > 0 && ws == NULL)) return PORT_ERR_WORKSPACE;
    *algo = a;
    return PORT_OK;
}

/* ---------------- im2col / col2im over an output tile ---------------- */
static inline void valid_cols(int64_t *lo, int64_t *hi, int64_t w, int64_t sw, int64_t pw,
                              int64_t kj, int64_t ow0, int64_t tw) {
    int64_t l, h;
    if (sw == 1) { /* no integer divisions on the common path (they cost more than a short row) */
        l = pw - kj - ow0;
        h = w + pw - kj - ow0;
    } else {
        l = cdiv(pw - kj, sw) - ow0;
        h = fdiv(w - 1 + pw - kj, sw) - ow0 + 1;
    }
    l = PORT_MAX(l, 0);
    h = PORT_MIN(h, tw);
    if (h < l) h = l;
    *lo = l;
    *hi = h;
}

/* One row r = (ci, ki, kj) of the im2col matrix of one image over an output tile. */
static void im2col_row(float *dst, int64_t r, const float *x, int64_t h, int64_t w, int64_t kh,
                       int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t oh0,
                       int64_t th, int64_t ow0, int64_t tw) {
    int64_t kj = r % kw, ki = (r / kw) % kh, ci = r / (kw * kh);
    const float *xc = x + ci * h * w;
    int64_t lo, hi;
    valid_cols(&lo, &hi, w, sw, pw, kj, ow0, tw);
    for (int64_t oy = 0; oy < th; oy++) {
        int64_t ih = (oh0 + oy) * sh - ph + ki;
        float *d = dst + oy * tw;
        if (ih < 0 || ih >= h) { /* short rows (small maps): a loop, not a library call */
            if (tw >= 16) memset(d, 0, (size_t)tw * sizeof(float));
            else
#pragma omp simd
                for (int64_t ox = 0; ox < tw; ox++) d[ox] = 0.0f;
            continue;
        }
        const float *xr = xc + ih * w - pw + kj;
        for (int64_t ox = 0; ox < lo; ox++) d[ox] = 0.0f;
        if (sw == 1 && hi - lo >= 16) {
            memcpy(d + lo, xr + ow0 + lo, (size_t)(hi - lo) * sizeof(float));
        } else if (sw == 1) { /* short rows (small maps): a library call per row costs more than the copy */
#pragma omp simd
            for (int64_t ox = lo; ox < hi; ox++) d[ox] = xr[ow0 + ox];
        } else {
            for (int64_t ox = lo; ox < hi; ox++) d[ox] = xr[(ow0 + ox) * sw];
        }
        for (int64_t ox = hi; ox < tw; ox++) d[ox] = 0.0f;
    }
}

/* dx[ci] += col2im of rows (ci, *, *) of one image's tile. */
static void col2im_channel(float *dx, const float *cols, int64_t ld, int64_t ci, int64_t h,
                           int64_t w, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                           int64_t pw, int64_t oh0, int64_t th, int64_t ow0, int64_t tw) {
    float *dxc = dx + ci * h * w;
    for (int64_t ki = 0; ki < kh; ki++) {
        for (int64_t kj = 0; kj < kw; kj++) {
            const float *src = cols + ((ci * kh + ki) * kw + kj) * ld;
            int64_t lo, hi;
            valid_cols(&lo, &hi, w, sw, pw, kj, ow0, tw);
            for (int64_t oy = 0; oy < th; oy++) {
                int64_t ih = (oh0 + oy) * sh - ph + ki;
                if (ih < 0 || ih >= h) continue;
                float *dr = dxc + ih * w - pw + kj;
                const float *s = src + oy * tw;
                if (sw == 1) {
                    for (int64_t ox = lo; ox < hi; ox++) dr[ow0 + ox] += s[ox];
                } else {
                    for (int64_t ox = lo; ox < hi; ox++) dr[(ow0 + ox) * sw] += s[ox];
                }
            }
        }
    }
}

void port__im2col_part(float *cols, int64_t T, const float *xg, const port_conv2d_params *p, int64_t k0,
                       int64_t k1, int64_t oh0, int64_t r0, int64_t r1, int64_t ow0, int64_t tw) {
#pragma omp parallel for schedule(static) if (!port__in_parallel() && (k1 - k0) * (r1 - r0) * tw > PORT_PAR_MIN)
    for (int64_t r = k0; r < k1; r++)
        im2col_row(cols + r * T + r0 * tw, r, xg, p->h, p->w, p->kh, p->kw, p->stride_h, p->stride_w,
                   p->pad_h, p->pad_w, oh0 + r0, r1 - r0, ow0, tw);
}

/* Columns [j, j + len) of one image's im2col row r (output positions in row-major order): a partial first
 * output row, whole rows, a partial last row. */
static void im2col_seg(float *dst, int64_t r, const float *xg, const port_conv2d_params *p, int64_t j, int64_t len) {
    int64_t wo = port_conv2d_out_w(p), oh = j / wo, ow = j % wo;
#define SEG(oh0, th, ow0, tw) im2col_row(dst, r, xg, p->h, p->w, p->kh, p->kw, p->stride_h, p->stride_w, p->pad_h, \
                                         p->pad_w, oh0, th, ow0, tw)
    if (ow > 0) {
        int64_t t = PORT_MIN(len, wo - ow);
        SEG(oh, 1, ow, t);
        dst += t; len -= t; oh++;
    }
    if (len >= wo) {
        int64_t rows = len / wo;
        SEG(oh, rows, 0, wo);
        dst += rows * wo; len -= rows * wo; oh += rows;
    }
    if (len > 0) SEG(oh, 1, 0, len);
#undef SEG
}

/* The vendored GEMM's B panels of one image's im2col matrix [K, P], built from x while the GEMM packs (no
 * [K, P] matrix is written and read back): a row segment at a time, then split into the panels.  Only for maps
 * of PORT_CONV_PACK_MIN_COLS output pixels or more: the GEMM splits smaller products by rows, and every row
 * task would gather the same panels again (an 8x8 map, 256 channels: 15% slower than im2col, then GEMM); and
 * only at stride 1 along W (MobileNetV2's 224x224 stride-2 stem: 8% slower; the 32x32 stride-1 maps of the CIFAR
 * stems and ResNet-18's first stage: 0.78x and 0.92x of the time, paired in one process). */
#ifndef PORT_CONV_PACK_MIN_COLS
#define PORT_CONV_PACK_MIN_COLS 512
#endif
typedef struct { const float *xg; const port_conv2d_params *p; } im2col_src;
static void im2col_pack(const void *ctx, float *bp, int64_t nr_, int64_t p0, int64_t kc, int64_t j0, int64_t nc) {
    const im2col_src *s = (const im2col_src *)ctx;
    float row[512];
    for (int64_t q = 0; q < kc; q++) {
        im2col_seg(row, p0 + q, s->xg, s->p, j0, nc);
        int64_t jr = 0;
        for (; jr + nr_ <= nc; jr += nr_) memcpy(bp + jr * kc + q * nr_, row + jr, (size_t)nr_ * sizeof(float));
        if (jr < nc) {
            float *d = bp + jr * kc + q * nr_;
            int64_t c = 0;
            for (; c < nc - jr; c++) d[c] = row[jr + c];
            for (; c < nr_; c++) d[c] = 0.0f;
        }
    }
}

void port__col2im_tile(float *dx, const float *cols, int64_t cin, int64_t h, int64_t w,
                       int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                       int64_t oh0, int64_t th, int64_t ow0, int64_t tw) {
    int64_t T = th * tw;
#pragma omp parallel for schedule(static) if (cin * kh * kw * T > PORT_PAR_MIN && cin > 1 && !port__in_parallel())
    for (int64_t ci = 0; ci < cin; ci++)
        col2im_channel(dx, cols, T, ci, h, w, kh, kw, sh, sw, ph, pw, oh0, th, ow0, tw);
}

/* ---------------- depthwise direct ----------------
 * The valid output-column range of each kernel column kj does not depend on the row, the channel or the
 * image: it is computed once per call (kw <= DW_KW_MAX; wider kernels compute it per use). */
#define DW_KW_MAX 32
typedef struct { int64_t lo[DW_KW_MAX], hi[DW_KW_MAX]; int have; } dw_cols;

static void dw_cols_init(dw_cols *vc, const port_conv2d_params *p, int64_t wo) {
    vc->have = p->kw <= DW_KW_MAX;
    for (int64_t kj = 0; vc->have && kj < p->kw; kj++)
        valid_cols(&vc->lo[kj], &vc->hi[kj], p->w, p->stride_w, p->pad_w, kj, 0, wo);
}
static inline void dw_range(const dw_cols *vc, const port_conv2d_params *p, int64_t wo, int64_t kj,
                            int64_t *lo, int64_t *hi) {
    if (vc->have) { *lo = vc->lo[kj]; *hi = vc->hi[kj]; }
    else valid_cols(lo, hi, p->w, p->stride_w, p->pad_w, kj, 0, wo);
}

/* the 16 lanes of a partial sum, pairwise (dw_tap_dots' order) */
static inline float dw_lane_sum(const float *a) {
    float l8[8];
    for (int l = 0; l < 8; l++) l8[l] = a[l] + a[l + 8];
    return ((l8[0] + l8[1]) + (l8[2] + l8[3])) + ((l8[4] + l8[5]) + (l8[6] + l8[7]));
}

/* Stride-1 depthwise planes through a zero-padded copy: the input plane sits in a buffer whose rows are
 * WS = out_w + kw - 1 floats apart, so out(oh, ow) = sum_ki,kj w[ki][kj] * buf[(oh + ki) * WS + ow + kj] and
 * every (ki, kj) is ONE flat loop over out_h * WS positions (the kw - 1 extra columns per row are computed and
 * dropped).  On small maps (4x4 .. 32x32) this replaces many 4-32 element row loops by a few long ones.  Used
 * when both buffers fit PORT_DW_PAD_MAX floats on the worker's stack; 0 disables (micro-controllers). */
#ifndef PORT_DW_PAD_MAX
#define PORT_DW_PAD_MAX 8192
#endif
#if PORT_DW_PAD_MAX > 0
static int64_t dw_pad_floats(int64_t oh, int64_t ow, int64_t kh, int64_t kw) {
    int64_t ws = ow + kw - 1;
    return (oh + kh - 1) * ws + kw - 1 + oh * ws;   /* padded input (+ overrun) and the output rows */
}
/* n floats: rows of 4 .. 32 floats, where a memcpy call costs more than the copy.  GCC turns a plain copy loop
 * into a memcpy call; the empty asm statement in the body keeps it a loop of 16-byte moves. */
static inline void copy_row(float *restrict dst, const float *restrict src, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        port_v4f v = port_ld4(src + i);
        memcpy(dst + i, &v, sizeof v);
        __asm__ volatile("");
    }
    for (; i < n; i++) {
        dst[i] = src[i];
        __asm__ volatile("");
    }
}
/* Images per stacked buffer: the padded planes of up to this many images of one channel, one under the other
 * (rows = oh + kh - 1 each: the zero rows of one image's bottom and the next one's top padding separate them),
 * run as ONE tall plane -- its out rows that straddle two images are computed and dropped.  On 4x4 and 8x8 maps
 * a plane's own loops are a few vectors long; stacked, every (ki, kj) is one loop over all the images. */
static int64_t dw_stack(int64_t n, int64_t oh, int64_t ow, int64_t kh, int64_t kw) {
    int64_t ws = ow + kw - 1, rows = oh + kh - 1;
    int64_t per = rows * ws + rows * ws;     /* one more image: its padded rows and its (tall) output rows */
    int64_t m = (PORT_DW_PAD_MAX - (kw - 1)) / per;
    return PORT_MAX(1, PORT_MIN(m, n));
}
/* buf <- the zero-padded planes of m images (plane j at in + j * stride), each in `rows` rows of ws floats with
 * the plane at (top, left); returns the tall plane's output rows (m * rows - (kh - 1)) */
static int64_t dw_pad_stack(float *buf, const float *in, int64_t stride, int64_t m, int64_t ih, int64_t iw,
                            int64_t top, int64_t left, int64_t rows, int64_t ws, int64_t kh, int64_t kw) {
    memset(buf, 0, (size_t)(m * rows * ws + kw - 1) * sizeof(float));
    for (int64_t j = 0; j < m; j++)
        for (int64_t r = 0; r < ih; r++)
            copy_row(buf + (j * rows + top + r) * ws + left, in + j * stride + r * iw, iw);
    return m * rows - (kh - 1);
}
/* acc (th rows of ws) = bias + sum_ki,kj wk[ki][kj] (flipped if flip) * the padded buffer shifted by (ki, kj),
 * the taps added in (ki, kj) order: one flat loop per tap, vectorised at the widest ISA the CPU has
 * (PORT_ISA_CLONES; the same operations per element in every clone, so the same bits). */
PORT_ISA_CLONES static void dw_taps_s1(float *restrict acc, const float *restrict buf, const float *wk, float bias,
                                       int64_t th, int64_t ws, int64_t kh, int64_t kw, int flip) {
    int64_t L = th * ws;
    for (int64_t i = 0; i < L; i++) acc[i] = bias;
    for (int64_t ki = 0; ki < kh; ki++)
        for (int64_t kj = 0; kj < kw; kj++) {
            float wv = flip ? wk[(kh - 1 - ki) * kw + (kw - 1 - kj)] : wk[ki * kw + kj];
            const float *src = buf + ki * ws + kj;
            for (int64_t i = 0; i < L; i++) acc[i] += wv * src[i];
        }
}
#define DW_S1_OK(p, oh, ow) ((p)->stride_h == 1 && (p)->stride_w == 1 && (p)->pad_h < (p)->kh && \
                             (p)->pad_w < (p)->kw && dw_pad_floats(oh, ow, (p)->kh, (p)->kw) <= PORT_DW_PAD_MAX)

/* Every (image, channel) plane: out (oh x ow) = the padded plane of `in` (ih x iw, placed at (top, left)) through
 * the kernel (flipped if flip) -- the forward pass, and the input gradient (dy through the flipped kernel).  Work
 * items: (channel, a stack of images); every output element gets the same operations in the same order as a
 * plane on its own. */
static void dw_planes_s1(float *out, const float *in, const float *w, const float *b, const port_conv2d_params *p,
                         int64_t ih, int64_t iw, int64_t oh, int64_t ow, int64_t top, int64_t left, int flip) {
    int64_t kh = p->kh, kw = p->kw, C = p->c_in, N = p->n, ws = ow + kw - 1, rows = oh + kh - 1;
    int64_t nb = dw_stack(N, oh, ow, kh, kw), chunks = (N + nb - 1) / nb;
#pragma omp parallel for schedule(static) if (p->n * C * oh * ow * kh * kw > PORT_PAR_MIN_MACS)
    for (int64_t t = 0; t < C * chunks; t++) {
        float buf[PORT_DW_PAD_MAX];
        int64_t c = t / chunks, n0 = (t % chunks) * nb, m = PORT_MIN(nb, N - n0);
        int64_t th = dw_pad_stack(buf, in + (n0 * C + c) * ih * iw, C * ih * iw, m, ih, iw, top, left, rows, ws,
                                  kh, kw);
        float *acc = buf + m * rows * ws + kw - 1;
        dw_taps_s1(acc, buf, w + c * kh * kw, b ? b[c] : 0.0f, th, ws, kh, kw, flip);
        for (int64_t j = 0; j < m; j++)
            for (int64_t r = 0; r < oh; r++)
                copy_row(out + ((n0 + j) * C + c) * oh * ow + r * ow, acc + (j * rows + r) * ws, ow);
    }
}

static void dw_fwd_s1(float *y, const float *x, const float *w, const float *b, const port_conv2d_params *p) {
    dw_planes_s1(y, x, w, b, p, p->h, p->w, port_conv2d_out_h(p), port_conv2d_out_w(p), p->pad_h, p->pad_w, 0);
}

/* dx = full correlation of dy with the flipped kernel: dy placed at (kh-1-pad_h, kw-1-pad_w), output H x W */
static void dw_bwd_in_s1(float *dx, const float *dy, const float *w, const port_conv2d_params *p) {
    dw_planes_s1(dx, dy, w, NULL, p, port_conv2d_out_h(p), port_conv2d_out_w(p), p->h, p->w, p->kh - 1 - p->pad_h,
                 p->kw - 1 - p->pad_w, 1);
}

/* dwk[ki][kj] += sum_i dyb[i] * buf[ki * ws + kj + i] over i < L: 16 partial sums (element i into lane i % 16:
 * one AVX-512 register, two AVX2 or four SSE ones, the same lanes on every ISA, so the same bits), combined
 * pairwise, then the tail */
typedef float dw_v16f __attribute__((vector_size(64)));
PORT_ISA_CLONES static void dw_tap_dots(float *dwk, const float *dyb, const float *buf, int64_t L, int64_t ws,
                                        int64_t kh, int64_t kw) {
    for (int64_t ki = 0; ki < kh; ki++)
        for (int64_t kj = 0; kj < kw; kj++) {
            const float *src = buf + ki * ws + kj;
            dw_v16f a = {0}, d, x;
            int64_t i = 0;
            for (; i + 16 <= L; i += 16) {
                memcpy(&d, dyb + i, sizeof d);
                memcpy(&x, src + i, sizeof x);
                a += d * x;
            }
            float l8[8];
            for (int l = 0; l < 8; l++) l8[l] = a[l] + a[l + 8];
            float t = ((l8[0] + l8[1]) + (l8[2] + l8[3])) + ((l8[4] + l8[5]) + (l8[6] + l8[7]));
            for (; i < L; i++) t += dyb[i] * src[i];
            dwk[ki * kw + kj] += t;
        }
}

/* dw[ki][kj] += per stack of images, a flat dot product: dy in rows of ws floats (zero tails, zero rows between
 * images) against the stacked padded x shifted by (ki, kj) */
static void dw_bwd_w_s1(float *dw, float *db, const float *dy, const float *x, const port_conv2d_params *p) {
    int64_t H = p->h, W = p->w, kh = p->kh, kw = p->kw, C = p->c_in, N = p->n;
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p), ws = wo + kw - 1, rows = ho + kh - 1;
    int64_t nb = dw_stack(N, ho, wo, kh, kw);
#pragma omp parallel for schedule(static) if (p->n * C * ho * wo * kh * kw > PORT_PAR_MIN_MACS)
    for (int64_t c = 0; c < C; c++) {
        float buf[PORT_DW_PAD_MAX];
        float *dwk = dw + c * kh * kw;
        double bsum = 0.0;
        for (int64_t n0 = 0; n0 < N; n0 += nb) {
            int64_t m = PORT_MIN(nb, N - n0);
            int64_t th = dw_pad_stack(buf, x + (n0 * C + c) * H * W, C * H * W, m, H, W, p->pad_h, p->pad_w, rows,
                                      ws, kh, kw);
            float *dyb = buf + m * rows * ws + kw - 1;   /* dy in the tall plane's output rows */
            memset(dyb, 0, (size_t)(th * ws) * sizeof(float));
            for (int64_t j = 0; j < m; j++) {
                const float *dyp = dy + ((n0 + j) * C + c) * ho * wo;
                for (int64_t r = 0; r < ho; r++)
                    copy_row(dyb + (j * rows + r) * ws, dyp + r * wo, wo);
                if (db) {
                    double s = 0.0;
                    for (int64_t i = 0; i < ho * wo; i++) s += dyp[i];
                    bsum += s;
                }
            }
            dw_tap_dots(dwk, dyb, buf, th * ws, ws, kh, kw);
        }
        if (db) db[c] += (float)bsum;
    }
}

/* ---------------- depthwise, a block of images in the vector lanes ----------------
 * On small maps (8x8 .. 1x1) a plane's rows are shorter than a vector and its padding is most of the padded
 * plane (a 7x7 kernel on a 2x2 map: 4 of 64 padded-plane taps are real), and stride 2 has no flat-loop form.
 * Here the 16 lanes of a vector hold the same position of one channel in 16 images (DW_LB), so every multiply-add
 * is a real one at full width whatever the map size or stride: a work item (channel, block of 16 images) gathers
 * its planes into xt[H][W + 2 pw][16] (zero columns left and right), then
 *   forward: y(oh, ow) = bias + the valid taps in (ki, kj) order -- rows exactly, columns exactly for a lone
 *            output and over the union of four neighbours' columns (their extra taps read the zero columns, so
 *            every product is a real tap or 0 * w); four outputs at once for independent sums;
 *   input gradient: dxt[H][W][16] += w * dy(oh, ow) over the valid taps, (oh, ow, ki, kj) in order;
 *   weight gradient: per tap, lanes += dy * x over the outputs in order, blocks in order, then the 16 lanes
 *            summed pairwise (as dw_tap_dots) -- one channel per work item.
 * Every element gets the same operations in the same order at any thread count.  Used when the lane buffers fit
 * PORT_DW_PAD_MAX floats and dw_lane_pays says so. */
#define DW_LB 16
#define DW_LANE_TAPS 64
#define DW_LANE_MIN_N 8     /* fewer images leave most lanes empty */

static int64_t dw_lane_floats(const port_conv2d_params *p) {
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p), xt = p->h * (p->w + 2 * p->pad_w);
    return (PORT_MAX(xt, p->h * p->w) + ho * wo) * DW_LB;   /* dy and xt (weight gradient) or dxt (input) */
}
/* the lane kernels run the real taps only: where the padded planes of the flat stride-1 loops would run more than
 * twice as many (small maps, wide kernels) or where there are none (stride 2), with at least DW_LANE_MIN_N images */
/* the real taps of one plane (valid rows times valid columns, summed over the outputs) */
static int64_t dw_real_taps(const port_conv2d_params *p) {
    int64_t rows = 0, cols = 0;
    for (int64_t o = 0; o < port_conv2d_out_h(p); o++)
        rows += PORT_MIN(p->kh, p->h + p->pad_h - o * p->stride_h) - PORT_MAX(0, p->pad_h - o * p->stride_h);
    for (int64_t o = 0; o < port_conv2d_out_w(p); o++)
        cols += PORT_MIN(p->kw, p->w + p->pad_w - o * p->stride_w) - PORT_MAX(0, p->pad_w - o * p->stride_w);
    return rows * cols;
}
static int dw_lane_pays(const port_conv2d_params *p) {
    if (p->n < DW_LANE_MIN_N || dw_lane_floats(p) > PORT_DW_PAD_MAX || p->kh * p->kw > DW_LANE_TAPS) return 0;
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p);
    if (!DW_S1_OK(p, ho, wo)) return 1;
    return (ho + p->kh - 1) * (wo + p->kw - 1) * p->kh * p->kw > 2 * dw_real_taps(p);
}
/* a region only for enough real multiply-adds (on a 2x2 map a 7x7 kernel has 4 of 49 taps real) */
static int dw_lane_par(const port_conv2d_params *p) {
    return p->n * p->c_in * dw_real_taps(p) > PORT_PAR_MIN_MACS && !port__in_parallel();
}

/* v[i][e] <-> v[e][i]: 16 x 16 floats transposed in registers, four rounds of swapping the off-diagonal blocks of
 * 8, 4, 2 and 1 (data moves only: the same values) */
PORT_ALWAYS_INLINE void lane_transpose16(dw_v16f *v) {
    static const port_i16 lo[4] = {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
                                   {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
                                   {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
                                   {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}};
    static const port_i16 hi[4] = {{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
                                   {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
                                   {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
                                   {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}};
    for (int r = 0; r < 4; r++) {
        int b = 8 >> r;
        for (int i = 0; i < 16; i++)
            if (!(i & b)) {
                dw_v16f a = v[i], c = v[i + b];
                v[i] = __builtin_shuffle(a, c, lo[r]);
                v[i + b] = __builtin_shuffle(a, c, hi[r]);
            }
    }
}
/* the full-block part of dw_lane_gather: columns [0, c1) of every row, 16 at a time */
PORT_ISA_CLONES static void lane_gather16(float *xt, const float *in, int64_t stride, int64_t h, int64_t w, int64_t wp,
                                          int64_t left, int64_t c1) {
    for (int64_t r = 0; r < h; r++)
        for (int64_t c0 = 0; c0 < c1; c0 += DW_LB) {
            dw_v16f v[DW_LB];
            for (int64_t j = 0; j < DW_LB; j++) v[j] = PORT_V16_LD(in + j * stride + r * w + c0);
            lane_transpose16(v);
            for (int64_t q = 0; q < DW_LB; q++) PORT_V16_ST(xt + (r * wp + left + c0 + q) * DW_LB, v[q]);
        }
}
/* the full-block part of dw_lane_scatter: positions [0, q1), 16 at a time */
PORT_ISA_CLONES static void lane_scatter16(float *out, int64_t stride, int64_t q1, const float *lt) {
    for (int64_t q0 = 0; q0 < q1; q0 += DW_LB) {
        dw_v16f v[DW_LB];
        for (int64_t q = 0; q < DW_LB; q++) v[q] = PORT_V16_LD(lt + (q0 + q) * DW_LB);
        lane_transpose16(v);
        for (int64_t j = 0; j < DW_LB; j++) PORT_V16_ST(out + j * stride + q0, v[j]);
    }
}
/* xt[r][pw + c][j] = plane j of `in` (planes `stride` floats apart, m of them; lanes m.. zero), row width wp; a full
 * block's columns 16 at a time through lane_transpose16 (a plain clone of the element loops would vectorise them
 * into scatter instructions, slower than the scalar moves on the 2x2 .. 4x4 maps' rows) */
static void dw_lane_gather(float *xt, const float *in, int64_t stride, int64_t m, int64_t h, int64_t w, int64_t wp,
                           int64_t left) {
    if (m < DW_LB || wp != w) memset(xt, 0, (size_t)(h * wp * DW_LB) * sizeof(float));
    int64_t c0 = m == DW_LB ? w / DW_LB * DW_LB : 0;
    if (c0 > 0) lane_gather16(xt, in, stride, h, w, wp, left, c0);
    for (int64_t j = 0; j < m; j++) {
        const float *src = in + j * stride;
        for (int64_t r = 0; r < h; r++)
            for (int64_t c = c0; c < w; c++) xt[((r * wp) + left + c) * DW_LB + j] = src[r * w + c];
    }
}
/* the inverse for the outputs: plane j of out (planes `stride` floats apart, j < m) <- lane j of lt[len][16] */
static void dw_lane_scatter(float *out, int64_t stride, int64_t m, int64_t len, const float *lt) {
    int64_t q0 = m == DW_LB ? len / DW_LB * DW_LB : 0;
    if (q0 > 0) lane_scatter16(out, stride, q0, lt);
    for (int64_t j = 0; j < m; j++)
        for (int64_t q = q0; q < len; q++) out[j * stride + q] = lt[q * DW_LB + j];
}
static inline int64_t dw_lo(int64_t pad, int64_t o, int64_t s) { return PORT_MAX(0, pad - o * s); }
static inline int64_t dw_hi(int64_t k, int64_t len, int64_t pad, int64_t o, int64_t s) {
    return PORT_MIN(k, len + pad - o * s);
}

/* the geometry of a lane item (depthwise or grouped), and the valid taps of output (oh, ow): rows [i0, i1),
 * columns [j0, j1), tap (ki, kj) at plane position q0 + ki * W + kj */
#define LANE_GEOM(p)                                                                                           \
    int64_t H = (p)->h, W = (p)->w, kh = (p)->kh, kw = (p)->kw, sh = (p)->stride_h, sw = (p)->stride_w;       \
    int64_t ph = (p)->pad_h, pw = (p)->pad_w, ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p);           \
    int64_t P = ho * wo, HW = H * W, cig = (p)->c_in / (p)->groups, cog = (p)->c_out / (p)->groups;           \
    int64_t K = cig * kh * kw;                                                                                 \
    (void)P; (void)HW; (void)cog; (void)K
#define LANE_WINDOW(p, oh, ow)                                                                                 \
    int64_t i0 = dw_lo(ph, oh, sh), i1 = dw_hi(kh, H, ph, oh, sh), j0 = dw_lo(pw, ow, sw);                    \
    int64_t j1 = dw_hi(kw, W, pw, ow, sw), q0 = ((oh) * sh - ph) * W + (ow) * sw - pw;                \
    (void)q0

PORT_ISA_CLONES static void dw_lane_fwd_item(float *yt, const float *xt, const float *wk, float bias,
                                             const port_conv2d_params *p) {
    int64_t H = p->h, W = p->w, kh = p->kh, kw = p->kw, sh = p->stride_h, sw = p->stride_w, ph = p->pad_h;
    int64_t pw = p->pad_w, wp = W + 2 * pw, ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p);
    int64_t s16 = sw * DW_LB;
    for (int64_t oh = 0; oh < ho; oh++) {
        int64_t i0 = dw_lo(ph, oh, sh), i1 = dw_hi(kh, H, ph, oh, sh);
        int64_t ow = 0;
        for (; ow + 4 <= wo; ow += 4) {
            int64_t j0 = dw_lo(pw, ow + 3, sw), j1 = dw_hi(kw, W, pw, ow, sw);
            dw_v16f a0 = PORT_V16_SPLAT(bias), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t ki = i0; ki < i1; ki++) {
                const float *xr = xt + ((oh * sh - ph + ki) * wp + ow * sw) * DW_LB;
                for (int64_t kj = j0; kj < j1; kj++) {
                    dw_v16f wv = PORT_V16_SPLAT(wk[ki * kw + kj]);
                    const float *s = xr + kj * DW_LB;
                    a0 += wv * PORT_V16_LD(s);
                    a1 += wv * PORT_V16_LD(s + s16);
                    a2 += wv * PORT_V16_LD(s + 2 * s16);
                    a3 += wv * PORT_V16_LD(s + 3 * s16);
                }
            }
            float *yr = yt + (oh * wo + ow) * DW_LB;
            PORT_V16_ST(yr, a0);
            PORT_V16_ST(yr + DW_LB, a1);
            PORT_V16_ST(yr + 2 * DW_LB, a2);
            PORT_V16_ST(yr + 3 * DW_LB, a3);
        }
        for (; ow < wo; ow++) {
            int64_t j0 = dw_lo(pw, ow, sw), j1 = dw_hi(kw, W, pw, ow, sw);
            dw_v16f a = PORT_V16_SPLAT(bias);
            for (int64_t ki = i0; ki < i1; ki++) {
                const float *xr = xt + ((oh * sh - ph + ki) * wp + ow * sw) * DW_LB;
                for (int64_t kj = j0; kj < j1; kj++)
                    a += PORT_V16_SPLAT(wk[ki * kw + kj]) * PORT_V16_LD(xr + kj * DW_LB);
            }
            PORT_V16_ST(yt + (oh * wo + ow) * DW_LB, a);
        }
    }
}

PORT_ISA_CLONES static void dw_lane_bwd_in_item(float *dxt, const float *dyt, const float *wk,
                                                const port_conv2d_params *p) {
    LANE_GEOM(p);
    memset(dxt, 0, (size_t)(HW * DW_LB) * sizeof(float));
    for (int64_t oh = 0; oh < ho; oh++)
        for (int64_t ow = 0; ow < wo; ow++) {
            LANE_WINDOW(p, oh, ow);
            dw_v16f d = PORT_V16_LD(dyt + (oh * wo + ow) * DW_LB);
            for (int64_t ki = i0; ki < i1; ki++)
                for (int64_t kj = j0; kj < j1; kj++) {
                    float *t = dxt + (q0 + ki * W + kj) * DW_LB;
                    PORT_V16_ST(t, PORT_V16_LD(t) + PORT_V16_SPLAT(wk[ki * kw + kj]) * d);
                }
        }
}

/* acc[ki * kw + kj] += dy(oh, ow) * x(oh*sh - ph + ki, ow*sw - pw + kj) over the valid taps, outputs in order */
PORT_ISA_CLONES static void dw_lane_bwd_w_item(dw_v16f *acc, const float *xt, const float *dyt,
                                               const port_conv2d_params *p) {
    int64_t H = p->h, W = p->w, kh = p->kh, kw = p->kw, sh = p->stride_h, sw = p->stride_w, ph = p->pad_h;
    int64_t pw = p->pad_w, wp = W + 2 * pw, ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p);
    for (int64_t oh = 0; oh < ho; oh++) {
        int64_t i0 = dw_lo(ph, oh, sh), i1 = dw_hi(kh, H, ph, oh, sh);
        for (int64_t ow = 0; ow < wo; ow++) {
            int64_t j0 = dw_lo(pw, ow, sw), j1 = dw_hi(kw, W, pw, ow, sw);
            dw_v16f d = PORT_V16_LD(dyt + (oh * wo + ow) * DW_LB);
            for (int64_t ki = i0; ki < i1; ki++) {
                const float *xr = xt + ((oh * sh - ph + ki) * wp + ow * sw) * DW_LB;
                for (int64_t kj = j0; kj < j1; kj++) acc[ki * kw + kj] += d * PORT_V16_LD(xr + kj * DW_LB);
            }
        }
    }
}

static void dw_lane_fwd(float *y, const float *x, const float *w, const float *b, const port_conv2d_params *p) {
    int64_t C = p->c_in, N = p->n, HW = p->h * p->w, P = port_conv2d_out_h(p) * port_conv2d_out_w(p);
    int64_t kk = p->kh * p->kw, blocks = (N + DW_LB - 1) / DW_LB;
#pragma omp parallel for schedule(static) if (dw_lane_par(p))
    for (int64_t t = 0; t < C * blocks; t++) {
        float buf[PORT_DW_PAD_MAX];
        float *xt = buf, *yt = buf + p->h * (p->w + 2 * p->pad_w) * DW_LB;
        int64_t c = t / blocks, n0 = (t % blocks) * DW_LB, m = PORT_MIN(DW_LB, N - n0);
        dw_lane_gather(xt, x + (n0 * C + c) * HW, C * HW, m, p->h, p->w, p->w + 2 * p->pad_w, p->pad_w);
        dw_lane_fwd_item(yt, xt, w + c * kk, b ? b[c] : 0.0f, p);
        dw_lane_scatter(y + (n0 * C + c) * P, C * P, m, P, yt);
    }
}

static void dw_lane_bwd_in(float *dx, const float *dy, const float *w, const port_conv2d_params *p) {
    int64_t C = p->c_in, N = p->n, HW = p->h * p->w, P = port_conv2d_out_h(p) * port_conv2d_out_w(p);
    int64_t kk = p->kh * p->kw, blocks = (N + DW_LB - 1) / DW_LB;
#pragma omp parallel for schedule(static) if (dw_lane_par(p))
    for (int64_t t = 0; t < C * blocks; t++) {
        float buf[PORT_DW_PAD_MAX];
        float *dyt = buf, *dxt = buf + P * DW_LB;
        int64_t c = t / blocks, n0 = (t % blocks) * DW_LB, m = PORT_MIN(DW_LB, N - n0);
        dw_lane_gather(dyt, dy + (n0 * C + c) * P, C * P, m, 1, P, P, 0);
        dw_lane_bwd_in_item(dxt, dyt, w + c * kk, p);
        dw_lane_scatter(dx + (n0 * C + c) * HW, C * HW, m, HW, dxt);
    }
}

static void dw_lane_bwd_w(float *dw, float *db, const float *dy, const float *x, const port_conv2d_params *p) {
    int64_t C = p->c_in, N = p->n, H = p->h, W = p->w, HW = H * W, kk = p->kh * p->kw;
    int64_t P = port_conv2d_out_h(p) * port_conv2d_out_w(p), wp = W + 2 * p->pad_w;
#pragma omp parallel for schedule(static) if (dw_lane_par(p))
    for (int64_t c = 0; c < C; c++) {
        float buf[PORT_DW_PAD_MAX];
        dw_v16f acc[DW_LANE_TAPS];   /* kk <= DW_LANE_TAPS (dw_lane_pays) */
        float *xt = buf, *dyt = buf + H * wp * DW_LB;
        double bsum = 0.0;
        memset(acc, 0, sizeof acc);
        for (int64_t n0 = 0; n0 < N; n0 += DW_LB) {
            int64_t m = PORT_MIN(DW_LB, N - n0);
            dw_lane_gather(xt, x + (n0 * C + c) * HW, C * HW, m, H, W, wp, p->pad_w);
            dw_lane_gather(dyt, dy + (n0 * C + c) * P, C * P, m, 1, P, P, 0);
            if (db)
                for (int64_t j = 0; j < m; j++) {
                    const float *d = dy + ((n0 + j) * C + c) * P;
                    double s = 0.0;
                    for (int64_t q = 0; q < P; q++) s += d[q];
                    bsum += s;
                }
            dw_lane_bwd_w_item(acc, xt, dyt, p);
        }
        float *dwk = dw + c * kk;
        for (int64_t k = 0; k < kk; k++) dwk[k] += dw_lane_sum((const float *)&acc[k]);
        if (db) db[c] += (float)bsum;
    }
}
#else
#define DW_S1_OK(p, oh, ow) 0
#endif

static void dw_fwd(float *y, const float *x, const float *w, const float *b,
                   const port_conv2d_params *p) {
#if PORT_DW_PAD_MAX > 0
    if (dw_lane_pays(p)) {
        dw_lane_fwd(y, x, w, b, p);
        return;
    }
    if (DW_S1_OK(p, port_conv2d_out_h(p), port_conv2d_out_w(p))) {
        dw_fwd_s1(y, x, w, b, p);
        return;
    }
#endif
    int64_t H = p->h, W = p->w, kh = p->kh, kw = p->kw, sh = p->stride_h, sw = p->stride_w;
    int64_t ph = p->pad_h, pw = p->pad_w, C = p->c_in;
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p);
    dw_cols vc;
    dw_cols_init(&vc, p, wo);
#pragma omp parallel for schedule(static) if (p->n * C * ho * wo * kh * kw > PORT_PAR_MIN_MACS)
    for (int64_t nc = 0; nc < p->n * C; nc++) {
        int64_t c = nc % C;
        const float *xp = x + nc * H * W;
        const float *wk = w + c * kh * kw;
        float *yp = y + nc * ho * wo;
        float bias = b ? b[c] : 0.0f;
        for (int64_t q = 0; q < ho * wo; q++) yp[q] = bias;
        for (int64_t oh = 0; oh < ho; oh++) {
            float *yr = yp + oh * wo;
            for (int64_t ki = 0; ki < kh; ki++) {
                int64_t ih = oh * sh - ph + ki;
                if (ih < 0 || ih >= H) continue;
                for (int64_t kj = 0; kj < kw; kj++) {
                    int64_t lo, hi;
                    dw_range(&vc, p, wo, kj, &lo, &hi);
                    const float *xr = xp + ih * W - pw + kj;
                    float wv = wk[ki * kw + kj];
                    if (sw == 1)
                        for (int64_t ow = lo; ow < hi; ow++) yr[ow] += wv * xr[ow];
                    else
                        for (int64_t ow = lo; ow < hi; ow++) yr[ow] += wv * xr[ow * sw];
                }
            }
        }
    }
}

static void dw_bwd_in(float *dx, const float *dy, const float *w, const port_conv2d_params *p) {
#if PORT_DW_PAD_MAX > 0
    if (dw_lane_pays(p)) {
        dw_lane_bwd_in(dx, dy, w, p);
        return;
    }
    if (DW_S1_OK(p, p->h, p->w)) {
        dw_bwd_in_s1(dx, dy, w, p);
        return;
    }
#endif
    int64_t H = p->h, W = p->w, kh = p->kh, kw = p->kw, sh = p->stride_h, sw = p->stride_w;
    int64_t ph = p->pad_h, pw = p->pad_w, C = p->c_in;
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p);
    dw_cols vc;
    dw_cols_init(&vc, p, wo);
#pragma omp parallel for schedule(static) if (p->n * C * ho * wo * kh * kw > PORT_PAR_MIN_MACS)
    for (int64_t nc = 0; nc < p->n * C; nc++) {
        int64_t c = nc % C;
        float *dxp = dx + nc * H * W;
        const float *wk = w + c * kh * kw;
        const float *dyp = dy + nc * ho * wo;
        memset(dxp, 0, (size_t)(H * W) * sizeof(float));
        for (int64_t oh = 0; oh < ho; oh++) {
            const float *dyr = dyp + oh * wo;
            for (int64_t ki = 0; ki < kh; ki++) {
                int64_t ih = oh * sh - ph + ki;
                if (ih < 0 || ih >= H) continue;
                for (int64_t kj = 0; kj < kw; kj++) {
                    int64_t lo, hi;
                    dw_range(&vc, p, wo, kj, &lo, &hi);
                    float *dxr = dxp + ih * W - pw + kj;
                    float wv = wk[ki * kw + kj];
                    if (sw == 1)
                        for (int64_t ow = lo; ow < hi; ow++) dxr[ow] += wv * dyr[ow];
                    else
                        for (int64_t ow = lo; ow < hi; ow++) dxr[ow * sw] += wv * dyr[ow];
                }
            }
        }
    }
}

static void dw_bwd_w(float *dw, float *db, const float *dy, const float *x,
                     const port_conv2d_params *p) {
#if PORT_DW_PAD_MAX > 0
    if (dw_lane_pays(p)) {
        dw_lane_bwd_w(dw, db, dy, x, p);
        return;
    }
    if (DW_S1_OK(p, port_conv2d_out_h(p), port_conv2d_out_w(p))) {
        dw_bwd_w_s1(dw, db, dy, x, p);
        return;
    }
#endif
    int64_t H = p->h, W = p->w, kh = p->kh, kw = p->kw, sh = p->stride_h, sw = p->stride_w;
    int64_t ph = p->pad_h, pw = p->pad_w, C = p->c_in;
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p);
    dw_cols vc;
    dw_cols_init(&vc, p, wo);
    /* valid output rows of kernel row ki: oh in [rlo, rhi) */
#pragma omp parallel for schedule(static) if (p->n * C * ho * wo * kh * kw > PORT_PAR_MIN_MACS)
    for (int64_t c = 0; c < C; c++) {
        float *dwk = dw + c * kh * kw;
        double bsum = 0.0;
        for (int64_t n = 0; n < p->n; n++) {
            const float *xp = x + (n * C + c) * H * W;
            const float *dyp = dy + (n * C + c) * ho * wo;
            if (db) {
                port_v4f f0 = port_splat4(0.0f), f1 = f0;
                int64_t i = 0;
                for (; i + PORT_LANES <= ho * wo; i += PORT_LANES) {
                    f0 += port_ld4(dyp + i);
                    f1 += port_ld4(dyp + i + 4);
                }
                double s = 0.0;
                for (int l = 0; l < 4; l++) s += f0[l];
                for (int l = 0; l < 4; l++) s += f1[l];
                for (; i < ho * wo; i++) s += dyp[i];
                bsum += s;
            }
            for (int64_t ki = 0; ki < kh; ki++) {
                int64_t rlo = cdiv(ph - ki, sh), rhi = fdiv(H - 1 + ph - ki, sh) + 1;
                rlo = PORT_MAX(rlo, 0);
                rhi = PORT_MIN(rhi, ho);
                for (int64_t kj = 0; kj < kw; kj++) {
                    int64_t lo, hi;
                    dw_range(&vc, p, wo, kj, &lo, &hi);
                    float acc = 0.0f;
                    for (int64_t oh = rlo; oh < rhi; oh++) {
                        const float *xr = xp + (oh * sh - ph + ki) * W - pw + kj;
                        const float *dyr = dyp + oh * wo;
                        if (sw == 1)
                            for (int64_t ow = lo; ow < hi; ow++) acc += dyr[ow] * xr[ow];
                        else
                            for (int64_t ow = lo; ow < hi; ow++) acc += dyr[ow] * xr[ow * sw];
                    }
                    dwk[ki * kw + kj] += acc;
                }
            }
        }
        if (db) db[c] += (float)bsum;
    }
}

/* ---------------- batch-folded drivers (conv_fold > 1) ----------------
 * Images n0..n0+nbc-1 of group g form one GEMM of L = nbc*P columns: cols[K, L] holds image i's im2col
 * block at columns i*P.. (for 1x1/s1/p0 it is a copy of x's channels), blk[cog, L] the output (forward) or
 * the gathered dy (backward). */
static void fold_cols(float *cols, const float *x, const port_conv2d_params *p, int64_t n0, int64_t nbc,
                      int64_t g, int64_t K, int64_t P) {
    int64_t cig = p->c_in / p->groups, HW = p->h * p->w, L = nbc * P;
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p);
#pragma omp parallel for schedule(static) if (K * L > 4 * PORT_PAR_MIN && !port__in_parallel())
    for (int64_t t = 0; t < nbc * K; t++) {
        int64_t i = t / K, r = t % K;
        const float *xg = x + ((n0 + i) * p->c_in + g * cig) * HW;
        im2col_row(cols + r * L + i * P, r, xg, p->h, p->w, p->kh, p->kw, p->stride_h, p->stride_w,
                   p->pad_h, p->pad_w, 0, ho, 0, wo);
    }
}

/* blk[co, i*P + q] <-> t[n0+i, g*cog+co, q] (gather: to_blk = 1; scatter with bias: to_blk = 0) */
static void fold_move(float *blk, float *t, const float *bias, int to_blk, const port_conv2d_params *p,
                      int64_t n0, int64_t nbc, int64_t g, int64_t P) {
    int64_t cog = p->c_out / p->groups, L = nbc * P;
#pragma omp parallel for schedule(static) if (cog * L > 4 * PORT_PAR_MIN && !port__in_parallel())
    for (int64_t s = 0; s < nbc * cog; s++) {
        int64_t i = s / cog, co = s % cog;
        float *tp = t + ((n0 + i) * p->c_out + g * cog + co) * P, *bp = blk + co * L + i * P;
        if (to_blk) {
            memcpy(bp, tp, (size_t)P * sizeof(float));
        } else if (bias) {
            float bv = bias[g * cog + co];
            for (int64_t q = 0; q < P; q++) tp[q] = bp[q] + bv;
        } else {
            memcpy(tp, bp, (size_t)P * sizeof(float));
        }
    }
}

/* dx's channels of group g, images n0..n0+nbc-1 = col2im of cols [K, nbc*P] (zeroed first; one thread) */
static void fold_col2im(float *dx, const float *cols, const port_conv2d_params *p, int64_t n0, int64_t nbc, int64_t g,
                        int64_t P) {
    int64_t cig = p->c_in / p->groups, HW = p->h * p->w, L = nbc * P;
    for (int64_t i = 0; i < nbc; i++) {
        float *dxg = dx + ((n0 + i) * p->c_in + g * cig) * HW;
        memset(dxg, 0, (size_t)(cig * HW) * sizeof(float));
        for (int64_t ci = 0; ci < cig; ci++)
            col2im_channel(dxg, cols + i * P, L, ci, p->h, p->w, p->kh, p->kw, p->stride_h, p->stride_w, p->pad_h,
                           p->pad_w, 0, port_conv2d_out_h(p), 0, port_conv2d_out_w(p));
    }
}

static void fold_fwd(float *y, const float *x, const float *w, const float *b,
                     const port_conv2d_params *p, int64_t nb, float *ws) {
    int64_t G = p->groups, cig = p->c_in / G, cog = p->c_out / G;
    int64_t P = port_conv2d_out_h(p) * port_conv2d_out_w(p), K = cig * p->kh * p->kw;
    for (int64_t n0 = 0; n0 < p->n; n0 += nb) {
        int64_t nbc = PORT_MIN(nb, p->n - n0), L = nbc * P;
        float *cols = ws, *blk = ws + K * L;
        for (int64_t g = 0; g < G; g++) {
            fold_cols(cols, x, p, n0, nbc, g, K, P);
            port__gemm(0, 0, cog, L, K, 1.0f, w + g * cog * K, K, cols, L, 0.0f, blk, L);
            fold_move(blk, y, b, 0, p, n0, nbc, g, P);
        }
    }
}

static void fold_bwd_in(float *dx, const float *dy, const float *w, const port_conv2d_params *p,
                        int64_t nb, float *ws) {
    int64_t G = p->groups, cig = p->c_in / G, cog = p->c_out / G;
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p), P = ho * wo;
    int64_t K = cig * p->kh * p->kw, HW = p->h * p->w;
    for (int64_t n0 = 0; n0 < p->n; n0 += nb) {
        int64_t nbc = PORT_MIN(nb, p->n - n0), L = nbc * P;
        float *cols = ws, *blk = ws + K * L;
        memset(dx + n0 * p->c_in * HW, 0, (size_t)(nbc * p->c_in * HW) * sizeof(float));
        for (int64_t g = 0; g < G; g++) {
            fold_move(blk, (float *)dy, NULL, 1, p, n0, nbc, g, P);
            port__gemm(1, 0, K, L, cog, 1.0f, w + g * cog * K, K, blk, L, 0.0f, cols, L);
#pragma omp parallel for schedule(static) if (K * L > 4 * PORT_PAR_MIN)
            for (int64_t s = 0; s < nbc * cig; s++) {
                int64_t i = s / cig, ci = s % cig;
                float *dxg = dx + ((n0 + i) * p->c_in + g * cig) * HW;
                col2im_channel(dxg, cols + i * P, L, ci, p->h, p->w, p->kh, p->kw, p->stride_h,
                               p->stride_w, p->pad_h, p->pad_w, 0, ho, 0, wo);
            }
        }
    }
}

static void fold_bwd_w(float *dw, const float *dy, const float *x, const port_conv2d_params *p,
                       int64_t nb, float *ws, int overwrite) {
    int64_t G = p->groups, cig = p->c_in / G, cog = p->c_out / G;
    int64_t P = port_conv2d_out_h(p) * port_conv2d_out_w(p), K = cig * p->kh * p->kw;
    for (int64_t n0 = 0; n0 < p->n; n0 += nb) {
        int64_t nbc = PORT_MIN(nb, p->n - n0), L = nbc * P;
        float *cols = ws, *blk = ws + K * L;
        for (int64_t g = 0; g < G; g++) {
            fold_move(blk, (float *)dy, NULL, 1, p, n0, nbc, g, P);
            fold_cols(cols, x, p, n0, nbc, g, K, P);
            port__gemm(0, 1, cog, K, L, 1.0f, blk, L, cols, L, overwrite && n0 == 0 ? 0.0f : 1.0f,
                       dw + g * cog * K, K);
        }
    }
}

/* ---------------- slot drivers (small products: one region over the images) ----------------
 * RegNet's 1x1 convolutions on 2x2 .. 8x8 maps (104 .. 440 channels, batch 32) and the per-image products of
 * small maps' convolutions: the drivers above and below run chunk by chunk (image by image where nothing is
 * folded), the GEMM of each threading itself, the copies between them on one thread -- a region per chunk,
 * and per-image products under PORT_GEMM_PAR_MIN on one thread in all: RegNet-Y-400MF's 1x1 layers ran
 * 1.0-1.4x faster on 2 threads than on 1.  Here ONE region splits work items (a chunk of images x a group):
 * slot s runs items s, s + S, ... on one thread, every step of an item single-threaded -- its products have the
 * same shapes at any thread count, so the same bits.  Forward and input gradient: items write disjoint outputs,
 * PORT_CONV_SLOTS slots (2: each slot is a fold's buffers of workspace -- 4 made digits_cnn's smallest plan's
 * peak 1.5x -- and 2 threads split them evenly).  Weight gradient: the items sum into dw; slot 0 into dw itself,
 * slot s > 0 into its own partial [c_out, K], added to dw after all the slots in slot order (a fixed order),
 * PORT_CONV_SLOTS_W slots (each partial is a weight's size of workspace).  A chunk is conv_fold / conv_fold_w
 * images, at most half the batch (two items at least), fewer where that makes an odd number of items under 8
 * even.  Used where one forward item's GEMM is at most PORT_CONV_SLOT_MAX_MACS multiply-adds (larger products
 * split well themselves) and the whole call has the work to open a region (smaller ones keep the drivers above,
 * and their smaller workspace): slot_ok. */
#ifndef PORT_CONV_SLOTS
#define PORT_CONV_SLOTS 2
#endif
#ifndef PORT_CONV_SLOTS_W
#define PORT_CONV_SLOTS_W 2
#endif
#ifndef PORT_CONV_SLOT_MAX_MACS
#define PORT_CONV_SLOT_MAX_MACS 33554432.0
#endif
typedef struct {
    int64_t nb, chunks, items, S, slot; /* images a chunk, chunks, items (chunks x groups), slots, floats a slot */
} slot_geom;
static slot_geom slot_geometry(const port_conv2d_params *p, int a, int wgrad) {
    slot_geom s;
    int64_t K = p->c_in / p->groups * p->kh * p->kw, cog = p->c_out / p->groups;
    int64_t P = port_conv2d_out_h(p) * port_conv2d_out_w(p);
    s.nb = PORT_MAX(1, PORT_MIN(wgrad ? conv_fold_w(p, a) : conv_fold(p, a), (p->n + 1) / 2));
    s.chunks = (p->n + s.nb - 1) / s.nb;
    if (s.chunks * p->groups % 2 && s.chunks * p->groups < 8) { /* 3 items on 2 threads: 2/3 of the rate */
        s.nb = (p->n + s.chunks) / (s.chunks + 1);
        s.chunks = (p->n + s.nb - 1) / s.nb;
    }
    s.items = s.chunks * p->groups;
    s.S = PORT_MIN(s.items, wgrad ? PORT_CONV_SLOTS_W : PORT_CONV_SLOTS);
    int direct = a == PORT_CONV_DIRECT; /* pointwise here: its image is its own im2col matrix */
    s.slot = s.nb > 1 ? (K + cog) * s.nb * P : (direct ? 0 : K * P);
    return s;
}
static int slot_ok(const port_conv2d_params *p, int a) {
    if (a == PORT_CONV_WINOGRAD || (a == PORT_CONV_DIRECT && port__conv_is_depthwise(p) && !port__conv_is_pointwise(p)))
        return 0;
    if (p->n < 2 || conv_grouped(p, a)) return 0;
    slot_geom s = slot_geometry(p, a, 0);
    double K = (double)(p->c_in / p->groups * p->kh * p->kw), cog = (double)(p->c_out / p->groups);
    double P = (double)(port_conv2d_out_h(p) * port_conv2d_out_w(p));
    return cog * K * (double)s.nb * P <= PORT_CONV_SLOT_MAX_MACS && /* and work for a region (slot_par) */
           (double)p->n * (double)p->c_out * K * P > PORT_PAR_MIN_MACS;
}
static int64_t slot_ws_floats(const port_conv2d_params *p, int a) {
    slot_geom f = slot_geometry(p, a, 0), w = slot_geometry(p, a, 1);
    int64_t wsize = p->c_out * (p->c_in / p->groups) * p->kh * p->kw;
    return PORT_MAX(f.S * f.slot, w.S * w.slot + (w.S - 1) * wsize);
}
/* whether a slot driver opens a region: enough multiply-adds in all (else one thread runs the slots) */
static int slot_par(const port_conv2d_params *p) { return group_par(p); }

/* one item of the forward (step 0) or the input gradient (step 1): images n0 .. n0+nbc-1, group g */
static void slot_item(int step, float *out, const float *t, const float *w, const float *b,
                      const port_conv2d_params *p, int a, int64_t n0, int64_t nbc, int64_t g, float *sl) {
    int64_t G = p->groups, cig = p->c_in / G, cog = p->c_out / G, K = cig * p->kh * p->kw;
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p), P = ho * wo, HW = p->h * p->w;
    const float *wg = w + g * cog * K;
    int direct = a == PORT_CONV_DIRECT;
    if (nbc == 1 && step == 0) {
        const float *xg = t + (n0 * p->c_in + g * cig) * HW;
        float *yg = out + (n0 * p->c_out + g * cog) * P, beta = 0.0f;
        if (b) {
            for (int64_t co = 0; co < cog; co++)
                for (int64_t q = 0; q < P; q++) yg[co * P + q] = b[g * cog + co];
            beta = 1.0f;
        }
        if (!direct) port__im2col_part(sl, P, xg, p, 0, K, 0, 0, ho, 0, wo);
        port__gemm(0, 0, cog, P, K, 1.0f, wg, K, direct ? xg : sl, P, beta, yg, P);
    } else if (nbc == 1) {
        float *dxg = out + (n0 * p->c_in + g * cig) * HW;
        const float *dyg = t + (n0 * p->c_out + g * cog) * P;
        if (direct) {
            port__gemm(1, 0, K, P, cog, 1.0f, wg, K, dyg, P, 0.0f, dxg, P);
            return;
        }
        port__gemm(1, 0, K, P, cog, 1.0f, wg, K, dyg, P, 0.0f, sl, P);
        for (int64_t ci = 0; ci < cig; ci++) memset(dxg + ci * HW, 0, (size_t)HW * sizeof(float));
        port__col2im_tile(dxg, sl, cig, p->h, p->w, p->kh, p->kw, p->stride_h, p->stride_w, p->pad_h, p->pad_w, 0,
                          ho, 0, wo);
    } else if (step == 0) {
        int64_t L = nbc * P;
        float *cols = sl, *blk = sl + K * L;
        fold_cols(cols, t, p, n0, nbc, g, K, P);
        port__gemm(0, 0, cog, L, K, 1.0f, wg, K, cols, L, 0.0f, blk, L);
        fold_move(blk, out, b, 0, p, n0, nbc, g, P);
    } else {
        int64_t L = nbc * P;
        float *cols = sl, *blk = sl + K * L;
        fold_move(blk, (float *)t, NULL, 1, p, n0, nbc, g, P);
        port__gemm(1, 0, K, L, cog, 1.0f, wg, K, blk, L, 0.0f, cols, L);
        fold_col2im(out, cols, p, n0, nbc, g, P);
    }
}

static void slot_fwd(int step, float *out, const float *t, const float *w, const float *b,
                     const port_conv2d_params *p, int a, float *ws) {
    slot_geom s = slot_geometry(p, a, 0);
#pragma omp parallel for schedule(static) if (slot_par(p))
    for (int64_t sl = 0; sl < s.S; sl++)
        for (int64_t it = sl; it < s.items; it += s.S) {
            int64_t c = it / p->groups, g = it % p->groups, n0 = c * s.nb;
            slot_item(step, out, t, w, b, p, a, n0, PORT_MIN(s.nb, p->n - n0), g, ws + sl * s.slot);
        }
}

/* dwo[g's rows] = beta * dwo[g's rows] + the weight gradient of images n0 .. n0+nbc-1, group g (beta 0 or 1) */
static void slot_item_w(float *dwo, const float *dy, const float *x, const port_conv2d_params *p, int a, int64_t n0,
                        int64_t nbc, int64_t g, float *sl, float beta) {
    int64_t G = p->groups, cig = p->c_in / G, cog = p->c_out / G, K = cig * p->kh * p->kw;
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p), P = ho * wo, HW = p->h * p->w;
    float *dwg = dwo + g * cog * K;
    if (nbc == 1) {
        const float *xg = x + (n0 * p->c_in + g * cig) * HW, *dyg = dy + (n0 * p->c_out + g * cog) * P;
        if (a != PORT_CONV_DIRECT) port__im2col_part(sl, P, xg, p, 0, K, 0, 0, ho, 0, wo);
        port__gemm(0, 1, cog, K, P, 1.0f, dyg, P, a != PORT_CONV_DIRECT ? sl : xg, P, beta, dwg, K);
        return;
    }
    int64_t L = nbc * P;
    float *cols = sl, *blk = sl + K * L;
    fold_move(blk, (float *)dy, NULL, 1, p, n0, nbc, g, P);
    fold_cols(cols, x, p, n0, nbc, g, K, P);
    port__gemm(0, 1, cog, K, L, 1.0f, blk, L, cols, L, beta, dwg, K);
}

static void slot_bwd_w(float *dw, const float *dy, const float *x, const port_conv2d_params *p, int a, float *ws,
                       int overwrite) {
    slot_geom s = slot_geometry(p, a, 1);
    int64_t wsize = p->c_out * (p->c_in / p->groups) * p->kh * p->kw;
    float *part = ws + s.S * s.slot; /* slot sl > 0: part + (sl - 1) * wsize */
    /* a slot that starts from zeros (s > 0; slot 0 where dw is overwritten): with one group its first item's
     * GEMM overwrites, with several the sums are zeroed first */
    int first_each = p->groups == 1;
#pragma omp parallel if (slot_par(p))
    {
#pragma omp for schedule(static)
        for (int64_t sl = 0; sl < s.S; sl++) {
            float *dwo = sl == 0 ? dw : part + (sl - 1) * wsize;
            int zero = sl > 0 || overwrite; /* dwo starts from zeros */
            if (zero && !first_each) memset(dwo, 0, (size_t)wsize * sizeof(float));
            for (int64_t it = sl; it < s.items; it += s.S) {
                int64_t c = it / p->groups, g = it % p->groups, n0 = c * s.nb;
                float beta = zero && first_each && it == sl ? 0.0f : 1.0f;
                slot_item_w(dwo, dy, x, p, a, n0, PORT_MIN(s.nb, p->n - n0), g, ws + sl * s.slot, beta);
            }
        }
#pragma omp for schedule(static)
        for (int64_t e = 0; e < wsize; e++)
            for (int64_t sl = 1; sl < s.S; sl++) dw[e] += part[(sl - 1) * wsize + e];
    }
}

/* ---------------- grouped drivers (groups > 1, small per-group GEMMs) ----------------
 * ResNeXt's and RegNet's grouped 3x3 convolutions (32 groups of 4..32 channels) make per-group GEMMs of a few
 * thousand to a few hundred thousand multiply-adds: the drivers above thread inside each of them (im2col rows,
 * GEMM blocks), one parallel region per group and image -- hundreds of regions per call, each costing more than
 * its work (a 4 x 36 x 256 product is ~3 us; a region up to a scheduler slice on a loaded machine).  Here ONE
 * region splits the groups: GROUP_SLOTS workspace slots, slot s runs groups s, s + S, ... each on one thread,
 * every step of a group (im2col, GEMM, col2im, scatter) single-threaded -- its products have the same shapes,
 * so the same bits, at any thread count.  Images are folded into a group's GEMM as conv_fold / conv_fold_w say.
 * Used by PORT_CONV_IM2COL where groups > 1 and one image's per-group GEMM is below PORT_GEMM_PAR_MIN (a GEMM
 * the GEMM itself would not split): conv_grouped.  A group runs in the vector lanes on small maps
 * (group_lane_ok), else through flat phase planes where their runs pay (group_flat_ok), else as im2col + GEMM. */
#ifndef PORT_CONV_GROUP_SLOTS
#define PORT_CONV_GROUP_SLOTS 16
#endif
static int conv_grouped(const port_conv2d_params *p, int a) {
    if (a != PORT_CONV_IM2COL || p->groups < 2) return 0;
    double K = (double)(p->c_in / p->groups * p->kh * p->kw), P = (double)port_conv2d_out_h(p) * port_conv2d_out_w(p);
    return (double)(p->c_out / p->groups) * K * P < PORT_GEMM_PAR_MIN;
}
static int64_t group_slots(const port_conv2d_params *p) { return PORT_MIN(p->groups, PORT_CONV_GROUP_SLOTS); }
/* floats of one slot: the im2col matrix of a fold [K, nb*P], and the output/gradient block [cog, nb*P] when
 * nb > 1 (conv_fold_w <= conv_fold: the forward's fold sizes it) */
#if PORT_DW_PAD_MAX > 0
static int group_lane_ok(const port_conv2d_params *p);
static int64_t group_lane_floats(const port_conv2d_params *p);
#else
#define group_lane_ok(p) 0
#define group_lane_floats(p) 0
#endif
static int group_flat_ok(const port_conv2d_params *p);
static int64_t group_flat_floats(const port_conv2d_params *p);
static int64_t group_slot_floats(const port_conv2d_params *p, int a) {
    if (group_lane_ok(p)) return group_lane_floats(p);
    if (group_flat_ok(p)) return group_flat_floats(p);
    int64_t K = p->c_in / p->groups * p->kh * p->kw, cog = p->c_out / p->groups;
    int64_t P = port_conv2d_out_h(p) * port_conv2d_out_w(p), nb = conv_fold(p, a);
    return (K + (nb > 1 ? cog : 0)) * nb * P;
}
/* Whether the grouped drivers open a region: enough multiply-adds in all (else one thread runs the slots). */
static int group_par(const port_conv2d_params *p) {
    double macs = (double)p->n * (double)p->c_out * (double)(p->c_in / p->groups * p->kh * p->kw) *
                  (double)(port_conv2d_out_h(p) * port_conv2d_out_w(p));
    return macs > PORT_PAR_MIN_MACS && !port__in_parallel();
}

/* cols[K, nbc*P] of group g, images n0..n0+nbc-1 (one thread).  im2col_row's work without its per-row setup:
 * the valid output columns of each kernel column come from one table (dw_cols) and the rows are walked by
 * (channel, ki, kj) -- on 4x4 .. 16x16 maps a row is a few vectors and the setup cost more than the copy. */
__attribute__((optimize("no-tree-loop-distribute-patterns")))
static void group_cols(float *cols, const float *x, const port_conv2d_params *p, int64_t n0, int64_t nbc,
                       int64_t g, int64_t P) {
    int64_t cig = p->c_in / p->groups, HW = p->h * p->w, L = nbc * P, H = p->h, W = p->w;
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p), kh = p->kh, kw = p->kw, sh = p->stride_h;
    int64_t sw = p->stride_w, ph = p->pad_h, pw = p->pad_w;
    dw_cols vc;
    dw_cols_init(&vc, p, wo);
    for (int64_t i = 0; i < nbc; i++)
        for (int64_t ci = 0; ci < cig; ci++) {
            const float *xc = x + ((n0 + i) * p->c_in + g * cig + ci) * HW;
            for (int64_t ki = 0; ki < kh; ki++)
                for (int64_t kj = 0; kj < kw; kj++) {
                    float *d0 = cols + ((ci * kh + ki) * kw + kj) * L + i * P;
                    int64_t lo, hi;
                    dw_range(&vc, p, wo, kj, &lo, &hi);
                    for (int64_t oy = 0; oy < ho; oy++) {
                        int64_t ih = oy * sh - ph + ki;
                        float *d = d0 + oy * wo;
                        if (ih < 0 || ih >= H) {
                            for (int64_t ox = 0; ox < wo; ox++) d[ox] = 0.0f;
                            continue;
                        }
                        const float *xr = xc + ih * W - pw + kj;
                        for (int64_t ox = 0; ox < lo; ox++) d[ox] = 0.0f;
                        if (sw == 1)
                            for (int64_t ox = lo; ox < hi; ox++) d[ox] = xr[ox];
                        else
                            for (int64_t ox = lo; ox < hi; ox++) d[ox] = xr[ox * sw];
                        for (int64_t ox = hi; ox < wo; ox++) d[ox] = 0.0f;
                    }
                }
        }
}

/* Group g's gradient block of images n0..n0+nbc-1 as a [cog, nbc*P] matrix (one thread): dy's own block for one
 * image, else gathered into blk (blk[co, i*P + q] = dy[n0+i, g*cog+co, q]). */
static const float *group_dy(float *blk, const float *dy, const port_conv2d_params *p, int64_t n0, int64_t nbc,
                             int64_t g, int64_t P) {
    int64_t cog = p->c_out / p->groups, L = nbc * P;
    if (nbc == 1) return dy + (n0 * p->c_out + g * cog) * P;
    for (int64_t i = 0; i < nbc; i++)
        for (int64_t co = 0; co < cog; co++)
            memcpy(blk + co * L + i * P, dy + ((n0 + i) * p->c_out + g * cog + co) * P, (size_t)P * sizeof(float));
    return blk;
}

static void group_fwd_one(float *y, const float *x, const float *w, const float *b, const port_conv2d_params *p,
                          int64_t g, float *slot) {
    int64_t cog = p->c_out / p->groups, K = p->c_in / p->groups * p->kh * p->kw;
    int64_t P = port_conv2d_out_h(p) * port_conv2d_out_w(p), nb = conv_fold(p, PORT_CONV_IM2COL);
    const float *wg = w + g * cog * K;
    for (int64_t n0 = 0; n0 < p->n; n0 += nb) {
        int64_t nbc = PORT_MIN(nb, p->n - n0), L = nbc * P;
        float *cols = slot, *blk = slot + K * L;
        group_cols(cols, x, p, n0, nbc, g, P);
        if (nbc == 1) { /* one image: the group's output block is contiguous, the GEMM writes it in place */
            float *yg = y + (n0 * p->c_out + g * cog) * P, beta = 0.0f;
            if (b) {
                for (int64_t co = 0; co < cog; co++)
                    for (int64_t q = 0; q < P; q++) yg[co * P + q] = b[g * cog + co];
                beta = 1.0f;
            }
            port__gemm(0, 0, cog, P, K, 1.0f, wg, K, cols, P, beta, yg, P);
            continue;
        }
        port__gemm(0, 0, cog, L, K, 1.0f, wg, K, cols, L, 0.0f, blk, L);
        for (int64_t i = 0; i < nbc; i++)
            for (int64_t co = 0; co < cog; co++) {
                float *tp = y + ((n0 + i) * p->c_out + g * cog + co) * P;
                const float *bp = blk + co * L + i * P;
                float bv = b ? b[g * cog + co] : 0.0f;
                for (int64_t q = 0; q < P; q++) tp[q] = bp[q] + bv;
            }
    }
}

static void group_bwd_in_one(float *dx, const float *dy, const float *w, const port_conv2d_params *p, int64_t g,
                             float *slot) {
    int64_t cig = p->c_in / p->groups, cog = p->c_out / p->groups, K = cig * p->kh * p->kw;
    int64_t P = port_conv2d_out_h(p) * port_conv2d_out_w(p), nb = conv_fold(p, PORT_CONV_IM2COL);
    const float *wg = w + g * cog * K;
    for (int64_t n0 = 0; n0 < p->n; n0 += nb) {
        int64_t nbc = PORT_MIN(nb, p->n - n0), L = nbc * P;
        float *cols = slot;
        port__gemm(1, 0, K, L, cog, 1.0f, wg, K, group_dy(slot + K * L, dy, p, n0, nbc, g, P), L, 0.0f, cols, L);
        fold_col2im(dx, cols, p, n0, nbc, g, P);
    }
}

static void group_bwd_w_one(float *dw, const float *dy, const float *x, const port_conv2d_params *p, int64_t g,
                            float *slot, int overwrite) {
    int64_t cog = p->c_out / p->groups, K = p->c_in / p->groups * p->kh * p->kw;
    int64_t P = port_conv2d_out_h(p) * port_conv2d_out_w(p), nb = conv_fold_w(p, PORT_CONV_IM2COL);
    float *dwg = dw + g * cog * K;
    for (int64_t n0 = 0; n0 < p->n; n0 += nb) {
        int64_t nbc = PORT_MIN(nb, p->n - n0), L = nbc * P;
        float *cols = slot;
        const float *A = group_dy(slot + K * L, dy, p, n0, nbc, g, P);
        group_cols(cols, x, p, n0, nbc, g, P);
        port__gemm(0, 1, cog, K, L, 1.0f, A, L, cols, L, overwrite && n0 == 0 ? 0.0f : 1.0f, dwg, K);
    }
}

#if PORT_DW_PAD_MAX > 0
/* ---------------- grouped, a block of 16 images in the vector lanes ----------------
 * RegNet's groups of 8 channels on 8x8 .. 2x2 maps: one group's GEMM is [8 x 72] x [72 x a few dozen columns],
 * far below the GEMM's rate.  As the depthwise lane kernels: lane j holds image n0 + j, and a group's planes of a
 * block of 16 images are gathered into lane-major buffers in its slot: xt[cig][H*W][16], yt / dyt[cog][P][16];
 * only the real taps run (exact row and column ranges).
 *   forward: y[co](p) = bias + sum over (ci, ki, kj) in order, eight output channels at once;
 *   input gradient: dxt[ci](q) += (sum over co in order of w * dy[co](p)), outputs and taps in order (an
 *   output's dy vectors loaded once);
 *   weight gradient: acc[co][ci][tap] (lanes, in the slot) += dy * x over the blocks and outputs in order, then
 *   the 16 lanes summed pairwise (dw_tap_dots' order); tap by tap, eight output channels' sums in registers
 *   (a sum in memory per output and tap was load/store-bound: 1.9x torch's weight gradient on 8x8 maps).
 * Used by the grouped driver when a group has at most LANE_CH channels each way and the map is small
 * (group_lane_ok); the slot holds the buffers (group_slot_floats). */
#define LANE_CH 16
static int group_lane_ok(const port_conv2d_params *p) {
    int64_t cig = p->c_in / p->groups, cog = p->c_out / p->groups;
    return p->groups > 1 && p->n >= DW_LANE_MIN_N && cig <= LANE_CH && cog <= LANE_CH && p->h * p->w <= 64 &&
           p->kh * p->kw <= 25;
}
static int64_t group_lane_floats(const port_conv2d_params *p) {
    int64_t cig = p->c_in / p->groups, cog = p->c_out / p->groups;
    int64_t P = port_conv2d_out_h(p) * port_conv2d_out_w(p);
    return (cig * p->h * p->w + cog * P + cog * cig * p->kh * p->kw) * DW_LB;
}

PORT_ISA_CLONES static void grp_lane_fwd_item(float *yt, const float *xt, const float *wg, const float *bg,
                                              const port_conv2d_params *p) {
    LANE_GEOM(p);
    for (int64_t oh = 0; oh < ho; oh++)
        for (int64_t ow = 0; ow < wo; ow++) {
            LANE_WINDOW(p, oh, ow);
            int64_t co = 0;
            for (; co + 4 <= cog; co += 4) {
                const float *w0 = wg + co * K;
                dw_v16f a0 = PORT_V16_SPLAT(bg ? bg[co] : 0.0f), a1 = PORT_V16_SPLAT(bg ? bg[co + 1] : 0.0f);
                dw_v16f a2 = PORT_V16_SPLAT(bg ? bg[co + 2] : 0.0f), a3 = PORT_V16_SPLAT(bg ? bg[co + 3] : 0.0f);
                for (int64_t ci = 0; ci < cig; ci++)
                    for (int64_t ki = i0; ki < i1; ki++)
                        for (int64_t kj = j0; kj < j1; kj++) {
                            dw_v16f xv = PORT_V16_LD(xt + (ci * HW + q0 + ki * W + kj) * DW_LB);
                            int64_t k = (ci * kh + ki) * kw + kj;
                            a0 += PORT_V16_SPLAT(w0[k]) * xv;
                            a1 += PORT_V16_SPLAT(w0[K + k]) * xv;
                            a2 += PORT_V16_SPLAT(w0[2 * K + k]) * xv;
                            a3 += PORT_V16_SPLAT(w0[3 * K + k]) * xv;
                        }
                float *yp = yt + (co * P + oh * wo + ow) * DW_LB;
                PORT_V16_ST(yp, a0);
                PORT_V16_ST(yp + P * DW_LB, a1);
                PORT_V16_ST(yp + 2 * P * DW_LB, a2);
                PORT_V16_ST(yp + 3 * P * DW_LB, a3);
            }
            for (; co < cog; co++) {
                dw_v16f a = PORT_V16_SPLAT(bg ? bg[co] : 0.0f);
                for (int64_t ci = 0; ci < cig; ci++)
                    for (int64_t ki = i0; ki < i1; ki++)
                        for (int64_t kj = j0; kj < j1; kj++)
                            a += PORT_V16_SPLAT(wg[co * K + (ci * kh + ki) * kw + kj]) *
                                 PORT_V16_LD(xt + (ci * HW + q0 + ki * W + kj) * DW_LB);
                PORT_V16_ST(yt + (co * P + oh * wo + ow) * DW_LB, a);
            }
        }
}

/* the input gradient of one block; dy's cog vectors of an output are loaded once (c8: cog is 8, a constant, so they
 * stay in registers) */
PORT_ALWAYS_INLINE void grp_lane_bwd_in_body(float *dxt, const float *dyt, const float *wg, const port_conv2d_params *p,
                                             const int c8) {
    LANE_GEOM(p);
    int64_t nco = c8 ? 8 : cog;
    memset(dxt, 0, (size_t)(cig * HW * DW_LB) * sizeof(float));
    for (int64_t oh = 0; oh < ho; oh++)
        for (int64_t ow = 0; ow < wo; ow++) {
            LANE_WINDOW(p, oh, ow);
            const float *d = dyt + (oh * wo + ow) * DW_LB;
            dw_v16f dv[LANE_CH];
            for (int64_t co = 0; co < nco; co++) dv[co] = PORT_V16_LD(d + co * P * DW_LB);
            for (int64_t ki = i0; ki < i1; ki++)
                for (int64_t kj = j0; kj < j1; kj++)
                    for (int64_t ci = 0; ci < cig; ci++) {
                        int64_t k = (ci * kh + ki) * kw + kj;
                        dw_v16f s = PORT_V16_SPLAT(wg[k]) * dv[0];
                        for (int64_t co = 1; co < nco; co++) s += PORT_V16_SPLAT(wg[co * K + k]) * dv[co];
                        float *t = dxt + (ci * HW + q0 + ki * W + kj) * DW_LB;
                        PORT_V16_ST(t, PORT_V16_LD(t) + s);
                    }
        }
}
PORT_ISA_CLONES static void grp_lane_bwd_in_item(float *dxt, const float *dyt, const float *wg,
                                                 const port_conv2d_params *p) {
    if (p->c_out / p->groups == 8) grp_lane_bwd_in_body(dxt, dyt, wg, p, 1);
    else grp_lane_bwd_in_body(dxt, dyt, wg, p, 0);
}

/* acc[i * K] += dy[i](oh, ow) * x(q0 + oh*sh*W + ow*sw) over the outputs [oh0, oh1) x [ow0, ow1) in order, i < mr
 * (a constant: the mr partial sums stay in registers) -- one tap of mr output channels */
PORT_ALWAYS_INLINE void grp_lane_dw_tap(float *acc, int64_t K, const float *xt, const float *dyt, int64_t P, int64_t q0,
                                        int64_t W, int64_t sh, int64_t sw, int64_t wo, int64_t oh0, int64_t oh1,
                                        int64_t ow0, int64_t ow1, const int mr) {
    dw_v16f a[8];
    for (int i = 0; i < mr; i++) a[i] = PORT_V16_LD(acc + i * K * DW_LB);
    for (int64_t oh = oh0; oh < oh1; oh++)
        for (int64_t ow = ow0; ow < ow1; ow++) {
            dw_v16f xv = PORT_V16_LD(xt + (q0 + oh * sh * W + ow * sw) * DW_LB);
            const float *d = dyt + (oh * wo + ow) * DW_LB;
            for (int i = 0; i < mr; i++) a[i] += PORT_V16_LD(d + i * P * DW_LB) * xv;
        }
    for (int i = 0; i < mr; i++) PORT_V16_ST(acc + i * K * DW_LB, a[i]);
}
/* acc[(co * cig + ci) * kk + tap] += dy[co](p) * x[ci](q) over the outputs p where the tap is valid, in order (tap
 * by tap, eight output channels at once: the partial sums stay in registers; on the smallest maps output by output,
 * the same sums in the same order) */
PORT_ISA_CLONES static void grp_lane_bwd_w_item(float *acc, const float *xt, const float *dyt,
                                                const port_conv2d_params *p) {
    LANE_GEOM(p);
    if (P < 16) {   /* 3x3 and 2x2 maps: a tap has one to four outputs, too few to pay for loading its sums */
        for (int64_t oh = 0; oh < ho; oh++)
            for (int64_t ow = 0; ow < wo; ow++) {
                LANE_WINDOW(p, oh, ow);
                const float *d = dyt + (oh * wo + ow) * DW_LB;
                for (int64_t ci = 0; ci < cig; ci++)
                    for (int64_t ki = i0; ki < i1; ki++)
                        for (int64_t kj = j0; kj < j1; kj++) {
                            dw_v16f xv = PORT_V16_LD(xt + (ci * HW + q0 + ki * W + kj) * DW_LB);
                            float *a = acc + ((ci * kh + ki) * kw + kj) * DW_LB;
                            for (int64_t co = 0; co < cog; co++)
                                PORT_V16_ST(a + co * K * DW_LB,
                                            PORT_V16_LD(a + co * K * DW_LB) + PORT_V16_LD(d + co * P * DW_LB) * xv);
                        }
            }
        return;
    }
    int64_t r0[DW_LANE_TAPS], r1[DW_LANE_TAPS], c0[DW_LANE_TAPS], c1[DW_LANE_TAPS];   /* kh, kw <= 25 */
    for (int64_t ki = 0; ki < kh; ki++) {   /* the outputs tap (ki, kj) is valid for: rows [r0, r1), columns [c0, c1) */
        r0[ki] = PORT_MAX(0, cdiv(ph - ki, sh));
        r1[ki] = PORT_MIN(ho, fdiv(H - 1 + ph - ki, sh) + 1);
    }
    for (int64_t kj = 0; kj < kw; kj++) {
        c0[kj] = PORT_MAX(0, cdiv(pw - kj, sw));
        c1[kj] = PORT_MIN(wo, fdiv(W - 1 + pw - kj, sw) + 1);
    }
    for (int64_t ci = 0; ci < cig; ci++)
        for (int64_t ki = 0; ki < kh; ki++)
            for (int64_t kj = 0; kj < kw; kj++) {
                if (r1[ki] <= r0[ki] || c1[kj] <= c0[kj]) continue;
                int64_t k = (ci * kh + ki) * kw + kj, q0 = ci * HW + (ki - ph) * W + kj - pw, co = 0;
#define TAP(mr) grp_lane_dw_tap(acc + (co * K + k) * DW_LB, K, xt, dyt + co * P * DW_LB, P, q0, W, sh, sw, wo, r0[ki], \
                                r1[ki], c0[kj], c1[kj], mr)
                for (; co + 8 <= cog; co += 8) TAP(8);
                for (; co + 4 <= cog; co += 4) TAP(4);
                for (; co < cog; co++) TAP(1);
#undef TAP
            }
}

/* group g, every block of images, in the slot: step 0 forward, 1 input gradient, 2 weight gradient (3: over dw) */
static void group_lane_one(int step, float *out, const float *t0, const float *t1, const float *b,
                           const port_conv2d_params *p, int64_t g, float *slot) {
    int64_t N = p->n, C = p->c_in, CO = p->c_out, HW = p->h * p->w, P = port_conv2d_out_h(p) * port_conv2d_out_w(p);
    int64_t cig = C / p->groups, cog = CO / p->groups, K = cig * p->kh * p->kw;
    float *xt = slot, *yt = slot + cig * HW * DW_LB, *acc = yt + cog * P * DW_LB;
    if (step >= 2) memset(acc, 0, (size_t)(cog * K * DW_LB) * sizeof(float));
    for (int64_t n0 = 0; n0 < N; n0 += DW_LB) {
        int64_t m = PORT_MIN(DW_LB, N - n0);
        if (step != 1)   /* x: t0 (forward) or t1 (weight gradient, after dy) */
            for (int64_t ci = 0; ci < cig; ci++)
                dw_lane_gather(xt + ci * HW * DW_LB, (step == 0 ? t0 : t1) + (n0 * C + g * cig + ci) * HW, C * HW, m,
                               1, HW, HW, 0);
        if (step != 0)   /* dy: t0 */
            for (int64_t co = 0; co < cog; co++)
                dw_lane_gather(yt + co * P * DW_LB, t0 + (n0 * CO + g * cog + co) * P, CO * P, m, 1, P, P, 0);
        if (step == 0) {
            grp_lane_fwd_item(yt, xt, t1 + g * cog * K, b ? b + g * cog : NULL, p);
            for (int64_t co = 0; co < cog; co++)
                dw_lane_scatter(out + (n0 * CO + g * cog + co) * P, CO * P, m, P, yt + co * P * DW_LB);
        } else if (step == 1) {
            grp_lane_bwd_in_item(xt, yt, t1 + g * cog * K, p);
            for (int64_t ci = 0; ci < cig; ci++)
                dw_lane_scatter(out + (n0 * C + g * cig + ci) * HW, C * HW, m, HW, xt + ci * HW * DW_LB);
        } else {
            grp_lane_bwd_w_item(acc, xt, yt, p);
        }
    }
    if (step < 2) return;
    float *dwg = out + g * cog * K;
    for (int64_t k = 0; k < cog * K; k++) {
        float t = dw_lane_sum(acc + k * DW_LB);
        dwg[k] = step == 3 ? t : dwg[k] + t;
    }
}
#else
#define group_lane_one(step, out, t0, t1, b, p, g, slot) ((void)0)
#endif

/* ---------------- grouped, flat phase planes ----------------
 * RegNet's stride-2 grouped layers on 32x32 and 16x16 inputs (groups of 8 channels): im2col writes kh*kw copies
 * of the input for [8 x 72] x [72 x P] products far below the GEMM's rate, and the lane kernels' buffers (whole
 * planes of 16 images) would be 2.5x the slot.  Here the taps read the input in place: the zero-padded input of a
 * channel is split into its stride phases (phase (a, b) holds xpad[u*sh + a][v*sw + b]) in planes of
 * R = ho + (kh-1)/sh rows of ws = wo + (kw-1)/sw floats, so tap (ki, kj) of output (oh, ow) is phase
 * (ki % sh, kj % sw) at flat position oh*ws + ow + (ki/sh)*ws + kj/sw: every tap is one flat run over the outputs
 * (the (kw-1)/sw extra columns per row are computed and dropped), and a step is a product whose B rows are those
 * runs.  The planes of m images are stacked, one under the other (as dw_stack), for runs of ~FLAT_COLS.
 *   forward: C[co] = bias + sum over taps (ci, ki, kj) in order of w * run, 8 output channels x 32 positions at
 *            once (flat_mm);
 *   input gradient: per input phase (a, b), dx's phase plane = dy (zero-padded by (kh-1)/sh rows and (kw-1)/sw
 *            columns) correlated with the taps (a + sh t, b + sw t'): the same product, taps in (co, t, t') order;
 *   weight gradient: lanes[co][tap] += dy (in the forward's flat layout, zeros in the dropped columns) * run over
 *            the stacks in order, then the 16 lanes summed pairwise (dw_tap_dots' order) (flat_dots).
 * One thread per group (group_run): the same operations in the same order at any thread count.  Used by the
 * grouped driver for groups of at most FLAT_KMAX taps each way (pad < kernel) where the runs waste at most a
 * third of the positions (group_flat_ok); the slot holds the buffers (group_flat_floats). */
#define FLAT_NR 32      /* positions per step of the products: two 16-float vectors */
#define FLAT_COLS 256   /* positions per stack (images are stacked until a run is this long) */
#define FLAT_KMAX 288   /* taps of a product (its row table is on the stack): 32 channels of a 3x3 kernel */
typedef struct {
    int64_t th, tw, nph, npw;   /* the taps' reach in a phase plane, (kh-1)/sh and (kw-1)/sw; forward phases */
    int64_t R, ws, U, V, Rb, wsb; /* forward planes: rows per image, pitch; input gradient: dx phase planes'
                                   * rows and columns, dy planes' rows per image and pitch */
    int64_t m, Lf, Lb, planef, planeb; /* images per stack, positions per stack (rounded up to FLAT_NR) and
                                        * floats per stacked plane (with the slack the rounding reads) */
} flat_geom;

static int64_t round_up(int64_t v, int64_t q) { return (v + q - 1) / q * q; }
static flat_geom flat_geometry(const port_conv2d_params *p) {
    flat_geom f;
    int64_t sh = p->stride_h, sw = p->stride_w, ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p);
    f.th = (p->kh - 1) / sh;
    f.tw = (p->kw - 1) / sw;
    f.nph = PORT_MIN(sh, p->kh);
    f.npw = PORT_MIN(sw, p->kw);
    f.R = ho + f.th;
    f.ws = wo + f.tw;
    f.U = (p->pad_h + p->h - 1) / sh + 1;
    f.V = (p->pad_w + p->w - 1) / sw + 1;
    f.Rb = f.U + f.th;
    f.wsb = f.V + f.tw;
    f.m = PORT_MAX(1, PORT_MIN(p->n, FLAT_COLS / (f.R * f.ws)));
    f.Lf = round_up((f.m * f.R - f.th) * f.ws, FLAT_NR);
    f.Lb = round_up(((f.m - 1) * f.Rb + f.U) * f.wsb, FLAT_NR);
    f.planef = f.m * f.R * f.ws + f.tw + FLAT_NR;
    f.planeb = f.m * f.Rb * f.wsb + f.tw + FLAT_NR;
    return f;
}
static int group_flat_ok(const port_conv2d_params *p) {
    int64_t cig = p->c_in / p->groups, cog = p->c_out / p->groups;
    if (p->groups < 2 || p->pad_h >= p->kh || p->pad_w >= p->kw || PORT_MIN(p->stride_w, p->kw) > 8 ||
        cig * p->kh * p->kw > FLAT_KMAX ||
        cog * p->kh * p->kw > FLAT_KMAX)
        return 0;
    flat_geom f = flat_geometry(p);
    int64_t P = port_conv2d_out_h(p) * port_conv2d_out_w(p);
    return 3 * f.m * P >= 2 * f.Lf;
}
static int64_t group_flat_floats(const port_conv2d_params *p) {
    flat_geom f = flat_geometry(p);
    int64_t cig = p->c_in / p->groups, cog = p->c_out / p->groups, K = cig * p->kh * p->kw;
    int64_t fwd = cig * f.nph * f.npw * f.planef + cog * f.Lf;
    int64_t bwi = cog * f.planeb + p->stride_h * p->stride_w * cig * f.Lb + PORT_V16_W + cig * cog * p->kh * p->kw;
    return PORT_MAX(fwd + cog * K * PORT_V16_W, bwi);   /* the weight gradient: fwd's buffers and the lanes */
}

/* c[i][l] = (bias ? bias[i] : 0) + sum over k in order of a[i * lda + k] * b[k][l], i < mr, l < L (a multiple of
 * FLAT_NR); mr a constant: the 2 * mr accumulators stay in registers */
PORT_ALWAYS_INLINE void flat_mm_rows(float *c, int64_t ldc, const float *a, int64_t lda, const float *const *b,
                                     const float *bias, int64_t K, int64_t L, const int mr) {
    for (int64_t l = 0; l < L; l += FLAT_NR) {
        port_v16 c0[8] = {0}, c1[8] = {0};
        for (int i = 0; i < mr; i++) {
            c0[i] = PORT_V16_SPLAT(bias ? bias[i] : 0.0f);
            c1[i] = c0[i];
        }
        for (int64_t k = 0; k < K; k++) {
            port_v16 x0 = PORT_V16_LD(b[k] + l), x1 = PORT_V16_LD(b[k] + l + PORT_V16_W);
            for (int i = 0; i < mr; i++) {
                port_v16 av = PORT_V16_SPLAT(a[i * lda + k]);
                c0[i] += av * x0;
                c1[i] += av * x1;
            }
        }
        for (int i = 0; i < mr; i++) {
            PORT_V16_ST(c + i * ldc + l, c0[i]);
            PORT_V16_ST(c + i * ldc + l + PORT_V16_W, c1[i]);
        }
    }
}
PORT_ISA_CLONES static void flat_mm(float *c, int64_t ldc, const float *a, int64_t lda, const float *const *b,
                                    const float *bias, int64_t M, int64_t K, int64_t L) {
    int64_t i = 0;
    for (; i + 8 <= M; i += 8) flat_mm_rows(c + i * ldc, ldc, a + i * lda, lda, b, bias ? bias + i : NULL, K, L, 8);
    for (; i + 4 <= M; i += 4) flat_mm_rows(c + i * ldc, ldc, a + i * lda, lda, b, bias ? bias + i : NULL, K, L, 4);
    for (; i < M; i++) flat_mm_rows(c + i * ldc, ldc, a + i * lda, lda, b, bias ? bias + i : NULL, K, L, 1);
}

/* lanes[(i * K + k) * 16 + j] += sum over l = j (mod 16) in order of d[i * ldd + l] * b[k][l], i < mr, k < kr,
 * l < L (a multiple of 16); constant mr, kr: the accumulators stay in registers */
PORT_ALWAYS_INLINE void flat_dots_block(float *lanes, int64_t K, const float *d, int64_t ldd, const float *const *b,
                                        int64_t L, const int mr, const int kr) {
    port_v16 s[4][4], x[4];
    for (int i = 0; i < mr; i++)
        for (int k = 0; k < kr; k++) s[i][k] = PORT_V16_LD(lanes + (i * K + k) * PORT_V16_W);
    for (int64_t l = 0; l < L; l += PORT_V16_W) {
        for (int k = 0; k < kr; k++) x[k] = PORT_V16_LD(b[k] + l);
        for (int i = 0; i < mr; i++) {
            port_v16 dv = PORT_V16_LD(d + i * ldd + l);
            for (int k = 0; k < kr; k++) s[i][k] += dv * x[k];
        }
    }
    for (int i = 0; i < mr; i++)
        for (int k = 0; k < kr; k++) PORT_V16_ST(lanes + (i * K + k) * PORT_V16_W, s[i][k]);
}
PORT_ISA_CLONES static void flat_dots(float *lanes, const float *d, int64_t ldd, const float *const *b, int64_t M,
                                      int64_t K, int64_t L) {
    for (int64_t i = 0; i < M; i += 4) {
        int64_t k = 0;
        float *li = lanes + i * K * PORT_V16_W;
        if (i + 4 <= M) {
            for (; k + 4 <= K; k += 4) flat_dots_block(li + k * PORT_V16_W, K, d + i * ldd, ldd, b + k, L, 4, 4);
            for (; k < K; k++) flat_dots_block(li + k * PORT_V16_W, K, d + i * ldd, ldd, b + k, L, 4, 1);
            continue;
        }
        for (int64_t r = i; r < M; r++) {
            float *lr = lanes + r * K * PORT_V16_W;
            for (k = 0; k + 4 <= K; k += 4) flat_dots_block(lr + k * PORT_V16_W, K, d + r * ldd, ldd, b + k, L, 1, 4);
            for (; k < K; k++) flat_dots_block(lr + k * PORT_V16_W, K, d + r * ldd, ldd, b + k, L, 1, 1);
        }
    }
}

/* d[0, n) = s[0, n): a map row (4 .. 64 floats), where a library call costs more than the copy */
PORT_ALWAYS_INLINE void flat_copy(float *restrict d, const float *restrict s, int64_t n) {
    int64_t i = 0;
    for (; i + PORT_V16_W <= n; i += PORT_V16_W) PORT_V16_ST(d + i, PORT_V16_LD(s + i));
    if (i + 8 <= n) {
        port_v8 v;
        memcpy(&v, s + i, sizeof v);
        memcpy(d + i, &v, sizeof v);
        i += 8;
    }
    for (; i < n; i++) {
        d[i] = s[i];
        __asm__ volatile("");
    }
}
/* d[0, ws) <- zeros, then xr[v * s] for v in [v0, v1) (s a constant: strided loads the compiler vectorises; s = 1:
 * flat_copy); the empty asm statements keep the short loops loops (not library calls) */
PORT_ALWAYS_INLINE void flat_phase_row(float *d, const float *xr, int64_t v0, int64_t v1, int64_t ws, const int s) {
    for (int64_t v = 0; v < v0; v++) {
        d[v] = 0.0f;
        __asm__ volatile("");
    }
    if (s == 1) flat_copy(d + v0, xr + v0, v1 - v0);
    else
        for (int64_t v = v0; v < v1; v++) d[v] = xr[v * s];
    for (int64_t v = v1; v < ws; v++) {
        d[v] = 0.0f;
        __asm__ volatile("");
    }
}
/* e[v] = x[2v], o[v] = x[2v + 1] for 2v (+ 1) < W: 32 (16) floats at a time through two shuffles; e and o hold
 * W / 2 + 16 floats */
#define FLAT_ROW_MAX 256
PORT_ALWAYS_INLINE void flat_deinterleave(float *e, float *o, const float *x, int64_t W) {
    const port_i16 ev = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const port_i16 od = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    int64_t c = 0;
    for (; c + 2 * PORT_V16_W <= W; c += 2 * PORT_V16_W) {
        port_v16 lo = PORT_V16_LD(x + c), hi = PORT_V16_LD(x + c + PORT_V16_W);
        PORT_V16_ST(e + c / 2, __builtin_shuffle(lo, hi, ev));
        PORT_V16_ST(o + c / 2, __builtin_shuffle(lo, hi, od));
    }
    if (c + PORT_V16_W <= W) {   /* 8 of each (the 8 more floats stored are overwritten or never read) */
        port_v16 lo = PORT_V16_LD(x + c);
        PORT_V16_ST(e + c / 2, __builtin_shuffle(lo, lo, ev));
        PORT_V16_ST(o + c / 2, __builtin_shuffle(lo, lo, od));
        c += PORT_V16_W;
    }
    for (; c < W; c++) (c & 1 ? o : e)[c / 2] = x[c];
}
/* xph <- the stacked phase planes of group g's input channels, images n0..n0+m-1 (plane (ci, a, b) at
 * xph + ((ci * nph + a) * npw + b) * planef; zeros outside the input): every float of a plane written once, the
 * input read once in order (input row ih is row (ih + pad_h) / sh of the phases a = (ih + pad_h) % sh) */
PORT_ISA_CLONES static void flat_phases(float *xph, const float *x, const port_conv2d_params *p, const flat_geom *f,
                                        int64_t n0, int64_t m, int64_t g) {
    int64_t cig = p->c_in / p->groups, H = p->h, W = p->w, sh = p->stride_h, sw = p->stride_w, HW = H * W;
    int64_t ws = f->ws, R = f->R, np = f->nph * f->npw, v0[8], v1[8];
    for (int64_t b = 0; b < f->npw && b < 8; b++) {
        v0[b] = PORT_MAX(0, cdiv(p->pad_w - b, sw));
        v1[b] = PORT_MAX(v0[b], PORT_MIN(ws, cdiv(W + p->pad_w - b, sw)));
    }
    for (int64_t ci = 0; ci < cig; ci++) {
        float *pc = xph + ci * np * f->planef;
        for (int64_t q = 0; q < np; q++) {   /* the rows no input row lands on, and the slack */
            int64_t a = q / f->npw;
            float *pl = pc + q * f->planef;
            for (int64_t u = 0; u < R; u++) {
                int64_t ih = u * sh + a - p->pad_h;
                if (ih >= 0 && ih < H) continue;
                for (int64_t j = 0; j < m; j++)
                    for (int64_t v = 0; v < ws; v++) pl[(j * R + u) * ws + v] = 0.0f;
            }
            for (int64_t v = m * R * ws; v < f->planef; v++) pl[v] = 0.0f;
        }
        for (int64_t j = 0; j < m; j++) {
            const float *xc = x + ((n0 + j) * p->c_in + g * cig + ci) * HW;
            int64_t a = p->pad_h % sh, u = p->pad_h / sh;
            for (int64_t ih = 0; ih < H; ih++, a++) {
                if (a == sh) {
                    a = 0;
                    u++;
                }
                for (int64_t q = 0; q < W; q += 16) __builtin_prefetch(xc + HW + ih * W + q);   /* the next plane */
                if (a >= f->nph || u >= R) continue;
                if (sw == 2 && W <= 2 * FLAT_ROW_MAX) {   /* both column phases from one pass over the row */
                    float eo[2][FLAT_ROW_MAX + 2 * PORT_V16_W];
                    flat_deinterleave(eo[0], eo[1], xc + ih * W, W);
                    for (int64_t b = 0; b < f->npw; b++) {
                        int64_t o = b - p->pad_w;   /* d[v] = x[2v + o] = eo[o & 1][v + (o >> 1)] */
                        float *d = pc + (a * f->npw + b) * f->planef + (j * R + u) * ws;
                        flat_phase_row(d, eo[o & 1] + (o >> 1), v0[b], v1[b], ws, 1);
                    }
                    continue;
                }
                for (int64_t b = 0; b < f->npw; b++) {
                    float *d = pc + (a * f->npw + b) * f->planef + (j * R + u) * ws;
                    const float *xr = xc + ih * W + b - p->pad_w;
                    if (sw == 1) flat_phase_row(d, xr, v0[b], v1[b], ws, 1);
                    else flat_phase_row(d, xr, v0[b], v1[b], ws, (int)sw);
                }
            }
        }
    }
}
/* row[k] for the forward's taps k = (ci, ki, kj): their runs in the phase planes */
static void flat_fwd_rows(const float **row, const float *xph, const port_conv2d_params *p, const flat_geom *f) {
    int64_t cig = p->c_in / p->groups, kh = p->kh, kw = p->kw, sh = p->stride_h, sw = p->stride_w;
    for (int64_t ci = 0; ci < cig; ci++)
        for (int64_t ki = 0; ki < kh; ki++)
            for (int64_t kj = 0; kj < kw; kj++)
                row[(ci * kh + ki) * kw + kj] = xph + ((ci * f->nph + ki % sh) * f->npw + kj % sw) * f->planef +
                                                (ki / sh) * f->ws + kj / sw;
}

/* dx's planes of group g, images n0..n0+m-1, from the input gradient's phase planes (phase (a, b) of channel ci
 * at dxa + ((a * sw + b) * cig + ci) * Lb, image j's rows from j * Rb * wsb): every float written once, in order
 * (stride 2 along W: the two column phases interleaved through two shuffles, 32 floats at a time) */
PORT_ISA_CLONES static void flat_dx_rows(float *dx, const float *dxa, const port_conv2d_params *p, const flat_geom *f,
                                         int64_t n0, int64_t m, int64_t g) {
    int64_t C = p->c_in, cig = C / p->groups, H = p->h, W = p->w, sh = p->stride_h, sw = p->stride_w;
    int64_t pw = p->pad_w, ps = cig * f->Lb;
    const port_i16 lo = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
    const port_i16 hi = {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    for (int64_t j = 0; j < m; j++)
        for (int64_t ci = 0; ci < cig; ci++) {
            float *dxc = dx + ((n0 + j) * C + g * cig + ci) * H * W;
            for (int64_t ih = 0; ih < H; ih++) {
                int64_t a = (ih + p->pad_h) % sh, u = (ih + p->pad_h) / sh;
                const float *r = dxa + a * sw * ps + ci * f->Lb + (j * f->Rb + u) * f->wsb;   /* phase (a, 0) */
                float *d = dxc + ih * W;
                if (sw == 1) {
                    for (int64_t iw = 0; iw < W; iw++) d[iw] = r[iw + pw];
                } else if (sw == 2) {   /* d[2k] = e[k], d[2k + 1] = o[k] */
                    const float *e = r + (pw & 1) * ps + (pw >> 1), *o = r + ((pw + 1) & 1) * ps + ((pw + 1) >> 1);
                    int64_t k = 0;
                    for (; 2 * k + 2 * PORT_V16_W <= W; k += PORT_V16_W) {
                        port_v16 ev = PORT_V16_LD(e + k), ov = PORT_V16_LD(o + k);
                        PORT_V16_ST(d + 2 * k, __builtin_shuffle(ev, ov, lo));
                        PORT_V16_ST(d + 2 * k + PORT_V16_W, __builtin_shuffle(ev, ov, hi));
                    }
                    if (2 * k + PORT_V16_W <= W) {   /* 8 of each (reads 8 more: the slack after dxa) */
                        PORT_V16_ST(d + 2 * k, __builtin_shuffle(PORT_V16_LD(e + k), PORT_V16_LD(o + k), lo));
                        k += PORT_V16_W / 2;
                    }
                    for (int64_t iw = 2 * k; iw < W; iw++) d[iw] = (iw & 1 ? o : e)[iw / 2];
                } else {
                    for (int64_t iw = 0; iw < W; iw++) d[iw] = r[((iw + pw) % sw) * ps + (iw + pw) / sw];
                }
            }
        }
}

/* group g, every stack of images, in the slot: step 0 forward, 1 input gradient, 2 weight gradient (3: over dw) */
static void group_flat_one(int step, float *out, const float *t0, const float *t1, const float *bias,
                           const port_conv2d_params *p, int64_t g, float *slot) {
    flat_geom f = flat_geometry(p);
    int64_t N = p->n, C = p->c_in, CO = p->c_out, kh = p->kh, kw = p->kw;
    int64_t sh = p->stride_h, sw = p->stride_w, ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p), P = ho * wo;
    int64_t cig = C / p->groups, cog = CO / p->groups, K = cig * kh * kw;
    const float *row[FLAT_KMAX];
    float *xph = slot, *acc = slot + cig * f.nph * f.npw * f.planef, *lanes = acc + cog * f.Lf;
    if (step >= 2) memset(lanes, 0, (size_t)(cog * K * PORT_V16_W) * sizeof(float));
    for (int64_t n0 = 0; n0 < N; n0 += f.m) {
        int64_t m = PORT_MIN(f.m, N - n0);
        if (step == 0) {
            flat_phases(xph, t0, p, &f, n0, m, g);
            flat_fwd_rows(row, xph, p, &f);
            flat_mm(acc, f.Lf, t1 + g * cog * K, K, row, bias ? bias + g * cog : NULL, cog, K, f.Lf);
            for (int64_t j = 0; j < m; j++)
                for (int64_t co = 0; co < cog; co++)
                    for (int64_t oh = 0; oh < ho; oh++)
                        flat_copy(out + ((n0 + j) * CO + g * cog + co) * P + oh * wo,
                                  acc + co * f.Lf + (j * f.R + oh) * f.ws, wo);
        } else if (step >= 2) {
            flat_phases(xph, t1, p, &f, n0, m, g);
            flat_fwd_rows(row, xph, p, &f);
            memset(acc, 0, (size_t)(cog * f.Lf) * sizeof(float));
            for (int64_t j = 0; j < m; j++)
                for (int64_t co = 0; co < cog; co++)
                    for (int64_t oh = 0; oh < ho; oh++)
                        flat_copy(acc + co * f.Lf + (j * f.R + oh) * f.ws,
                                  t0 + ((n0 + j) * CO + g * cog + co) * P + oh * wo, wo);
            flat_dots(lanes, acc, f.Lf, row, cog, K, f.Lf);
        } else {
            float *dyq = slot, *dxa = dyq + cog * f.planeb, *wa = dxa + sh * sw * cig * f.Lb + PORT_V16_W;
            const float *wg = t1 + g * cog * K;
            memset(dyq, 0, (size_t)(cog * f.planeb) * sizeof(float));
            for (int64_t j = 0; j < m; j++)
                for (int64_t co = 0; co < cog; co++)
                    for (int64_t oh = 0; oh < ho; oh++)
                        flat_copy(dyq + co * f.planeb + (j * f.Rb + f.th + oh) * f.wsb + f.tw,
                                  t0 + ((n0 + j) * CO + g * cog + co) * P + oh * wo, wo);
            for (int64_t a = 0; a < sh; a++)
                for (int64_t b = 0; b < sw; b++) {
                    int64_t nt = a < kh ? (kh - 1 - a) / sh + 1 : 0, nu = b < kw ? (kw - 1 - b) / sw + 1 : 0;
                    int64_t Kb = cog * nt * nu;
                    for (int64_t co = 0; co < cog; co++)
                        for (int64_t t = 0; t < nt; t++)
                            for (int64_t u = 0; u < nu; u++) {
                                int64_t k = (co * nt + t) * nu + u;
                                row[k] = dyq + co * f.planeb + (f.th - t) * f.wsb + f.tw - u;
                                for (int64_t ci = 0; ci < cig; ci++)
                                    wa[ci * Kb + k] = wg[((co * cig + ci) * kh + a + sh * t) * kw + b + sw * u];
                            }
                    flat_mm(dxa + (a * sw + b) * cig * f.Lb, f.Lb, wa, Kb, row, NULL, cig, Kb, f.Lb);
                }
            flat_dx_rows(out, dxa, p, &f, n0, m, g);
        }
    }
    if (step < 2) return;
    float *dwg = out + g * cog * K;
    for (int64_t k = 0; k < cog * K; k++) {
        float t = dw_lane_sum(lanes + k * PORT_V16_W);
        dwg[k] = step == 3 ? t : dwg[k] + t;
    }
}

/* One driver for the three: step 0 forward, 1 input gradient, 2 weight gradient (3: overwriting dw). */
static void group_run(int step, float *out, const float *t0, const float *t1, const float *b,
                      const port_conv2d_params *p, float *ws) {
    int64_t S = group_slots(p), slot = group_slot_floats(p, PORT_CONV_IM2COL);
    int lanes = group_lane_ok(p), flat = !lanes && group_flat_ok(p);
#pragma omp parallel for schedule(static) if (group_par(p))
    for (int64_t s = 0; s < S; s++)
        for (int64_t g = s; g < p->groups; g += S) {
            float *sl = ws + s * slot;
            if (lanes) group_lane_one(step, out, t0, t1, b, p, g, sl);
            else if (flat) group_flat_one(step, out, t0, t1, b, p, g, sl);
            else if (step == 0) group_fwd_one(out, t0, t1, b, p, g, sl);
            else if (step == 1) group_bwd_in_one(out, t0, t1, p, g, sl);
            else group_bwd_w_one(out, t0, t1, p, g, sl, step == 3);
        }
}

/* ---------------- generic drivers ---------------- */
static size_t conv_wbytes(const port_conv2d_params *p) {
    return (size_t)(p->c_out * (p->c_in / p->groups) * p->kh * p->kw) * sizeof(float);
}

static void bias_grad(float *db, const float *dy, int64_t n, int64_t cout, int64_t P) {
#pragma omp parallel for schedule(static) if (n * cout * P > PORT_PAR_MIN)
    for (int64_t co = 0; co < cout; co++) {
        double s = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const float *d = dy + (i * cout + co) * P;
            float fs = 0.0f;
            for (int64_t q = 0; q < P; q++) fs += d[q];
            s += fs;
        }
        db[co] += (float)s;
    }
}

void port__conv_fwd(float *y, const float *x, const float *w, const float *b,
                    const port_conv2d_params *p, int algo, float *ws) {
    if (algo == PORT_CONV_WINOGRAD) {
        port__conv_winograd_fwd(y, x, w, b, p, ws);
        return;
    }
    if (algo == PORT_CONV_DIRECT && port__conv_is_depthwise(p) && !port__conv_is_pointwise(p)) {
        dw_fwd(y, x, w, b, p);
        return;
    }
    if (conv_grouped(p, algo)) {
        group_run(0, y, x, w, b, p, ws);
        return;
    }
    if (slot_ok(p, algo)) {
        slot_fwd(0, y, x, w, b, p, algo, ws);
        return;
    }
    int64_t nb = conv_fold(p, algo);
    if (nb > 1) {
        fold_fwd(y, x, w, b, p, nb, ws);
        return;
    }
    int64_t G = p->groups, cig = p->c_in / G, cog = p->c_out / G;
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p), P = ho * wo;
    int64_t K = cig * p->kh * p->kw, HW = p->h * p->w;
    int direct = algo == PORT_CONV_DIRECT; /* pointwise here */
    for (int64_t n = 0; n < p->n; n++) {
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + (n * p->c_in + g * cig) * HW;
            float *yg = y + (n * p->c_out + g * cog) * P;
            float beta = 0.0f;
            if (b) {
                for (int64_t co = 0; co < cog; co++) {
                    float bv = b[g * cog + co];
                    float *yr = yg + co * P;
                    for (int64_t q = 0; q < P; q++) yr[q] = bv;
                }
                beta = 1.0f;
            }
            if (!direct && P >= PORT_CONV_PACK_MIN_COLS && p->stride_w == 1 && port__gemm_bpack_ok(cog, P, K)) {
                im2col_src src = {xg, p};
                port__bpack bs = {im2col_pack, &src};
                port__sgemm_vendored_bpack(0, cog, P, K, 1.0f, w + g * cog * K, K, &bs, beta, yg, P);
                continue;
            }
            const float *B = xg;
            if (!direct) {
                port__im2col_part(ws, P, xg, p, 0, K, 0, 0, ho, 0, wo);
                B = ws;
            }
            port__gemm(0, 0, cog, P, K, 1.0f, w + g * cog * K, K, B, P, beta, yg, P);
        }
    }
}

void port__conv_bwd_in(float *dx, const float *dy, const float *w, const port_conv2d_params *p,
                       int algo, float *ws) {
    if (algo == PORT_CONV_WINOGRAD) {
        port__conv_winograd_bwd_in(dx, dy, w, p, ws);
        return;
    }
    if (algo == PORT_CONV_DIRECT && port__conv_is_depthwise(p) && !port__conv_is_pointwise(p)) {
        dw_bwd_in(dx, dy, w, p);
        return;
    }
    if (conv_grouped(p, algo)) {
        group_run(1, dx, dy, w, NULL, p, ws);
        return;
    }
    if (slot_ok(p, algo)) {
        slot_fwd(1, dx, dy, w, NULL, p, algo, ws);
        return;
    }
    int64_t nb = conv_fold(p, algo);
    if (nb > 1) {
        fold_bwd_in(dx, dy, w, p, nb, ws);
        return;
    }
    int64_t G = p->groups, cig = p->c_in / G, cog = p->c_out / G;
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p), P = ho * wo;
    int64_t K = cig * p->kh * p->kw, HW = p->h * p->w;
    int direct = algo == PORT_CONV_DIRECT;
    for (int64_t n = 0; n < p->n; n++) {
        if (!direct) memset(dx + n * p->c_in * HW, 0, (size_t)(p->c_in * HW) * sizeof(float));
        for (int64_t g = 0; g < G; g++) {
            float *dxg = dx + (n * p->c_in + g * cig) * HW;
            const float *dyg = dy + (n * p->c_out + g * cog) * P;
            if (direct) {
                port__gemm(1, 0, K, P, cog, 1.0f, w + g * cog * K, K, dyg, P, 0.0f, dxg, P);
            } else {
                port__gemm(1, 0, K, P, cog, 1.0f, w + g * cog * K, K, dyg, P, 0.0f, ws, P);
                port__col2im_tile(dxg, ws, cig, p->h, p->w, p->kh, p->kw, p->stride_h,
                                  p->stride_w, p->pad_h, p->pad_w, 0, ho, 0, wo);
            }
        }
    }
}

void port__conv_bwd_w(float *dw, float *db, const float *dy, const float *x,
                      const port_conv2d_params *p, int algo, float *ws, int overwrite) {
    /* overwrite: the first image's GEMM writes dw with beta = 0 (the same values as adding into zeros; the old
     * contents are never read); the paths that accumulate by other means zero dw first, db is zeroed first */
    if (overwrite && db) memset(db, 0, (size_t)p->c_out * sizeof(float));
    if (overwrite && (algo == PORT_CONV_WINOGRAD ||
                      (algo == PORT_CONV_DIRECT && port__conv_is_depthwise(p) && !port__conv_is_pointwise(p))))
        memset(dw, 0, conv_wbytes(p));
    if (algo == PORT_CONV_WINOGRAD) {
        port__conv_winograd_bwd_w(dw, dy, x, p, ws);
        if (db) bias_grad(db, dy, p->n, p->c_out, port_conv2d_out_h(p) * port_conv2d_out_w(p));
        return;
    }
    if (algo == PORT_CONV_DIRECT && port__conv_is_depthwise(p) && !port__conv_is_pointwise(p)) {
        dw_bwd_w(dw, db, dy, x, p);
        return;
    }
    if (conv_grouped(p, algo)) {
        group_run(overwrite ? 3 : 2, dw, dy, x, NULL, p, ws);
        if (db) bias_grad(db, dy, p->n, p->c_out, port_conv2d_out_h(p) * port_conv2d_out_w(p));
        return;
    }
    if (slot_ok(p, algo)) {
        slot_bwd_w(dw, dy, x, p, algo, ws, overwrite);
        if (db) bias_grad(db, dy, p->n, p->c_out, port_conv2d_out_h(p) * port_conv2d_out_w(p));
        return;
    }
    int64_t nb = conv_fold_w(p, algo);
    if (nb > 1) {
        fold_bwd_w(dw, dy, x, p, nb, ws, overwrite);
        if (db) bias_grad(db, dy, p->n, p->c_out, port_conv2d_out_h(p) * port_conv2d_out_w(p));
        return;
    }
    int64_t G = p->groups, cig = p->c_in / G, cog = p->c_out / G;
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p), P = ho * wo;
    int64_t K = cig * p->kh * p->kw, HW = p->h * p->w;
    int direct = algo == PORT_CONV_DIRECT;
    for (int64_t n = 0; n < p->n; n++) {
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + (n * p->c_in + g * cig) * HW;
            const float *dyg = dy + (n * p->c_out + g * cog) * P;
            const float *B = xg;
            if (!direct) {
                port__im2col_part(ws, P, xg, p, 0, K, 0, 0, ho, 0, wo);
                B = ws;
            }
            port__gemm(0, 1, cog, K, P, 1.0f, dyg, P, B, P, overwrite && n == 0 ? 0.0f : 1.0f, dw + g * cog * K,
                       K);
        }
    }
    if (db) bias_grad(db, dy, p->n, p->c_out, P);
}

/* ---------------- public whole-tensor API ---------------- */
static size_t conv_xbytes(const port_conv2d_params *p) {
    return (size_t)(p->n * p->c_in * p->h * p->w) * sizeof(float);
}
static size_t conv_ybytes(const port_conv2d_params *p) {
    return (size_t)(p->n * p->c_out * port_conv2d_out_h(p) * port_conv2d_out_w(p)) *
           sizeof(float);
}

port_status port_conv2d_forward(float *y, const float *x, const float *w, const float *b,
                                const port_conv2d_params *p, int algo, void *ws,
                                size_t ws_bytes) {
    port_status st = port__conv_validate(p, &algo, ws, ws_bytes);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(w);
    size_t yb = conv_ybytes(p);
    PORT_CHECK(!port__ranges_overlap(y, yb, x, conv_xbytes(p)) &&
                   !port__ranges_overlap(y, yb, w, conv_wbytes(p)) &&
                   !port__ranges_overlap(y, yb, b, (size_t)p->c_out * sizeof(float)) &&
                   !port__ranges_overlap(y, yb, ws, ws_bytes),
               PORT_ERR_ALIAS);
    port__conv_fwd(y, x, w, b, p, algo, (float *)ws);
    return PORT_OK;
}

port_status port_conv2d_backward_input(float *dx, const float *dy, const float *w,
                                       const port_conv2d_params *p, int algo, void *ws,
                                       size_t ws_bytes) {
    port_status st = port__conv_validate(p, &algo, ws, ws_bytes);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(w);
    size_t xb = conv_xbytes(p);
    PORT_CHECK(!port__ranges_overlap(dx, xb, dy, conv_ybytes(p)) &&
                   !port__ranges_overlap(dx, xb, w, conv_wbytes(p)) &&
                   !port__ranges_overlap(dx, xb, ws, ws_bytes),
               PORT_ERR_ALIAS);
    port__conv_bwd_in(dx, dy, w, p, algo, (float *)ws);
    return PORT_OK;
}

static port_status conv_backward_weight(float *dw, float *db, const float *dy, const float *x,
                                        const port_conv2d_params *p, int algo, void *ws,
                                        size_t ws_bytes, int overwrite) {
    port_status st = port__conv_validate(p, &algo, ws, ws_bytes);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dw); PORT_NOTNULL(dy); PORT_NOTNULL(x);
    size_t wb = conv_wbytes(p);
    PORT_CHECK(!port__ranges_overlap(dw, wb, dy, conv_ybytes(p)) &&
                   !port__ranges_overlap(dw, wb, x, conv_xbytes(p)) &&
                   !port__ranges_overlap(dw, wb, ws, ws_bytes) &&
                   !port__ranges_overlap(dw, wb, db, (size_t)p->c_out * sizeof(float)),
               PORT_ERR_ALIAS);
    port__conv_bwd_w(dw, db, dy, x, p, algo, (float *)ws, overwrite);
    return PORT_OK;
}

port_status port_conv2d_backward_weight(float *dw, float *db, const float *dy, const float *x,
                                        const port_conv2d_params *p, int algo, void *ws,
                                        size_t ws_bytes) {
    return conv_backward_weight(dw, db, dy, x, p, algo, ws, ws_bytes, 0);
}

port_status port_conv2d_backward_weight_overwrite(float *dw, float *db, const float *dy, const float *x,
                                                  const port_conv2d_params *p, int algo, void *ws,
                                                  size_t ws_bytes) {
    return conv_backward_weight(dw, db, dy, x, p, algo, ws, ws_bytes, 1);
}

/* ---------------- patch-based (tiled) conv ---------------- */
static void tile_dims(const port_conv2d_params *p, int64_t *th, int64_t *tw) {
    *th = PORT_MIN(*th, port_conv2d_out_h(p));
    *tw = PORT_MIN(*tw, port_conv2d_out_w(p));
}

size_t port_conv2d_patch_workspace_bytes(const port_conv2d_params *p, int64_t tile_h,
                                         int64_t tile_w) {
    if (port_conv2d_check(p) != PORT_OK || tile_h < 1 || tile_w < 1) return 0;
    tile_dims(p, &tile_h, &tile_w);
    int64_t K = p->c_in / p->groups * p->kh * p->kw, T = tile_h * tile_w;
    /* Full-width tiles are contiguous row bands of y/dy: GEMM reads/writes
     * them in place (ld = H_out*W_out), so no output-tile buffer is needed. */
    int64_t tmp = tile_w == port_conv2d_out_w(p) ? 0 : p->c_out / p->groups;
    return (size_t)((K + tmp) * T) * sizeof(float);
}

static port_status patch_validate(const port_conv2d_params *p, int64_t *th, int64_t *tw,
                                  void *ws, size_t ws_bytes) {
    port_status st = port_conv2d_check(p);
    if (st != PORT_OK) return st;
    PORT_CHECK(*th >= 1 && *tw >= 1, PORT_ERR_ARG);
    size_t need = port_conv2d_patch_workspace_bytes(p, *th, *tw);
    PORT_CHECK(ws != NULL && ws_bytes >= need, PORT_ERR_WORKSPACE);
    tile_dims(p, th, tw);
    return PORT_OK;
}

/* Small tiles' work is shared by the pool: thread t of nt takes the tile's rows [r0, r1) -- columns
 * [r0*tw, r1*tw) of the tile's im2col matrix [K, T] (and of the output buffer [cog, T]) -- so the threads need
 * no workspace of their own; one parallel region per tile.  Tiles whose GEMM is large enough for port__gemm to
 * split it (PORT_GEMM_PAR_MIN) run their steps outside a region, each step threading itself (im2col by rows
 * of K, the GEMM by blocks, col2im by channel); tiles below PATCH_PAR_MIN_MACS run on one thread. */
#define PATCH_PAR_MIN_MACS (2 * PORT_PAR_MIN)
static int patch_team(int64_t macs) {
    return macs >= PATCH_PAR_MIN_MACS && (double)macs < PORT_GEMM_PAR_MIN;
}
static void tile_rows(int64_t th, int64_t *r0, int64_t *r1) {
#ifdef _OPENMP
    int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
#else
    int64_t nt = 1, t = 0;
#endif
    *r0 = th * t / nt;
    *r1 = th * (t + 1) / nt;
}

/* A team's GEMMs run on bands of [0, len) cut by the length alone (at most PATCH_BANDS of them, even for 1, 2, 4
 * and 8 threads), thread t of nt taking bands [t*nb/nt, (t+1)*nb/nt), one GEMM per band: the products' shapes, by
 * which OpenBLAS picks its kernels, and so the bits do not depend on the thread count.  Outside a team (team = 0)
 * the whole of [0, len) is one band.  band_range: this thread's bands; band_lo(len, b): band b's first row. */
#define PATCH_BANDS 8
static int64_t band_count(int64_t len, int team) { return team ? PORT_MIN(len, PATCH_BANDS) : 1; }
static void band_range(int64_t len, int team, int64_t *b0, int64_t *b1) {
    if (team) {
        tile_rows(band_count(len, team), b0, b1);
    } else {
        *b0 = 0;
        *b1 = 1;
    }
}
static int64_t band_lo(int64_t len, int team, int64_t b) { return len * b / band_count(len, team); }

/* tmp[co, oy*tw + ox] <-> t[co, (oh0+oy)*wo + ow0 + ox] for the tile's rows [r0, r1) (gather: to_tmp = 1;
 * scatter adding the bias: to_tmp = 0). */
static void tile_move(float *tmp, float *t, const float *bias, int to_tmp, int64_t cog, int64_t T,
                      int64_t P, int64_t wo, int64_t oh0, int64_t r0, int64_t r1, int64_t ow0,
                      int64_t tw) {
    for (int64_t co = 0; co < cog; co++)
        for (int64_t oy = r0; oy < r1; oy++) {
            float *tr = t + co * P + (oh0 + oy) * wo + ow0, *br = tmp + co * T + oy * tw;
            if (to_tmp) {
                memcpy(br, tr, (size_t)tw * sizeof(float));
            } else {
                float bv = bias ? bias[co] : 0.0f;
                for (int64_t ox = 0; ox < tw; ox++) tr[ox] = br[ox] + bv;
            }
        }
}

/* A tile's forward, rows [r0, r1) of it: im2col of their columns, then their GEMM (into y in place when the
 * tile spans whole rows, else into tmp [cog, T] and scattered with the bias) */
static void patch_fwd_rows(float *yg, const float *xg, const float *wg, const float *bg, float *cols,
                           const port_conv2d_params *p, int64_t cog, int64_t K, int64_t oh0, int64_t th,
                           int64_t ow0, int64_t tw, int64_t r0, int64_t r1) {
    int64_t wo = port_conv2d_out_w(p), P = port_conv2d_out_h(p) * wo, T = th * tw, L = (r1 - r0) * tw;
    if (L <= 0) return;
    port__im2col_part(cols, T, xg, p, 0, K, oh0, r0, r1, ow0, tw);
    if (tw == wo) {
        float *yr = yg + (oh0 + r0) * wo, beta = 0.0f;
        if (bg) {
            for (int64_t co = 0; co < cog; co++)
                for (int64_t q = 0; q < L; q++) yr[co * P + q] = bg[co];
            beta = 1.0f;
        }
        port__gemm(0, 0, cog, L, K, 1.0f, wg, K, cols + r0 * tw, T, beta, yr, P);
        return;
    }
    float *tmp = cols + K * T;
    port__gemm(0, 0, cog, L, K, 1.0f, wg, K, cols + r0 * tw, T, 0.0f, tmp + r0 * tw, T);
    tile_move(tmp, yg, bg, 0, cog, T, P, wo, oh0, r0, r1, ow0, tw);
}

port_status port_conv2d_patch_forward(float *y, const float *x, const float *w, const float *b,
                                      const port_conv2d_params *p, int64_t tile_h,
                                      int64_t tile_w, void *ws, size_t ws_bytes) {
    port_status st = patch_validate(p, &tile_h, &tile_w, ws, ws_bytes);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(w);
    size_t yb = conv_ybytes(p);
    PORT_CHECK(!port__ranges_overlap(y, yb, x, conv_xbytes(p)) &&
                   !port__ranges_overlap(y, yb, w, conv_wbytes(p)) &&
                   !port__ranges_overlap(y, yb, ws, ws_bytes),
               PORT_ERR_ALIAS);
    int64_t G = p->groups, cig = p->c_in / G, cog = p->c_out / G;
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p), P = ho * wo;
    int64_t K = cig * p->kh * p->kw, HW = p->h * p->w;
    float *cols = (float *)ws;
    for (int64_t n = 0; n < p->n; n++)
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + (n * p->c_in + g * cig) * HW, *wg = w + g * cog * K;
            const float *bg = b ? b + g * cog : NULL;
            float *yg = y + (n * p->c_out + g * cog) * P;
            for (int64_t oh0 = 0; oh0 < ho; oh0 += tile_h)
                for (int64_t ow0 = 0; ow0 < wo; ow0 += tile_w) {
                    int64_t th = PORT_MIN(tile_h, ho - oh0), tw = PORT_MIN(tile_w, wo - ow0);
                    if (th > 1 && patch_team(cog * K * th * tw)) {
#pragma omp parallel
                        {
                            int64_t b0, b1;
                            band_range(th, 1, &b0, &b1);
                            for (int64_t bi = b0; bi < b1; bi++)
                                patch_fwd_rows(yg, xg, wg, bg, cols, p, cog, K, oh0, th, ow0, tw,
                                               band_lo(th, 1, bi), band_lo(th, 1, bi + 1));
                        }
                    } else {
                        patch_fwd_rows(yg, xg, wg, bg, cols, p, cog, K, oh0, th, ow0, tw, 0, th);
                    }
                }
        }
    return PORT_OK;
}

/* A tile's input gradient: its column gradients by bands of the tile's rows, then col2im by input channel (the
 * rows' input halos overlap).  Called by every thread of a team (team = 1) or outside any parallel region. */
static void patch_bwi_tile(float *dxg, const float *dyg, const float *wg, float *cols, const port_conv2d_params *p,
                           int64_t cog, int64_t K, int64_t oh0, int64_t th, int64_t ow0, int64_t tw, int team) {
    int64_t wo = port_conv2d_out_w(p), P = port_conv2d_out_h(p) * wo, T = th * tw;
    float *tmp = cols + K * T;
    int64_t b0, b1;
    band_range(th, team, &b0, &b1);
    for (int64_t bi = b0; bi < b1; bi++) {
        int64_t r0 = band_lo(th, team, bi), r1 = band_lo(th, team, bi + 1);
        if (r1 <= r0) continue;
        const float *dyt = dyg + (oh0 + r0) * wo;
        int64_t ld = P;
        if (tw != wo) {
            tile_move(tmp, (float *)dyg, NULL, 1, cog, T, P, wo, oh0, r0, r1, ow0, tw);
            dyt = tmp + r0 * tw;
            ld = T;
        }
        port__gemm(1, 0, K, (r1 - r0) * tw, cog, 1.0f, wg, K, dyt, ld, 0.0f, cols + r0 * tw, T);
    }
    if (!port__in_parallel()) { /* alone: col2im threads itself */
        port__col2im_tile(dxg, cols, p->c_in / p->groups, p->h, p->w, p->kh, p->kw, p->stride_h, p->stride_w,
                          p->pad_h, p->pad_w, oh0, th, ow0, tw);
        return;
    }
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t ci = 0; ci < p->c_in / p->groups; ci++)
        col2im_channel(dxg, cols, T, ci, p->h, p->w, p->kh, p->kw, p->stride_h, p->stride_w, p->pad_h,
                       p->pad_w, oh0, th, ow0, tw);
}

/* A tile's dw += dy_tile cols^T, by bands of dw's longer side; by bands of K, every thread builds the im2col
 * rows it multiplies (no barrier unless dy is gathered).  Called like patch_bwi_tile. */
static void patch_bww_tile(float *dwg, const float *dyg, const float *xg, float *cols, const port_conv2d_params *p,
                           int64_t cog, int64_t K, int64_t oh0, int64_t th, int64_t ow0, int64_t tw, int team) {
    int64_t wo = port_conv2d_out_w(p), P = port_conv2d_out_h(p) * wo, T = th * tw;
    float *tmp = cols + K * T;
    const float *dyt = tw == wo ? dyg + oh0 * wo : tmp;
    int64_t ld = tw == wo ? P : T, m0, m1, b0, b1;
    if (tw != wo) {
        tile_rows(th, &m0, &m1);
        tile_move(tmp, (float *)dyg, NULL, 1, cog, T, P, wo, oh0, m0, m1, ow0, tw);
    }
    if (cog >= K) {
        tile_rows(th, &m0, &m1);
        port__im2col_part(cols, T, xg, p, 0, K, oh0, m0, m1, ow0, tw);
#pragma omp barrier
        band_range(cog, team, &b0, &b1);
        for (int64_t bi = b0; bi < b1; bi++) {
            m0 = band_lo(cog, team, bi);
            m1 = band_lo(cog, team, bi + 1);
            port__gemm(0, 1, m1 - m0, K, T, 1.0f, dyt + m0 * ld, ld, cols, T, 1.0f, dwg + m0 * K, K);
        }
        return;
    }
    if (tw != wo) {
#pragma omp barrier
    }
    band_range(K, team, &b0, &b1);
    for (int64_t bi = b0; bi < b1; bi++) {
        m0 = band_lo(K, team, bi);
        m1 = band_lo(K, team, bi + 1);
        port__im2col_part(cols, T, xg, p, m0, m1, oh0, 0, th, ow0, tw);
        port__gemm(0, 1, cog, m1 - m0, T, 1.0f, dyt, ld, cols + m0 * T, T, 1.0f, dwg + m0, K);
    }
}

port_status port_conv2d_patch_backward_input(float *dx, const float *dy, const float *w,
                                             const port_conv2d_params *p, int64_t tile_h,
                                             int64_t tile_w, void *ws, size_t ws_bytes) {
    port_status st = patch_validate(p, &tile_h, &tile_w, ws, ws_bytes);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(w);
    size_t xb = conv_xbytes(p);
    PORT_CHECK(!port__ranges_overlap(dx, xb, dy, conv_ybytes(p)) &&
                   !port__ranges_overlap(dx, xb, w, conv_wbytes(p)) &&
                   !port__ranges_overlap(dx, xb, ws, ws_bytes),
               PORT_ERR_ALIAS);
    int64_t G = p->groups, cig = p->c_in / G, cog = p->c_out / G;
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p), P = ho * wo;
    int64_t K = cig * p->kh * p->kw, HW = p->h * p->w;
    float *cols = (float *)ws;
    memset(dx, 0, xb);
    for (int64_t n = 0; n < p->n; n++)
        for (int64_t g = 0; g < G; g++) {
            float *dxg = dx + (n * p->c_in + g * cig) * HW;
            const float *dyg = dy + (n * p->c_out + g * cog) * P, *wg = w + g * cog * K;
            for (int64_t oh0 = 0; oh0 < ho; oh0 += tile_h)
                for (int64_t ow0 = 0; ow0 < wo; ow0 += tile_w) {
                    int64_t th = PORT_MIN(tile_h, ho - oh0), tw = PORT_MIN(tile_w, wo - ow0);
                    if (patch_team(cog * K * th * tw)) {
#pragma omp parallel
                        patch_bwi_tile(dxg, dyg, wg, cols, p, cog, K, oh0, th, ow0, tw, 1);
                    } else {
                        patch_bwi_tile(dxg, dyg, wg, cols, p, cog, K, oh0, th, ow0, tw, 0);
                    }
                }
        }
    return PORT_OK;
}

port_status port_conv2d_patch_backward_weight(float *dw, float *db, const float *dy,
                                              const float *x, const port_conv2d_params *p,
                                              int64_t tile_h, int64_t tile_w, void *ws,
                                              size_t ws_bytes) {
    port_status st = patch_validate(p, &tile_h, &tile_w, ws, ws_bytes);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(dw); PORT_NOTNULL(dy); PORT_NOTNULL(x);
    size_t wb = conv_wbytes(p);
    PORT_CHECK(!port__ranges_overlap(dw, wb, dy, conv_ybytes(p)) &&
                   !port__ranges_overlap(dw, wb, x, conv_xbytes(p)) &&
                   !port__ranges_overlap(dw, wb, ws, ws_bytes) &&
                   !port__ranges_overlap(dw, wb, db, (size_t)p->c_out * sizeof(float)),
               PORT_ERR_ALIAS);
    int64_t G = p->groups, cig = p->c_in / G, cog = p->c_out / G;
    int64_t ho = port_conv2d_out_h(p), wo = port_conv2d_out_w(p), P = ho * wo;
    int64_t K = cig * p->kh * p->kw, HW = p->h * p->w;
    float *cols = (float *)ws;
    for (int64_t n = 0; n < p->n; n++)
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + (n * p->c_in + g * cig) * HW;
            const float *dyg = dy + (n * p->c_out + g * cog) * P;
            float *dwg = dw + g * cog * K;
            for (int64_t oh0 = 0; oh0 < ho; oh0 += tile_h)
                for (int64_t ow0 = 0; ow0 < wo; ow0 += tile_w) {
                    int64_t th = PORT_MIN(tile_h, ho - oh0), tw = PORT_MIN(tile_w, wo - ow0);
                    if (patch_team(cog * K * th * tw)) {
#pragma omp parallel
                        patch_bww_tile(dwg, dyg, xg, cols, p, cog, K, oh0, th, ow0, tw, 1);
                    } else {
                        patch_bww_tile(dwg, dyg, xg, cols, p, cog, K, oh0, th, ow0, tw, 0);
                    }
                }
        }
    if (db) bias_grad(db, dy, p->n, p->c_out, P);
    return PORT_OK;
}
