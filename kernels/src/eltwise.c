/* Element-wise kernels: relu, relu6, hardswish, sigmoid, hardsigmoid, silu, add, accumulate (dropout: rng.c). */
#include "internal.h"

#define ELT_CHECK(out, in, count) \
    PORT_NOTNULL(out);            \
    PORT_NOTNULL(in);             \
    PORT_CHECK((count) >= 0, PORT_ERR_SHAPE)

/* Small counts run a plain loop: entering an OpenMP region (even with a
 * false if-clause) costs more than the whole kernel on tiny tensors.
 * Backward selects load dy unconditionally (`g = dy[i]; cond ? g : 0`): a load
 * under the condition cannot be if-converted with portable (SSE2) flags, so
 * the loop stays scalar with a data-dependent branch, which mispredicts on
 * real activations (10-20x slower, and timed differently on the profiler's
 * data than in a training step). A select of loaded values vectorises. */
#define ELT_LOOP(body)                                                     \
    do {                                                                   \
        if (count > PORT_PAR_MIN) {                                        \
            _Pragma("omp parallel for simd schedule(static)")              \
            for (int64_t i = 0; i < count; i++) { body }                   \
        } else {                                                           \
            _Pragma("omp simd")                                            \
            for (int64_t i = 0; i < count; i++) { body }                   \
        }                                                                  \
    } while (0)

port_status port_relu_forward(float *y, const float *x, int64_t count) {
    ELT_CHECK(y, x, count);
    /* NaN propagates as in torch.relu: only x <= 0 maps to 0 */
    ELT_LOOP(float v = x[i]; y[i] = v <= 0.0f ? 0.0f : v;);
    return PORT_OK;
}

port_status port_relu_backward(float *dx, const float *dy, const float *y, int64_t count) {
    ELT_CHECK(dx, dy, count);
    PORT_NOTNULL(y);
    /* as torch's threshold_backward: dx = y <= 0 ? 0 : dy (a NaN y passes dy) */
    ELT_LOOP(float g = dy[i]; dx[i] = y[i] <= 0.0f ? 0.0f : g;);
    return PORT_OK;
}

port_status port_relu6_forward(float *y, const float *x, int64_t count) {
    ELT_CHECK(y, x, count);
    ELT_LOOP(
        float v = x[i];                  /* NaN propagates (torch.clamp) */
        v = v <= 0.0f ? 0.0f : v;
        y[i] = v >= 6.0f ? 6.0f : v;
    );
    return PORT_OK;
}

port_status port_relu6_backward(float *dx, const float *dy, const float *y, int64_t count) {
    ELT_CHECK(dx, dy, count);
    PORT_NOTNULL(y);
    /* as torch's hardtanh_backward: dy where 0 < v < 6, else (and for a NaN v) 0 */
    ELT_LOOP(float g = dy[i]; float v = y[i]; dx[i] = (v > 0.0f) & (v < 6.0f) ? g : 0.0f;);
    return PORT_OK;
}

port_status port_hardswish_forward(float *y, const float *x, int64_t count) {
    ELT_CHECK(y, x, count);
    PORT_CHECK(y != x, PORT_ERR_ALIAS);
    ELT_LOOP(
        float v = x[i] + 3.0f;
        v = v > 0.0f ? v : 0.0f;
        v = v < 6.0f ? v : 6.0f;
        y[i] = x[i] * v / 6.0f;
    );
    return PORT_OK;
}

port_status port_hardswish_backward(float *dx, const float *dy, const float *x, int64_t count) {
    ELT_CHECK(dx, dy, count);
    PORT_NOTNULL(x);
    ELT_LOOP(
        float v = x[i];
        float g = dy[i];
        float mid = g * (v / 3.0f + 0.5f);
        /* same boundaries as PyTorch: 0 for x <= -3, dy for x >= 3 */
        float r = v < 3.0f ? mid : g;
        dx[i] = v <= -3.0f ? 0.0f : r;
    );
    return PORT_OK;
}

/* sigmoid and silu: the logistic in double from the portable exp (same bits on every ISA), rounded once.  Their
 * loops (and SwiGLU's) run in blocks of SIG_BLOCK elements, each block in an ISA clone (PORT_ISA_CLONES: 8 doubles
 * per AVX-512 vector where the baseline has 2; the same operations per element in every clone, so the same bits);
 * the double exp costs tens of operations per element, so the blocks go parallel from PORT_PAR_MIN / 8 elements
 * (as GELU's, transformer.c).  In place (y = x, dx = dy) is allowed: each element is read before it is written. */
