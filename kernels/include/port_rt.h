/*
 * port_rt.h -- the public C ABI of port-rt, PORT's Python-free training runtime.
 *
 * Two layers:
 *
 *  1. One compiled kernel call (port_rt_call): a kernel id, its pointer
 *     arguments as arena byte offsets, its integer and float parameters.
 *     port_rt_exec() runs one call with resolved pointers.  The Python
 *     executor binds every C-backend call through port_rt_exec() too, so a
 *     call means the same thing in Python and in port-rt.
 *
 *  2. A bundle (a compiled training program, written by `port compile`) and
 *     a runtime over it: port_rt_load() checks the bundle and initialises the
 *     caller's arena from it; port_rt_step() runs one training step;
 *     port_rt_evaluate() runs the inference program on a batch.
 *
 * Conventions: as port_kernels.h.  Caller-owned memory (the runtime never
 * allocates: the bundle bytes, the arena and the port_rt struct belong to
 * the caller), no global state, a status for every failure, nothing printed.
 *
 * Bundle layout (format 3, little-endian), offsets in bytes from the file start.  Format 1 is format 2
 * with bytes 424..448 zero (float32 inputs, one label per sample); format 2 is format 3 with bytes 440..512
 * zero (one input tensor); the loader reads all three (a writer uses 3 only for a model with several inputs):
 *
 *   0    8  magic "PORTRTB\0"
 *   8    4  u32 format version (2; 1 is read too)
 *   12   4  u32 header bytes (512)
 *   16   8  u64 total bytes (the file size)
 *   24   8  u64 arena bytes            32  8  u64 persistent bytes
 *   40   8  u64 file offset of the persistent image (persistent bytes long:
 *             parameters, buffers, optimizer state, constants)
 *   48   8  u64 file offset of the call table (port_rt_call records)
 *   56   4  u32 training calls          60  4  u32 evaluation calls (after them)
 *   64   8  u64 file offset of the zero ranges (i64 offset, i64 bytes pairs)
 *   72   4  u32 zero ranges             76  4  u32 flags: PORT_RT_FLAG_NO_IMAGE (the
 *             bundle has no persistent image: the caller's arena already holds
 *             that state; the Python Trainer's in-process engine) | PORT_RT_FLAG_IGNORE_INDEX
 *             (labels equal to the ignore index at 432 are skipped by the loss)
 *   80   8  i64 input offset            88  8  i64 input bytes
 *   96   8  i64 label offset            104 8  i64 label bytes
 *   112  8  i64 loss offset             120 8  i64 logits offset
 *   128  8  i64 batch size              136 8  i64 classes
 *   144  8  i64 eval input offset       152 8  i64 eval logits offset
 *   160  8  i64 eval loss offset (-1: none)  168 8 i64 eval label offset (-1: none)
 *   176  88 port_rt_state: the run state at compile time (optimizer and its
 *             hyperparameters, steps done, dropout seed and counter)
 *   264  64 graph digest (ASCII hex, NUL padded)
 *   328  64 plan digest (ASCII hex, NUL padded)
 *   392  8  u64 file offset of the checkpoint template (0: none): n x
 *             {i64 arena offset, i64 bytes, i64 data offset} for the
 *             checkpointed tensors, then the header's fixed members as JSON
 *             (no braces), then its "tensors" array as JSON
 *   400  4  u32 checkpointed tensors n   404  4  u32 fixed JSON bytes
 *   408  4  u32 tensors JSON bytes       412  4  u32 zero
 *   416  8  u64 checkpoint data bytes (the tensors, each 64-byte aligned)
 *   424  4  u32 input dtype: PORT_RT_INPUT_F32 (0) or PORT_RT_INPUT_I64 (1: token ids)
 *   428  4  u32 labels per sample L (0 read as 1): int64 labels per sample (a
 *             sequence model's per-token targets: L = sequence length); label
 *             bytes = batch x L x 8, logits = batch x L x classes floats
 *   432  8  i64 ignore index (with PORT_RT_FLAG_IGNORE_INDEX)
 *   440  4  u32 extra inputs k (format 3: 1..PORT_RT_MAX_EXTRA_INPUTS; 0 in format 2): the model's further
 *             input tensors (an attention mask, token type ids) after the input at 80, in the model's order
 *   444  4  u32 zero
 *   448  8  u64 file offset of the extra-input table (8-byte aligned): k x 32 bytes {i64 training arena
 *             offset, i64 evaluation arena offset, i64 bytes (a whole batch), u32 dtype (PORT_RT_INPUT_*),
 *             u32 zero}
 *   456  56 zero
 *   512  ...  sections (each 64-byte aligned)
 *   total-32  32  SHA-256 of bytes [0, total-32)
 *
 * A signed bundle (`port compile --sign-key FILE`) is the bundle above followed by a 64-byte signature trailer
 * (the file is total + 64 bytes; the header's total does not count the trailer, so the bundle's own bytes and
 * checks are those of an unsigned one):
 *   total     8  magic "PORTSIG\0"
 *   total+8   4  u32 signature version (1)         total+12  4  u32 algorithm (1: HMAC-SHA-256)
 *   total+16  8  key id: the first 8 bytes of HMAC-SHA-256(key, "port-rt key id") (names the key in errors)
 *   total+24  8  zero
 *   total+32 32  tag: HMAC-SHA-256(key, file bytes [0, total+32)), the bundle and the trailer's first 32 bytes
 * The SHA-256 alone guards against accidents only (a torn copy, a flipped bit): anyone can edit a bundle and
 * hash it again.  The tag guards against edits by whoever lacks the key; a reader that needs that refuses
 * unsigned bundles (port-rt --key FILE --require-signed), since stripping the trailer leaves a valid unsigned one.
 *
 * port_rt_call record: 288 bytes, the struct below with no padding.
 */
