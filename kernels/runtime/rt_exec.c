/* port_rt_exec: one compiled call -> one kernel of port_kernels.h.  The only
 * place that maps a call's flat arguments to a kernel's signature; the
 * Python executor, the profiler and port-rt all run C calls through it. */
#include "port_rt.h"

#include <stddef.h>

int port_rt_abi_version(void) { return PORT_RT_ABI_VERSION; }

const char *port_rt_kernel_name(int kernel) {
    switch (kernel) {
#define PORT_RT_NAME_(id, NAME, fn, run, rule) case id: return #fn;
        PORT_RT_KERNELS(PORT_RT_NAME_)
#undef PORT_RT_NAME_
    default: return NULL;
    }
}

uint64_t port_rt_rng_stream(int64_t counter, int64_t op) {
    return (uint64_t)(uint32_t)counter | (uint64_t)(uint32_t)op << 32;
}

/* attention calls: iv = bh, heads, tq, tk, dh, causal, algo, kv_heads, mask kind, mask dims[4], the forward op
 * (the dropout stream); fv = scale, dropout p */
static port_attention_params attn_p(const port_rt_call *c, const port_rt_state *s) {
    return port_rt_attention_params(c->iv, c->fv, s->seed, port_rt_rng_stream(s->dropout_counter, c->iv[13]));
}

#define conv_p port_rt_conv2d_params
#define pool_p port_rt_pool2d_params

static port_batchnorm_params bn_p(const port_rt_call *c) {
    const int64_t *v = c->iv;
    port_batchnorm_params p = {v[0], v[1], v[2], v[3], (float)c->fv[0], (float)c->fv[1]};
    return p;
}

static port_upsample2d_params upsample_p(const port_rt_call *c) {
    const int64_t *v = c->iv;
    port_upsample2d_params p = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], (float)c->fv[0], (float)c->fv[1]};
    return p;
}

static port_binary_params binary_p(const int64_t *v) {
    port_binary_params p = {v[0], v[1], v[2], v[3], {v[4], v[5], v[6], v[7], v[8], v[9]}};
    return p;
}

/* patch calls: iv[15] = tile height, iv[14] = tile width (0 in bundles before row bands: square tiles) */
#define PATCH_TW(v) ((v)[14] > 0 ? (v)[14] : (v)[15])
#define F(i) ((float *)ptrs[i])
#define CF(i) ((const float *)ptrs[i])

/* How a call runs its entry point fn: one macro per argument layout, named by the kernel's row of PORT_RT_KERNELS
 * (port_rt.h).  Each is a statement that returns fn's status; in scope: c (the call), v (its iv), ptrs, ws and wsb
 * (the workspace and its bytes), s (the run state).  Layouts shared by several kernels come first. */
#define RUN_Y_X(fn) return fn(F(0), CF(1), v[0]);                  /* y, x; count */
#define RUN_Y_A_B(fn) return fn(F(0), CF(1), CF(2), v[0]);         /* y (dx), a (dy), b (y|x); count */
#define RUN_CONV_FWD(fn)                                                                                             \
    { port_conv2d_params p = conv_p(v); return fn(F(0), CF(1), CF(2), CF(3), &p, (int)v[14], ws, wsb); }
#define RUN_CONV_BWD_IN(fn)                                                                                          \
    { port_conv2d_params p = conv_p(v); return fn(F(0), CF(1), CF(2), &p, (int)v[14], ws, wsb); }
#define RUN_CONV_BWD_W(fn)                                                                                           \
    { port_conv2d_params p = conv_p(v); return fn(F(0), F(1), CF(2), CF(3), &p, (int)v[14], ws, wsb); }
#define RUN_PATCH_FWD(fn)                                                                                            \
    { port_conv2d_params p = conv_p(v); return fn(F(0), CF(1), CF(2), CF(3), &p, v[15], PATCH_TW(v), ws, wsb); }
#define RUN_PATCH_BWD_IN(fn)                                                                                         \
    { port_conv2d_params p = conv_p(v); return fn(F(0), CF(1), CF(2), &p, v[15], PATCH_TW(v), ws, wsb); }
#define RUN_PATCH_BWD_W(fn)                                                                                          \
    { port_conv2d_params p = conv_p(v); return fn(F(0), F(1), CF(2), CF(3), &p, v[15], PATCH_TW(v), ws, wsb); }
