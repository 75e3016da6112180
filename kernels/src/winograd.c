/* Winograd F(2x2, 3x3) convolution: 3x3 kernels, stride 1, groups 1, padding <= 2 (PORT_CONV_WINOGRAD).
 *
 * Every 2x2 output tile is A^T [ U (.) V ] A with U = G g G^T (the 3x3 kernel, transformed to 4x4) and
 * V = B^T d B (the tile's 4x4 input patch), so each of the 16 positions xi of the 4x4 domain is one GEMM
 * over channels: M_xi[c_out, tiles] = U_xi[c_out, c_in] V_xi[c_in, tiles].  That is 16 * c_in MACs per
 * output tile per output channel against 36 * c_in for the direct sum: 2.25x fewer.
 *
 * * backward input (stride 1) is the same convolution of dy with the kernels flipped and c_in/c_out
 *   swapped, padding 2 - pad: the forward driver runs it;
 * * backward weight: dL/dU = sum over tiles (A dy A^T) (.) V, 16 GEMMs reducing over the tiles
 *   dU_xi[c_out, c_in] += Y_xi[c_out, tiles] V_xi[c_in, tiles]^T, then dg = G^T dU G.
 *
 * Tiles (n, ti, tj) over the output map are processed in chunks of `wg_chunk` tiles so the workspace is
 * 16 c_in c_out floats (U or dU) plus 16 (c_in + c_out) floats per chunk tile, bounded by
 * PORT_WG_CHUNK_FLOATS; edge tiles read zeros outside the input and write only the valid outputs.
 * When all tiles fit one chunk (small maps: ResNet's last stages) the GEMMs' output channels are taken in
 * blocks of PORT_WG_BLOCK rows instead: each block's U (or dU) rows are made, used and dropped in turn, so
 * 16 * PORT_WG_BLOCK * c_in floats stand in for the 16 c_in c_out (512 x 512 channels: 16.8 of a 25 MB
 * workspace), at no extra work (the input transform V is made once either way).
 * Accuracy: the transforms have entries 0, +-1, +-1/2, so results differ from the direct sum by a few
 * float32 ulps of the partial sums (tests/kernels/test_conv.py compares with torch in float64).
 * The plain reference beside it is kernels/src/conv_ref.c. */
#include "internal.h"

#ifndef PORT_WG_ROW_MAX
#define PORT_WG_ROW_MAX 520 /* widest padded map row (w + 2 pad + 4) the transforms buffer on their stack
                               (~12 floats per row element); `make port-rt-m4` builds with 72 (maps up to 64
                               wide, ~2 KiB of stack), 0 disables the algorithm */
#endif
#define WG_ROW_MAX (PORT_WG_ROW_MAX > 0 ? PORT_WG_ROW_MAX : 2)
#define WG_HALF (WG_ROW_MAX / 2)
#ifndef PORT_WG_CHUNK_FLOATS
#define PORT_WG_CHUNK_FLOATS (1 << 21) /* V and M blocks of one chunk: 8 MiB */
#endif
#ifndef PORT_WG_BLOCK
#define PORT_WG_BLOCK 64 /* output-channel rows per block when the tiles fit one chunk */
#endif

int port__conv_winograd_legal(const port_conv2d_params *p) {
    return p->kh == 3 && p->kw == 3 && p->stride_h == 1 && p->stride_w == 1 && p->groups == 1 &&
           p->pad_h <= 2 && p->pad_w <= 2 && p->w + 2 * p->pad_w + 4 <= PORT_WG_ROW_MAX;
}

/* tiles of a map with `oh` x `ow` outputs (n images) */
static int64_t wg_tiles(int64_t n, int64_t oh, int64_t ow) { return n * ((oh + 1) / 2) * ((ow + 1) / 2); }

#ifndef PORT_WG_AUTO_MIN_TILES
#define PORT_WG_AUTO_MIN_TILES 64
#endif
int port__conv_winograd_pays(const port_conv2d_params *p) {
    return port__conv_winograd_legal(p) && p->c_in >= 16 && p->c_out >= 16 &&
           wg_tiles(p->n, port_conv2d_out_h(p), port_conv2d_out_w(p)) >= PORT_WG_AUTO_MIN_TILES;
}