#ifndef PORT_RT_H
#define PORT_RT_H

#include "port_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PORT_RT_ABI_VERSION 1
#define PORT_RT_BUNDLE_VERSION 3
#define PORT_RT_MAX_EXTRA_INPUTS 8
#define PORT_RT_HEADER_BYTES 512

/* The one list of runtime ops: id, NAME, the entry point it runs (what the profiler and the executor report), how
 * port_rt_exec calls it (an argument-layout macro of rt_exec.c, RUN_*: several kernels share one) and its call rule
 * (a function of rt_check.c: the operands its parameters imply, their ranges, what may alias).  The enum, the
 * entry names, rt_exec.c's dispatch and rt_check.c's rule table are generated from it: a new runtime op is one row
 * here (with a layout macro and a rule where no existing one fits); an id not here is refused by the call rule. */
#define PORT_RT_KERNELS(X) \
    X(1, CONV2D_FORWARD, port_conv2d_forward, RUN_CONV_FWD, conv)                                                      \
    X(2, CONV2D_BACKWARD_INPUT, port_conv2d_backward_input, RUN_CONV_BWD_IN, conv)                                     \
    X(3, CONV2D_BACKWARD_WEIGHT, port_conv2d_backward_weight, RUN_CONV_BWD_W, conv)                                    \
    X(4, CONV2D_PATCH_FORWARD, port_conv2d_patch_forward, RUN_PATCH_FWD, conv)                                         \
    X(5, CONV2D_PATCH_BACKWARD_INPUT, port_conv2d_patch_backward_input, RUN_PATCH_BWD_IN, conv)                        \
    X(6, CONV2D_PATCH_BACKWARD_WEIGHT, port_conv2d_patch_backward_weight, RUN_PATCH_BWD_W, conv)                       \
    X(7, CONV2D_BN_RELU_FORWARD_TRAIN, port_conv2d_bn_relu_forward_train, RUN_CONV_BN_RELU, conv)                      \
    X(8, BATCHNORM2D_FORWARD_TRAIN, port_batchnorm2d_forward_train, RUN_BN_TRAIN, batchnorm)                           \
    X(9, BATCHNORM2D_FORWARD_EVAL, port_batchnorm2d_forward_eval, RUN_BN_Y_5, batchnorm)                               \
    X(10, BATCHNORM2D_BACKWARD_INPUT, port_batchnorm2d_backward_input, RUN_BN_Y_5, batchnorm)                          \
    X(11, BATCHNORM2D_BACKWARD_WEIGHT, port_batchnorm2d_backward_weight, RUN_BN_DW_4, batchnorm)                       \
    X(12, BATCHNORM2D_BACKWARD_INPUT_FROM_OUTPUT, port_batchnorm2d_backward_input_from_output, RUN_BN_Y_5, batchnorm)  \
    X(13, BATCHNORM2D_BACKWARD_WEIGHT_FROM_OUTPUT, port_batchnorm2d_backward_weight_from_output, RUN_BN_DW_4,         \
      batchnorm)                                                                                                     \
    X(14, BATCHNORM2D_BACKWARD_INPUT_EVAL, port_batchnorm2d_backward_input_eval, RUN_BN_DX_EVAL, batchnorm)            \
    X(15, BATCHNORM2D_BACKWARD_WEIGHT_EVAL, port_batchnorm2d_backward_weight_eval, RUN_BN_DW_4, batchnorm)             \
    X(16, RELU_FORWARD, port_relu_forward, RUN_Y_X, ew_fwd)                                                            \
    X(17, RELU_BACKWARD, port_relu_backward, RUN_Y_A_B, ew_bwd)                                                        \
    X(18, RELU6_FORWARD, port_relu6_forward, RUN_Y_X, ew_fwd)                                                          \
    X(19, RELU6_BACKWARD, port_relu6_backward, RUN_Y_A_B, ew_bwd)                                                      \
    X(20, HARDSWISH_FORWARD, port_hardswish_forward, RUN_Y_X, ew_fwd_no_alias)                                         \
    X(21, HARDSWISH_BACKWARD, port_hardswish_backward, RUN_Y_A_B, ew_bwd)                                              \
    X(22, ADD, port_add, RUN_Y_A_B, add_rule)                                                                          \
    X(23, DROPOUT_FORWARD, port_dropout_forward, RUN_DROPOUT_FWD, dropout_rule)                                        \
    X(24, DROPOUT_BACKWARD, port_dropout_backward, RUN_DROPOUT_BWD, dropout_rule)                                      \
    X(25, MAXPOOL2D_FORWARD, port_maxpool2d_forward, RUN_MAXPOOL_FWD, pooling)                                         \
    X(26, MAXPOOL2D_BACKWARD_INPUT, port_maxpool2d_backward_input, RUN_MAXPOOL_BWD, pooling)                           \
    X(27, AVGPOOL2D_FORWARD, port_avgpool2d_forward, RUN_AVGPOOL, pooling)                                             \
    X(28, AVGPOOL2D_BACKWARD_INPUT, port_avgpool2d_backward_input, RUN_AVGPOOL, pooling)                               \
    X(29, GLOBAL_AVGPOOL_FORWARD, port_global_avgpool_forward, RUN_Y_X_3, mean_rule)                                   \
    X(30, GLOBAL_AVGPOOL_BACKWARD_INPUT, port_global_avgpool_backward_input, RUN_Y_X_3, mean_rule)                     \
    X(31, LINEAR_FORWARD, port_linear_forward, RUN_LINEAR_FWD, linear_rule)                                            \
    X(32, LINEAR_BACKWARD_INPUT, port_linear_backward_input, RUN_LINEAR_BWD_IN, linear_rule)                           \
    X(33, LINEAR_BACKWARD_WEIGHT, port_linear_backward_weight, RUN_LINEAR_BWD_W, linear_rule)                          \
    X(34, SOFTMAX_XENT_FORWARD, port_softmax_xent_forward, RUN_XENT_FWD, xent_rule)                                    \
    X(35, SOFTMAX_XENT_BACKWARD, port_softmax_xent_backward, RUN_XENT_BWD, xent_rule)                                  \
    X(36, SGD_STEP, port_sgd_step, RUN_SGD, optim_rule)                                                                \
    X(37, ADAMW_STEP, port_adamw_step, RUN_ADAMW, optim_rule)                                                          \
    X(38, BIAS_BACKWARD, port_bias_backward, RUN_Y_X_3, bias_rule)                                                     \
    X(39, PAGE_OUT, port_rt_page_out, RUN_NONE, page_rule)                                                             \
    X(40, PAGE_IN, port_rt_page_in, RUN_NONE, page_rule)                                                               \
    X(41, EMBEDDING_FORWARD, port_embedding_forward, RUN_EMB_FWD, embedding_rule)                                      \
    X(42, EMBEDDING_BACKWARD_WEIGHT, port_embedding_backward_weight, RUN_EMB_BWD_W, embedding_rule)                    \
    X(43, LAYERNORM_FORWARD, port_layernorm_forward, RUN_LN_FWD, layernorm_rule)                                       \
    X(44, LAYERNORM_BACKWARD_INPUT, port_layernorm_backward_input, RUN_LN_BWD_IN, layernorm_rule)                      \
    X(45, LAYERNORM_BACKWARD_WEIGHT, port_layernorm_backward_weight, RUN_LN_BWD_W, layernorm_rule)                     \
    X(46, GELU_FORWARD, port_gelu_forward, RUN_GELU_FWD, gelu_rule)                                                    \
    X(47, GELU_BACKWARD, port_gelu_backward, RUN_GELU_BWD, gelu_rule)                                                  \
    X(48, TANH_FORWARD, port_tanh_forward, RUN_Y_X, ew_fwd)                                                            \
    X(49, TANH_BACKWARD, port_tanh_backward, RUN_Y_A_B, ew_bwd)                                                        \
    X(50, SCALE, port_scale, RUN_SCALE, scale_rule)                                                                    \
    X(51, SOFTMAX_FORWARD, port_softmax_forward, RUN_Y_X_2, softmax_rule)                                              \
    X(52, SOFTMAX_BACKWARD, port_softmax_backward, RUN_Y_A_B_2, softmax_rule)                                          \
    X(53, BMM, port_bmm, RUN_BMM, bmm_rule)                                                                            \
    X(54, PERMUTE, port_permute, RUN_PERMUTE, permute)                                                                 \
    X(55, ADD_BROADCAST, port_add_broadcast, RUN_Y_A_B_2, rows_rule)                                                   \
    X(56, SUM_ROWS, port_sum_rows, RUN_Y_X_2, rows_rule)                                                               \
    X(57, MEAN_MID_FORWARD, port_mean_mid_forward, RUN_Y_X_3, mean_rule)                                               \
    X(58, MEAN_MID_BACKWARD, port_mean_mid_backward, RUN_Y_X_3, mean_rule)                                             \
    X(59, ARANGE_I64, port_arange_i64, RUN_ARANGE, int_rule)                                                           \
    X(60, NE_SCALAR_I64, port_ne_scalar_i64, RUN_NE_SCALAR, int_rule)                                                  \
    X(61, ATTENTION_FORWARD, port_attention_forward, RUN_ATTN_FWD, attention)                                          \
    X(62, ATTENTION_BACKWARD, port_attention_backward, RUN_ATTN_BWD, attention)                                        \
    X(63, SOFTMAX_XENT_IGNORE_FORWARD, port_softmax_xent_ignore_forward, RUN_XENT_IGNORE_FWD, xent_rule)               \
    X(64, SOFTMAX_XENT_IGNORE_BACKWARD, port_softmax_xent_ignore_backward, RUN_XENT_IGNORE_BWD, xent_rule)             \
    X(65, CONV2D_BACKWARD_WEIGHT_OVERWRITE, port_conv2d_backward_weight_overwrite, RUN_CONV_BWD_W, conv)               \
    X(66, SIGMOID_FORWARD, port_sigmoid_forward, RUN_Y_X, ew_fwd)                                                      \
    X(67, SIGMOID_BACKWARD, port_sigmoid_backward, RUN_Y_A_B, ew_bwd)                                                  \
    X(68, HARDSIGMOID_FORWARD, port_hardsigmoid_forward, RUN_Y_X, ew_fwd)                                              \
    X(69, HARDSIGMOID_BACKWARD, port_hardsigmoid_backward, RUN_Y_A_B, ew_bwd)                                          \
    X(70, SILU_FORWARD, port_silu_forward, RUN_Y_X, ew_fwd)                                                            \
    X(71, SILU_BACKWARD, port_silu_backward, RUN_Y_A_B, ew_bwd)                                                        \
    X(72, BINARY_FORWARD, port_binary_forward, RUN_BINARY_FWD, binary_rule)                                            \
    X(73, BINARY_BACKWARD, port_binary_backward, RUN_BINARY_BWD, binary_rule)                                          \
    X(74, UNARY_FORWARD, port_unary_forward, RUN_UNARY_FWD, unary_rule)                                                \
    X(75, UNARY_BACKWARD, port_unary_backward, RUN_UNARY_BWD, unary_rule)                                              \
    X(76, SLICE_COPY, port_slice_copy, RUN_SLICE_COPY, slice_copy)                                                     \
    X(77, EXPAND, port_expand, RUN_EXPAND, expand)                                                                     \
    X(90, RMSNORM_FORWARD, port_rmsnorm_forward, RUN_RMSNORM_FWD, norms)                                               \
    X(91, RMSNORM_BACKWARD_INPUT, port_rmsnorm_backward_input, RUN_RMSNORM_BWD_IN, norms)                              \
    X(92, RMSNORM_BACKWARD_WEIGHT, port_rmsnorm_backward_weight, RUN_RMSNORM_BWD_W, norms)                             \
    X(93, GROUPNORM_FORWARD, port_groupnorm_forward, RUN_GN_FWD, norms)                                                \
    X(94, GROUPNORM_BACKWARD_INPUT, port_groupnorm_backward_input, RUN_GN_BWD_IN, norms)                               \
    X(95, GROUPNORM_BACKWARD_WEIGHT, port_groupnorm_backward_weight, RUN_GN_BWD_W, norms)                              \
    X(96, UPSAMPLE2D_FORWARD, port_upsample2d_forward, RUN_UPSAMPLE, resize)                                           \
    X(97, UPSAMPLE2D_BACKWARD_INPUT, port_upsample2d_backward_input, RUN_UPSAMPLE, resize)                             \
    X(98, ADAPTIVE_AVGPOOL2D_FORWARD, port_adaptive_avgpool2d_forward, RUN_ADAPTIVE, resize)                           \
    X(99, ADAPTIVE_AVGPOOL2D_BACKWARD_INPUT, port_adaptive_avgpool2d_backward_input, RUN_ADAPTIVE, resize)             \
    X(110, BERNOULLI_FORWARD, port_bernoulli_forward, RUN_BERNOULLI, bernoulli_rule)                                   \
    X(111, SE_FORWARD, port_se_forward, RUN_SE_FWD, se)                                                                \
    X(112, SE_BACKWARD_WEIGHT, port_se_backward_weight, RUN_SE_BWD_W, se)                                              \
    X(113, SE_BACKWARD_INPUT, port_se_backward_input, RUN_SE_BWD_IN, se)                                               \
    X(132, SE_BACKWARD_WEIGHT_OVERWRITE, port_se_backward_weight_overwrite, RUN_SE_BWD_W, se)                          \
    X(121, MASKED_FILL, port_masked_fill, RUN_MASKED_FILL, masked_fill)                                                \
    X(122, MASK_CAST, port_mask_cast, RUN_MASK_CAST, masks)                                                            \
    X(123, MASK_LOGIC, port_mask_logic, RUN_MASK_LOGIC, masks)                                                         \
    X(124, EXPAND_MASK, port_expand_mask, RUN_EXPAND_MASK, masks)                                                      \
    X(125, MASK_INDEX2, port_mask_index2, RUN_MASK_INDEX2, masks)                                                      \
    X(126, MASK_COMPARE, port_mask_compare, RUN_MASK_COMPARE, masks)                                                   \
    X(127, MASK_COMPARE_SCALAR, port_mask_compare_scalar, RUN_MASK_COMPARE_SCALAR, masks)                              \
    X(128, WHERE_FORWARD, port_where_forward, RUN_WHERE_FWD, where_rule)                                               \
    X(129, WHERE_BACKWARD, port_where_backward, RUN_WHERE_BWD, where_rule)                                             \
    X(120, EMBEDDING_BACKWARD_WEIGHT_PAD, port_embedding_backward_weight_pad, RUN_EMB_BWD_W_PAD, embedding_rule)       \
    X(135, SWIGLU_FORWARD, port_swiglu_forward, RUN_Y_A_B, swiglu_rule)                                                \
    X(136, SWIGLU_BACKWARD, port_swiglu_backward, RUN_SWIGLU_BWD, swiglu_rule)                                         \
    X(115, ROTARY_FORWARD, port_rotary_forward, RUN_ROTARY, rotary)                                                    \
    X(116, ROTARY_BACKWARD, port_rotary_backward, RUN_ROTARY, rotary)                                                  \
    X(114, RMSNORM_STATS, port_rmsnorm_stats, RUN_RMS_STATS, rmsnorm_linear)                                           \
    X(117, RMSNORM_LINEAR_FORWARD, port_rmsnorm_linear_forward, RUN_RMSLIN_FWD, rmsnorm_linear)                        \
    X(118, RMSNORM_LINEAR_BACKWARD_WEIGHT, port_rmsnorm_linear_backward_weight, RUN_RMSLIN_BWD_W, rmsnorm_linear)      \
    X(119, RMSNORM_LINEARS_FORWARD, port_rmsnorm_linears_forward, RUN_RMSLINS, rmsnorm_linears)                        \
    X(131, RMSNORM_LINEARS_BACKWARD_WEIGHT, port_rmsnorm_linears_backward_weight, RUN_RMSLINS, rmsnorm_linears)        \
    X(137, INT_BINARY, port_int_binary, RUN_INT_BINARY, pooling_rows)                                                  \
    X(138, ARGMAX_ROWS, port_argmax_rows, RUN_ARGMAX_ROWS, pooling_rows)                                               \
    X(139, INDEX2_ROWS, port_index2_rows, RUN_INDEX2_ROWS, pooling_rows)                                               \
    X(140, LINEAR_T_FORWARD, port_linear_t_forward, RUN_LINEAR_FWD, linear_rule)                                       \
    X(141, LINEAR_T_BACKWARD_INPUT, port_linear_t_backward_input, RUN_LINEAR_BWD_IN, linear_rule)                      \
    X(142, LINEAR_T_BACKWARD_WEIGHT, port_linear_t_backward_weight, RUN_LINEAR_BWD_W, linear_rule)

