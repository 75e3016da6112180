/*
 * port_kernels.h -- the public C ABI of the PORT kernel library.
 *
 * Conventions (apply to every kernel below):
 *  - Flat C ABI, `port_` prefix, every kernel returns a port_status.
 *  - Argument order: OUTPUTS first, then INPUTS, then PARAMS, then WORKSPACE
 *    (pointer + size in bytes).
 *  - Caller-owned memory: kernels never allocate, print or exit.  A kernel
 *    that needs scratch memory has a `*_workspace_bytes()` query; passing a
 *    smaller workspace returns PORT_ERR_WORKSPACE.
 *  - Activations are float32, NCHW, contiguous.  Labels are int64.  Max-pool
 *    indices are int64 flat indices into the H*W plane of the input (same as
 *    PyTorch).  Dropout masks are uint8, one byte per element (1 = kept).
 *  - Gradient semantics:
 *      * WEIGHT gradients (dw, db, dgamma, dbeta) ACCUMULATE:  dw += ...
 *        (patch execution / micro-batching rely on this; zero them yourself
 *        at the start of a step).
 *      * INPUT gradients (dx) OVERWRITE: dx = ...
 *  - Aliasing: outputs must not overlap inputs, except where a kernel states
 *    "may alias" (in-place variants).  Aliasing is then allowed only as exact
 *    equality of the two pointers.
 *  - Threads: kernels use OpenMP (port_set_num_threads) and BLAS.  Threads split
 *    independent outputs and every sum runs in an order fixed by the shapes, so
 *    results are bit-identical at any thread count: the BLAS backend
 *    (PORT_GEMM_BLAS) splits a large product into row or column blocks chosen
 *    by its shape and the machine's processor count (omp_get_num_procs), each
 *    one single-threaded sgemm; the vendored GEMM
 *    splits C over threads but sums every element of it the same way.  A
 *    training run may change its thread count between steps without changing
 *    a bit (tests/kernels/test_threads.py).
 *  - "Saved:" lines list what the backward of a kernel needs from forward.
 */
#ifndef PORT_KERNELS_H
#define PORT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define PORT_API __declspec(dllexport)
#else
#define PORT_API __attribute__((visibility("default")))
#endif

#define PORT_ABI_VERSION 2

typedef enum {
    PORT_OK = 0,
    PORT_ERR_NULL = 1,        /* a required pointer is NULL               */
    PORT_ERR_SHAPE = 2,       /* non-positive / inconsistent dimensions   */
    PORT_ERR_ARG = 3,         /* bad scalar argument (p, eps, label, ...) */
    PORT_ERR_WORKSPACE = 4,   /* workspace too small                      */
    PORT_ERR_UNSUPPORTED = 5, /* algorithm not applicable to these params */
    PORT_ERR_ALIAS = 6        /* forbidden aliasing of output and input   */
} port_status;

/* ------------------------------------------------------------------ */
/* Library-wide                                                        */
/* ------------------------------------------------------------------ */
PORT_API const char *port_status_string(int status);
PORT_API int port_abi_version(void);
/* OpenMP threads of the kernels AND the BLAS threads. */
PORT_API void port_set_num_threads(int n);
PORT_API int port_get_num_threads(void);
/* 1 if the vendored GEMM runs AVX-512 code on this CPU (runtime dispatch). */
PORT_API int port_cpu_has_avx512(void);

/* GEMM backend: PORT_GEMM_BLAS (OpenBLAS CBLAS), PORT_GEMM_VENDORED (blocked
 * SGEMM in this library, AVX-512 / AVX2 / portable micro kernels by run-time
 * dispatch, and AVX-512 kernels for narrow products: n <= 32 (n <= 64 untransposed), or
 * B^T with k <= 16; also the test oracle) or PORT_GEMM_AUTO (OpenBLAS built in: the
 * vendored one, but OpenBLAS for small products and n <= 16 that the narrow
 * kernels do not take, by shape only).
 * Default with OpenBLAS built in: AUTO on a CPU with AVX-512 whose OpenBLAS
 * runs AVX-512 kernels, VENDORED on one whose OpenBLAS does not (e.g.
 * OPENBLAS_CORETYPE=Haswell), BLAS elsewhere; without OpenBLAS: VENDORED. */
#define PORT_GEMM_BLAS 0
#define PORT_GEMM_VENDORED 1
#define PORT_GEMM_AUTO 2
PORT_API port_status port_set_gemm_backend(int backend);
PORT_API int port_get_gemm_backend(void);
/* The GEMM port_sgemm runs for op(A)[m x k] op(B)[k x n] under the current setting: PORT_GEMM_BLAS or
 * PORT_GEMM_VENDORED (AUTO resolved by shape). */
PORT_API int port_gemm_backend_for(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k);

/* Row-major C[m,n] = alpha * op(A)[m,k] op(B)[k,n] + beta * C.
 * trans_a / trans_b: 0 = no transpose, 1 = transpose. */
PORT_API port_status port_sgemm(float *c, const float *a, const float *b,
                                int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                float alpha, float beta, int64_t lda, int64_t ldb, int64_t ldc);

/* ------------------------------------------------------------------ */
/* Convolution 2D (dilation 1).  x[n,c_in,h,w], w[c_out,c_in/groups,kh,kw],
 * b[c_out] (may be NULL), y[n,c_out,h_out,w_out].
 * Saved for backward: x and w (input grad needs only w).                */
/* ------------------------------------------------------------------ */
typedef struct {
    int64_t n, c_in, h, w, c_out, kh, kw, stride_h, stride_w, pad_h, pad_w, groups;
    /* Output dims the caller's y/dy buffers have, or 0 (not given).  When
     * given, every kernel taking these params refuses (PORT_ERR_SHAPE) dims
     * other than port_conv2d_out_h/w: a buffer sized for other params. */
    int64_t h_out, w_out;
} port_conv2d_params;

/* algorithms */
#define PORT_CONV_AUTO 0   /* direct for depthwise / 1x1-s1-p0, winograd where it pays, else im2col */
#define PORT_CONV_IM2COL 1 /* im2col + GEMM, any params                      */
#define PORT_CONV_DIRECT 2 /* depthwise (groups==c_in==c_out) or 1x1 s1 p0  */
#define PORT_CONV_WINOGRAD 3 /* F(2x2,3x3): 3x3, stride 1, groups 1, pad <= 2 */

PORT_API int64_t port_conv2d_out_h(const port_conv2d_params *p);
PORT_API int64_t port_conv2d_out_w(const port_conv2d_params *p);
PORT_API port_status port_conv2d_check(const port_conv2d_params *p);
/* Workspace (bytes) shared by forward / backward_input / backward_weight. */
PORT_API size_t port_conv2d_workspace_bytes(const port_conv2d_params *p, int algo);
/* The algorithm `algo` runs as for these params (PORT_CONV_AUTO resolved), or -1 when it does not apply.
 * AUTO picks winograd where it is legal and each of its 16 GEMMs gets at least PORT_WG_AUTO_MIN_TILES
 * columns (2x2 output tiles over the batch) and 16 input and output channels; fewer tiles or channels
 * leave the GEMMs too small to repay the transforms (measured: bench/kernels.py). */
PORT_API int port_conv2d_resolve_algo(const port_conv2d_params *p, int algo);

PORT_API port_status port_conv2d_forward(float *y, const float *x, const float *w, const float *b,
                                         const port_conv2d_params *p, int algo,
                                         void *ws, size_t ws_bytes);
/* dx = conv_transpose(dy, w)   (overwrites dx) */
PORT_API port_status port_conv2d_backward_input(float *dx, const float *dy, const float *w,
                                                const port_conv2d_params *p, int algo,
                                                void *ws, size_t ws_bytes);
/* dw += corr(x, dy); db += sum(dy) (db may be NULL) */
PORT_API port_status port_conv2d_backward_weight(float *dw, float *db, const float *dy,
                                                 const float *x, const port_conv2d_params *p,
                                                 int algo, void *ws, size_t ws_bytes);