/* Floats between consecutive xi planes of U, V, M, Y (16 planes of n floats each): n rounded up to whole cache
 * lines, plus one line when that count is even, so that the 16 streams the transforms read and write do not start
 * at the same cache set (power-of-two planes: 64 x 64 channels, 1024-tile chunks); ~5% measured on 256-tile
 * chunks of 64 channels. */
static int64_t wg_ps(int64_t n) {
    int64_t lines = (n + 15) / 16;
    return (lines + !(lines & 1)) * 16;
}

static int64_t wg_chunk(int64_t cin, int64_t cout, int64_t tiles) {
    int64_t tc = PORT_WG_CHUNK_FLOATS / (16 * (cin + cout));
    tc = PORT_MAX(16, tc / 16 * 16);
    return PORT_MIN(tc, tiles);
}

/* Output-channel rows per block of a pass with `rows` GEMM rows over `cols` channels and T tiles: all of them
 * unless the tiles fit one chunk and there are more rows than PORT_WG_BLOCK. */
static int64_t wg_block(int64_t rows, int64_t cols, int64_t T) {
    return (T <= wg_chunk(rows, cols, T) && rows > PORT_WG_BLOCK) ? PORT_WG_BLOCK : rows;
}

/* Floats one pass needs: U or dU rows (kb x cols), V (cols per chunk tile), M or Y (kb per chunk tile). */
static int64_t wg_pass_floats(int64_t rows, int64_t cols, int64_t T) {
    int64_t tc = wg_chunk(rows, cols, T), kb = wg_block(rows, cols, T);
    return 16 * (wg_ps(kb * cols) + wg_ps(cols * tc) + wg_ps(kb * tc));
}

/* Blocked passes (where rows + cols <= PORT_WG_BLOCKED_MAX_CH and the tiles make at least two blocks): each
 * thread takes blocks of wg_tb tiles and runs a block's input transform, 16 GEMMs and output transform (or, for
 * the weight gradient, its input and gradient transforms and 16 GEMMs into its group's dU) back to back in a slot
 * of the workspace that only it touches (V and M or Y of a block: about PORT_WG_TB_FLOATS floats, within a
 * core's L2). The chunked passes split a chunk's channels over the threads in one phase and its 16 planes in the
 * next, so every float of V and M moves between the cores twice: on a 2-vCPU VM the same chunked call (inception's
 * 32x32-channel 35x35 maps, batch 32) ran 5.1 ms in some processes and 11-13 ms in others, slower than on one
 * thread (10 ms), while the blocked one ran 4.6-6.1 throughout. The forward output of a tile does not depend on
 * its block or thread; the weight gradient sums WG_SLOTS fixed groups of blocks (each in block order) in group
 * order, so its bits do not depend on the thread count either. A call runs on at most WG_SLOTS threads. */
#ifndef PORT_WG_TB_FLOATS
#define PORT_WG_TB_FLOATS (1 << 18)
#endif
#ifndef PORT_WG_BLOCKED_MAX_CH
#define PORT_WG_BLOCKED_MAX_CH 256
#endif
#define WG_SLOTS 4

/* tiles per block of a blocked pass over `cols` input and `rows` output channels: a multiple of 16, >= 16 */
static int64_t wg_tb(int64_t rows, int64_t cols) {
    int64_t tb = PORT_WG_TB_FLOATS / (16 * (rows + cols));
    return PORT_MAX(16, tb / 16 * 16);
}
static int wg_blocked(int64_t rows, int64_t cols, int64_t T) {
    return rows + cols <= PORT_WG_BLOCKED_MAX_CH && T >= 2 * wg_tb(rows, cols);
}
/* floats of one slot: V (cols x tb) and M or Y (rows x tb), 16 planes each; the weight gradient's slots hold
 * their group's dU (rows x cols) too */