typedef enum {
#define PORT_RT_ENUM_(id, NAME, fn, run, rule) PORT_RT_##NAME = id,
    PORT_RT_KERNELS(PORT_RT_ENUM_)
#undef PORT_RT_ENUM_
    PORT_RT_KERNEL_END
} port_rt_kernel;

#define PORT_RT_MAX_PTRS 10
#define PORT_RT_MAX_INTS 16
#define PORT_RT_MAX_FLOATS 2

/* One kernel call.  ptr[]: the pointer arguments in the kernel's argument
 * order (outputs, then inputs), as arena byte offsets, -1 for NULL.  iv[]:
 * integer parameters (a params struct's fields in order, then counts, algo;
 * patch convolutions: tile width, tile height); fv[]: float parameters (eps, momentum, p, label smoothing).  The
 * bytes [zero_offset[i], +zero_bytes[i]) are zeroed before the kernel runs
 * (accumulated gradients that live in scratch).  flags: PORT_RT_LATE_UPDATE
 * for an optimizer update that runs after the whole pass. */
typedef struct {
    int32_t kernel;
    int32_t op;          /* graph op id (-1: none); seeds dropout */
    int32_t flags;
    int32_t reserved;
    int64_t ptr[PORT_RT_MAX_PTRS];
    int64_t iv[PORT_RT_MAX_INTS];
    double fv[PORT_RT_MAX_FLOATS];
    int64_t ws_offset, ws_bytes;
    int64_t zero_offset[2], zero_bytes[2];
} port_rt_call;