/* dw = corr(x, dy); db = sum(dy): the same values as port_conv2d_backward_weight into zeroed dw/db, without
 * reading their old contents (a gradient's first writer in a step: no zeroing pass over it beforehand) */
PORT_API port_status port_conv2d_backward_weight_overwrite(float *dw, float *db, const float *dy,
                                                           const float *x, const port_conv2d_params *p,
                                                           int algo, void *ws, size_t ws_bytes);

/* Patch-based (spatially tiled) convolution: the output is computed in
 * tiles of tile_h x tile_w output pixels; im2col is done per tile with its
 * input halo, so the workspace scales with the tile, not the image.  A tile
 * spanning whole rows (tile_w >= W_out: a band, what PORT's patch<T>
 * variants run) needs no output buffer -- the GEMM writes y and reads dy in
 * place -- so its workspace is the band's im2col alone.  A tile's rows are
 * split over the OpenMP threads.  Results equal the whole-tensor kernels
 * (fp32 rounding aside). */
PORT_API size_t port_conv2d_patch_workspace_bytes(const port_conv2d_params *p, int64_t tile_h,
                                                  int64_t tile_w);
PORT_API port_status port_conv2d_patch_forward(float *y, const float *x, const float *w,
                                               const float *b, const port_conv2d_params *p,
                                               int64_t tile_h, int64_t tile_w, void *ws,
                                               size_t ws_bytes);
PORT_API port_status port_conv2d_patch_backward_input(float *dx, const float *dy, const float *w,
                                                      const port_conv2d_params *p, int64_t tile_h,
                                                      int64_t tile_w, void *ws, size_t ws_bytes);
PORT_API port_status port_conv2d_patch_backward_weight(float *dw, float *db, const float *dy,
                                                       const float *x,
                                                       const port_conv2d_params *p,
                                                       int64_t tile_h, int64_t tile_w, void *ws,
                                                       size_t ws_bytes);

/* Plain reference convolution (direct loops over the definition, double accumulators, no workspace, single
 * thread): the in-C oracle the fast kernels are tested against.  Same semantics as the three calls above:
 * forward overwrites y, backward_input overwrites dx, backward_weight accumulates into dw (and db). */
PORT_API port_status port_conv2d_reference_forward(float *y, const float *x, const float *w,
                                                   const float *b, const port_conv2d_params *p);
PORT_API port_status port_conv2d_reference_backward_input(float *dx, const float *dy, const float *w,
                                                          const port_conv2d_params *p);
PORT_API port_status port_conv2d_reference_backward_weight(float *dw, float *db, const float *dy,
                                                           const float *x,
                                                           const port_conv2d_params *p);

/* ------------------------------------------------------------------ */
/* Batch norm 2D over x[n,c,h,w]; gamma/beta/means/vars are [c].        */
/* ------------------------------------------------------------------ */
typedef struct {
    int64_t n, c, h, w;
    float eps;
    float momentum; /* running = (1-momentum)*running + momentum*batch */
} port_batchnorm_params;

/* Training: batch statistics (biased variance to normalise), writes
 * save_mean[c], save_invstd[c] = 1/sqrt(var+eps); updates running_mean and
 * running_var (UNBIASED variance, like PyTorch) unless they are NULL.
 * y MAY ALIAS x (in-place BN).
 * Saved: x, save_mean, save_invstd (or, in-place: y, gamma, beta, save_invstd). */
PORT_API port_status port_batchnorm2d_forward_train(float *y, float *save_mean, float *save_invstd,
                                                    float *running_mean, float *running_var,
                                                    const float *x, const float *gamma,
                                                    const float *beta,
                                                    const port_batchnorm_params *p);
/* Frozen / eval: normalise with running stats.  y MAY ALIAS x. Saved: x (only
 * for dgamma) and running stats. */
PORT_API port_status port_batchnorm2d_forward_eval(float *y, const float *x, const float *gamma,
                                                   const float *beta,
                                                   const float *running_mean,
                                                   const float *running_var,
                                                   const port_batchnorm_params *p);
/* Training backward. dx MAY ALIAS dy. */
PORT_API port_status port_batchnorm2d_backward_input(float *dx, const float *dy, const float *x,
                                                     const float *gamma, const float *save_mean,
                                                     const float *save_invstd,
                                                     const port_batchnorm_params *p);
/* dgamma += sum(dy*xhat), dbeta += sum(dy) (either may be NULL) */
PORT_API port_status port_batchnorm2d_backward_weight(float *dgamma, float *dbeta, const float *dy,
                                                      const float *x, const float *save_mean,
                                                      const float *save_invstd,
                                                      const port_batchnorm_params *p);
/* In-place BN backward: xhat is reconstructed as (y - beta) / gamma.
 * REQUIRES gamma[c] != 0 for every channel (PORT_ERR_ARG otherwise).
 * dx MAY ALIAS dy. */
PORT_API port_status port_batchnorm2d_backward_input_from_output(
    float *dx, const float *dy, const float *y, const float *gamma, const float *beta,
    const float *save_invstd, const port_batchnorm_params *p);
PORT_API port_status port_batchnorm2d_backward_weight_from_output(
    float *dgamma, float *dbeta, const float *dy, const float *y, const float *gamma,
    const float *beta, const port_batchnorm_params *p);
/* Frozen BN backward: dx = dy * gamma / sqrt(running_var + eps). dx MAY ALIAS dy. */
PORT_API port_status port_batchnorm2d_backward_input_eval(float *dx, const float *dy,
                                                          const float *gamma,
                                                          const float *running_var,
                                                          const port_batchnorm_params *p);
PORT_API port_status port_batchnorm2d_backward_weight_eval(float *dgamma, float *dbeta,
                                                           const float *dy, const float *x,
                                                           const float *running_mean,
                                                           const float *running_var,
                                                           const port_batchnorm_params *p);

/* ------------------------------------------------------------------ */
/* Element-wise (count = number of elements)                             */
/* ------------------------------------------------------------------ */
/* y MAY ALIAS x.  Saved: y (the output) only. */
PORT_API port_status port_relu_forward(float *y, const float *x, int64_t count);
/* dx = dy * (y > 0).  dx MAY ALIAS dy. */
PORT_API port_status port_relu_backward(float *dx, const float *dy, const float *y, int64_t count);
/* y = min(max(x,0),6). y MAY ALIAS x.  Saved: y. */
PORT_API port_status port_relu6_forward(float *y, const float *x, int64_t count);
/* dx = dy * (0 < y < 6).  dx MAY ALIAS dy. */
PORT_API port_status port_relu6_backward(float *dx, const float *dy, const float *y,
                                         int64_t count);
/* y = x * relu6(x+3)/6.  y must NOT alias x (backward needs x). Saved: x. */
PORT_API port_status port_hardswish_forward(float *y, const float *x, int64_t count);
/* dx MAY ALIAS dy. */
PORT_API port_status port_hardswish_backward(float *dx, const float *dy, const float *x,
                                             int64_t count);

/* sigmoid (backward from the output y), hardsigmoid relu6(x + 3) / 6 and silu x sigmoid(x) (backward from the
 * input x), as torch.sigmoid / F.hardsigmoid / F.silu and their derivatives. y may be x (in place); dx may be dy. */
PORT_API port_status port_sigmoid_forward(float *y, const float *x, int64_t count);
PORT_API port_status port_sigmoid_backward(float *dx, const float *dy, const float *y, int64_t count);
PORT_API port_status port_hardsigmoid_forward(float *y, const float *x, int64_t count);
PORT_API port_status port_hardsigmoid_backward(float *dx, const float *dy, const float *x, int64_t count);
PORT_API port_status port_silu_forward(float *y, const float *x, int64_t count);
PORT_API port_status port_silu_backward(float *dx, const float *dy, const float *x, int64_t count);
/* silu computes in float32 (port__expf_f32's e^-|x|: within a few float ulps of the exact value, as torch's float
 * silu; -0 below x = -87, where the exact value is under 1e-36);
 * its references compute the logistic in double, rounded once (as sigmoid), about 4x slower. */