static int64_t wg_slot_floats(int64_t rows, int64_t cols, int grad_w) {
    int64_t tb = wg_tb(rows, cols);
    return 16 * (wg_ps(cols * tb) + wg_ps(rows * tb) + (grad_w ? wg_ps(rows * cols) : 0));
}
/* floats of workspace of a forward-shaped pass (rows over cols) or the weight gradient's */
static int64_t wg_conv_floats(int64_t rows, int64_t cols, int64_t T, int grad_w) {
    if (!wg_blocked(rows, cols, T)) return wg_pass_floats(rows, cols, T);
    int64_t tb = wg_tb(rows, cols), slots = PORT_MIN((T + tb - 1) / tb, WG_SLOTS);  /* no more than the blocks */
    return (grad_w ? 0 : 16 * wg_ps(rows * cols)) + slots * wg_slot_floats(rows, cols, grad_w);
}
static int wg_team(int64_t tasks) {
    return (int)PORT_MIN((int64_t)port_get_num_threads(), PORT_MIN(tasks, WG_SLOTS));
}
static inline int64_t wg_slot(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

size_t port__conv_winograd_ws_floats(const port_conv2d_params *p) {
    int64_t to = wg_tiles(p->n, port_conv2d_out_h(p), port_conv2d_out_w(p)), ti = wg_tiles(p->n, p->h, p->w);
    /* forward: c_out rows over c_in, output tiles; backward input: c_in rows over c_out, input tiles;
     * backward weight: dU's c_out rows over c_in, output tiles */
    int64_t f = wg_conv_floats(p->c_out, p->c_in, to, 0), bi = wg_conv_floats(p->c_in, p->c_out, ti, 0);
    int64_t bw = wg_conv_floats(p->c_out, p->c_in, to, 1);
    return (size_t)PORT_MAX(PORT_MAX(f, bi), bw);
}

/* U[xi][o][i] = (G g G^T)[xi] for g = w[o][i] (flip = 0) or, for the backward input's kernels,
 * g = w[i][o] rotated by 180 degrees (flip = 1); w is [co][ci][3][3] with co = rows of U unless flipped.
 * One row o of U per call, vectorised along i (the kernels' loads are strided, U's stores contiguous): as a
 * scalar loop per (o, i) it took longer than the 16 GEMMs at 256 channels on 8x8 maps. */
PORT_ISA_CLONES static void wg_weights_row(float *restrict U, const float *restrict w, int64_t rows, int64_t cols,
                                           int flip, int64_t o, int64_t o0, int64_t kb) {
    int64_t RC = wg_ps(kb * cols), st = flip ? rows * 9 : 9;
    const float *base = flip ? w + o * 9 : w + o * cols * 9;
    float *u = U + (o - o0) * cols;
#pragma omp simd
    for (int64_t i = 0; i < cols; i++) {
        const float *s = base + i * st;
        float g[3][3];
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++) g[a][b] = flip ? s[(2 - a) * 3 + (2 - b)] : s[a * 3 + b];
        float t[4][3];
        for (int b = 0; b < 3; b++) {
            t[0][b] = g[0][b];
            t[1][b] = 0.5f * (g[0][b] + g[1][b] + g[2][b]);
            t[2][b] = 0.5f * (g[0][b] - g[1][b] + g[2][b]);
            t[3][b] = g[2][b];
        }
        for (int a = 0; a < 4; a++) {
            u[(a * 4 + 0) * RC + i] = t[a][0];
            u[(a * 4 + 1) * RC + i] = 0.5f * (t[a][0] + t[a][1] + t[a][2]);
            u[(a * 4 + 2) * RC + i] = 0.5f * (t[a][0] - t[a][1] + t[a][2]);
            u[(a * 4 + 3) * RC + i] = t[a][2];
        }
    }
}

/* rows o0 .. o0+kb-1 of U (of `rows`), stored as a kb-row U */
static void wg_weights(float *U, const float *w, int64_t rows, int64_t cols, int flip, int64_t o0, int64_t kb) {
#pragma omp parallel for schedule(static) if (kb * cols * 16 > PORT_PAR_MIN)
    for (int64_t o = o0; o < o0 + kb; o++) wg_weights_row(U, w, rows, cols, flip, o, o0, kb);
}

/* A chunk's tiles t0..t0+tcc-1 (flattened (n, ti, tj), row-major) are walked as row segments: the one
 * starting at chunk column j is image n, tile row ti, tiles tj0..tj1-1 (its columns j..j+tj1-tj0-1). */