/* the largest optimizer setting (lr, momentum, dampening, weight decay, eps) a bundle or checkpoint may hold: the
 * kernels take them as floats, so FLT_MAX (a larger finite double would be inf there) */
#define PORT_RT_MAX_SETTING 3.4028234663852886e38

#define PORT_RT_LATE_UPDATE 1
#define PORT_RT_FLAG_NO_IMAGE 1
#define PORT_RT_FLAG_IGNORE_INDEX 2
#define PORT_RT_INPUT_F32 0
#define PORT_RT_INPUT_I64 1

#define PORT_RT_OPT_SGD 1
#define PORT_RT_OPT_SGD_MOMENTUM 2
#define PORT_RT_OPT_ADAMW 3

/* What changes between steps: the optimizer's settings and counters. */
typedef struct {
    int32_t optimizer; /* PORT_RT_OPT_* */
    int32_t nesterov;
    double lr, momentum, dampening, weight_decay, beta1, beta2, eps;
    int64_t step;            /* optimizer steps done */
    uint64_t seed;           /* the run's dropout seed */
    int64_t dropout_counter; /* forward passes done */
} port_rt_state;

/* The param structs of the calls that take one, from the call's iv[] (and fv[]): the one reading of their layout,
 * used by port_rt_exec to run a call and by the call rule (port_rt_call_check) to judge the very struct that runs.
 * Convolutions: iv[0..13] the struct's fields in order.  Pools: iv[0..11] as the struct, iv[12..13] dilation,
 * iv[14] ceil_mode, iv[15] exclude_pad.  Attention: iv = bh, heads, tq, tk, dh, causal, (algo), kv_heads, mask
 * kind, mask dims[4]; fv = scale, dropout p; the dropout seed and stream the run's. */