PORT_API port_status port_silu_forward_reference(float *y, const float *x, int64_t count);
PORT_API port_status port_silu_backward_reference(float *dx, const float *dy, const float *x, int64_t count);

/* ---- issue 54 fused variants (h54-fused) ---- */
/* SwiGLU y = silu(a) * b (same shapes, count elements) and its gradients, the same bits as port_silu_forward then
 * an element-wise product (and their backward: ga = dy b, da = silu'(a) ga, db = dy silu(a)). No output may alias
 * an input or each other; da or db may be dy (in place). */
PORT_API port_status port_swiglu_forward(float *y, const float *a, const float *b, int64_t count);
PORT_API port_status port_swiglu_backward(float *da, float *db, const float *dy, const float *a,
                                          const float *b, int64_t count);
/* Rotary position embedding fused (transformer.c): y = x cos + rotate_half(x) sin over the last dim d (even),
 * x, y [n, heads, seq, d], cos, sin [table_n, 1, seq, d] (table_n 1 or n); the same bits as the plain
 * mul -> narrow/neg/cat -> mul -> add chain.  Backward dx = dy cos + rotate_half^T(dy sin).  y may be x and dx
 * may be dy (in place). */
PORT_API port_status port_rotary_forward(float *y, const float *x, const float *cos_t, const float *sin_t,
                                         int64_t n, int64_t heads, int64_t seq, int64_t d, int64_t table_n);
PORT_API port_status port_rotary_backward(float *dx, const float *dy, const float *cos_t, const float *sin_t,
                                          int64_t n, int64_t heads, int64_t seq, int64_t d, int64_t table_n);
/* Squeeze-excitation (se.c): y = x * gate(W2 act(W1 mean_hw(x) + b1) + b2) per (n, c) of x [n, c, hw], with
 * w1 [s, c], b1 [s], w2 [c, s], b2 [c]; act PORT_SE_RELU or PORT_SE_SILU, gate PORT_SE_SIGMOID or
 * PORT_SE_HARDSIGMOID.  The forward writes y [n, c, hw], h = W1 pooled + b1 [n, s] and z = W2 act(h) + b2 [n, c]
 * (what the backward reads; the pooled mean, act(h) and the gate are rebuilt).  The backward is two calls:
 * _weight accumulates dw1, db1, dw2, db2 and writes dh = d(loss)/dh [n, s] from dy, x, w2, h, z; _input writes
 * dx = dy gate + (W1^T dh) / hw from dy, z, w1, dh (dx may be dy).  Workspace: port_se_workspace_bytes(n, c, s,
 * kernel) with kernel 0 forward, 1 _weight, 2 _input.  Each step runs the plain member's kernel (the pool, the
 * fcs as pointwise PORT_CONV_DIRECT convolutions, the activation kernels, the mul's gradient sums): the plain
 * chain's bits at any thread count. */
enum { PORT_SE_RELU = 0, PORT_SE_SILU = 1 };
enum { PORT_SE_SIGMOID = 0, PORT_SE_HARDSIGMOID = 1 };
PORT_API size_t port_se_workspace_bytes(int64_t n, int64_t c, int64_t s, int kernel);
PORT_API port_status port_se_forward(float *y, float *h, float *z, const float *x, const float *w1, const float *b1,
                                     const float *w2, const float *b2, int64_t n, int64_t c, int64_t s, int64_t hw,
                                     int act, int gate, void *ws, size_t ws_bytes);
PORT_API port_status port_se_backward_weight(float *dw1, float *db1, float *dw2, float *db2, float *dh,
                                             const float *dy, const float *x, const float *w2, const float *h,
                                             const float *z, int64_t n, int64_t c, int64_t s, int64_t hw, int act,
                                             int gate, void *ws, size_t ws_bytes);
/* the same, writing dw1, db1, dw2, db2 instead of adding to them (the step's only writer of those gradients) */
PORT_API port_status port_se_backward_weight_overwrite(float *dw1, float *db1, float *dw2, float *db2, float *dh,
                                                       const float *dy, const float *x, const float *w2,
                                                       const float *h, const float *z, int64_t n, int64_t c,
                                                       int64_t s, int64_t hw, int act, int gate, void *ws,
                                                       size_t ws_bytes);
PORT_API port_status port_se_backward_input(float *dx, const float *dy, const float *z, const float *w1,
                                            const float *dh, int64_t n, int64_t c, int64_t s, int64_t hw, int gate,
                                            void *ws, size_t ws_bytes);
/* RMSNorm + linear fused (rmslinear.c): the norm's output y = x rstd gamma [n, in] never stored.  _stats writes
 * rstd [n] as port_rmsnorm_forward does; _linear_forward writes y_lin [n, out] = y W^T + b (wt: W stored [in, out],
 * y W + b) and _linear_backward_weight accumulates dw += dy^T y (wt: y^T dy), db += sum_n dy (db, b, gamma may be
 * NULL), each normalising blocks of block_rows rows of x into the workspace (port_rmsnorm_linear_workspace_bytes)
 * and running the linear kernels on them: block_rows >= n gives the plain rms_norm -> linear chain's bits;
 * smaller blocks, the same rows on smaller GEMMs and the weight gradient summed block by block in row order. */
PORT_API size_t port_rmsnorm_linear_workspace_bytes(int64_t n, int64_t in, int64_t block_rows);
PORT_API port_status port_rmsnorm_stats(float *rstd, const float *x, int64_t rows, int64_t d, float eps);
PORT_API port_status port_rmsnorm_linear_forward(float *y, const float *x, const float *rstd, const float *gamma,
                                                 const float *w, const float *b, int64_t n, int64_t in, int64_t out,
                                                 int64_t block_rows, int wt, void *ws, size_t ws_bytes);
PORT_API port_status port_rmsnorm_linear_backward_weight(float *dw, float *db, const float *dy, const float *x,
                                                         const float *rstd, const float *gamma, int64_t n,
                                                         int64_t in, int64_t out, int64_t block_rows, int wt,
                                                         void *ws, size_t ws_bytes);
/* All k linears reading one norm in one call (k <= PORT_RMSLIN_MAX_LINEARS; ids 119, 131).  _linears_forward
 * writes rstd [n] (as port_rmsnorm_stats) and y[i] [n, out[i]] = y_n W_i^T + b_i (wt: W_i stored [in, out[i]])
 * for i < k, normalising each block of block_rows rows of x into the workspace (port_rmsnorm_linear_workspace_bytes)
 * once and running the k linears' GEMMs on it; _linears_backward_weight accumulates dw[i] += dy[i]^T y_n (wt:
 * y_n^T dy[i]) and db[i] += sum_n dy[i], the block rebuilt once for all k.  b, db (the arrays) and their entries,
 * gamma may be NULL.  block_rows >= n: the plain rms_norm -> linears chain's bits; smaller blocks as the
 * per-linear calls above.  _ref: the plain members themselves (port_rmsnorm_forward, or the norm's output rebuilt
 * whole, then port_linear_* on all n rows; block_rows unused, workspace that of block_rows = n). */
#define PORT_RMSLIN_MAX_LINEARS 3
PORT_API port_status port_rmsnorm_linears_forward(float *rstd, float *const *y, const float *x, const float *gamma,
                                                  const float *const *w, const float *const *b, const int64_t *out,
                                                  int64_t k, int64_t n, int64_t in, float eps, int64_t block_rows,
                                                  int wt, void *ws, size_t ws_bytes);
PORT_API port_status port_rmsnorm_linears_forward_ref(float *rstd, float *const *y, const float *x,
                                                      const float *gamma, const float *const *w,
                                                      const float *const *b, const int64_t *out, int64_t k, int64_t n,
                                                      int64_t in, float eps, int64_t block_rows, int wt, void *ws,
                                                      size_t ws_bytes);
PORT_API port_status port_rmsnorm_linears_backward_weight(float *const *dw, float *const *db, const float *const *dy,
                                                          const float *x, const float *rstd, const float *gamma,
                                                          const int64_t *out, int64_t k, int64_t n, int64_t in,
                                                          int64_t block_rows, int wt, void *ws, size_t ws_bytes);