#define RUN_CONV_BN_RELU(fn)                                                                                         \
    {                                                                                                                \
        port_conv2d_params p = conv_p(v);                                                                            \
        return fn(F(0), F(1), F(2), F(3), F(4), F(5), CF(6), CF(7), CF(8), CF(9), &p, (float)c->fv[0],              \
                  (float)c->fv[1], (int)v[14], ws, wsb);                                                             \
    }
#define RUN_BN_TRAIN(fn)                                                                                             \
    { port_batchnorm_params p = bn_p(c); return fn(F(0), F(1), F(2), F(3), F(4), CF(5), CF(6), CF(7), &p); }
#define RUN_BN_Y_5(fn) { port_batchnorm_params p = bn_p(c); return fn(F(0), CF(1), CF(2), CF(3), CF(4), CF(5), &p); }
#define RUN_BN_DW_4(fn) { port_batchnorm_params p = bn_p(c); return fn(F(0), F(1), CF(2), CF(3), CF(4), CF(5), &p); }
#define RUN_BN_DX_EVAL(fn) { port_batchnorm_params p = bn_p(c); return fn(F(0), CF(1), CF(2), CF(3), &p); }
#define RUN_SE_FWD(fn)                                                                                               \
    return fn(F(0), F(1), F(2), CF(3), CF(4), CF(5), CF(6), CF(7), v[0], v[1], v[2], v[3], (int)v[4], (int)v[5], ws, \
              wsb);
#define RUN_SE_BWD_W(fn)                                                                                             \
    return fn(F(0), F(1), F(2), F(3), F(4), CF(5), CF(6), CF(7), CF(8), CF(9), v[0], v[1], v[2], v[3], (int)v[4],   \
              (int)v[5], ws, wsb);
#define RUN_SE_BWD_IN(fn) return fn(F(0), CF(1), CF(2), CF(3), CF(4), v[0], v[1], v[2], v[3], (int)v[5], ws, wsb);
#define RUN_SWIGLU_BWD(fn) return fn(F(0), F(1), CF(2), CF(3), CF(4), v[0]);
#define RUN_ROTARY(fn) return fn(F(0), CF(1), CF(2), CF(3), v[0], v[1], v[2], v[3], v[4]);
#define RUN_RMS_STATS(fn) return fn(F(0), CF(1), v[0], v[1], (float)c->fv[0]);
#define RUN_RMSLIN_FWD(fn) /* iv: n, in, out, block rows, wt */                                                     \
    return fn(F(0), CF(1), CF(2), CF(3), CF(4), CF(5), v[0], v[1], v[2], v[3], (int)v[4], ws, wsb);
#define RUN_RMSLIN_BWD_W(fn)                                                                                         \
    return fn(F(0), F(1), CF(2), CF(3), CF(4), CF(5), v[0], v[1], v[2], v[3], (int)v[4], ws, wsb);
#define RUN_RMSLINS(fn) return rmsnorm_linears(c, ptrs, ws, wsb);
#define RUN_BINARY_FWD(fn) { port_binary_params p = binary_p(v); return fn(F(0), CF(1), CF(2), &p); }
#define RUN_BINARY_BWD(fn) /* iv: as forward, then accumulate */                                                  \
    { port_binary_params p = binary_p(v); return fn(F(0), F(1), CF(2), CF(3), CF(4), &p, (int)v[10]); }
#define RUN_RMSNORM_FWD(fn) return fn(F(0), F(1), CF(2), CF(3), v[0], v[1], (float)c->fv[0]);   /* iv: rows, d; eps */
#define RUN_RMSNORM_BWD_IN(fn) return fn(F(0), CF(1), CF(2), CF(3), CF(4), v[0], v[1]);
#define RUN_RMSNORM_BWD_W(fn) return fn(F(0), CF(1), CF(2), CF(3), v[0], v[1]);
#define RUN_GN_FWD(fn) /* iv: n, c, hw, groups; fv: eps */                                                          \
    return fn(F(0), F(1), CF(2), CF(3), CF(4), v[0], v[1], v[2], v[3], (float)c->fv[0]);