static inline port_conv2d_params port_rt_conv2d_params(const int64_t *v) {
    port_conv2d_params p = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12], v[13]};
    return p;
}
static inline port_pool2d_params port_rt_pool2d_params(const int64_t *v) {
    port_pool2d_params p = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11],
                            v[12], v[13], v[14], v[15]};
    return p;
}
static inline port_attention_params port_rt_attention_params(const int64_t *v, const double *fv, uint64_t seed,
                                                             uint64_t stream) {
    port_attention_params p = {v[0], v[1], v[2], v[3], v[4], v[5], (float)fv[0], v[7], v[8],
                               {v[9], v[10], v[11], v[12]}, (float)fv[1], seed, stream};
    return p;
}

PORT_API int port_rt_abi_version(void);
/* The entry point a kernel id runs ("port_conv2d_forward"), or NULL. */
PORT_API const char *port_rt_kernel_name(int kernel);
/* The stream of a random call (dropout, bernoulli, attention dropout; port_kernels.h's generator, keyed by the
 * run's seed): (forward passes done mod 2^32) | (graph op id of the forward op mod 2^32) << 32.  A backward or a
 * re-run in the same pass draws its forward's values again. */
PORT_API uint64_t port_rt_rng_stream(int64_t counter, int64_t op);

/* Run one call with resolved pointers (ptrs[i] = base + c->ptr[i], NULL where
 * c->ptr[i] < 0; ws = the call's workspace).  Zero ranges are the caller's.
 * PAGE_OUT / PAGE_IN are not kernels: PORT_ERR_UNSUPPORTED. */
