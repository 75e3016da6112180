/* Squeeze-excitation fused (issue 54): y = x * gate(fc2(act(fc1(mean_hw(x))))) per (n, c), the chain of
 * MobileNetV3 (relu, hardsigmoid), EfficientNet (silu, sigmoid) and RegNet-Y (relu, sigmoid).
 *
 * The plain members' bits: every step is the plain member's own kernel on the same operands -- the pool
 * (port_global_avgpool_forward), the fcs as the 1x1 convolutions the plain plan runs (port__conv_fwd / _bwd_in /
 * _bwd_w, PORT_CONV_DIRECT: the C library's own choice for a pointwise conv, on the pooled [n, c, 1, 1] map; the
 * im2col form gives the same bits there: its columns are a copy of the map), the activation and gate kernels
 * (eltwise.c), the mul's gradient as port_binary_backward sums it (rows of dy x in 8 double lanes) -- so the fused
 * chain equals the plain chain bit for bit at any thread count (each member's kernel does; tests/e2e/test_fused_se.py
 * trains both plans to the same bits).  Only the element-wise tail is written here: y = x * gate and
 * dx = dy * gate + dm / hw, the same float operations as the mul, the pool's gradient and the grad_accumulate.
 *
 * Storage: the forward writes y and the small per-sample vectors h = fc1 output and z = fc2 output; the pooled
 * mean, act(h) and the gate are rebuilt where needed by the same kernels (the same bits).  Weight gradients
 * accumulate (dw += ... as the plain convs' weight gradients; port_se_backward_weight_overwrite writes them as the
 * convs' overwriting form: the step's only writer of the fcs' gradients, which then need no zeroing first),
 * dx overwrites. */
#include "internal.h"

/* the 1x1 convolution of an fc on the pooled map: n images of cin channels, 1x1, to cout channels */
static port_conv2d_params se_fc(int64_t n, int64_t cin, int64_t cout) {
    port_conv2d_params p = {0};
    p.n = n, p.c_in = cin, p.h = 1, p.w = 1, p.c_out = cout, p.kh = 1, p.kw = 1, p.stride_h = 1, p.stride_w = 1;
    p.groups = 1;
    return p;
}

/* floats of the fcs' convolution workspace (the larger of the two: one region serves both, one at a time; the
 * folded batch's copies of the pooled map and of the output: (c + s) n floats from batch 2) */
static int64_t se_conv_floats(int64_t n, int64_t c, int64_t s) {
    port_conv2d_params p1 = se_fc(n, c, s), p2 = se_fc(n, s, c);
    size_t b1 = port_conv2d_workspace_bytes(&p1, PORT_CONV_DIRECT);
    size_t b2 = port_conv2d_workspace_bytes(&p2, PORT_CONV_DIRECT);
    return (int64_t)((PORT_MAX(b1, b2) + sizeof(float) - 1) / sizeof(float));
}

/* Workspace layouts (floats; cw: se_conv_floats, each part live only while named):
 *   forward   [max(nc, ns): pooled, then act(h), then the gate][cw: the convolutions]
 *   _weight   [nc: dz, then pooled][ns: act(h)][max(cw, nc): the sigmoid's output, then the convolutions]
 *   _input    [nc: dm][max(cw, nc): fc1's convolution, then the gate]            (nc = n c, ns = n s) */
size_t port_se_workspace_bytes(int64_t n, int64_t c, int64_t s, int kernel) {
    if (n <= 0 || c <= 0 || s <= 0) return 0;
    int64_t nc = n * c, ns = n * s, cw = se_conv_floats(n, c, s);
    switch (kernel) {
    case 0: return (size_t)(PORT_MAX(nc, ns) + cw) * sizeof(float);
    case 1: return (size_t)(nc + ns + PORT_MAX(cw, nc)) * sizeof(float);
    case 2: return (size_t)(nc + PORT_MAX(cw, nc)) * sizeof(float);
    default: return 0;
    }
}

#define SE_CHECK_DIMS(n, c, s, hw, act, gate)                                              \
    PORT_CHECK((n) > 0 && (c) > 0 && (s) > 0 && (hw) > 0, PORT_ERR_SHAPE);                 \
    PORT_CHECK(((act) == PORT_SE_RELU || (act) == PORT_SE_SILU) &&                         \
               ((gate) == PORT_SE_SIGMOID || (gate) == PORT_SE_HARDSIGMOID), PORT_ERR_ARG)

