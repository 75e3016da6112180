/* Softmax cross-entropy with mean reduction and label smoothing. */
#include "internal.h"
#include <math.h>

port_status port_softmax_xent_forward(float *loss, float *probs, const float *logits,
                                      const int64_t *labels, int64_t n, int64_t k,
                                      float label_smoothing) {
    PORT_NOTNULL(loss); PORT_NOTNULL(probs); PORT_NOTNULL(logits); PORT_NOTNULL(labels);
    PORT_CHECK(n > 0 && k > 0, PORT_ERR_SHAPE);
    PORT_CHECK(label_smoothing >= 0.0f && label_smoothing <= 1.0f, PORT_ERR_ARG);
    for (int64_t i = 0; i < n; i++) PORT_CHECK(labels[i] >= 0 && labels[i] < k, PORT_ERR_ARG);
    double total = 0.0, ls = label_smoothing;
    /* serial: an OpenMP reduction would sum the rows in an order that depends on the thread count */
    for (int64_t i = 0; i < n; i++) {
        const float *z = logits + i * k;
        float *pr = probs + i * k;
        float mx = z[0];
        for (int64_t j = 1; j < k; j++) mx = z[j] > mx ? z[j] : mx;
        double s = 0.0, sz = 0.0;
        for (int64_t j = 0; j < k; j++) {
            float e = port__expf(z[j] - mx);
            pr[j] = e;
            s += e;
            sz += (double)z[j] - mx;
        }
        double lse = port__log(s);
        float inv = (float)(1.0 / s);
        for (int64_t j = 0; j < k; j++) pr[j] *= inv;
        double nll = -(((double)z[labels[i]] - mx) - lse);
        double smooth = -(sz - (double)k * lse) / (double)k; /* mean_j -log p_j */
        total += (1.0 - ls) * nll + ls * smooth;
    }
    loss[0] = (float)(total / (double)n);
    return PORT_OK;
}

port_status port_softmax_xent_backward(float *dlogits, const float *probs, const int64_t *labels,
                                       const float *grad_loss, int64_t n, int64_t k,
                                       float label_smoothing) {
    PORT_NOTNULL(dlogits); PORT_NOTNULL(probs); PORT_NOTNULL(labels); PORT_NOTNULL(grad_loss);
    PORT_CHECK(n > 0 && k > 0, PORT_ERR_SHAPE);
    PORT_CHECK(label_smoothing >= 0.0f && label_smoothing <= 1.0f, PORT_ERR_ARG);
    for (int64_t i = 0; i < n; i++) PORT_CHECK(labels[i] >= 0 && labels[i] < k, PORT_ERR_ARG);
    /* labels are in [0, k): -1 ignores none */
    port__xent_grad_rows(dlogits, probs, labels, n, k, grad_loss[0] / (float)n, label_smoothing, -1);
    return PORT_OK;
}

void port__xent_grad_rows(float *dlogits, const float *probs, const int64_t *labels, int64_t n, int64_t k,
                          float scale, float label_smoothing, int64_t ignore_index) {
    float off = label_smoothing / (float)k, on = 1.0f - label_smoothing + off;
#pragma omp parallel for schedule(static) if (n * k > PORT_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float *pr = probs + i * k;
        float *d = dlogits + i * k;
        int64_t y = labels[i];
        if (y == ignore_index) {
            memset(d, 0, (size_t)k * sizeof(float));
            continue;
        }
        for (int64_t j = 0; j < k; j++) d[j] = (pr[j] - (j == y ? on : off)) * scale;
    }
}