typedef struct { int64_t n, ti, tj0, tj1; } wg_seg;
static inline wg_seg wg_segment(int64_t t0, int64_t j, int64_t tcc, int64_t th, int64_t tw) {
    int64_t t = t0 + j;
    wg_seg g = {t / (tw * th), (t / tw) % th, t % tw, 0};
    g.tj1 = PORT_MIN(tw, g.tj0 + tcc - j);
    return g;
}

/* The four input rows r0..r0+3 of a tile row, split into even and odd columns with the padding applied:
 * E[a][q] = map(r0 + a, 2q - pw), O[a][q] = map(r0 + a, 2q + 1 - pw), zero outside, for q in [q0, q1). */
static inline void wg_rows(float E[4][WG_HALF], float O[4][WG_HALF], const float *xc, int64_t h, int64_t w,
                    int64_t r0, int64_t pw, int64_t q0, int64_t q1) {
    for (int a = 0; a < 4; a++) {
        int64_t r = r0 + a;
        if (r < 0 || r >= h) {
            for (int64_t q = q0; q < q1; q++) E[a][q] = O[a][q] = 0.0f;
            continue;
        }
        const float *xr = xc + r * w;
        /* interior q (both columns inside the row: pw <= 2q <= w - 2 + pw) without bounds checks */
        int64_t m0 = PORT_MIN(PORT_MAX(q0, (pw + 1) / 2), q1), m1 = PORT_MAX(PORT_MIN(q1, (w - 2 + pw) / 2 + 1), m0);
        for (int64_t q = q0; q < m0; q++) {
            int64_t c = 2 * q - pw;
            E[a][q] = (c >= 0 && c < w) ? xr[c] : 0.0f;
            O[a][q] = (c + 1 >= 0 && c + 1 < w) ? xr[c + 1] : 0.0f;
        }
        for (int64_t q = m0; q < m1; q++) {
            E[a][q] = xr[2 * q - pw];
            O[a][q] = xr[2 * q - pw + 1];
        }
        for (int64_t q = m1; q < q1; q++) {
            int64_t c = 2 * q - pw;
            E[a][q] = (c >= 0 && c < w) ? xr[c] : 0.0f;
            O[a][q] = (c + 1 >= 0 && c + 1 < w) ? xr[c + 1] : 0.0f;
        }
    }
}

/* V[xi][c][j] = (B^T d B)[xi] for the tiles t0 + j (j < tcc) of the map in[n][c][h][w] tiled for an
 * output of oh x ow with padding (ph, pw).  Tile tj of a tile row covers columns 2tj-pw .. 2tj-pw+3, i.e.
 * E[tj], O[tj], E[tj+1], O[tj+1]: d B is computed for a whole tile row at once (R), then B^T (d B). */
PORT_ISA_CLONES static void wg_input_channel(float *V, const float *in, int64_t C, int64_t h, int64_t w,
                                             int64_t th, int64_t tw, int64_t ph, int64_t pw, int64_t t0,
                                             int64_t tcc, int64_t c) {
    int64_t CT = wg_ps(C * tcc);
    float E[4][WG_HALF], O[4][WG_HALF], R[4][WG_HALF];
    for (int64_t j = 0; j < tcc;) {
        wg_seg sg = wg_segment(t0, j, tcc, th, tw);
        int64_t n = sg.n, ti = sg.ti, tj0 = sg.tj0, tj1 = sg.tj1, len = tj1 - tj0;
        wg_rows(E, O, in + (n * C + c) * h * w, h, w, 2 * ti - ph, pw, tj0, tj1 + 1);
        for (int b = 0; b < 4; b++) {
            for (int a = 0; a < 4; a++) {
                const float *e = E[a] + tj0, *o = O[a] + tj0;
                float *r = R[a];
                switch (b) {
                case 0: for (int64_t q = 0; q < len; q++) r[q] = e[q] - e[q + 1]; break;
                case 1: for (int64_t q = 0; q < len; q++) r[q] = o[q] + e[q + 1]; break;
                case 2: for (int64_t q = 0; q < len; q++) r[q] = e[q + 1] - o[q]; break;
                default: for (int64_t q = 0; q < len; q++) r[q] = o[q] - o[q + 1]; break;
                }
            }
            float *v0 = V + (0 * 4 + b) * CT + c * tcc + j, *v1 = V + (1 * 4 + b) * CT + c * tcc + j;
            float *v2 = V + (2 * 4 + b) * CT + c * tcc + j, *v3 = V + (3 * 4 + b) * CT + c * tcc + j;
            for (int64_t q = 0; q < len; q++) {
                v0[q] = R[0][q] - R[2][q];
                v1[q] = R[1][q] + R[2][q];
                v2[q] = R[2][q] - R[1][q];
                v3[q] = R[1][q] - R[3][q];
            }
        }
        j += len;
    }
}