static void se_act(float *a, const float *h, int64_t count, int act) {
    if (act == PORT_SE_SILU) port_silu_forward(a, h, count);
    else port_relu_forward(a, h, count);
}

static void se_gate(float *g, const float *z, int64_t count, int gate) {
    if (gate == PORT_SE_HARDSIGMOID) port_hardsigmoid_forward(g, z, count);
    else port_sigmoid_forward(g, z, count);
}

port_status port_se_forward(float *y, float *h, float *z, const float *x, const float *w1, const float *b1,
                            const float *w2, const float *b2, int64_t n, int64_t c, int64_t s, int64_t hw, int act,
                            int gate, void *ws, size_t ws_bytes) {
    PORT_NOTNULL(y); PORT_NOTNULL(h); PORT_NOTNULL(z); PORT_NOTNULL(x);
    PORT_NOTNULL(w1); PORT_NOTNULL(b1); PORT_NOTNULL(w2); PORT_NOTNULL(b2);
    SE_CHECK_DIMS(n, c, s, hw, act, gate);
    PORT_CHECK(ws != NULL && ws_bytes >= port_se_workspace_bytes(n, c, s, 0), PORT_ERR_WORKSPACE);
    PORT_CHECK(y != x && h != z && (const float *)h != x && (const float *)z != x, PORT_ERR_ALIAS);
    float *pooled = (float *)ws, *a = pooled, *g = pooled, *cw = pooled + PORT_MAX(n * c, n * s);
    port_conv2d_params p1 = se_fc(n, c, s), p2 = se_fc(n, s, c);
    port_global_avgpool_forward(pooled, x, n, c, hw);
    port__conv_fwd(h, pooled, w1, b1, &p1, PORT_CONV_DIRECT, cw);
    se_act(a, h, n * s, act);                                          /* over pooled: no longer read */
    port__conv_fwd(z, a, w2, b2, &p2, PORT_CONV_DIRECT, cw);
    se_gate(g, z, n * c, gate);                                        /* over act(h): no longer read */
#pragma omp parallel for schedule(static) if (n * c * hw > PORT_PAR_MIN)
    for (int64_t nc = 0; nc < n * c; nc++) {                           /* the mul: x * gate, broadcast over hw */
        const float *xp = x + nc * hw;
        float *yp = y + nc * hw, gv = g[nc];
        for (int64_t q = 0; q < hw; q++) yp[q] = xp[q] * gv;
    }
    return PORT_OK;
}

static port_status se_backward_weight(float *dw1, float *db1, float *dw2, float *db2, float *dh, const float *dy,
                                      const float *x, const float *w2, const float *h, const float *z, int64_t n,
                                      int64_t c, int64_t s, int64_t hw, int act, int gate, void *ws, size_t ws_bytes,
                                      int overwrite) {
    PORT_NOTNULL(dw1); PORT_NOTNULL(db1); PORT_NOTNULL(dw2); PORT_NOTNULL(db2); PORT_NOTNULL(dh);
    PORT_NOTNULL(dy); PORT_NOTNULL(x); PORT_NOTNULL(w2); PORT_NOTNULL(h); PORT_NOTNULL(z);
    SE_CHECK_DIMS(n, c, s, hw, act, gate);
    PORT_CHECK(ws != NULL && ws_bytes >= port_se_workspace_bytes(n, c, s, 1), PORT_ERR_WORKSPACE);
    PORT_CHECK(dh != h && dh != dw1 && dh != dw2 && dw1 != dw2 && db1 != db2, PORT_ERR_ALIAS);
    float *dz = (float *)ws, *a = dz + n * c, *cw = a + n * s, *t = cw, *pooled = dz;
    port_conv2d_params p1 = se_fc(n, c, s), p2 = se_fc(n, s, c);
    /* the mul's gradient of the gate: sum_hw dy x per (n, c), as port_binary_backward sums a broadcast operand's */
    port_binary_params bp = {0};
    bp.op = PORT_BINARY_MUL, bp.rank = 2, bp.a_bcast = 2, bp.b_bcast = 0, bp.dims[0] = n * c, bp.dims[1] = hw;
    port_binary_backward(dz, NULL, dy, NULL, x, &bp, 0);
    if (gate == PORT_SE_HARDSIGMOID) {
        port_hardsigmoid_backward(dz, dz, z, n * c);                   /* hardsigmoid saves its input */
    } else {
        port_sigmoid_forward(t, z, n * c);                             /* sigmoid saves its output */
        port_sigmoid_backward(dz, dz, t, n * c);
    }
    se_act(a, h, n * s, act);
    port__conv_bwd_in(dh, dz, w2, &p2, PORT_CONV_DIRECT, cw);          /* d act(h) into dh, then through act */
    port__conv_bwd_w(dw2, db2, dz, a, &p2, PORT_CONV_DIRECT, cw, overwrite);
    if (act == PORT_SE_SILU) port_silu_backward(dh, dh, h, n * s);     /* silu saves its input, relu its output */
    else port_relu_backward(dh, dh, a, n * s);
    port_global_avgpool_forward(pooled, x, n, c, hw);                  /* over dz: no longer read */
    port__conv_bwd_w(dw1, db1, dh, pooled, &p1, PORT_CONV_DIRECT, cw, overwrite);
    return PORT_OK;
}