PORT_API port_status port_rmsnorm_linears_backward_weight_ref(float *const *dw, float *const *db,
                                                              const float *const *dy, const float *x,
                                                              const float *rstd, const float *gamma,
                                                              const int64_t *out, int64_t k, int64_t n, int64_t in,
                                                              int64_t block_rows, int wt, void *ws, size_t ws_bytes);
/* ---- end issue 54 fused variants ---- */
/* y = a + b; y MAY ALIAS a or b.  Backward is the identity (no kernel). */
PORT_API port_status port_add(float *y, const float *a, const float *b, int64_t count);
/* a += b */
PORT_API port_status port_accumulate(float *a, const float *b, int64_t count);

/* ---- issue 54: random numbers (rng.c) --------------------------------------------------------------------
 * PORT's one generator, Philox4x32-10 (Salmon et al., SC'11; Random123): element e of a call draws the 32-bit
 * word e % 4 of Philox4x32-10 with key (seed low 32 bits, seed high 32 bits) and counter (e/4 low, e/4 high,
 * stream low, stream high).  A pure function of (seed, stream, e): the same bits at any thread count, on every
 * backend and in port-rt.  PORT's calls pass the run's seed and stream = port_rt_rng_stream(forward passes done,
 * graph op id).  A draw u keeps an element of dropout(p) iff u >= ceil(p 2^32) and is a one of bernoulli(q) iff
 * u < ceil(q 2^32). */
/* One Philox4x32-10 block: out[4] of the counter ctr[4] under the key key[2] (for known-answer tests). */
PORT_API void port_philox4x32_10(uint32_t *out, const uint32_t *ctr, const uint32_t *key);
/* out[i] = the draw of element offset + i. */
PORT_API port_status port_rng_u32(uint32_t *out, int64_t count, int64_t offset, uint64_t seed, uint64_t stream);
/* Dropout: mask[i] = keep(i), y = x * mask / (1 - p).  p in [0, 1); y MAY ALIAS x.  Saved: mask (uint8). */
PORT_API port_status port_dropout_forward(float *y, uint8_t *mask, const float *x, int64_t count, float p,
                                          uint64_t seed, uint64_t stream);
/* dx = dy*mask/(1-p).  dx MAY ALIAS dy. */
PORT_API port_status port_dropout_backward(float *dx, const float *dy, const uint8_t *mask,
                                           int64_t count, float p);
/* y[i] = 1 with probability prob, else 0 (torch's bernoulli_(prob): stochastic depth's per-sample mask).
 * prob in [0, 1]. */
PORT_API port_status port_bernoulli_forward(float *y, int64_t count, float prob, uint64_t seed, uint64_t stream);
/* ---- end issue 54 random numbers ---------------------------------------------------------------------- */

/* ------------------------------------------------------------------ */
/* Pooling                                                               */
/* ------------------------------------------------------------------ */
typedef struct {
    int64_t n, c, h, w, kh, kw, stride_h, stride_w, pad_h, pad_w;
    /* Output dims of the caller's y/dy/indices buffers, or 0 (not given);
     * when given, dims other than port_pool2d_out_h/w give PORT_ERR_SHAPE. */
    int64_t h_out, w_out;
    /* Dilation (0 or 1: none; max pools only, average pools refuse other values with PORT_ERR_ARG) and
     * ceil_mode (0/1: PyTorch's rule, a last window must start inside the input or its left padding). */
    int64_t dilation_h, dilation_w, ceil_mode;
    /* Average pools only (max pools refuse 1): 0 divides by the window's size inside the padded input
     * (count_include_pad=True, PyTorch's default), 1 by its count of input elements (count_include_pad=False). */
    int64_t exclude_pad;
} port_pool2d_params;

PORT_API int64_t port_pool2d_out_h(const port_pool2d_params *p);
PORT_API int64_t port_pool2d_out_w(const port_pool2d_params *p);
/* Max pool (padding = -inf), with dilation and ceil_mode. indices: int64 flat index in the input H*W
 * plane (the first maximum in window order; NaN wins).  Saved: indices only. */
PORT_API port_status port_maxpool2d_forward(float *y, int64_t *indices, const float *x,
                                            const port_pool2d_params *p);
PORT_API port_status port_maxpool2d_backward_input(float *dx, const float *dy,
                                                   const int64_t *indices,
                                                   const port_pool2d_params *p);
/* Average pool with ceil_mode and count_include_pad as PyTorch (no divisor_override): a window clipped to the
 * padded input [-pad, size + pad) is divided by its size there (exclude_pad 0) or by its count of input
 * elements (exclude_pad 1); y = sum * (1 / divisor) in float.  Saved: nothing. */
PORT_API port_status port_avgpool2d_forward(float *y, const float *x, const port_pool2d_params *p);
PORT_API port_status port_avgpool2d_backward_input(float *dx, const float *dy,
                                                   const port_pool2d_params *p);
/* Global average pool x[n,c,h,w] -> y[n,c].  Saved: nothing. */
PORT_API port_status port_global_avgpool_forward(float *y, const float *x, int64_t n, int64_t c,
                                                 int64_t hw);
PORT_API port_status port_global_avgpool_backward_input(float *dx, const float *dy, int64_t n,
                                                        int64_t c, int64_t hw);

/* ------------------------------------------------------------------ */
/* Linear: y[n,out] = x[n,in] W[out,in]^T + b[out] (b may be NULL).      */
/* Saved: x (weight grad), W (input grad).                               */
/* ------------------------------------------------------------------ */
typedef struct {
    int64_t n, in_features, out_features;
} port_linear_params;

PORT_API port_status port_linear_forward(float *y, const float *x, const float *w, const float *b,
                                         const port_linear_params *p);
PORT_API port_status port_linear_backward_input(float *dx, const float *dy, const float *w,
                                                const port_linear_params *p);
/* dw += dy^T x, db += sum_n dy (db may be NULL) */
PORT_API port_status port_linear_backward_weight(float *dw, float *db, const float *dy,
                                                 const float *x, const port_linear_params *p);
/* ---- issue 54 (Conv1D): the same three with W stored [in, out] (Hugging Face GPT-2's Conv1D,
 * addmm(b, x, W)): y = x W + b; dx = dy W^T; dw[in, out] += x^T dy, db += sum_n dy (db may be NULL). */
PORT_API port_status port_linear_t_forward(float *y, const float *x, const float *w, const float *b,
                                           const port_linear_params *p);
PORT_API port_status port_linear_t_backward_input(float *dx, const float *dy, const float *w,
                                                  const port_linear_params *p);
PORT_API port_status port_linear_t_backward_weight(float *dw, float *db, const float *dy,
                                                   const float *x, const port_linear_params *p);
/* Bias gradient alone (a layer whose weight is frozen): db[j] += sum of
 * dy[i, j, k] over i < n, k < inner (dy is [n, c, inner] contiguous). */
PORT_API port_status port_bias_backward(float *db, const float *dy, int64_t n, int64_t c,
                                        int64_t inner);

/* ------------------------------------------------------------------ */
/* Softmax cross-entropy, mean reduction, optional label smoothing.
 * logits[n,k], labels[n] int64 in [0,k).  Forward writes loss[0] and
 * probs[n,k] (softmax, saved for backward).  Matches
 * torch.nn.functional.cross_entropy(label_smoothing=ls).                 */
/* ------------------------------------------------------------------ */
PORT_API port_status port_softmax_xent_forward(float *loss, float *probs, const float *logits,
                                               const int64_t *labels, int64_t n, int64_t k,
                                               float label_smoothing);
/* dlogits = grad_loss[0] * (probs - target) / n.  dlogits MAY ALIAS probs. */
PORT_API port_status port_softmax_xent_backward(float *dlogits, const float *probs,
                                                const int64_t *labels, const float *grad_loss,
                                                int64_t n, int64_t k, float label_smoothing);

