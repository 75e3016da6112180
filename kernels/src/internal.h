/* Private helpers shared by the kernel sources (not part of the ABI). */
#ifndef PORT_INTERNAL_H
#define PORT_INTERNAL_H
#include "port_kernels.h"
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif


#define PORT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define PORT_MAX(a, b) ((a) > (b) ? (a) : (b))
#define PORT_CHECK(cond, code) \
    do {                       \
        if (!(cond)) return (code); \
    } while (0)
#define PORT_NOTNULL(ptr) PORT_CHECK((ptr) != NULL, PORT_ERR_NULL)

/* Only parallelise loops with at least this much work (elements). */
#define PORT_PAR_MIN 32768
/* ... or this many multiply-adds (direct depthwise loops: ~100 us on one core).  A parallel region costs a few
 * us on a quiet machine but up to a scheduler slice (ms) when another process holds a core and the region
 * waits for a descheduled worker: small kernels stay on one thread. */
#define PORT_PAR_MIN_MACS (8 * PORT_PAR_MIN)
/* Split a BLAS GEMM over the OpenMP threads only above this many MACs. */
#define PORT_GEMM_PAR_MIN 1048576.0

/* GEMM dispatch (row-major), honouring the selected backend. Sizes must be
 * validated by the caller (fit in int32 for BLAS). */
/* Portable exp / log / integer power (portmath.c): the same bits on every ISA and C library. */
float port__expf(float x);
double port__log(double x);
double port__powi(double b, int64_t n);

void port__gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* Vendored blocked SGEMM. */
void port__sgemm_vendored(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                          float *c, int64_t ldc);

/* im2col / col2im of one image and one group, restricted to the output tile
 * [oh0, oh0+th) x [ow0, ow0+tw).  cols is [cin*kh*kw, th*tw]. */
void port__im2col_tile(float *cols, const float *x, int64_t cin, int64_t h, int64_t w, int64_t kh,
                       int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t oh0,
                       int64_t th, int64_t ow0, int64_t tw);
/* dx += col2im(cols) over the same tile. */
void port__col2im_tile(float *dx, const float *cols, int64_t cin, int64_t h, int64_t w,
                       int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                       int64_t oh0, int64_t th, int64_t ow0, int64_t tw);

/* Resolve PORT_CONV_AUTO; returns the algo or -1 when not applicable. */
int port__conv_resolve_algo(const port_conv2d_params *p, int algo);
int port__conv_is_depthwise(const port_conv2d_params *p);
int port__conv_is_pointwise(const port_conv2d_params *p);

static inline int port__ranges_overlap(const void *a, size_t abytes, const void *b, size_t bbytes) {
    const char *pa = (const char *)a, *pb = (const char *)b;
    return a && b && pa < pb + bbytes && pb < pa + abytes;
}


/* Unchecked conv implementations (params validated, algo resolved). */
void port__conv_fwd(float *y, const float *x, const float *w, const float *b,
                    const port_conv2d_params *p, int algo, float *ws);
void port__conv_bwd_in(float *dx, const float *dy, const float *w, const port_conv2d_params *p,
                       int algo, float *ws);
void port__conv_bwd_w(float *dw, float *db, const float *dy, const float *x,
                      const port_conv2d_params *p, int algo, float *ws);
/* Winograd F(2x2,3x3) (kernels/src/winograd.c); ws holds port__conv_winograd_ws_floats(p) floats. */
int port__conv_winograd_legal(const port_conv2d_params *p);
int port__conv_winograd_pays(const port_conv2d_params *p); /* PORT_CONV_AUTO's choice */
size_t port__conv_winograd_ws_floats(const port_conv2d_params *p);
void port__conv_winograd_fwd(float *y, const float *x, const float *w, const float *b,
                             const port_conv2d_params *p, float *ws);
void port__conv_winograd_bwd_in(float *dx, const float *dy, const float *w, const port_conv2d_params *p,
                                float *ws);
void port__conv_winograd_bwd_w(float *dw, const float *dy, const float *x, const port_conv2d_params *p,
                               float *ws);
port_status port__conv_validate(const port_conv2d_params *p, int *algo, void *ws,
                                size_t ws_bytes);

/* Batch-norm cores (norm.c).  relu != 0 fuses a following ReLU. */
void port__bn_train_forward(float *y, float *save_mean, float *save_invstd, float *running_mean,
                            float *running_var, const float *x, const float *gamma,
                            const float *beta, int64_t n, int64_t c, int64_t hw, float eps,
                            float momentum, int relu);
/* dx (may be NULL) overwritten; dgamma/dbeta (may be NULL) accumulate. */
void port__bn_train_backward(float *dx, float *dgamma, float *dbeta, const float *dy,
                             const float *x, const float *gamma, const float *beta,
                             const float *mean, const float *invstd, int64_t n, int64_t c,
                             int64_t hw, int relu);
#endif