static void wg_input(float *V, const float *in, int64_t C, int64_t h, int64_t w, int64_t oh, int64_t ow,
                     int64_t ph, int64_t pw, int64_t t0, int64_t tcc) {
    int64_t th = (oh + 1) / 2, tw = (ow + 1) / 2;
#pragma omp parallel for schedule(static) if (C * tcc * 16 > PORT_PAR_MIN)
    for (int64_t c = 0; c < C; c++) wg_input_channel(V, in, C, h, w, th, tw, ph, pw, t0, tcc, c);
}

/* out[n][k0 + k][oh][ow] (tiles t0..t0+tcc, row k of M's kb rows, of Kc channels) = A^T M A (+ bias) */
static void wg_output_row(float *out, const float *M, const float *bias, int64_t Kc, int64_t k0, int64_t kb,
                          int64_t oh, int64_t ow, int64_t t0, int64_t tcc, int64_t k) {
    int64_t th = (oh + 1) / 2, tw = (ow + 1) / 2, KT = wg_ps(kb * tcc);
    {
        float bv = bias ? bias[k0 + k] : 0.0f;
        float row[2][WG_ROW_MAX];
        for (int64_t j = 0; j < tcc;) {
            wg_seg sg = wg_segment(t0, j, tcc, th, tw);
            int64_t n = sg.n, ti = sg.ti, tj0 = sg.tj0, tj1 = sg.tj1;
            const float *m = M + k * tcc + j - tj0;
            float *yk = out + (n * Kc + k0 + k) * oh * ow;
            int64_t r0 = 2 * ti;
#pragma omp simd
            for (int64_t tj = tj0; tj < tj1; tj++) {
                float s[2][4];
                for (int b = 0; b < 4; b++) {
                    float m0 = m[(0 * 4 + b) * KT + tj], m1 = m[(1 * 4 + b) * KT + tj];
                    float m2 = m[(2 * 4 + b) * KT + tj], m3 = m[(3 * 4 + b) * KT + tj];
                    s[0][b] = m0 + m1 + m2;
                    s[1][b] = m1 - m2 - m3;
                }
                for (int a = 0; a < 2; a++) {
                    row[a][2 * tj] = s[a][0] + s[a][1] + s[a][2] + bv;
                    row[a][2 * tj + 1] = s[a][1] - s[a][2] - s[a][3] + bv;
                }
            }
            int64_t lo = 2 * tj0, hi = PORT_MIN(2 * tj1, ow);
            for (int a = 0; a < 2 && r0 + a < oh; a++)
                memcpy(yk + (r0 + a) * ow + lo, row[a] + lo, (size_t)(hi - lo) * sizeof(float));
            j += tj1 - tj0;
        }
    }
}

/* out[n][k0 + k][oh][ow] (tiles t0..t0+tcc, k < kb of Kc channels) = A^T M A (+ bias) for M's kb rows */
static void wg_output(float *out, const float *M, const float *bias, int64_t Kc, int64_t k0, int64_t kb,
                      int64_t oh, int64_t ow, int64_t t0, int64_t tcc) {
#pragma omp parallel for schedule(static) if (kb * tcc * 16 > PORT_PAR_MIN)
    for (int64_t k = 0; k < kb; k++) wg_output_row(out, M, bias, Kc, k0, kb, oh, ow, t0, tcc, k);
}

/* Y[xi][k][j] = (A dy A^T)[xi] for the 2x2 output tiles t0 + j of dy[n][k0 + k][oh][ow] (zeros outside),
 * k < kb of Kc channels */