#define RUN_GN_BWD_IN(fn) return fn(F(0), CF(1), CF(2), CF(3), CF(4), v[0], v[1], v[2], v[3]);
#define RUN_GN_BWD_W(fn) return fn(F(0), F(1), CF(2), CF(3), CF(4), v[0], v[1], v[2], v[3]);
#define RUN_UPSAMPLE(fn) { port_upsample2d_params p = upsample_p(c); return fn(F(0), CF(1), &p); }
#define RUN_ADAPTIVE(fn) return fn(F(0), CF(1), v[0], v[1], v[2], v[3], v[4], v[5]);   /* iv: n, c, h, w, ho, wo */
#define RUN_UNARY_FWD(fn) return fn(F(0), CF(1), v[0], v[1], (float)c->fv[0]);
#define RUN_UNARY_BWD(fn) return fn(F(0), CF(1), CF(2), v[0], v[1], (float)c->fv[0]);
#define RUN_SLICE_COPY(fn) /* iv: outer, inner, ny, nx, len, y_start, x_start, fill */                              \
    { port_slice_params p = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]}; return fn(F(0), CF(1), &p); }
#define RUN_EXPAND(fn) return fn(F(0), CF(1), v[0], v[1], v + 2);   /* iv: rank, x_bcast, dims[6] */
#define RUN_MASKED_FILL(fn) /* iv: rank, m_bcast, dims[6]; fv: value */                                             \
    return fn(F(0), CF(1), (const uint8_t *)ptrs[2], v[0], v[1], v + 2, (float)c->fv[0]);
#define RUN_MASK_CAST(fn) return fn(ptrs[0], v[0], ptrs[1], v[1], v[2]);   /* iv: y_dt, x_dt, count */
#define RUN_MASK_LOGIC(fn) /* iv: op, rank, a_bcast, b_bcast, dims[6] */                                            \
    return fn((uint8_t *)ptrs[0], (const uint8_t *)ptrs[1], (const uint8_t *)ptrs[2], v[0], v[1], v[2], v[3], v + 4);
#define RUN_EXPAND_MASK(fn) return fn((uint8_t *)ptrs[0], (const uint8_t *)ptrs[1], v[0], v[1], v + 2);
#define RUN_MASK_COMPARE(fn) return fn((uint8_t *)ptrs[0], CF(1), CF(2), v[0], v[1], v[2], v[3], v + 4);
#define RUN_MASK_COMPARE_SCALAR(fn) return fn((uint8_t *)ptrs[0], CF(1), v[0], v[1], (float)c->fv[0]);
#define RUN_WHERE_FWD(fn) /* iv: rank, c_bcast, a_bcast, b_bcast, dims[6], scalars; fv: a, b values */              \
    return fn(F(0), (const uint8_t *)ptrs[1], CF(2), CF(3), v[0], v[1], v[2], v[3], v + 4, v[10], (float)c->fv[0],  \
              (float)c->fv[1]);
#define RUN_WHERE_BWD(fn) return fn(F(0), F(1), CF(2), (const uint8_t *)ptrs[3], v[0], v[1], v[2], v[3], v + 4);
#define RUN_INT_BINARY(fn) return fn(ptrs[0], ptrs[1], ptrs[2], v[0], v[1], v[2], v[3], v[4], v + 5);
#define RUN_ARGMAX_ROWS(fn) return fn((int64_t *)ptrs[0], ptrs[1], v[0], v[1], v[2]);   /* iv: x_dtype, rows, cols */
#define RUN_INDEX2_ROWS(fn) /* iv: rows, cols, inner, rank, i0_bcast, i1_bcast, dims[6], scatter */                 \
    return fn(F(0), CF(1), (const int64_t *)ptrs[2], (const int64_t *)ptrs[3], v[0], v[1], v[2], v[3], v[4], v[5],  \
              v + 6, v[12]);
#define RUN_MASK_INDEX2(fn) /* iv: rows, cols, rank, i0_bcast, i1_bcast, dims[6] */                                 \
    return fn((uint8_t *)ptrs[0], (const uint8_t *)ptrs[1], (const int64_t *)ptrs[2], (const int64_t *)ptrs[3],     \
              v[0], v[1], v[2], v[3], v[4], v + 5);
#define RUN_DROPOUT_FWD(fn)                                                                                          \
    return fn(F(0), (uint8_t *)ptrs[1], CF(2), v[0], (float)c->fv[0], s->seed,                                       \
              port_rt_rng_stream(s->dropout_counter, c->op));