/* ------------------------------------------------------------------ */
/* Optimizers (in place, match torch.optim single-tensor implementations)  */
/* ------------------------------------------------------------------ */
/* torch.optim.SGD.  momentum_buf may be NULL iff momentum == 0.
 * first_step != 0: the momentum buffer is initialised to the (decayed)
 * gradient, as PyTorch does on its first step. */
PORT_API port_status port_sgd_step(float *param, float *momentum_buf, const float *grad,
                                   int64_t count, double lr, double momentum, double dampening,
                                   double weight_decay, int nesterov, int first_step);
/* torch.optim.AdamW (foreach=False, amsgrad=False, maximize=False).
 * step = step count AFTER increment (1 on the first call). */
PORT_API port_status port_adamw_step(float *param, float *exp_avg, float *exp_avg_sq,
                                     const float *grad, int64_t count, double lr, double beta1,
                                     double beta2, double eps, double weight_decay, int64_t step);

/* ------------------------------------------------------------------ */
/* Fused conv2d + batch norm + ReLU                                      */
/* ------------------------------------------------------------------ */
/* Training: z = conv(x, w) (no conv bias), batch statistics of z
 * (save_mean, save_invstd, running stats updated unless NULL), then
 * y = relu(gamma*(z-mean)*invstd + beta) in one pass over z.
 * Saved: x, w, z, save_mean, save_invstd, gamma, beta; the backward runs as the unfused
 * relu, batch-norm and conv backward kernels (what the plan's `fused` variant means).
 * Workspace: port_conv2d_workspace_bytes(p, algo). */
PORT_API port_status port_conv2d_bn_relu_forward_train(
    float *y, float *z, float *save_mean, float *save_invstd, float *running_mean,
    float *running_var, const float *x, const float *w, const float *gamma, const float *beta,
    const port_conv2d_params *p, float eps, float momentum, int algo, void *ws, size_t ws_bytes);

/* ------------------------------------------------------------------ */
/* Transformer (kernels/src/transformer.c).  Row-major contiguous float32;
 * int64 indices / labels, uint8 masks.  Sums run in a fixed order (double
 * accumulators), so results do not depend on the thread count (see
 * Threads above).                                                       */
/* ------------------------------------------------------------------ */
/* Embedding: y[i,:] = w[idx[i],:] for i < n; w [v,d]; idx int64, each in [0,v) else PORT_ERR_ARG.
 * Saved: idx. */
PORT_API port_status port_embedding_forward(float *y, const int64_t *idx, const float *w, int64_t n, int64_t v,
                                            int64_t d);
/* dw[idx[i],:] += dy[i,:]  (ACCUMULATES; rows added in index order i = 0..n-1: deterministic; parallel over
 * column blocks of d) */
PORT_API port_status port_embedding_backward_weight(float *dw, const float *dy, const int64_t *idx, int64_t n,
                                                    int64_t v, int64_t d);
/* --- issue 54, HF masks (h54-mask) --- */
/* As port_embedding_backward_weight, but no gradient goes to row pad (PyTorch's padding_idx; 0 <= pad < v, else
 * PORT_ERR_ARG): dw[idx[i],:] += dy[i,:] for every i with idx[i] != pad. */
PORT_API port_status port_embedding_backward_weight_pad(float *dw, const float *dy, const int64_t *idx, int64_t n,
                                                        int64_t v, int64_t d, int64_t pad);
/* --- end issue 54, HF masks --- */

/* Layer norm over the last dim: x,y [rows,d]; gamma, beta [d] or NULL (no affine). stats [2*rows]: stats[r] = mean,
 * stats[rows + r] = rstd = 1/sqrt(biased var + eps) (eps >= 0); saved for backward (with x and gamma).
 * Matches torch.nn.functional.layer_norm. */
PORT_API port_status port_layernorm_forward(float *y, float *stats, const float *x, const float *gamma,
                                            const float *beta, int64_t rows, int64_t d, float eps);
/* dx OVERWRITES; gamma may be NULL */
PORT_API port_status port_layernorm_backward_input(float *dx, const float *dy, const float *x, const float *stats,
                                                   const float *gamma, int64_t rows, int64_t d);
/* dgamma += sum_rows dy*xhat; dbeta += sum_rows dy; either may be NULL (not both) */
PORT_API port_status port_layernorm_backward_weight(float *dgamma, float *dbeta, const float *dy, const float *x,
                                                    const float *stats, int64_t rows, int64_t d);

/* GELU, approximate 0 = exact x*Phi(x) (erf), 1 = tanh approximation (torch's approximate='tanh').
 * y must NOT alias x. Saved: x. */
PORT_API port_status port_gelu_forward(float *y, const float *x, int64_t count, int approximate);
/* dx MAY ALIAS dy. */
PORT_API port_status port_gelu_backward(float *dx, const float *dy, const float *x, int64_t count,
                                        int approximate);
/* tanh: y MAY ALIAS x; saved: y. */
PORT_API port_status port_tanh_forward(float *y, const float *x, int64_t count);
/* dx = dy*(1-y*y); dx MAY ALIAS dy. */
PORT_API port_status port_tanh_backward(float *dx, const float *dy, const float *y, int64_t count);
/* y = alpha*x; y MAY ALIAS x (the backward of a scaling is the same kernel). */
PORT_API port_status port_scale(float *y, const float *x, int64_t count, float alpha);

/* Softmax over the last dim: x,y [rows,d]; y MAY ALIAS x. Saved: y. */
PORT_API port_status port_softmax_forward(float *y, const float *x, int64_t rows, int64_t d);
/* dx = y*(dy - sum_j dy*y); dx MAY ALIAS dy. */
PORT_API port_status port_softmax_backward(float *dx, const float *dy, const float *y, int64_t rows, int64_t d);

/* Batched GEMM, row-major contiguous: for each of `batch` matrices c[m,n] = alpha*op(a)[m,k] op(b)[k,n] + beta*c;
 * a is [batch,m,k] ([batch,k,m] if trans_a), b is [batch,k,n] ([batch,n,k] if trans_b). c must not overlap a or b.
 * beta == 0 overwrites c (NaNs in c ignored, as BLAS). */
PORT_API port_status port_bmm(float *c, const float *a, const float *b, int64_t batch, int64_t m, int64_t n,
                              int64_t k, int trans_a, int trans_b, float alpha, float beta);

/* y = x.permute(perm).contiguous(): rank in 1..6, shape = x's dims (rank entries), perm a permutation of
 * 0..rank-1 (else PORT_ERR_ARG).  y must not overlap x.  The backward is the inverse permutation. */
PORT_API port_status port_permute(float *y, const float *x, int64_t rank, const int64_t *shape,
                                  const int64_t *perm);

/* y[o,i] = a[o,i] + b[i] (b broadcast over leading dims); y MAY ALIAS a */
/* Binary element-wise ops with full broadcasting (binary.c): y = a op b, contiguous operands.  dims: the
 * output's shape (rank 1..PORT_BINARY_MAX_RANK; callers merge neighbouring dims that broadcast alike); bit i of
 * a_bcast / b_bcast: that operand has size 1 along dim i (its shape is dims with those dims set to 1). */
#define PORT_BINARY_MAX_RANK 6
enum { PORT_BINARY_ADD = 0, PORT_BINARY_SUB = 1, PORT_BINARY_MUL = 2, PORT_BINARY_DIV = 3 };
typedef struct {
    int64_t op, rank, a_bcast, b_bcast;
    int64_t dims[PORT_BINARY_MAX_RANK];
} port_binary_params;

/* elements of operand 0 (a), 1 (b) or 2 (y); -1 for invalid params */
PORT_API int64_t port_binary_numel(const port_binary_params *p, int operand);
/* y may be the full-shape operand (in place). */
PORT_API port_status port_binary_forward(float *y, const float *a, const float *b, const port_binary_params *p);
/* da / db (either may be NULL: not computed) = dy * d(a op b)/da, .../db, each summed over its operand's broadcast
 * dims; accumulate = 1 adds into them, 0 overwrites.  a and b may be NULL where no wanted gradient reads them
 * (add, sub: neither; mul: da reads b, db reads a; div: da reads b, db reads a and b).  No aliasing of a gradient
 * with dy, a, b or the other gradient. */