PORT_API port_status port_rt_exec(const port_rt_call *c, void *const *ptrs, void *ws,
                                  const port_rt_state *s);

/* ------------------------------------------------------------------ */
/* Bundles                                                              */
/* ------------------------------------------------------------------ */
#define PORT_RT_ERR_BUNDLE 20  /* wrong magic, version, size, checksum, offset */
#define PORT_RT_ERR_ARENA 21   /* the caller's arena is too small or misaligned */
#define PORT_RT_ERR_LABEL 22   /* a label is not a class index (see port_rt.bad_label) */
#define PORT_RT_ERR_PAGING 23  /* paging: no spill file, or its I/O failed */
#define PORT_RT_ERR_NONFINITE 24 /* the loss is NaN or infinite: the step's update was not applied */

typedef struct {
    /* set by port_rt_load (pointers into the caller's bundle and arena) */
    const uint8_t *bundle;
    uint64_t bundle_bytes;
    uint8_t *arena;
    uint64_t arena_bytes, persistent_bytes;
    const port_rt_call *calls;
    uint32_t n_train, n_eval, n_zero;
    const int64_t *zero;
    int64_t input_offset, input_bytes, label_offset, label_bytes, loss_offset, logits_offset;
    int64_t batch, classes, eval_input_offset, eval_logits_offset, eval_loss_offset, eval_label_offset;
    port_rt_state state;           /* the caller may change lr etc. between steps */
    char graph_digest[65], plan_digest[65];
    /* paging: a file descriptor the caller opened for reading and writing
     * (-1: the program must not page), and the file offset of each page key */
    int spill_fd;
    /* diagnostics of the last failure */
    int32_t failed_call;           /* index of the call that failed, -1 */
    int64_t bad_label, bad_label_index;
    /* checkpoint template (checkpoints: the Python trainer's format 2, port/train/checkpoint.py) */
    const int64_t *ckpt_table;
    const char *ckpt_fixed, *ckpt_tensors;
    uint32_t ckpt_n, ckpt_fixed_len, ckpt_tensors_len;
    uint64_t ckpt_data_bytes;
    /* format 2: the input's dtype (PORT_RT_INPUT_*), int64 labels per sample,
     * and the label the loss skips (has_ignore_index: 0 when none) */
    uint32_t input_dtype, has_ignore_index;
    int64_t labels_per_sample, ignore_index;
    /* format 3: the extra inputs (their table in the bundle: the layout above) and every input's bytes
     * together (input_bytes plus the extra inputs' bytes): what x of port_rt_step / port_rt_evaluate holds */
    uint32_t n_extra_inputs, extra_reserved;
    const uint8_t *extra_inputs;
    int64_t inputs_bytes;
} port_rt;

