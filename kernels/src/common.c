/* Library-wide entry points: status strings, threads, GEMM backend. */
#include "internal.h"
#include <limits.h>

#ifdef PORT_HAVE_OPENBLAS
#include <cblas.h>
#endif

static int g_gemm_backend =
#ifdef PORT_HAVE_OPENBLAS
    PORT_GEMM_BLAS;
#else
    PORT_GEMM_VENDORED;
#endif

const char *port_status_string(int status) {
    switch (status) {
    case PORT_OK: return "ok";
    case PORT_ERR_NULL: return "a required pointer argument is NULL";
    case PORT_ERR_SHAPE: return "invalid or inconsistent shape parameters";
    case PORT_ERR_ARG: return "invalid scalar argument";
    case PORT_ERR_WORKSPACE: return "workspace too small (query the *_workspace_bytes function)";
    case PORT_ERR_UNSUPPORTED: return "algorithm not supported for these parameters";
    case PORT_ERR_ALIAS: return "output aliases an input where this is not allowed";
    default: return "unknown status";
    }
}

int port_abi_version(void) { return PORT_ABI_VERSION; }

/* One thread pool: the OpenMP runtime (shared with torch when both are in the
 * process; see port/exec/capi.py).  OpenBLAS always runs single-threaded -- its
 * own pthread pool would spin against the OpenMP workers -- and port__gemm
 * splits large GEMMs over the OpenMP threads itself. */
#ifdef PORT_HAVE_OPENBLAS
char *scipy_openblas_get_corename(void);

/* 1 if OpenBLAS runs kernels for a core with AVX-512 (its DYNAMIC_ARCH build picks the core when it loads, or
 * takes OPENBLAS_CORETYPE, which may name an older core than the CPU is: Haswell on an AVX-512 CPU runs 8-lane
 * kernels at half the FMA rate). */
static int blas_core_has_avx512(void) {
    const char *core = scipy_openblas_get_corename();
    static const char *const wide[] = {"skylakex", "cooperlake", "sapphirerapids", "zen4", "zen5"};
    if (!core) return 0;
    for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++) {
        const char *w = wide[i], *c = core;
        while (*w && *c && (*c | 0x20) == *w) { w++; c++; }
        if (!*w && !*c) return 1;
    }
    return 0;
}

__attribute__((constructor)) static void port__blas_single_threaded(void) {
    scipy_openblas_set_num_threads(1);
    /* The default GEMM where the CPU has AVX-512: the vendored one's 12 x 32 kernel was the faster on every conv
     * shape of bench/gemm.py (1.04-1.32x OpenBLAS's SkylakeX kernels on an Intel Xeon, 1.1-1.7x its Haswell
     * kernels on an AVX-512 EPYC; bench/RESULTS.md, "GEMM backends"), but OpenBLAS's AVX-512 kernels win on small
     * and narrow products (port__gemm_pick): where OpenBLAS runs them, AUTO; else the vendored one.  OpenBLAS
     * on other CPUs.  port_set_gemm_backend overrides it. */
    if (port_cpu_has_avx512()) g_gemm_backend = blas_core_has_avx512() ? PORT_GEMM_AUTO : PORT_GEMM_VENDORED;
}
#endif

void port_set_num_threads(int n) {
    if (n < 1) n = 1;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
#ifdef PORT_HAVE_OPENBLAS
    scipy_openblas_set_num_threads(1);
#endif
}

int port_get_num_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

int port_cpu_has_avx512(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? 1 : 0;
#else
    return 0;
#endif
}

port_status port_set_gemm_backend(int backend) {
    if (backend == PORT_GEMM_VENDORED) { g_gemm_backend = backend; return PORT_OK; }
#ifdef PORT_HAVE_OPENBLAS
    if (backend == PORT_GEMM_BLAS || backend == PORT_GEMM_AUTO) { g_gemm_backend = backend; return PORT_OK; }
    return PORT_ERR_ARG;
#else
    return backend == PORT_GEMM_BLAS || backend == PORT_GEMM_AUTO ? PORT_ERR_UNSUPPORTED : PORT_ERR_ARG;
#endif
}

int port_get_gemm_backend(void) { return g_gemm_backend; }

int port_gemm_backend_for(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k) {
    return port__gemm_pick(trans_a, trans_b, m, n, k);
}

/* The GEMM that runs op(A)[m x k] op(B)[k x n]: PORT_GEMM_BLAS or PORT_GEMM_VENDORED.  AUTO sends to OpenBLAS
 * every product with n <= 16 and every small one (<= 2^20 multiply-adds), where its small-matrix kernels win.
 * Measured on an Intel Xeon core (1 thread, GFLOP/s OpenBLAS / vendored): 64x128x27 136 / 104, 27x128x64 TN
 * 155 / 114, 96x64x96 177 / 123, 4608x16x512 TN 65 / 63, 512x16x4608 65 / 60; but 32x256x288 103 / 147,
 * 4608x128x512 TN 118 / 134, 576x1024x64 TN 115 / 146.  Small NT products alone ran faster vendored (64x27x128
 * 63 / 85), but the patch kernels' weight gradients cut them into row bands (8 x 27 x 128), each re-packing B:
 * there OpenBLAS was 1.4x faster (bench/kernels.py, patch8 on the CIFAR stems).  Narrow products that the
 * vendored GEMM's AVX-512 narrow kernels take (gemm_skinny.c: n <= 32, a batch-1 convolution on a small map) go
 * to them: 512x16x4608 0.36 ms against OpenBLAS's 0.61 on 2 threads.  A choice by shape only: the same bits at
 * any thread count. */