port_status port_se_backward_weight(float *dw1, float *db1, float *dw2, float *db2, float *dh, const float *dy,
                                    const float *x, const float *w2, const float *h, const float *z, int64_t n,
                                    int64_t c, int64_t s, int64_t hw, int act, int gate, void *ws, size_t ws_bytes) {
    return se_backward_weight(dw1, db1, dw2, db2, dh, dy, x, w2, h, z, n, c, s, hw, act, gate, ws, ws_bytes, 0);
}

port_status port_se_backward_weight_overwrite(float *dw1, float *db1, float *dw2, float *db2, float *dh,
                                              const float *dy, const float *x, const float *w2, const float *h,
                                              const float *z, int64_t n, int64_t c, int64_t s, int64_t hw, int act,
                                              int gate, void *ws, size_t ws_bytes) {
    return se_backward_weight(dw1, db1, dw2, db2, dh, dy, x, w2, h, z, n, c, s, hw, act, gate, ws, ws_bytes, 1);
}

port_status port_se_backward_input(float *dx, const float *dy, const float *z, const float *w1, const float *dh,
                                   int64_t n, int64_t c, int64_t s, int64_t hw, int gate, void *ws, size_t ws_bytes) {
    PORT_NOTNULL(dx); PORT_NOTNULL(dy); PORT_NOTNULL(z); PORT_NOTNULL(w1); PORT_NOTNULL(dh);
    SE_CHECK_DIMS(n, c, s, hw, PORT_SE_RELU, gate);
    PORT_CHECK(ws != NULL && ws_bytes >= port_se_workspace_bytes(n, c, s, 2), PORT_ERR_WORKSPACE);
    PORT_CHECK((const float *)dx != z && (const float *)dx != w1 && (const float *)dx != dh, PORT_ERR_ALIAS);
    float *dm = (float *)ws, *cw = dm + n * c, *g = cw;
    port_conv2d_params p1 = se_fc(n, c, s);
    port__conv_bwd_in(dm, dh, w1, &p1, PORT_CONV_DIRECT, cw);          /* fc1's input gradient: the pooled mean's */
    se_gate(g, z, n * c, gate);                                        /* over the convolution's workspace */
    /* the mul's dx (dy gate), the pool's (dm / hw) and their sum, as the mul, the pool's gradient and the
     * grad_accumulate compute them; dx may be dy: each element read before it is written */
#pragma omp parallel for schedule(static) if (n * c * hw > PORT_PAR_MIN)
    for (int64_t nc = 0; nc < n * c; nc++) {
        float gm = dm[nc] / (float)hw, gv = g[nc];
        const float *gp = dy + nc * hw;
        float *dp = dx + nc * hw;
        for (int64_t q = 0; q < hw; q++) dp[q] = gp[q] * gv + gm;
    }
    return PORT_OK;
}