/* Check a bundle (magic, version, sizes, SHA-256, every call's offsets inside
 * the arena) and report the arena it needs. */
PORT_API int port_rt_bundle_check(const uint8_t *bundle, uint64_t bundle_bytes,
                                  uint64_t *arena_bytes);

/* The call rule (kernels/runtime/rt_check.c), the one definition of a well-formed call that the bundle loader
 * and Python's program check (port.lower.arena.check_program) both apply.
 *
 * port_rt_call_shape: what a call's parameters imply.  nptrs / nints / nfloats: the arguments its kernel takes
 * (ptr[i >= nptrs] must be -1, iv[i >= nints] and fv[i >= nfloats] zero); bytes[i]: the bytes the kernel
 * touches from ptr[i] (from the integer parameters, computed without overflow: a product past INT64_MAX reads
 * as INT64_MAX); elem[i]: its element size (ptr[i] must be a multiple); writes: bit i set where the kernel writes
 * through ptr[i]; may_alias[i]: bit j set where output i may be input j in place (the same offset and bytes: the
 * kernels' "MAY ALIAS"); ws_bytes: the workspace the kernel's query asks for.
 *
 * port_rt_call_problem: why a call (or a bundle) was refused.  call: its index in the bundle (-1: the header or
 * a section, not a call); kernel: its kernel id; field: "ptr[2]", "iv[0]", "fv[1]", "ws", "zero[0]", "flags",
 * "kernel", "header", ...; what: the rule it breaks; value, bytes, limit: the offending value, the extent it
 * implies, and the bound it had to respect (0 where they do not apply).  All strings are static. */
typedef struct {
    int32_t nptrs, nints, nfloats, writes;
    int64_t bytes[PORT_RT_MAX_PTRS];
    int32_t elem[PORT_RT_MAX_PTRS];
    int32_t may_alias[PORT_RT_MAX_PTRS];
    int64_t ws_bytes;
} port_rt_call_shape;

typedef struct {
    int32_t call, kernel;
    const char *field, *what;
    int64_t value, bytes, limit;
} port_rt_call_problem;

/* The shape of one call (PORT_RT_ERR_BUNDLE, with *why if given, when a parameter is out of range: a count or
 * dimension below 1, an enum or flag outside its values, a float that is not finite or outside its range). */
PORT_API int port_rt_call_shape_of(const port_rt_call *c, port_rt_call_shape *shape, port_rt_call_problem *why);
/* The whole rule for one call in an arena of arena_bytes whose first persistent_bytes are the persistent
 * region: its kernel id, flags and reserved fields; port_rt_call_shape_of; every non-NULL operand's full extent
 * inside the arena and aligned to its element size; unused arguments empty; the workspace at least the kernel's
 * query, 64-byte aligned inside the scratch region; zero ranges inside the arena; no output overlapping another
 * operand or the workspace except an allowed in-place pair (exactly the same bytes).  PAGE_OUT / PAGE_IN: their
 * range inside the arena and a non-negative file offset.  PORT_OK or PORT_RT_ERR_BUNDLE (*why if given). */
PORT_API int port_rt_call_check(const port_rt_call *c, uint64_t arena_bytes, uint64_t persistent_bytes,
                                port_rt_call_problem *why);
/* port_rt_bundle_check, saying why a bundle was refused (*why; why->call >= 0 for a call). */
PORT_API int port_rt_bundle_check_why(const uint8_t *bundle, uint64_t bundle_bytes, uint64_t *arena_bytes,
                                      port_rt_call_problem *why);
/* Check the bundle, then initialise rt and the caller's arena (64-byte
 * aligned, at least the bundle's arena bytes): zeroed, with the persistent
 * image copied in (unless the bundle says PORT_RT_FLAG_NO_IMAGE: then the
 * arena is used as it is). */
PORT_API int port_rt_load(port_rt *rt, const uint8_t *bundle, uint64_t bundle_bytes,
                          uint8_t *arena, uint64_t arena_bytes);
/* One training step: x (input bytes: batch samples of float32 values or, for
 * PORT_RT_INPUT_I64, int64 token ids; a model with several inputs: inputs_bytes,
 * each input's whole batch in the model's order, the extra inputs' as the
 * bundle's table gives their bytes and dtypes), y (batch x labels_per_sample int64
 * labels); writes the mean loss.  Labels are checked before anything runs
 * (PORT_RT_ERR_LABEL; the ignore index passes).
 * A non-finite loss returns PORT_RT_ERR_NONFINITE before the optimizer
 * updates that follow the pass (as the Python Trainer's on_nonfinite=stop). */