#define RUN_BERNOULLI(fn)                                                                                            \
    return fn(F(0), v[0], (float)c->fv[0], s->seed, port_rt_rng_stream(s->dropout_counter, c->op));
#define RUN_DROPOUT_BWD(fn) return fn(F(0), CF(1), (const uint8_t *)ptrs[2], v[0], (float)c->fv[0]);
#define RUN_MAXPOOL_FWD(fn) { port_pool2d_params p = pool_p(v); return fn(F(0), (int64_t *)ptrs[1], CF(2), &p); }
#define RUN_MAXPOOL_BWD(fn)                                                                                          \
    { port_pool2d_params p = pool_p(v); return fn(F(0), CF(1), (const int64_t *)ptrs[2], &p); }
#define RUN_AVGPOOL(fn) { port_pool2d_params p = pool_p(v); return fn(F(0), CF(1), &p); }
#define RUN_Y_X_3(fn) return fn(F(0), CF(1), v[0], v[1], v[2]);      /* y, x; three counts */
#define RUN_LINEAR_FWD(fn) { port_linear_params p = {v[0], v[1], v[2]}; return fn(F(0), CF(1), CF(2), CF(3), &p); }
#define RUN_LINEAR_BWD_IN(fn) { port_linear_params p = {v[0], v[1], v[2]}; return fn(F(0), CF(1), CF(2), &p); }
#define RUN_LINEAR_BWD_W(fn)                                                                                         \
    { port_linear_params p = {v[0], v[1], v[2]}; return fn(F(0), F(1), CF(2), CF(3), &p); }
#define RUN_XENT_FWD(fn) return fn(F(0), F(1), CF(2), (const int64_t *)ptrs[3], v[0], v[1], (float)c->fv[0]);
#define RUN_XENT_BWD(fn) return fn(F(0), CF(1), (const int64_t *)ptrs[2], CF(3), v[0], v[1], (float)c->fv[0]);
#define RUN_XENT_IGNORE_FWD(fn)                                                                                      \
    return fn(F(0), F(1), CF(2), (const int64_t *)ptrs[3], v[0], v[1], (float)c->fv[0], v[2]);
#define RUN_XENT_IGNORE_BWD(fn)                                                                                      \
    return fn(F(0), CF(1), (const int64_t *)ptrs[2], CF(3), v[0], v[1], (float)c->fv[0], v[2]);
#define RUN_SGD(fn)                                                                                                  \
    {                                                                                                                \
        int mom = ptrs[1] != NULL;                                                                                   \
        return fn(F(0), F(1), CF(2), v[0], s->lr, mom ? s->momentum : 0.0, s->dampening, s->weight_decay,           \
                  s->nesterov ? 1 : 0, s->step == 0 ? 1 : 0);                                                        \
    }
#define RUN_ADAMW(fn)                                                                                                \
    return fn(F(0), F(1), F(2), CF(3), v[0], s->lr, s->beta1, s->beta2, s->eps, s->weight_decay, s->step + 1);
#define RUN_EMB_FWD(fn) return fn(F(0), (const int64_t *)ptrs[1], CF(2), v[0], v[1], v[2]);
#define RUN_EMB_BWD_W(fn) return fn(F(0), CF(1), (const int64_t *)ptrs[2], v[0], v[1], v[2]);
#define RUN_EMB_BWD_W_PAD(fn) return fn(F(0), CF(1), (const int64_t *)ptrs[2], v[0], v[1], v[2], v[3]);
#define RUN_LN_FWD(fn) return fn(F(0), F(1), CF(2), CF(3), CF(4), v[0], v[1], (float)c->fv[0]);
#define RUN_LN_BWD_IN(fn) return fn(F(0), CF(1), CF(2), CF(3), CF(4), v[0], v[1]);
#define RUN_LN_BWD_W(fn) return fn(F(0), F(1), CF(2), CF(3), CF(4), v[0], v[1]);
#define RUN_GELU_FWD(fn) return fn(F(0), CF(1), v[0], (int)v[1]);
#define RUN_GELU_BWD(fn) return fn(F(0), CF(1), CF(2), v[0], (int)v[1]);
#define RUN_SCALE(fn) return fn(F(0), CF(1), v[0], (float)c->fv[0]);
#define RUN_Y_X_2(fn) return fn(F(0), CF(1), v[0], v[1]);            /* y, x; two counts */
#define RUN_Y_A_B_2(fn) return fn(F(0), CF(1), CF(2), v[0], v[1]);   /* y, a, b; two counts */
#define RUN_BMM(fn)                                                                                                  \
    return fn(F(0), CF(1), CF(2), v[0], v[1], v[2], v[3], (int)v[4], (int)v[5], (float)c->fv[0], (float)c->fv[1]);