static void wg_grad_output_row(float *Y, const float *dy, int64_t Kc, int64_t k0, int64_t kb, int64_t oh,
                               int64_t ow, int64_t t0, int64_t tcc, int64_t k) {
    int64_t th = (oh + 1) / 2, tw = (ow + 1) / 2, KT = wg_ps(kb * tcc);
    {
        float row[2][WG_ROW_MAX];
        for (int64_t j = 0; j < tcc;) {
            wg_seg sg = wg_segment(t0, j, tcc, th, tw);
            int64_t n = sg.n, ti = sg.ti, tj0 = sg.tj0, tj1 = sg.tj1;
            const float *g = dy + (n * Kc + k0 + k) * oh * ow;
            float *y = Y + k * tcc + j - tj0;
            int64_t r0 = 2 * ti;
            int64_t lo = 2 * tj0, hi = 2 * tj1, vh = PORT_MIN(hi, ow);
            for (int a = 0; a < 2; a++) {
                if (r0 + a < oh) {
                    memcpy(row[a] + lo, g + (r0 + a) * ow + lo, (size_t)(vh - lo) * sizeof(float));
                    for (int64_t q = vh; q < hi; q++) row[a][q] = 0.0f;
                } else {
                    for (int64_t q = lo; q < hi; q++) row[a][q] = 0.0f;
                }
            }
#pragma omp simd
            for (int64_t tj = tj0; tj < tj1; tj++) {
                float s[4][2], e[2][2];
                for (int a = 0; a < 2; a++)
                    for (int b = 0; b < 2; b++) e[a][b] = row[a][2 * tj + b];
                for (int b = 0; b < 2; b++) {
                    s[0][b] = e[0][b];
                    s[1][b] = e[0][b] + e[1][b];
                    s[2][b] = e[0][b] - e[1][b];
                    s[3][b] = -e[1][b];
                }
                for (int a = 0; a < 4; a++) {
                    y[(a * 4 + 0) * KT + tj] = s[a][0];
                    y[(a * 4 + 1) * KT + tj] = s[a][0] + s[a][1];
                    y[(a * 4 + 2) * KT + tj] = s[a][0] - s[a][1];
                    y[(a * 4 + 3) * KT + tj] = -s[a][1];
                }
            }
            j += tj1 - tj0;
        }
    }
}

static void wg_grad_output(float *Y, const float *dy, int64_t Kc, int64_t k0, int64_t kb, int64_t oh, int64_t ow,
                           int64_t t0, int64_t tcc) {
#pragma omp parallel for schedule(static) if (kb * tcc * 16 > PORT_PAR_MIN)
    for (int64_t k = 0; k < kb; k++) wg_grad_output_row(Y, dy, Kc, k0, kb, oh, ow, t0, tcc, k);
}

/* The 16 GEMMs of one chunk.  On several threads each GEMM runs single-threaded on one thread (16 GEMMs
 * split evenly over 2, 4, 8 or 16 threads); port__gemm stays single-threaded inside a parallel region. */
static void wg_gemms(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t sa,
                     int64_t lda, const float *B, int64_t sb, int64_t ldb, float beta, float *C,
                     int64_t sc, int64_t ldc) {
#pragma omp parallel for schedule(static) if ((double)m * (double)n * (double)k * 16.0 >= PORT_GEMM_PAR_MIN)
    for (int xi = 0; xi < 16; xi++)
        port__gemm(ta, tb, m, n, k, 1.0f, A + xi * sa, lda, B + xi * sb, ldb, beta, C + xi * sc, ldc);
}

/* out[n][Kc][oh][ow] = conv3x3(in[n][C][h][w]) with the kernels wt (U[16][Kc][C] = their transform, flipped
 * for the backward input: see wg_weights_row). Whole U and chunks of tiles, or, when the tiles fit one chunk,
 * blocks of kb output channels with their own U rows (wg_block). */
