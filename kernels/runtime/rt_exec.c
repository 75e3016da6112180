/* port_rt_exec: one compiled call -> one kernel of port_kernels.h.  The only
 * place that maps a call's flat arguments to a kernel's signature; the
 * Python executor, the profiler and port-rt all run C calls through it. */
#include "port_rt.h"

#include <stddef.h>

int port_rt_abi_version(void) { return PORT_RT_ABI_VERSION; }

const char *port_rt_kernel_name(int kernel) {
    switch (kernel) {
#define PORT_RT_NAME_(id, NAME, fn) case id: return #fn;
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

port_status port_rt_exec(const port_rt_call *c, void *const *ptrs, void *ws, const port_rt_state *s) {
    if (!c || !ptrs || !s) return PORT_ERR_NULL;
    const int64_t *v = c->iv;
    size_t wsb = c->ws_bytes > 0 ? (size_t)c->ws_bytes : 0;
    switch (c->kernel) {
    case PORT_RT_CONV2D_FORWARD: {
        port_conv2d_params p = conv_p(v);
        return port_conv2d_forward(F(0), CF(1), CF(2), CF(3), &p, (int)v[14], ws, wsb);
    }
    case PORT_RT_CONV2D_BACKWARD_INPUT: {
        port_conv2d_params p = conv_p(v);
        return port_conv2d_backward_input(F(0), CF(1), CF(2), &p, (int)v[14], ws, wsb);
    }
    case PORT_RT_CONV2D_BACKWARD_WEIGHT: {
        port_conv2d_params p = conv_p(v);
        return port_conv2d_backward_weight(F(0), F(1), CF(2), CF(3), &p, (int)v[14], ws, wsb);
    }
    case PORT_RT_CONV2D_BACKWARD_WEIGHT_OVERWRITE: {
        port_conv2d_params p = conv_p(v);
        return port_conv2d_backward_weight_overwrite(F(0), F(1), CF(2), CF(3), &p, (int)v[14], ws, wsb);
    }
    case PORT_RT_CONV2D_PATCH_FORWARD: {
        port_conv2d_params p = conv_p(v);
        return port_conv2d_patch_forward(F(0), CF(1), CF(2), CF(3), &p, v[15], PATCH_TW(v), ws, wsb);
    }
    case PORT_RT_CONV2D_PATCH_BACKWARD_INPUT: {
        port_conv2d_params p = conv_p(v);
        return port_conv2d_patch_backward_input(F(0), CF(1), CF(2), &p, v[15], PATCH_TW(v), ws, wsb);
    }
    case PORT_RT_CONV2D_PATCH_BACKWARD_WEIGHT: {
        port_conv2d_params p = conv_p(v);
        return port_conv2d_patch_backward_weight(F(0), F(1), CF(2), CF(3), &p, v[15], PATCH_TW(v), ws, wsb);
    }
    case PORT_RT_CONV2D_BN_RELU_FORWARD_TRAIN: {
        port_conv2d_params p = conv_p(v);
        return port_conv2d_bn_relu_forward_train(F(0), F(1), F(2), F(3), F(4), F(5), CF(6), CF(7), CF(8),
                                                 CF(9), &p, (float)c->fv[0], (float)c->fv[1], (int)v[14],
                                                 ws, wsb);
    }
    case PORT_RT_BATCHNORM2D_FORWARD_TRAIN: {
        port_batchnorm_params p = bn_p(c);
        return port_batchnorm2d_forward_train(F(0), F(1), F(2), F(3), F(4), CF(5), CF(6), CF(7), &p);
    }
    case PORT_RT_BATCHNORM2D_FORWARD_EVAL: {
        port_batchnorm_params p = bn_p(c);
        return port_batchnorm2d_forward_eval(F(0), CF(1), CF(2), CF(3), CF(4), CF(5), &p);
    }
    case PORT_RT_BATCHNORM2D_BACKWARD_INPUT: {
        port_batchnorm_params p = bn_p(c);
        return port_batchnorm2d_backward_input(F(0), CF(1), CF(2), CF(3), CF(4), CF(5), &p);
    }
    case PORT_RT_BATCHNORM2D_BACKWARD_WEIGHT: {
        port_batchnorm_params p = bn_p(c);
        return port_batchnorm2d_backward_weight(F(0), F(1), CF(2), CF(3), CF(4), CF(5), &p);
    }
    case PORT_RT_BATCHNORM2D_BACKWARD_INPUT_FROM_OUTPUT: {
        port_batchnorm_params p = bn_p(c);
        return port_batchnorm2d_backward_input_from_output(F(0), CF(1), CF(2), CF(3), CF(4), CF(5), &p);
    }
    case PORT_RT_BATCHNORM2D_BACKWARD_WEIGHT_FROM_OUTPUT: {
        port_batchnorm_params p = bn_p(c);
        return port_batchnorm2d_backward_weight_from_output(F(0), F(1), CF(2), CF(3), CF(4), CF(5), &p);
    }
    case PORT_RT_BATCHNORM2D_BACKWARD_INPUT_EVAL: {
        port_batchnorm_params p = bn_p(c);
        return port_batchnorm2d_backward_input_eval(F(0), CF(1), CF(2), CF(3), &p);
    }
    case PORT_RT_BATCHNORM2D_BACKWARD_WEIGHT_EVAL: {
        port_batchnorm_params p = bn_p(c);
        return port_batchnorm2d_backward_weight_eval(F(0), F(1), CF(2), CF(3), CF(4), CF(5), &p);
    }
    case PORT_RT_RELU_FORWARD: return port_relu_forward(F(0), CF(1), v[0]);
    case PORT_RT_RELU_BACKWARD: return port_relu_backward(F(0), CF(1), CF(2), v[0]);
    case PORT_RT_RELU6_FORWARD: return port_relu6_forward(F(0), CF(1), v[0]);
    case PORT_RT_RELU6_BACKWARD: return port_relu6_backward(F(0), CF(1), CF(2), v[0]);
    case PORT_RT_HARDSWISH_FORWARD: return port_hardswish_forward(F(0), CF(1), v[0]);
    case PORT_RT_HARDSWISH_BACKWARD: return port_hardswish_backward(F(0), CF(1), CF(2), v[0]);
    case PORT_RT_SIGMOID_FORWARD: return port_sigmoid_forward(F(0), CF(1), v[0]);
    case PORT_RT_SIGMOID_BACKWARD: return port_sigmoid_backward(F(0), CF(1), CF(2), v[0]);
    case PORT_RT_HARDSIGMOID_FORWARD: return port_hardsigmoid_forward(F(0), CF(1), v[0]);
    case PORT_RT_HARDSIGMOID_BACKWARD: return port_hardsigmoid_backward(F(0), CF(1), CF(2), v[0]);
    case PORT_RT_SILU_FORWARD: return port_silu_forward(F(0), CF(1), v[0]);
    case PORT_RT_SILU_BACKWARD: return port_silu_backward(F(0), CF(1), CF(2), v[0]);
    case PORT_RT_SE_FORWARD:
        return port_se_forward(F(0), F(1), F(2), CF(3), CF(4), CF(5), CF(6), CF(7), v[0], v[1], v[2], v[3], (int)v[4],
                               (int)v[5], ws, wsb);
    case PORT_RT_SE_BACKWARD_WEIGHT:
        return port_se_backward_weight(F(0), F(1), F(2), F(3), F(4), CF(5), CF(6), CF(7), CF(8), CF(9), v[0], v[1],
                                       v[2], v[3], (int)v[4], (int)v[5], ws, wsb);
    case PORT_RT_SE_BACKWARD_WEIGHT_OVERWRITE:
        return port_se_backward_weight_overwrite(F(0), F(1), F(2), F(3), F(4), CF(5), CF(6), CF(7), CF(8), CF(9), v[0],
                                                 v[1], v[2], v[3], (int)v[4], (int)v[5], ws, wsb);
    case PORT_RT_SE_BACKWARD_INPUT:
        return port_se_backward_input(F(0), CF(1), CF(2), CF(3), CF(4), v[0], v[1], v[2], v[3], (int)v[5], ws,
                                      wsb);
    case PORT_RT_SWIGLU_FORWARD: return port_swiglu_forward(F(0), CF(1), CF(2), v[0]);
    case PORT_RT_SWIGLU_BACKWARD:
        return port_swiglu_backward(F(0), F(1), CF(2), CF(3), CF(4), v[0]);
    case PORT_RT_ROTARY_FORWARD:
        return port_rotary_forward(F(0), CF(1), CF(2), CF(3), v[0], v[1], v[2], v[3], v[4]);
    case PORT_RT_ROTARY_BACKWARD:
        return port_rotary_backward(F(0), CF(1), CF(2), CF(3), v[0], v[1], v[2], v[3], v[4]);
    case PORT_RT_RMSNORM_STATS: return port_rmsnorm_stats(F(0), CF(1), v[0], v[1], (float)c->fv[0]);
    case PORT_RT_RMSNORM_LINEAR_FORWARD:   /* iv: n, in, out, block rows, wt */
        return port_rmsnorm_linear_forward(F(0), CF(1), CF(2), CF(3), CF(4), CF(5), v[0], v[1], v[2], v[3], (int)v[4],
                                           ws, wsb);
    case PORT_RT_RMSNORM_LINEAR_BACKWARD_WEIGHT:
        return port_rmsnorm_linear_backward_weight(F(0), F(1), CF(2), CF(3), CF(4), CF(5), v[0], v[1], v[2], v[3],
                                                   (int)v[4], ws, wsb);
    case PORT_RT_RMSNORM_LINEARS_FORWARD:              /* iv: n, in, k, block rows, wt, bias mask, out[k] */
    case PORT_RT_RMSNORM_LINEARS_BACKWARD_WEIGHT: {    /* (rt_check.c: rmsnorm_linears, the pointers' order) */
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
    case PORT_RT_BINARY_FORWARD: {   /* iv: op, rank, a_bcast, b_bcast, dims[6] */
        port_binary_params p = binary_p(v);
        return port_binary_forward(F(0), CF(1), CF(2), &p);
    }
    case PORT_RT_BINARY_BACKWARD: {  /* iv: as forward, then accumulate */
        port_binary_params p = binary_p(v);
        return port_binary_backward(F(0), F(1), CF(2), CF(3), CF(4), &p, (int)v[10]);
    }
    /* issue 54 norms, pooling and resize (ids 90-99) */
    case PORT_RT_RMSNORM_FORWARD:   /* iv: rows, d; fv: eps */
        return port_rmsnorm_forward(F(0), F(1), CF(2), CF(3), v[0], v[1], (float)c->fv[0]);
    case PORT_RT_RMSNORM_BACKWARD_INPUT: return port_rmsnorm_backward_input(F(0), CF(1), CF(2), CF(3), CF(4), v[0], v[1]);
    case PORT_RT_RMSNORM_BACKWARD_WEIGHT: return port_rmsnorm_backward_weight(F(0), CF(1), CF(2), CF(3), v[0], v[1]);
    case PORT_RT_GROUPNORM_FORWARD:   /* iv: n, c, hw, groups; fv: eps */
        return port_groupnorm_forward(F(0), F(1), CF(2), CF(3), CF(4), v[0], v[1], v[2], v[3], (float)c->fv[0]);
    case PORT_RT_GROUPNORM_BACKWARD_INPUT:
        return port_groupnorm_backward_input(F(0), CF(1), CF(2), CF(3), CF(4), v[0], v[1], v[2], v[3]);
    case PORT_RT_GROUPNORM_BACKWARD_WEIGHT:
        return port_groupnorm_backward_weight(F(0), F(1), CF(2), CF(3), CF(4), v[0], v[1], v[2], v[3]);
    case PORT_RT_UPSAMPLE2D_FORWARD: {   /* iv: n, c, h, w, ho, wo, mode, align_corners; fv: rh, rw */
        port_upsample2d_params p = upsample_p(c);
        return port_upsample2d_forward(F(0), CF(1), &p);
    }
    case PORT_RT_UPSAMPLE2D_BACKWARD_INPUT: {
        port_upsample2d_params p = upsample_p(c);
        return port_upsample2d_backward_input(F(0), CF(1), &p);
    }
    case PORT_RT_ADAPTIVE_AVGPOOL2D_FORWARD:   /* iv: n, c, h, w, ho, wo */
        return port_adaptive_avgpool2d_forward(F(0), CF(1), v[0], v[1], v[2], v[3], v[4], v[5]);
    case PORT_RT_ADAPTIVE_AVGPOOL2D_BACKWARD_INPUT:
        return port_adaptive_avgpool2d_backward_input(F(0), CF(1), v[0], v[1], v[2], v[3], v[4], v[5]);
    case PORT_RT_UNARY_FORWARD: return port_unary_forward(F(0), CF(1), v[0], v[1], (float)c->fv[0]);
    case PORT_RT_UNARY_BACKWARD: return port_unary_backward(F(0), CF(1), CF(2), v[0], v[1], (float)c->fv[0]);
    case PORT_RT_SLICE_COPY: {   /* iv: outer, inner, ny, nx, len, y_start, x_start, fill */
        port_slice_params p = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
        return port_slice_copy(F(0), CF(1), &p);
    }
    case PORT_RT_EXPAND: return port_expand(F(0), CF(1), v[0], v[1], v + 2);   /* iv: rank, x_bcast, dims[6] */
    case PORT_RT_MASKED_FILL:     /* iv: rank, m_bcast, dims[6]; fv: value */
        return port_masked_fill(F(0), CF(1), (const uint8_t *)ptrs[2], v[0], v[1], v + 2, (float)c->fv[0]);
    case PORT_RT_MASK_CAST: return port_mask_cast(ptrs[0], v[0], ptrs[1], v[1], v[2]);  /* iv: y_dt, x_dt, count */
    case PORT_RT_MASK_LOGIC:      /* iv: op, rank, a_bcast, b_bcast, dims[6] */
        return port_mask_logic((uint8_t *)ptrs[0], (const uint8_t *)ptrs[1], (const uint8_t *)ptrs[2], v[0], v[1],
                               v[2], v[3], v + 4);
    case PORT_RT_EXPAND_MASK:     /* iv: rank, x_bcast, dims[6] */
        return port_expand_mask((uint8_t *)ptrs[0], (const uint8_t *)ptrs[1], v[0], v[1], v + 2);
    case PORT_RT_MASK_COMPARE:    /* iv: op, rank, a_bcast, b_bcast, dims[6] */
        return port_mask_compare((uint8_t *)ptrs[0], CF(1), CF(2), v[0], v[1], v[2], v[3], v + 4);
    case PORT_RT_MASK_COMPARE_SCALAR:   /* iv: op, count; fv: scalar */
        return port_mask_compare_scalar((uint8_t *)ptrs[0], CF(1), v[0], v[1], (float)c->fv[0]);
    case PORT_RT_WHERE_FORWARD:   /* iv: rank, c_bcast, a_bcast, b_bcast, dims[6], scalars; fv: a, b values */
        return port_where_forward(F(0), (const uint8_t *)ptrs[1], CF(2), CF(3), v[0], v[1], v[2], v[3], v + 4, v[10],
                                  (float)c->fv[0], (float)c->fv[1]);
    case PORT_RT_WHERE_BACKWARD:  /* iv: rank, c_bcast, a_bcast, b_bcast, dims[6] */
        return port_where_backward(F(0), F(1), CF(2), (const uint8_t *)ptrs[3], v[0], v[1], v[2], v[3], v + 4);
    case PORT_RT_INT_BINARY:      /* iv: dtype, op, rank, a_bcast, b_bcast, dims[6] */
        return port_int_binary(ptrs[0], ptrs[1], ptrs[2], v[0], v[1], v[2], v[3], v[4], v + 5);
    case PORT_RT_ARGMAX_ROWS:     /* iv: x_dtype, rows, cols */
        return port_argmax_rows((int64_t *)ptrs[0], ptrs[1], v[0], v[1], v[2]);
    case PORT_RT_INDEX2_ROWS:     /* iv: rows, cols, inner, rank, i0_bcast, i1_bcast, dims[6], scatter */
        return port_index2_rows(F(0), CF(1), (const int64_t *)ptrs[2], (const int64_t *)ptrs[3], v[0], v[1], v[2],
                                v[3], v[4], v[5], v + 6, v[12]);
    case PORT_RT_MASK_INDEX2:     /* iv: rows, cols, rank, i0_bcast, i1_bcast, dims[6] */
        return port_mask_index2((uint8_t *)ptrs[0], (const uint8_t *)ptrs[1], (const int64_t *)ptrs[2],
                                (const int64_t *)ptrs[3], v[0], v[1], v[2], v[3], v[4], v + 5);
    case PORT_RT_ADD: return port_add(F(0), CF(1), CF(2), v[0]);
    case PORT_RT_DROPOUT_FORWARD:
        return port_dropout_forward(F(0), (uint8_t *)ptrs[1], CF(2), v[0], (float)c->fv[0], s->seed,
                                    port_rt_rng_stream(s->dropout_counter, c->op));
    case PORT_RT_BERNOULLI_FORWARD:
        return port_bernoulli_forward(F(0), v[0], (float)c->fv[0], s->seed,
                                      port_rt_rng_stream(s->dropout_counter, c->op));
    case PORT_RT_DROPOUT_BACKWARD:
        return port_dropout_backward(F(0), CF(1), (const uint8_t *)ptrs[2], v[0], (float)c->fv[0]);
    case PORT_RT_MAXPOOL2D_FORWARD: {
        port_pool2d_params p = pool_p(v);
        return port_maxpool2d_forward(F(0), (int64_t *)ptrs[1], CF(2), &p);
    }
    case PORT_RT_MAXPOOL2D_BACKWARD_INPUT: {
        port_pool2d_params p = pool_p(v);
        return port_maxpool2d_backward_input(F(0), CF(1), (const int64_t *)ptrs[2], &p);
    }
    case PORT_RT_AVGPOOL2D_FORWARD: {
        port_pool2d_params p = pool_p(v);
        return port_avgpool2d_forward(F(0), CF(1), &p);
    }
    case PORT_RT_AVGPOOL2D_BACKWARD_INPUT: {
        port_pool2d_params p = pool_p(v);
        return port_avgpool2d_backward_input(F(0), CF(1), &p);
    }
    case PORT_RT_GLOBAL_AVGPOOL_FORWARD: return port_global_avgpool_forward(F(0), CF(1), v[0], v[1], v[2]);
    case PORT_RT_GLOBAL_AVGPOOL_BACKWARD_INPUT:
        return port_global_avgpool_backward_input(F(0), CF(1), v[0], v[1], v[2]);
    case PORT_RT_LINEAR_FORWARD: {
        port_linear_params p = {v[0], v[1], v[2]};
        return port_linear_forward(F(0), CF(1), CF(2), CF(3), &p);
    }
    case PORT_RT_LINEAR_BACKWARD_INPUT: {
        port_linear_params p = {v[0], v[1], v[2]};
        return port_linear_backward_input(F(0), CF(1), CF(2), &p);
    }
    case PORT_RT_LINEAR_BACKWARD_WEIGHT: {
        port_linear_params p = {v[0], v[1], v[2]};
        return port_linear_backward_weight(F(0), F(1), CF(2), CF(3), &p);
    }
    case PORT_RT_LINEAR_T_FORWARD: {
        port_linear_params p = {v[0], v[1], v[2]};
        return port_linear_t_forward(F(0), CF(1), CF(2), CF(3), &p);
    }
    case PORT_RT_LINEAR_T_BACKWARD_INPUT: {
        port_linear_params p = {v[0], v[1], v[2]};
        return port_linear_t_backward_input(F(0), CF(1), CF(2), &p);
    }
    case PORT_RT_LINEAR_T_BACKWARD_WEIGHT: {
        port_linear_params p = {v[0], v[1], v[2]};
        return port_linear_t_backward_weight(F(0), F(1), CF(2), CF(3), &p);
    }
    case PORT_RT_SOFTMAX_XENT_FORWARD:
        return port_softmax_xent_forward(F(0), F(1), CF(2), (const int64_t *)ptrs[3], v[0], v[1],
                                         (float)c->fv[0]);
    case PORT_RT_SOFTMAX_XENT_BACKWARD:
        return port_softmax_xent_backward(F(0), CF(1), (const int64_t *)ptrs[2], CF(3), v[0], v[1],
                                          (float)c->fv[0]);
    case PORT_RT_SGD_STEP: {
        int mom = ptrs[1] != NULL;
        return port_sgd_step(F(0), F(1), CF(2), v[0], s->lr, mom ? s->momentum : 0.0, s->dampening,
                             s->weight_decay, s->nesterov ? 1 : 0, s->step == 0 ? 1 : 0);
    }
    case PORT_RT_ADAMW_STEP:
        return port_adamw_step(F(0), F(1), F(2), CF(3), v[0], s->lr, s->beta1, s->beta2, s->eps,
                               s->weight_decay, s->step + 1);
    case PORT_RT_BIAS_BACKWARD: return port_bias_backward(F(0), CF(1), v[0], v[1], v[2]);
    /* transformer kernels: pointers in argument order, ints in iv, floats in fv */
    case PORT_RT_EMBEDDING_FORWARD:
        return port_embedding_forward(F(0), (const int64_t *)ptrs[1], CF(2), v[0], v[1], v[2]);
    case PORT_RT_EMBEDDING_BACKWARD_WEIGHT:
        return port_embedding_backward_weight(F(0), CF(1), (const int64_t *)ptrs[2], v[0], v[1], v[2]);
    case PORT_RT_EMBEDDING_BACKWARD_WEIGHT_PAD:
        return port_embedding_backward_weight_pad(F(0), CF(1), (const int64_t *)ptrs[2], v[0], v[1], v[2], v[3]);
    case PORT_RT_LAYERNORM_FORWARD:
        return port_layernorm_forward(F(0), F(1), CF(2), CF(3), CF(4), v[0], v[1], (float)c->fv[0]);
    case PORT_RT_LAYERNORM_BACKWARD_INPUT:
        return port_layernorm_backward_input(F(0), CF(1), CF(2), CF(3), CF(4), v[0], v[1]);
    case PORT_RT_LAYERNORM_BACKWARD_WEIGHT:
        return port_layernorm_backward_weight(F(0), F(1), CF(2), CF(3), CF(4), v[0], v[1]);
    case PORT_RT_GELU_FORWARD: return port_gelu_forward(F(0), CF(1), v[0], (int)v[1]);
    case PORT_RT_GELU_BACKWARD: return port_gelu_backward(F(0), CF(1), CF(2), v[0], (int)v[1]);
    case PORT_RT_TANH_FORWARD: return port_tanh_forward(F(0), CF(1), v[0]);
    case PORT_RT_TANH_BACKWARD: return port_tanh_backward(F(0), CF(1), CF(2), v[0]);
    case PORT_RT_SCALE: return port_scale(F(0), CF(1), v[0], (float)c->fv[0]);
    case PORT_RT_SOFTMAX_FORWARD: return port_softmax_forward(F(0), CF(1), v[0], v[1]);
    case PORT_RT_SOFTMAX_BACKWARD: return port_softmax_backward(F(0), CF(1), CF(2), v[0], v[1]);
    case PORT_RT_BMM:
        return port_bmm(F(0), CF(1), CF(2), v[0], v[1], v[2], v[3], (int)v[4], (int)v[5], (float)c->fv[0],
                        (float)c->fv[1]);
    case PORT_RT_PERMUTE: return port_permute(F(0), CF(1), v[0], &v[1], &v[7]);
    case PORT_RT_ADD_BROADCAST: return port_add_broadcast(F(0), CF(1), CF(2), v[0], v[1]);
    case PORT_RT_SUM_ROWS: return port_sum_rows(F(0), CF(1), v[0], v[1]);
    case PORT_RT_MEAN_MID_FORWARD: return port_mean_mid_forward(F(0), CF(1), v[0], v[1], v[2]);
    case PORT_RT_MEAN_MID_BACKWARD: return port_mean_mid_backward(F(0), CF(1), v[0], v[1], v[2]);
    case PORT_RT_ARANGE_I64: return port_arange_i64((int64_t *)ptrs[0], v[0], v[1]);
    case PORT_RT_NE_SCALAR_I64:
        return port_ne_scalar_i64((uint8_t *)ptrs[0], (const int64_t *)ptrs[1], v[0], v[1]);
    case PORT_RT_ATTENTION_FORWARD: {
        port_attention_params p = attn_p(c, s);
        return port_attention_forward(F(0), F(1), CF(2), CF(3), CF(4), ptrs[5], &p, (int)v[6], ws, wsb);
    }
    case PORT_RT_ATTENTION_BACKWARD: {
        port_attention_params p = attn_p(c, s);
        return port_attention_backward(F(0), F(1), F(2), CF(3), CF(4), CF(5), CF(6), CF(7), CF(8), ptrs[9], &p,
                                       (int)v[6], ws, wsb);
    }
    case PORT_RT_SOFTMAX_XENT_IGNORE_FORWARD:
        return port_softmax_xent_ignore_forward(F(0), F(1), CF(2), (const int64_t *)ptrs[3], v[0], v[1],
                                                (float)c->fv[0], v[2]);
    case PORT_RT_SOFTMAX_XENT_IGNORE_BACKWARD:
        return port_softmax_xent_ignore_backward(F(0), CF(1), (const int64_t *)ptrs[2], CF(3), v[0], v[1],
                                                 (float)c->fv[0], v[2]);
    default: return PORT_ERR_UNSUPPORTED;
    }
}