PORT_API int port_rt_step(port_rt *rt, const void *x, const int64_t *y, float *loss);
/* port_rt_step in two halves (a caller that checks the gradients before the
 * update): the pass (forward, loss, backward, early updates; the dropout
 * counter advances), then the optimizer updates that follow it (the step
 * counter advances). */
PORT_API int port_rt_forward_backward(port_rt *rt, const void *x, const int64_t *y, float *loss);
PORT_API int port_rt_update(port_rt *rt);
/* sizeof(port_rt), for bindings that mirror the struct. */
PORT_API uint64_t port_rt_struct_bytes(void);
/* The inference program on one batch: logits (batch x labels_per_sample x
 * classes floats) and, if labels are given, the number of correct argmax
 * predictions (rows whose label is the ignore index are not counted). */
PORT_API int port_rt_evaluate(port_rt *rt, const void *x, const int64_t *y, float *logits,
                              int64_t *correct);

/* Checkpoints in the Python Trainer's format (port/train/checkpoint.py, format 2: magic, version, header
 * length, SHA-256, JSON header, data), so either can resume the other.  Caller-owned memory:
 * port_rt_checkpoint_bytes() bounds the size; port_rt_write_checkpoint() fills out[] and sets *written;
 * port_rt_read_checkpoint() checks magic, version, length, checksum, graph digest and tensor table, then
 * restores the tensors and the step / RNG counters.  PORT_RT_ERR_CHECKPOINT on any mismatch. */
#define PORT_RT_ERR_CHECKPOINT 25
PORT_API uint64_t port_rt_checkpoint_bytes(const port_rt *rt);
PORT_API int port_rt_write_checkpoint(const port_rt *rt, uint8_t *out, uint64_t n, uint64_t *written);
PORT_API int port_rt_read_checkpoint(port_rt *rt, const uint8_t *ckpt, uint64_t n);

/* Why port_rt_check_checkpoint refused a checkpoint: the header key (or "magic", "format version", "header
 * length", "checksum", "size"), what it must be, and the value's bytes in the checkpoint (value: NULL where the
 * key is missing or the file is too short to hold it). */
typedef struct {
    const char *key, *want, *value;
    uint32_t value_bytes;
} port_rt_ckpt_problem;
/* port_rt_read_checkpoint's checks without restoring anything: magic, version, length, checksum, tensor table,
 * graph digest and the range of every header field a reader uses (step, rng.dropout_counter and bn_batches in
 * [0, 2^53], rng.seed in [-2^63, 2^64), the optimizer's lr, eps in (0, 1e6], momentum, dampening, weight_decay in
 * [0, 1e6], betas in [0, 1), finite).  PORT_RT_ERR_CHECKPOINT with *why (if why is given) on the first failure. */
PORT_API int port_rt_check_checkpoint(const port_rt *rt, const uint8_t *ckpt, uint64_t n, port_rt_ckpt_problem *why);

/* SHA-256 (FIPS 180-4), for bundles and checkpoints. */
PORT_API void port_sha256(uint8_t *out, const void *data, uint64_t n);   /* out: 32 bytes */
/* HMAC-SHA-256 (RFC 2104), for signed bundles.  out: 32 bytes. */
PORT_API void port_hmac_sha256(uint8_t *out, const void *key, uint64_t key_bytes, const void *data, uint64_t n);

/* Signed bundles (the trailer: the layout comment above).  port_rt_bundle_split: the bundle's own bytes of a
 * file (*bundle_bytes, what port_rt_bundle_check and port_rt_load take) and whether a signature trailer follows
 * (*is_signed); PORT_RT_ERR_BUNDLE when the file is neither a bundle nor a bundle and a trailer (its size field
 * says otherwise).  port_rt_bundle_verify: PORT_OK when the file is signed and its tag is HMAC-SHA-256 under key
 * (compared in constant time); PORT_RT_ERR_UNSIGNED without a trailer; PORT_RT_ERR_SIGNATURE when the tag
 * differs (a byte was edited, or another key signed it: compare port_rt_key_id with the trailer's key id). */
#define PORT_RT_ERR_UNSIGNED 30
#define PORT_RT_ERR_SIGNATURE 31
#define PORT_RT_SIG_BYTES 64
PORT_API int port_rt_bundle_split(const uint8_t *file, uint64_t n, uint64_t *bundle_bytes, int *is_signed);
PORT_API int port_rt_bundle_verify(const uint8_t *file, uint64_t n, const void *key, uint64_t key_bytes);
PORT_API void port_rt_key_id(uint8_t *out, const void *key, uint64_t key_bytes);   /* out: 8 bytes */

#ifdef __cplusplus
}
#endif
#endif /* PORT_RT_H */