PORT_API port_status port_binary_backward(float *da, float *db, const float *dy, const float *a, const float *b,
                                          const port_binary_params *p, int accumulate);
/* The plain reference of port_binary_backward (the same checks): each gradient element summed over its reduced
 * positions in index order, offsets from an odometer over the full index.  port_binary_backward takes it where no
 * fast path applies; port_binary_backward_path says which path operand k's gradient takes: 0 this reference,
 * 1 elementwise (nothing reduced: the same bits as the reference), 2 rows (the reduced dims are the trailing ones:
 * contiguous row sums in 8 double lanes, a fixed order at any thread count and ISA; to double rounding the
 * reference's sum), -1 invalid params. */
PORT_API port_status port_binary_backward_reference(float *da, float *db, const float *dy, const float *a,
                                                    const float *b, const port_binary_params *p, int accumulate);
PORT_API int port_binary_backward_path(const port_binary_params *p, int operand);

/* ---- issue 54: generic unary math and shape copies (unary.c, shape.c; port-rt ids 74-77) ---------------- */
/* Unary element-wise math: y = f(x) with op (scalar: pow's exponent, shift's constant; else ignored):
 *   NEG -x; EXP e^x (portable exp); RSQRT 1/sqrt(x); COS, SIN (in double, rounded); POW x^scalar (integer
 *   exponents by repeated squaring, 0.5 and -0.5 as sqrt and 1/sqrt, others exp(e log x), all in double, rounded; x < 0 with a
 *   non-integer exponent is NaN); ABS |x|; SHIFT x + scalar.  y MAY ALIAS x. */
enum { PORT_UNARY_NEG = 0, PORT_UNARY_EXP = 1, PORT_UNARY_RSQRT = 2, PORT_UNARY_COS = 3, PORT_UNARY_SIN = 4,
       PORT_UNARY_POW = 5, PORT_UNARY_ABS = 6, PORT_UNARY_SHIFT = 7 };
PORT_API port_status port_unary_forward(float *y, const float *x, int64_t count, int64_t op, float scalar);
/* dx = dy * f'(.) from the saved tensor s (what port_unary_saves(op) says: 0 nothing (s may be NULL), 1 x, 2 y):
 *   NEG -dy; EXP dy*y; RSQRT dy*y^3*-0.5; COS -dy*sin x; SIN dy*cos x; POW dy*e*x^(e-1) (0 where e == 0);
 *   ABS dy*sign(x); SHIFT dy.  dx MAY ALIAS dy. */
PORT_API port_status port_unary_backward(float *dx, const float *dy, const float *s, int64_t count, int64_t op,
                                         float scalar);
/* what op's backward reads: 0 nothing, 1 its input x, 2 its output y; -1 for an unknown op */
PORT_API int port_unary_saves(int64_t op);

/* A range copy along one dim: y viewed [outer, ny, inner], x viewed [outer, nx, inner];
 * y[:, y_start + j, :] = x[:, x_start + j, :] for j < len.  fill = 1 also zeroes the rest of y (a narrow's
 * gradient), 0 leaves it (one part of a cat).  narrow / select / split / unbind: y_start 0, ny len; cat: one
 * call per input; their gradients the other way round.  y must not overlap x. */
typedef struct {
    int64_t outer, inner, ny, nx, len, y_start, x_start, fill;
} port_slice_params;
PORT_API port_status port_slice_copy(float *y, const float *x, const port_slice_params *p);

/* y = x broadcast to dims (rank 1..PORT_BINARY_MAX_RANK): bit i of x_bcast says x has size 1 along dim i (x is
 * contiguous with the other dims).  The gradient is port_binary_backward's (op add, dx as a, a_bcast = x_bcast).
 * y must not overlap x. */
PORT_API port_status port_expand(float *y, const float *x, int64_t rank, int64_t x_bcast, const int64_t *dims);
/* ---- end of issue 54 unary / shape block ------------------------------------------------------------------ */

/* ---- issue 54: masked_fill (shape.c; port-rt id 121) ---------------------------------------------------------
 * y = x where the mask is 0, value where it is not (torch.masked_fill with a scalar: a causal or padding mask
 * before softmax).  x and y have the full shape dims (rank 1..PORT_BINARY_MAX_RANK); the mask (one byte per
 * element, torch's bool) has size 1 along dim i where bit i of m_bcast is set and dims[i] elsewhere.  value may
 * be infinite (-inf: a masked attention score), not NaN.  y MAY ALIAS x.  The gradient is the same call on dy
 * with value 0 (dx = dy where the mask is 0, else 0; dx MAY ALIAS dy).  A pure select: the same bits at any
 * thread count. */
PORT_API port_status port_masked_fill(float *y, const float *x, const uint8_t *mask, int64_t rank, int64_t m_bcast,
                                      const int64_t *dims, float value);
/* The plain reference: one element at a time, the mask's offset computed from the full index. */
PORT_API port_status port_masked_fill_reference(float *y, const float *x, const uint8_t *mask, int64_t rank,
                                                int64_t m_bcast, const int64_t *dims, float value);
/* ---- end of issue 54 masked_fill block ------------------------------------------------------------------- */

/* ---- issue 54: input-dependent masks (mask.c; port-rt ids 122-127) -----------------------------------------
 * Masks are one byte per element (torch's bool, 0/1); dtype codes below.  HF turns attention_mask (int64 [B, K])
 * into a boolean [B, 1, Q, K] mask with these: a cast to bool, a gather mask[batch_idx, kv_idx] by two broadcast
 * index tensors, an and with a causal mask, an expand.  No gradients (masks are not differentiated).  Pure
 * selects and copies: the same bits at any thread count. */
enum { PORT_DT_F32 = 0, PORT_DT_BOOL = 1, PORT_DT_I64 = 2, PORT_DT_I32 = 3 };
enum { PORT_MASK_AND = 0, PORT_MASK_OR = 1, PORT_MASK_XOR = 2, PORT_MASK_NOT = 3 };
enum { PORT_CMP_EQ = 0, PORT_CMP_NE = 1, PORT_CMP_LT = 2, PORT_CMP_LE = 3, PORT_CMP_GT = 4, PORT_CMP_GE = 5 };
/* y = x cast elementwise, count elements: to bool x != 0; to float32 the value (bool 0/1, int64 rounded); to
 * int32 the 0/1 of a bool mask.  y_dtype float32, bool or int32 (then x_dtype bool); x_dtype any.  No aliasing. */
PORT_API port_status port_mask_cast(void *y, int64_t y_dtype, const void *x, int64_t x_dtype, int64_t count);
/* y = a op b (op PORT_MASK_*; NOT: y = !a, b read but ignored: pass a) over the full shape dims (rank
 * 1..PORT_BINARY_MAX_RANK), a / b of size 1 along the dims whose bit is set in a_bcast / b_bcast.  y MAY ALIAS a
 * full-shape operand. */
PORT_API port_status port_mask_logic(uint8_t *y, const uint8_t *a, const uint8_t *b, int64_t op, int64_t rank,
                                     int64_t a_bcast, int64_t b_bcast, const int64_t *dims);
/* y (full shape dims) = x (size 1 along the dims whose bit is set in x_bcast) broadcast; no aliasing. */
PORT_API port_status port_expand_mask(uint8_t *y, const uint8_t *x, int64_t rank, int64_t x_bcast,
                                      const int64_t *dims);
/* y[e] = x[i0[e], i1[e]] for x [rows, cols], the int64 index tensors broadcast to y's shape dims as the bits of
 * i0_bcast / i1_bcast say; indices in [-rows, rows) / [-cols, cols) (negative from the end), else PORT_ERR_ARG. */
PORT_API port_status port_mask_index2(uint8_t *y, const uint8_t *x, const int64_t *i0, const int64_t *i1,
                                      int64_t rows, int64_t cols, int64_t rank, int64_t i0_bcast, int64_t i1_bcast,
                                      const int64_t *dims);