static inline double sigm(double v) { return 1.0 / (1.0 + port__exp_inline(-v)); }

#define SIG_BLOCK 4096
#define SIG_BLOCKS(call) SIG_BLOCKS_FROM(PORT_PAR_MIN / 8, call)
#define SIG_BLOCKS_FROM(par_min, call)                                                         \
    do {                                                                                       \
        int64_t nb_ = (count + SIG_BLOCK - 1) / SIG_BLOCK;                                     \
        if (count > (par_min)) {                                                               \
            _Pragma("omp parallel for schedule(static)")                                       \
            for (int64_t b_ = 0; b_ < nb_; b_++) {                                             \
                int64_t i0 = b_ * SIG_BLOCK, n = count - i0 < SIG_BLOCK ? count - i0 : SIG_BLOCK; \
                call;                                                                          \
            }                                                                                  \
        } else if (count > 0) {                                                                \
            int64_t i0 = 0, n = count;                                                         \
            call;                                                                              \
        }                                                                                      \
    } while (0)

PORT_ISA_CLONES static void sigmoid_block(float *y, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = (float)sigm((double)x[i]);
}

/* silu's references (port_silu_forward_reference / _backward_reference): the double logistic as sigmoid's */
PORT_ISA_CLONES static void silu_ref_fwd_block(float *y, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        y[i] = (float)(v * sigm(v));
    }
}

/* as torch's silu_backward: dy s (1 + x (1 - s)), s = sigmoid(x) */
PORT_ISA_CLONES static void silu_ref_bwd_block(float *dx, const float *dy, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        double s = sigm(v);
        dx[i] = (float)((double)dy[i] * s * (1.0 + v * (1.0 - s)));
    }
}

/* silu and SwiGLU in float32 (as torch's float kernels compute them): e = e^-|x| by port__expf_f32 (1-2 float
 * ulps, no overflow), sigmoid 1 / (1 + e) for x >= 0 and e / (1 + e) below; 16 lanes per AVX-512 vector where the
 * double logistic has 8, and a shorter polynomial: about 4x the reference's speed (EfficientNet's SiLUs are 16M
 * elements a step at batch 32), within a few float ulps of it (tests/kernels/test_eltwise_pool.py).  Float
 * operations only (no contraction under -std=c11): the same bits on every ISA. */
static inline float sigm_f(float v) {
    float e = port__expf_f32(v < 0.0f ? v : -v);
    float r = 1.0f / (1.0f + e);
    return v >= 0.0f ? r : e * r;
}

/* silu's derivative times g, as torch's silu_backward: g s (1 + x (1 - s)) (SwiGLU's da the same expression),
 * with 1 - s taken as e / (1 + e) for x >= 0 (no cancellation where s nears 1; torch's float kernel loses there) */
static inline float silu_grad_f(float g, float v) {
    float e = port__expf_f32(v < 0.0f ? v : -v);
    float r = 1.0f / (1.0f + e), er = e * r;
    float s = v >= 0.0f ? r : er, oms = v >= 0.0f ? er : r;
    return g * s * (1.0f + v * oms);
}

PORT_ISA_CLONES static void silu_fwd_block(float *y, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = v * sigm_f(v);
    }
}

PORT_ISA_CLONES static void silu_bwd_block(float *dx, const float *dy, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) dx[i] = silu_grad_f(dy[i], x[i]);
}

PORT_ISA_CLONES static void swiglu_fwd_block(float *restrict y, const float *a, const float *b, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float v = a[i];
        float s = v * sigm_f(v);
        y[i] = s * b[i];
    }
}

PORT_ISA_CLONES static void swiglu_bwd_block(float *restrict da, float *restrict db, const float *dy, const float *a,
                                             const float *b, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float v = a[i];
        float g = dy[i];
        float s = v * sigm_f(v);
        float ga = g * b[i];
        db[i] = g * s;
        da[i] = silu_grad_f(ga, v);
    }
}

port_status port_sigmoid_forward(float *y, const float *x, int64_t count) {
    ELT_CHECK(y, x, count);
    SIG_BLOCKS(sigmoid_block(y + i0, x + i0, n));
    return PORT_OK;
}