static void wg_conv(float *out, const float *in, const float *wt, int flip, const float *bias, int64_t N,
                    int64_t C, int64_t h, int64_t w, int64_t Kc, int64_t oh, int64_t ow, int64_t ph, int64_t pw,
                    float *ws) {
    int64_t T = wg_tiles(N, oh, ow);
    if (wg_blocked(Kc, C, T)) {
        int64_t tb = wg_tb(Kc, C), nb = (T + tb - 1) / tb, per = wg_slot_floats(Kc, C, 0);
        int64_t th = (oh + 1) / 2, tw = (ow + 1) / 2;
        float *U = ws, *S = ws + 16 * wg_ps(Kc * C);
        wg_weights(U, wt, Kc, C, flip, 0, Kc);
        int team = wg_team(nb);
        (void)team;
#pragma omp parallel for schedule(dynamic, 1) num_threads(team) if (team > 1)
        for (int64_t b = 0; b < nb; b++) {
            int64_t t0 = b * tb, tcc = PORT_MIN(tb, T - t0);
            float *V = S + wg_slot() * per, *M = V + 16 * wg_ps(C * tcc);
            for (int64_t c = 0; c < C; c++) wg_input_channel(V, in, C, h, w, th, tw, ph, pw, t0, tcc, c);
            for (int xi = 0; xi < 16; xi++)
                port__gemm(0, 0, Kc, tcc, C, 1.0f, U + xi * wg_ps(Kc * C), C, V + xi * wg_ps(C * tcc), tcc, 0.0f,
                           M + xi * wg_ps(Kc * tcc), tcc);
            for (int64_t k = 0; k < Kc; k++) wg_output_row(out, M, bias, Kc, 0, Kc, oh, ow, t0, tcc, k);
        }
        return;
    }
    int64_t tc = wg_chunk(Kc, C, T), kb = wg_block(Kc, C, T);
    float *U = ws, *V = U + 16 * wg_ps(kb * C), *M = V + 16 * wg_ps(C * tc);
    if (kb == Kc) wg_weights(U, wt, Kc, C, flip, 0, Kc);
    for (int64_t t0 = 0; t0 < T; t0 += tc) {
        int64_t tcc = PORT_MIN(tc, T - t0);
        wg_input(V, in, C, h, w, oh, ow, ph, pw, t0, tcc);
        for (int64_t k0 = 0; k0 < Kc; k0 += kb) {   /* one pass unless blocked (then t0 = 0, tcc = T) */
            int64_t kbb = PORT_MIN(kb, Kc - k0);
            if (kb < Kc) wg_weights(U, wt, Kc, C, flip, k0, kbb);
            wg_gemms(0, 0, kbb, tcc, C, U, wg_ps(kbb * C), C, V, wg_ps(C * tcc), tcc, 0.0f, M,
                     wg_ps(kbb * tcc), tcc);
            wg_output(out, M, bias, Kc, k0, kbb, oh, ow, t0, tcc);
        }
    }
}

void port__conv_winograd_fwd(float *y, const float *x, const float *w, const float *b,
                             const port_conv2d_params *p, float *ws) {
    wg_conv(y, x, w, 0, b, p->n, p->c_in, p->h, p->w, p->c_out, port_conv2d_out_h(p), port_conv2d_out_w(p),
            p->pad_h, p->pad_w, ws);
}

void port__conv_winograd_bwd_in(float *dx, const float *dy, const float *w, const port_conv2d_params *p,
                                float *ws) {
    wg_conv(dx, dy, w, 1, NULL, p->n, p->c_out, port_conv2d_out_h(p), port_conv2d_out_w(p), p->c_in, p->h,
            p->w, 2 - p->pad_h, 2 - p->pad_w, ws);
}

/* dw[kc] += G^T dU[kc] G for the kc < KC (output, input) channel pairs of dU's rows */
static void wg_dw(float *dw, const float *dU, int64_t KC) {
    int64_t sdu = wg_ps(KC);
#pragma omp parallel for schedule(static) if (KC * 16 > PORT_PAR_MIN)
    for (int64_t kc = 0; kc < KC; kc++) {
        float u[4][4], s[3][4];
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++) u[a][b] = dU[(a * 4 + b) * sdu + kc];
        for (int b = 0; b < 4; b++) {
            s[0][b] = u[0][b] + 0.5f * (u[1][b] + u[2][b]);
            s[1][b] = 0.5f * (u[1][b] - u[2][b]);
            s[2][b] = 0.5f * (u[1][b] + u[2][b]) + u[3][b];
        }
        float *g = dw + kc * 9;
        for (int a = 0; a < 3; a++) {
            g[a * 3 + 0] += s[a][0] + 0.5f * (s[a][1] + s[a][2]);
            g[a * 3 + 1] += 0.5f * (s[a][1] - s[a][2]);
            g[a * 3 + 2] += 0.5f * (s[a][1] + s[a][2]) + s[a][3];
        }
    }
}