/* y = a cmp b (cmp PORT_CMP_*, IEEE: NaN compares unequal, as torch) of two float32 tensors broadcast as
 * port_mask_logic's operands; no aliasing. */
PORT_API port_status port_mask_compare(uint8_t *y, const float *a, const float *b, int64_t op, int64_t rank,
                                       int64_t a_bcast, int64_t b_bcast, const int64_t *dims);
/* y = x cmp scalar, count elements; no aliasing. */
PORT_API port_status port_mask_compare_scalar(uint8_t *y, const float *x, int64_t op, int64_t count, float scalar);
/* ---- end of issue 54 masks block ------------------------------------------------------------------------- */

/* ---- issue 54: where (mask.c; port-rt ids 128-129) -----------------------------------------------------------
 * y = cond ? a : b over the full shape dims (rank 1..PORT_BINARY_MAX_RANK); cond (a mask, one byte per element),
 * a and b each of size 1 along the dims whose bit is set in c_bcast / a_bcast / b_bcast.  Bit 0 of `scalars`: a is
 * the number a_value (pass a = NULL), bit 1: b is b_value (b = NULL); a value may be infinite, not NaN.  y MAY
 * ALIAS a full-shape a or b.  A pure select: the same bits at any thread count. */
PORT_API port_status port_where_forward(float *y, const uint8_t *cond, const float *a, const float *b, int64_t rank,
                                        int64_t c_bcast, int64_t a_bcast, int64_t b_bcast, const int64_t *dims,
                                        int64_t scalars, float a_value, float b_value);
/* The plain reference: one element at a time, every operand's offset computed from the full index. */
PORT_API port_status port_where_forward_reference(float *y, const uint8_t *cond, const float *a, const float *b,
                                                  int64_t rank, int64_t c_bcast, int64_t a_bcast, int64_t b_bcast,
                                                  const int64_t *dims, int64_t scalars, float a_value,
                                                  float b_value);
/* da = dy where cond, db = dy where !cond (0 elsewhere), each summed over its operand's broadcast dims in one
 * fixed order (double accumulator, one thread per element: the same bits at any thread count); OVERWRITES.  da or
 * db NULL: not computed (not both).  No aliasing of a gradient with dy, cond or the other gradient. */
PORT_API port_status port_where_backward(float *da, float *db, const float *dy, const uint8_t *cond, int64_t rank,
                                         int64_t c_bcast, int64_t a_bcast, int64_t b_bcast, const int64_t *dims);
/* ---- end of issue 54 where block ------------------------------------------------------------------------- */

/* ---- issue 54: last-token pooling (mask.c; port-rt ids 137-139) ----------------------------------------------
 * HF's sequence classifiers (GPT-2, Llama) pool the logits of each row's last non-pad token: an int32 cast of
 * (ids != pad) (port_mask_cast), times an int32 arange (port_int_binary), argmax over the last axis
 * (port_argmax_rows), logits[arange(B), idx] (port_index2_rows) and its gradient (the same call, scatter = 1).
 * y = a op b (op PORT_BINARY_ADD / SUB / MUL) of two int32 or int64 tensors (dtype PORT_DT_I32 / PORT_DT_I64)
 * broadcast as port_mask_logic's operands, wrapping around on overflow (as torch); y MAY ALIAS a full-shape
 * operand. */
PORT_API port_status port_int_binary(void *y, const void *a, const void *b, int64_t dtype, int64_t op, int64_t rank,
                                     int64_t a_bcast, int64_t b_bcast, const int64_t *dims);
/* y[r] (int64) = the index of the first largest of x[r, 0..cols) for x [rows, cols] of x_dtype (float32: NaN the
 * largest, the first NaN wins, as torch.argmax; bool; int64; int32).  No aliasing. */
PORT_API port_status port_argmax_rows(int64_t *y, const void *x, int64_t x_dtype, int64_t rows, int64_t cols);
/* scatter = 0: y[e, k] = x[i0[e], i1[e], k] for x [rows, cols, inner] float32 and the int64 index tensors
 * broadcast to the shape dims (y [dims..., inner]) as the bits of i0_bcast / i1_bcast say; scatter = 1 (the
 * gradient): y [rows, cols, inner] = 0, then y[i0[e], i1[e], k] += x[e, k] in e order (x [dims..., inner]): the
 * same bits at any thread count.  Indices in [-rows, rows) / [-cols, cols) (negative from the end), else
 * PORT_ERR_ARG.  No aliasing. */
PORT_API port_status port_index2_rows(float *y, const float *x, const int64_t *i0, const int64_t *i1, int64_t rows,
                                      int64_t cols, int64_t inner, int64_t rank, int64_t i0_bcast, int64_t i1_bcast,
                                      const int64_t *dims, int64_t scatter);
/* ---- end of issue 54 last-token pooling block -------------------------------------------------------------- */

PORT_API port_status port_add_broadcast(float *y, const float *a, const float *b, int64_t outer, int64_t inner);
/* db[i] = sum_o dy[o,i]  (OVERWRITES; summed in o order) */
PORT_API port_status port_sum_rows(float *db, const float *dy, int64_t outer, int64_t inner);
/* y[o,i] = mean over m of x[o,m,i] (x [outer,mid,inner]); backward dx[o,m,i] = dy[o,i]/mid */
PORT_API port_status port_mean_mid_forward(float *y, const float *x, int64_t outer, int64_t mid, int64_t inner);
PORT_API port_status port_mean_mid_backward(float *dx, const float *dy, int64_t outer, int64_t mid,
                                            int64_t inner);

/* Integer helpers: y[i] = start + i;  y[i] = (x[i] != value) as uint8 */
PORT_API port_status port_arange_i64(int64_t *y, int64_t count, int64_t start);
PORT_API port_status port_ne_scalar_i64(uint8_t *y, const int64_t *x, int64_t count, int64_t value);

/* Scaled dot-product attention (torch.nn.functional.scaled_dot_product_attention: masks of any broadcastable
 * shape, grouped-query attention, dropout).
 * q [bh,tq,dh]; k, v [bkv,tk,dh] with bkv = bh/heads*kv_heads; o [bh,tq,dh]; lse [bh,tq] = log-sum-exp of each
 * masked scaled score row (saved).  Query slice b = n*heads + h (batch row n, head h) reads key/value slice
 * n*kv_heads + h/(heads/kv_heads) (grouped-query attention, torch's enable_gqa; kv_heads 0 means heads).
 * mask, by mask_kind:
 *   PORT_ATTN_MASK_KEYS (0): NULL or uint8 [bh/heads, tk], 0 = that key is masked (padding) for every query of
 *     the heads of that batch row (bh must be a multiple of heads);
 *   PORT_ATTN_MASK_BOOL (1): uint8 [mask_dims] (torch's boolean attn_mask: 0 = masked), broadcast to
 *     [bh/heads, heads, tq, tk]: each mask_dims[i] is 1 or that extent;
 *   PORT_ATTN_MASK_ADD (2): float [mask_dims], broadcast so, added to the scaled scores (torch's float attn_mask).
 * causal != 0: key j is masked for query i when j > i + (tk - tq) (torch's is_causal for tq == tk); with a mask.
 * A query row with every key masked gets o = 0, lse = -inf and zero gradients (no NaN).
 * dropout_p in [0, 1): the probabilities P[b,i,j] are kept with probability 1 - p and scaled by 1/(1-p) before
 *   P V, the keep mask drawn from PORT's generator (rng.c) at element (b*tq + i)*tk + j of (seed, stream); the
 *   backward draws it again (nothing saved).  lse stays the softmax's.
 * algo PORT_ATTN_PLAIN (0): all bh score matrices materialised in the workspace (bh*tq*tk floats; backward
 *   2*bkv*tq*tk) and computed with GEMMs;
 * algo PORT_ATTN_TILED (1): FlashAttention-style, online softmax over key blocks of 128, never materialises a
 *   T x T matrix; forward parallel over (bh, 64-query block), backward recomputes the scores tile by tile from
 *   q, k and lse, parallel over bkv (the heads of a group in order: dk, dv summed in a fixed order).  Its
 *   workspace is per worker thread, not per task: min(tasks, 8) slots (a call runs on at most that many
 *   threads), a slot one 64x128 tile + 2 x 64 floats forward, two tiles + tq floats backward; tiles shrink to
 *   tq x tk below 64 x 128.  So it does not grow with bh (the plain one does).
 * Both exponentiate in float32 (port__expf_f32 of the sources: 1-2 ulp) with the row sums in 32 fixed lanes:
 *   the same bits on every ISA and thread count.
 * port_attention_workspace_bytes gives the bytes each needs (backward != 0: for the backward call; 0 for
 * invalid params); a smaller ws -> PORT_ERR_WORKSPACE.  o must not overlap q, k, v. */
