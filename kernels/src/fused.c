/* Fused conv2d + training batch norm + ReLU forward (the plan variant `fused`; backward runs unfused). */
#include "internal.h"
#include <math.h>

port_status port_conv2d_bn_relu_forward_train(float *y, float *z, float *save_mean,
                                              float *save_invstd, float *running_mean,
                                              float *running_var, const float *x, const float *w,
                                              const float *gamma, const float *beta,
                                              const port_conv2d_params *p, float eps,
                                              float momentum, int algo, void *ws,
                                              size_t ws_bytes) {
    port_status st = port__conv_validate(p, &algo, ws, ws_bytes);
    if (st != PORT_OK) return st;
    PORT_NOTNULL(y); PORT_NOTNULL(z); PORT_NOTNULL(x); PORT_NOTNULL(w);
    PORT_NOTNULL(save_mean); PORT_NOTNULL(save_invstd);
    PORT_CHECK(eps > 0.0f && momentum >= 0.0f && momentum <= 1.0f, PORT_ERR_ARG);
    int64_t P = port_conv2d_out_h(p) * port_conv2d_out_w(p);
    PORT_CHECK(p->n * P > 1, PORT_ERR_SHAPE);
    PORT_CHECK(y != z, PORT_ERR_ALIAS);
    port__conv_fwd(z, x, w, NULL, p, algo, (float *)ws);
    port__bn_train_forward(y, save_mean, save_invstd, running_mean, running_var, z, gamma, beta,
                           p->n, p->c_out, P, eps, momentum, 1);
    return PORT_OK;
}