void port__conv_winograd_bwd_w(float *dw, const float *dy, const float *x, const port_conv2d_params *p,
                               float *ws) {
    int64_t C = p->c_in, Kc = p->c_out, oh = port_conv2d_out_h(p), ow = port_conv2d_out_w(p);
    int64_t T = wg_tiles(p->n, oh, ow);
    if (wg_blocked(Kc, C, T)) {
        /* WG_SLOTS groups of consecutive blocks (fewer if there are fewer blocks), fixed by the shape: group g
         * sums its blocks' products in block order into its own dU, the groups' dU are then added in order */
        int64_t tb = wg_tb(Kc, C), nb = (T + tb - 1) / tb, G = PORT_MIN(nb, WG_SLOTS);
        int64_t per = wg_slot_floats(Kc, C, 1), KC = Kc * C, sdu = wg_ps(KC);
        int64_t th = (oh + 1) / 2, tw = (ow + 1) / 2;
        int team = wg_team(G);
        (void)team;
#pragma omp parallel for schedule(dynamic, 1) num_threads(team) if (team > 1)
        for (int64_t g = 0; g < G; g++) {
            float *dUg = ws + g * per, *V = dUg + 16 * sdu;
            for (int64_t b = g * nb / G; b < (g + 1) * nb / G; b++) {
                int64_t t0 = b * tb, tcc = PORT_MIN(tb, T - t0);
                float *Y = V + 16 * wg_ps(C * tcc);
                for (int64_t c = 0; c < C; c++)
                    wg_input_channel(V, x, C, p->h, p->w, th, tw, p->pad_h, p->pad_w, t0, tcc, c);
                for (int64_t k = 0; k < Kc; k++) wg_grad_output_row(Y, dy, Kc, 0, Kc, oh, ow, t0, tcc, k);
                for (int xi = 0; xi < 16; xi++)
                    port__gemm(0, 1, Kc, C, tcc, 1.0f, Y + xi * wg_ps(Kc * tcc), tcc, V + xi * wg_ps(C * tcc), tcc,
                               b == g * nb / G ? 0.0f : 1.0f, dUg + xi * sdu, C);
            }
        }
        if (G > 1) {
#pragma omp parallel for schedule(static) if (16 * KC * G > PORT_PAR_MIN)
            for (int64_t e = 0; e < 16 * KC; e++) {
                int64_t o = e / KC * sdu + e % KC;
                float acc = ws[o];
                for (int64_t g = 1; g < G; g++) acc += ws[g * per + o];
                ws[o] = acc;
            }
        }
        wg_dw(dw, ws, KC);
        return;
    }
    int64_t tc = wg_chunk(Kc, C, T), kb = wg_block(Kc, C, T);
    float *dU = ws, *V = ws + 16 * wg_ps(kb * C), *Y = V + 16 * wg_ps(C * tc);
    if (kb < Kc)   /* blocked: the tiles fit one chunk, V is made once */
        wg_input(V, x, C, p->h, p->w, oh, ow, p->pad_h, p->pad_w, 0, T);
    for (int64_t k0 = 0; k0 < Kc; k0 += kb) {
        int64_t kbb = PORT_MIN(kb, Kc - k0);
        for (int64_t t0 = 0; t0 < T; t0 += tc) {
            int64_t tcc = PORT_MIN(tc, T - t0);
            if (kb == Kc) wg_input(V, x, C, p->h, p->w, oh, ow, p->pad_h, p->pad_w, t0, tcc);
            wg_grad_output(Y, dy, Kc, k0, kbb, oh, ow, t0, tcc);
            wg_gemms(0, 1, kbb, C, tcc, Y, wg_ps(kbb * tcc), tcc, V, wg_ps(C * tcc), tcc, t0 == 0 ? 0.0f : 1.0f,
                     dU, wg_ps(kbb * C), C);
        }
        wg_dw(dw + k0 * C * 9, dU, kbb * C);
    }
}