int port__gemm_pick(int ta, int tb, int64_t m, int64_t n, int64_t k) {
    if (g_gemm_backend != PORT_GEMM_AUTO) return g_gemm_backend;
    if (port__gemm_skinny_pick(ta, tb, m, n, k)) return PORT_GEMM_VENDORED; /* its narrow kernels, gemm_skinny.c */
    if (n <= 16 || (double)m * (double)n * (double)k <= 1048576.0) return PORT_GEMM_BLAS;
    return PORT_GEMM_VENDORED;
}

int port__gemm_bpack_ok(int64_t m, int64_t n, int64_t k) {
    return port__gemm_pick(0, 0, m, n, k) == PORT_GEMM_VENDORED;
}

#ifdef PORT_HAVE_OPENBLAS
/* The processors this process may run on (omp_get_num_procs), read once: the BLAS GEMM's block count. */
static int gemm_blocks(void) {
    static int n = 0; /* benign race: every thread computes the same value */
    if (n == 0) {
        int p = 1;
#ifdef _OPENMP
        p = omp_get_num_procs();
#endif
        n = PORT_MAX(1, PORT_MIN(p, 64));
    }
    return n;
}
#endif

void port__gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
#ifdef PORT_HAVE_OPENBLAS
    if (port__gemm_pick(ta, tb, m, n, k) == PORT_GEMM_BLAS) {
        if (k <= 0) { /* BLAS would still scale C; do it explicitly */
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++)
                    c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
            return;
        }
        /* Large GEMMs are split into row or column blocks (multiples of 16 columns / 8 rows; the larger dim),
         * one per processor of the machine, each one single-threaded sgemm, spread over the threads
         * (sequentially inside a caller's parallel region).  The blocks depend on the shape and the processor
         * count, never on the thread count: OpenBLAS picks kernels (its small-matrix paths among them) by the
         * block's shape, so blocks cut per thread made a step's low bits depend on how many threads ran it.
         * (Blocks of a fixed count, 12, cost 1.4x on a 2048^3 product: every block packs the other operand.) */
        int64_t nblocks = gemm_blocks();
        if (nblocks > 1 && (double)m * (double)n * (double)k >= PORT_GEMM_PAR_MIN) {
            int split_n = n >= m;
            int64_t dim = split_n ? n : m, q = split_n ? 16 : 8;
            int64_t nb = ((dim + nblocks - 1) / nblocks + q - 1) / q * q;
            int64_t nblk = (dim + nb - 1) / nb;
            if (dim >= 2 * q && nblk > 1) {
#pragma omp parallel for schedule(static) if (!port__in_parallel())
                for (int64_t t = 0; t < nblk; t++) {
                    int64_t o = t * nb, len = PORT_MIN(nb, dim - o);
                    const float *a0 = a, *b0 = b;
                    float *c0 = c;
                    if (split_n) { b0 = tb ? b + o * ldb : b + o; c0 = c + o; }
                    else { a0 = ta ? a + o : a + o * lda; c0 = c + o * ldc; }
                    scipy_cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                                      tb ? CblasTrans : CblasNoTrans, (blasint)(split_n ? m : len),
                                      (blasint)(split_n ? len : n), (blasint)k, alpha, a0,
                                      (blasint)lda, b0, (blasint)ldb, beta, c0, (blasint)ldc);
                }
                return;
            }
        }
        scipy_cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                          tb ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k,
                          alpha, a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
        return;
    }
#endif
    port__sgemm_vendored(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

port_status port_sgemm(float *c, const float *a, const float *b, int trans_a, int trans_b,
                       int64_t m, int64_t n, int64_t k, float alpha, float beta, int64_t lda,
                       int64_t ldb, int64_t ldc) {
    PORT_NOTNULL(c);
    PORT_CHECK(m >= 0 && n >= 0 && k >= 0, PORT_ERR_SHAPE);
    PORT_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, PORT_ERR_SHAPE);
    PORT_CHECK(trans_a == 0 || trans_a == 1, PORT_ERR_ARG);
    PORT_CHECK(trans_b == 0 || trans_b == 1, PORT_ERR_ARG);
    if (m == 0 || n == 0) return PORT_OK;
    if (k > 0) { PORT_NOTNULL(a); PORT_NOTNULL(b); }
    PORT_CHECK(ldc >= n, PORT_ERR_SHAPE);
    PORT_CHECK(lda >= PORT_MAX(1, trans_a ? m : k), PORT_ERR_SHAPE);
    PORT_CHECK(ldb >= PORT_MAX(1, trans_b ? k : n), PORT_ERR_SHAPE);
    PORT_CHECK(lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX, PORT_ERR_SHAPE);
    port__gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return PORT_OK;
}
