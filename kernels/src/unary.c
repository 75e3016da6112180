/* Generic unary math (issue 54): neg, exp, rsqrt, cos, sin, pow by a scalar, abs and x + c, forward and
 * backward, one entry each with an op enum.  Element-wise: each element by one thread, the same bits at any
 * thread count.  exp is the portable one (portmath.c); cos, sin and non-integer powers run in double (libm's
 * cos / sin, the portable exp and log) and round once. */
#include "internal.h"

#include <math.h>

int port_unary_saves(int64_t op) {
    switch (op) {
    case PORT_UNARY_NEG: case PORT_UNARY_SHIFT: return 0;
    case PORT_UNARY_COS: case PORT_UNARY_SIN: case PORT_UNARY_POW: case PORT_UNARY_ABS: return 1;
    case PORT_UNARY_EXP: case PORT_UNARY_RSQRT: return 2;
    default: return -1;
    }
}

/* x^e in double, rounded once: integer exponents (|e| <= 2^20) by squaring (as torch: 0^-n = inf), +-0.5 as
 * sqrt and 1 / sqrt, others exp(e log x) (x < 0: NaN; 0^e: 0 for e > 0, inf for e < 0) */
static float powf_port(float xf, double e) {
    double x = (double)xf;
    if (e == 0.0) return 1.0f;
    if (e == floor(e) && fabs(e) <= 1048576.0) {
        double r = port__powi(x, (int64_t)fabs(e));
        return (float)(e < 0 ? 1.0 / r : r);
    }
    if (e == 0.5) return sqrtf(xf);
    if (e == -0.5) return 1.0f / sqrtf(xf);   /* as torch: rsqrt (-0 gives -inf) */
    if (x != x || x < 0) return NAN;
    if (x == 0) return e > 0 ? 0.0f : PORT__INF;
    if (isinf(x)) return e > 0 ? PORT__INF : 0.0f;
    return (float)port__exp(e * port__log(x));
}

static int unary_args(const void *out, const void *in, int64_t count, int64_t op, float scalar) {
    if (!out || !in) return PORT_ERR_NULL;
    if (count < 0) return PORT_ERR_SHAPE;
    if (port_unary_saves(op) < 0 || !isfinite(scalar)) return PORT_ERR_ARG;
    return PORT_OK;
}

#define UNARY_LOOP(body)                                                   \
    do {                                                                   \
        if (count > PORT_PAR_MIN) {                                        \
            _Pragma("omp parallel for schedule(static)")                   \
            for (int64_t i = 0; i < count; i++) { body }                   \
        } else {                                                           \
            for (int64_t i = 0; i < count; i++) { body }                   \
        }                                                                  \
    } while (0)

port_status port_unary_forward(float *y, const float *x, int64_t count, int64_t op, float scalar) {
    int st = unary_args(y, x, count, op, scalar);
    if (st) return (port_status)st;
    const float c = scalar;
    const double e = (double)scalar;
    switch (op) {
    case PORT_UNARY_NEG: UNARY_LOOP(y[i] = -x[i];); break;
    case PORT_UNARY_EXP: UNARY_LOOP(y[i] = port__expf_inline(x[i]);); break;
    case PORT_UNARY_RSQRT: UNARY_LOOP(y[i] = 1.0f / sqrtf(x[i]);); break;
    case PORT_UNARY_COS: UNARY_LOOP(y[i] = (float)cos((double)x[i]);); break;
    case PORT_UNARY_SIN: UNARY_LOOP(y[i] = (float)sin((double)x[i]);); break;
    case PORT_UNARY_POW:
        if (e == 2.0) UNARY_LOOP(float v = x[i]; y[i] = v * v;);
        else UNARY_LOOP(y[i] = powf_port(x[i], e););
        break;
    case PORT_UNARY_ABS: UNARY_LOOP(y[i] = fabsf(x[i]);); break;
    default: UNARY_LOOP(y[i] = x[i] + c;); break;
    }
    return PORT_OK;
}

port_status port_unary_backward(float *dx, const float *dy, const float *s, int64_t count, int64_t op,
                                float scalar) {
    int st = unary_args(dx, dy, count, op, scalar);
    if (st) return (port_status)st;
    PORT_CHECK(port_unary_saves(op) == 0 || s != NULL, PORT_ERR_NULL);
    const float c = scalar;
    const double e = (double)scalar;
    switch (op) {
    case PORT_UNARY_NEG: UNARY_LOOP(dx[i] = -dy[i];); break;
    case PORT_UNARY_EXP: UNARY_LOOP(dx[i] = dy[i] * s[i];); break;
    case PORT_UNARY_RSQRT: UNARY_LOOP(float v = s[i]; dx[i] = dy[i] * (v * v * v) * -0.5f;); break;
    case PORT_UNARY_COS: UNARY_LOOP(dx[i] = -dy[i] * (float)sin((double)s[i]);); break;
    case PORT_UNARY_SIN: UNARY_LOOP(dx[i] = dy[i] * (float)cos((double)s[i]);); break;
    case PORT_UNARY_POW:     /* as torch: dy * e * x^(e-1), zero for e == 0 */
        if (e == 0.0) UNARY_LOOP(dx[i] = 0.0f;);
        else if (e == 2.0) UNARY_LOOP(dx[i] = dy[i] * (2.0f * s[i]););
        else UNARY_LOOP(dx[i] = dy[i] * (c * powf_port(s[i], e - 1.0)););
        break;
    case PORT_UNARY_ABS: UNARY_LOOP(float v = s[i]; dx[i] = dy[i] * (float)((v > 0.0f) - (v < 0.0f)););
        break;
    default: UNARY_LOOP(dx[i] = dy[i];); break;
    }
    return PORT_OK;
}