#define RUN_PERMUTE(fn) return fn(F(0), CF(1), v[0], &v[1], &v[7]);
#define RUN_ARANGE(fn) return fn((int64_t *)ptrs[0], v[0], v[1]);
#define RUN_NE_SCALAR(fn) return fn((uint8_t *)ptrs[0], (const int64_t *)ptrs[1], v[0], v[1]);
#define RUN_ATTN_FWD(fn)                                                                                             \
    {                                                                                                                \
        port_attention_params p = attn_p(c, s);                                                                      \
        return fn(F(0), F(1), CF(2), CF(3), CF(4), ptrs[5], &p, (int)v[6], ws, wsb);                                \
    }
#define RUN_ATTN_BWD(fn)                                                                                             \
    {                                                                                                                \
        port_attention_params p = attn_p(c, s);                                                                      \
        return fn(F(0), F(1), F(2), CF(3), CF(4), CF(5), CF(6), CF(7), CF(8), ptrs[9], &p, (int)v[6], ws, wsb);      \
    }
#define RUN_NONE(fn) return PORT_ERR_UNSUPPORTED;   /* paging: the runtime's own I/O (rt_bundle.c), no kernel */

/* rmsnorm + k linears, forward and weight gradient.  iv: n, in, k, block rows, wt, bias mask, out[k]
 * (rt_check.c: rmsnorm_linears, the pointers' order) */
static port_status rmsnorm_linears(const port_rt_call *c, void *const *ptrs, void *ws, size_t wsb) {
    const int64_t *v = c->iv;
    int64_t k = v[2], nb = 0;
    float *o[PORT_RMSLIN_MAX_LINEARS] = {0}, *bg[PORT_RMSLIN_MAX_LINEARS] = {0};
    const float *in[PORT_RMSLIN_MAX_LINEARS] = {0};
    if (k < 1 || k > PORT_RMSLIN_MAX_LINEARS) return PORT_ERR_ARG;
    int fwd = c->kernel == PORT_RT_RMSNORM_LINEARS_FORWARD;
    int first = fwd ? 1 : 0, bias0 = fwd ? 2 * (int)k + 3 : (int)k;
    for (int i = 0; i < k; i++) {
        o[i] = F(first + i);
        if (v[5] >> i & 1) bg[i] = F(bias0 + nb++);
    }
    for (int i = 0; i < k; i++) in[i] = fwd ? CF(k + 3 + i) : CF(bias0 + nb + i);
    if (fwd)
        return port_rmsnorm_linears_forward(F(0), o, CF(k + 1), CF(k + 2), in, (const float *const *)bg, v + 6, k,
                                            v[0], v[1], (float)c->fv[0], v[3], (int)v[4], ws, wsb);
    int64_t x0 = bias0 + nb + k;
    return port_rmsnorm_linears_backward_weight(o, bg, in, CF(x0), CF(x0 + 1), CF(x0 + 2), v + 6, k, v[0], v[1],
                                                v[3], (int)v[4], ws, wsb);
}

port_status port_rt_exec(const port_rt_call *c, void *const *ptrs, void *ws, const port_rt_state *s) {
    if (!c || !ptrs || !s) return PORT_ERR_NULL;
    const int64_t *v = c->iv;
    size_t wsb = c->ws_bytes > 0 ? (size_t)c->ws_bytes : 0;
    switch (c->kernel) {   /* one case per row of PORT_RT_KERNELS: its layout macro around its entry point */
#define PORT_RT_RUN_(id, NAME, fn, run, rule) case id: run(fn)
        PORT_RT_KERNELS(PORT_RT_RUN_)
#undef PORT_RT_RUN_
    default: return PORT_ERR_UNSUPPORTED;
    }
}
