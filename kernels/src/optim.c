/* In-place optimizer updates, same arithmetic as torch.optim (single tensor). */
#include "internal.h"
#include <math.h>

port_status port_sgd_step(float *param, float *momentum_buf, const float *grad, int64_t count,
                          double lr, double momentum, double dampening, double weight_decay,
                          int nesterov, int first_step) {
    PORT_NOTNULL(param); PORT_NOTNULL(grad);
    PORT_CHECK(count >= 0, PORT_ERR_SHAPE);
    PORT_CHECK(lr >= 0.0 && momentum >= 0.0 && weight_decay >= 0.0, PORT_ERR_ARG);
    PORT_CHECK(!nesterov || (momentum > 0.0 && dampening == 0.0), PORT_ERR_ARG);
    if (momentum != 0.0) PORT_NOTNULL(momentum_buf);
    const float wd = (float)weight_decay, mom = (float)momentum;
    const float damp = (float)(1.0 - dampening), nlr = (float)(-lr);
#pragma omp parallel for schedule(static) if (count > PORT_PAR_MIN)
    for (int64_t i = 0; i < count; i++) {
        float d = grad[i];
        if (weight_decay != 0.0) d = d + wd * param[i];
        if (momentum != 0.0) {
            float b = first_step ? d : momentum_buf[i] * mom + damp * d;
            momentum_buf[i] = b;
            d = nesterov ? d + mom * b : b;
        }
        param[i] = param[i] + nlr * d;
    }
    return PORT_OK;
}

port_status port_adamw_step(float *param, float *exp_avg, float *exp_avg_sq, const float *grad,
                            int64_t count, double lr, double beta1, double beta2, double eps,
                            double weight_decay, int64_t step) {
    PORT_NOTNULL(param); PORT_NOTNULL(exp_avg); PORT_NOTNULL(exp_avg_sq); PORT_NOTNULL(grad);
    PORT_CHECK(count >= 0, PORT_ERR_SHAPE);
    PORT_CHECK(step >= 1 && lr >= 0.0 && eps >= 0.0 && weight_decay >= 0.0, PORT_ERR_ARG);
    PORT_CHECK(beta1 >= 0.0 && beta1 < 1.0 && beta2 >= 0.0 && beta2 < 1.0, PORT_ERR_ARG);
    const float decay = (float)(1.0 - lr * weight_decay);
    const float w = (float)(1.0 - beta1);
    const float b2 = (float)beta2, omb2 = (float)(1.0 - beta2);
    const double bc1 = 1.0 - port__powi(beta1, step), bc2 = 1.0 - port__powi(beta2, step);
    const float nstep = (float)(-(lr / bc1));
    const float bc2s = (float)sqrt(bc2), feps = (float)eps;
#pragma omp parallel for schedule(static) if (count > PORT_PAR_MIN)
    for (int64_t i = 0; i < count; i++) {
        float g = grad[i];
        float p = param[i] * decay;
        float m = exp_avg[i];
        m = w < 0.5f ? m + w * (g - m) : g - (g - m) * (1.0f - w);
        float v = exp_avg_sq[i] * b2 + omb2 * g * g;
        float denom = sqrtf(v) / bc2s + feps;
        param[i] = p + nstep * (m / denom);
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
    return PORT_OK;
}