port_status port_sigmoid_backward(float *dx, const float *dy, const float *y, int64_t count) {
    ELT_CHECK(dx, dy, count);
    PORT_NOTNULL(y);
    /* as torch's sigmoid_backward: dy (1 - y) y */
    ELT_LOOP(float t = y[i]; dx[i] = dy[i] * (1.0f - t) * t;);
    return PORT_OK;
}

port_status port_hardsigmoid_forward(float *y, const float *x, int64_t count) {
    ELT_CHECK(y, x, count);
    ELT_LOOP(
        float v = x[i] + 3.0f;           /* NaN propagates */
        v = v <= 0.0f ? 0.0f : v;
        v = v >= 6.0f ? 6.0f : v;
        y[i] = v / 6.0f;
    );
    return PORT_OK;
}

port_status port_hardsigmoid_backward(float *dx, const float *dy, const float *x, int64_t count) {
    ELT_CHECK(dx, dy, count);
    PORT_NOTNULL(x);
    /* as torch's hardsigmoid_backward: dy / 6 where -3 < x < 3, else 0 */
    ELT_LOOP(float g = dy[i]; float v = x[i]; dx[i] = (v > -3.0f) & (v < 3.0f) ? g / 6.0f : 0.0f;);
    return PORT_OK;
}

#define SILU_PAR_MIN (PORT_PAR_MIN / 4)   /* the float logistic: about half the double's work per element */

static port_status silu_forward(float *y, const float *x, int64_t count, int reference) {
    ELT_CHECK(y, x, count);
    if (reference) SIG_BLOCKS(silu_ref_fwd_block(y + i0, x + i0, n));
    else SIG_BLOCKS_FROM(SILU_PAR_MIN, silu_fwd_block(y + i0, x + i0, n));
    return PORT_OK;
}

static port_status silu_backward(float *dx, const float *dy, const float *x, int64_t count, int reference) {
    ELT_CHECK(dx, dy, count);
    PORT_NOTNULL(x);
    if (reference) SIG_BLOCKS(silu_ref_bwd_block(dx + i0, dy + i0, x + i0, n));
    else SIG_BLOCKS_FROM(SILU_PAR_MIN, silu_bwd_block(dx + i0, dy + i0, x + i0, n));
    return PORT_OK;
}

port_status port_silu_forward(float *y, const float *x, int64_t count) { return silu_forward(y, x, count, 0); }
port_status port_silu_backward(float *dx, const float *dy, const float *x, int64_t count) {
    return silu_backward(dx, dy, x, count, 0);
}
port_status port_silu_forward_reference(float *y, const float *x, int64_t count) {
    return silu_forward(y, x, count, 1);
}
port_status port_silu_backward_reference(float *dx, const float *dy, const float *x, int64_t count) {
    return silu_backward(dx, dy, x, count, 1);
}

/* SwiGLU, silu(a) * b fused (Llama's MLP): the silu output is rounded to float before the product and the
 * backward takes the same roundings as the plain silu -> mul chain (ga = dy b, db = dy silu(a)), so both give the
 * same bits; the fused pair saves a and b only (no silu output). y may not alias a or b; da, db distinct. */
port_status port_swiglu_forward(float *y, const float *a, const float *b, int64_t count) {
    ELT_CHECK(y, a, count);
    PORT_NOTNULL(b);
    PORT_CHECK(y != a && y != b, PORT_ERR_ALIAS);
    SIG_BLOCKS_FROM(SILU_PAR_MIN, swiglu_fwd_block(y + i0, a + i0, b + i0, n));
    return PORT_OK;
}

port_status port_swiglu_backward(float *da, float *db, const float *dy, const float *a, const float *b,
                                 int64_t count) {
    ELT_CHECK(da, dy, count);
    PORT_NOTNULL(db); PORT_NOTNULL(a); PORT_NOTNULL(b);
    PORT_CHECK(da != db && da != a && da != b && db != a && db != b, PORT_ERR_ALIAS);
    SIG_BLOCKS_FROM(SILU_PAR_MIN, swiglu_bwd_block(da + i0, db + i0, dy + i0, a + i0, b + i0, n));
    return PORT_OK;
}

port_status port_add(float *y, const float *a, const float *b, int64_t count) {
    ELT_CHECK(y, a, count);
    PORT_NOTNULL(b);
    ELT_LOOP(y[i] = a[i] + b[i];);
    return PORT_OK;
}

port_status port_accumulate(float *a, const float *b, int64_t count) {
    ELT_CHECK(a, b, count);
    ELT_LOOP(a[i] += b[i];);
    return PORT_OK;
}