#define PORT_ATTN_PLAIN 0
#define PORT_ATTN_TILED 1
#define PORT_ATTN_MASK_KEYS 0
#define PORT_ATTN_MASK_BOOL 1
#define PORT_ATTN_MASK_ADD 2
typedef struct {
    int64_t bh, heads, tq, tk, dh, causal;
    float scale;
    /* issue 54: grouped-query attention, broadcast masks, dropout */
    int64_t kv_heads;        /* 0 (= heads) or a divisor of heads */
    int64_t mask_kind;       /* PORT_ATTN_MASK_* */
    int64_t mask_dims[4];    /* kinds BOOL and ADD: the mask's extents (bh/heads|1, heads|1, tq|1, tk|1) */
    float dropout_p;
    uint64_t seed, stream;   /* PORT's generator (read when dropout_p > 0) */
} port_attention_params;
/* elements of the mask operand (0 for invalid params; kind KEYS: bh/heads*tk) */
PORT_API int64_t port_attention_mask_numel(const port_attention_params *p);
PORT_API size_t port_attention_workspace_bytes(const port_attention_params *p, int algo, int backward);
PORT_API port_status port_attention_forward(float *o, float *lse, const float *q, const float *k, const float *v,
                                            const void *mask, const port_attention_params *p, int algo,
                                            void *ws, size_t ws_bytes);
/* dq, dk, dv OVERWRITE (no overlap with each other or the inputs); any of them may be NULL (that gradient is
 * not computed; not all three); reads o and lse of the forward */
PORT_API port_status port_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                             const float *k, const float *v, const float *o, const float *lse,
                                             const void *mask, const port_attention_params *p, int algo,
                                             void *ws, size_t ws_bytes);

/* Cross-entropy with ignore_index (token-level loss over n = batch*seq rows): as port_softmax_xent_forward, but
 * rows whose label == ignore_index are skipped; loss = mean over counted rows (0 if none); probs written for every
 * row.  Other labels must be in [0,k) (else PORT_ERR_ARG).  Matches F.cross_entropy(ignore_index=,
 * label_smoothing=). */
PORT_API port_status port_softmax_xent_ignore_forward(float *loss, float *probs, const float *logits,
                                                      const int64_t *labels, int64_t n, int64_t k,
                                                      float label_smoothing, int64_t ignore_index);
/* dlogits = grad_loss[0]*(probs - target)/count for counted rows, 0 for ignored rows; dlogits MAY ALIAS probs */
PORT_API port_status port_softmax_xent_ignore_backward(float *dlogits, const float *probs, const int64_t *labels,
                                                       const float *grad_loss, int64_t n, int64_t k,
                                                       float label_smoothing, int64_t ignore_index);

/* ------------------------------------------------------------------ */
/* Norms, pooling and resize of issue 54 (normpool.c)                   */
/* ------------------------------------------------------------------ */
/* RMS norm over the last dim (Llama's RMSNorm, F.rms_norm): x, y [rows, d]; gamma [d] or NULL.
 * rstd[r] = 1/sqrt(mean_j x[r,j]^2 + eps) (eps >= 0, finite; the mean in double), y = x * rstd * gamma.
 * Saved for backward: x, rstd (and gamma).  y must not alias x. */
PORT_API port_status port_rmsnorm_forward(float *y, float *rstd, const float *x, const float *gamma, int64_t rows,
                                          int64_t d, float eps);
/* dx OVERWRITES: g = dy * gamma, dx = rstd * (g - x * rstd^2 * mean(g * x)); gamma may be NULL; dx may be dy */
PORT_API port_status port_rmsnorm_backward_input(float *dx, const float *dy, const float *x, const float *rstd,
                                                 const float *gamma, int64_t rows, int64_t d);
/* dgamma[j] += sum_r dy[r,j] * x[r,j] * rstd[r] (rows summed in order, in double) */
PORT_API port_status port_rmsnorm_backward_weight(float *dgamma, const float *dy, const float *x, const float *rstd,
                                                  int64_t rows, int64_t d);

/* Group norm (nn.GroupNorm, F.group_norm): x, y [n, c, hw], groups divides c; statistics over each sample's
 * group of c/groups consecutive channels (biased variance, in double).  stats [2 * n * groups]: mean, then
 * rstd = 1/sqrt(var + eps) (eps > 0, finite).  gamma, beta [c] or NULL.  y may alias x only when nothing
 * reads x afterwards (the backward reads x). */
PORT_API port_status port_groupnorm_forward(float *y, float *stats, const float *x, const float *gamma,
                                            const float *beta, int64_t n, int64_t c, int64_t hw, int64_t groups,
                                            float eps);
/* dx OVERWRITES (g = dy * gamma[c]): dx = rstd * (g - mean(g) - x-hat * mean(g * x-hat)) over the group;
 * gamma may be NULL; dx may be dy */
PORT_API port_status port_groupnorm_backward_input(float *dx, const float *dy, const float *x, const float *stats,
                                                   const float *gamma, int64_t n, int64_t c, int64_t hw,
                                                   int64_t groups);
/* dgamma[c] += sum dy * x-hat, dbeta[c] += sum dy over the batch and hw (in order, in double); either NULL */
PORT_API port_status port_groupnorm_backward_weight(float *dgamma, float *dbeta, const float *dy, const float *x,
                                                    const float *stats, int64_t n, int64_t c, int64_t hw,
                                                    int64_t groups);

/* Resize of [n, c, h, w] to [n, c, ho, wo] (F.interpolate).  mode PORT_UPSAMPLE_NEAREST: source index
 * min(floor(o * r), in - 1); PORT_UPSAMPLE_BILINEAR: align_corners (0/1) as PyTorch.  rh, rw: the source step
 * per output pixel as PyTorch computes it from a scale factor s, (float)(1.0 / s), or 0: in / out from the sizes
 * (align_corners ignores them).  y must not overlap x. */
enum { PORT_UPSAMPLE_NEAREST = 0, PORT_UPSAMPLE_BILINEAR = 1 };
typedef struct {
    int64_t n, c, h, w, ho, wo, mode, align_corners;
    float rh, rw;
} port_upsample2d_params;
PORT_API port_status port_upsample2d_forward(float *y, const float *x, const port_upsample2d_params *p);
/* dx OVERWRITES: each dy pixel added to its sources in output order (one plane per thread) */
PORT_API port_status port_upsample2d_backward_input(float *dx, const float *dy, const port_upsample2d_params *p);

/* Adaptive average pool of [n, c, h, w] to [n, c, ho, wo] (any sizes >= 1): window i of an axis of size in
 * covers [floor(i * in / out), ceil((i + 1) * in / out)).  y must not overlap x. */
PORT_API port_status port_adaptive_avgpool2d_forward(float *y, const float *x, int64_t n, int64_t c, int64_t h,
                                                     int64_t w, int64_t ho, int64_t wo);
/* dx OVERWRITES */
PORT_API port_status port_adaptive_avgpool2d_backward_input(float *dx, const float *dy, int64_t n, int64_t c,
                                                            int64_t h, int64_t w, int64_t ho, int64_t wo);

#ifdef __cplusplus
}
#endif
#endif /* PORT_KERNELS_H */
