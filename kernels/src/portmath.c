/* exp, log, e^x - 1, tanh, erf, erfc and integer powers from +, -, *, / and exact scalings only: the same bits
 * on every ISA and C library (glibc, newlib on a Cortex-M, ...), which libm's expf/exp/log/tanh/erf/pow do not
 * promise.  Accuracy: exp to about 1e-16 relative before the final rounding to float, log to about 2 ulp of
 * double, tanh / erf about 1e-15, erfc about 1e-13 relative (internal.h has the branch-free inline versions
 * these call, for vectorised loops). */
#include "internal.h"

#include <math.h>

float port__expf(float x) { return port__expf_inline(x); }
double port__exp(double x) { return port__exp_inline(x); }
double port__expm1(double x) { return port__expm1_inline(x); }
double port__tanh(double x) { return port__tanh_inline(x); }
double port__erf(double x) { return port__erf_inline(x); }
double port__erfc(double x) { return port__erfc_inline(x); }

double port__log(double x) {
    if (x != x || x < 0) return NAN;
    if (x == 0) return -INFINITY;
    if (isinf(x)) return x;
    int e;
    double m = frexp(x, &e);                    /* x = m 2^e, m in [0.5, 1): exact */
    if (m < 0.70710678118654752440) {
        m *= 2.0;
        e -= 1;
    }
    double t = (m - 1.0) / (m + 1.0), t2 = t * t; /* |t| <= 0.1716: log m = 2 atanh t */
    double s = 0.0;
    for (int i = 31; i >= 3; i -= 2) s = (s + 1.0 / i) * t2;
    return (double)e * PORT__LN2_HI + ((double)e * PORT__LN2_LO + 2.0 * t * (1.0 + s));
}

double port__powi(double b, int64_t n) {
    double r = 1.0;
    for (; n > 0; n >>= 1, b *= b)
        if (n & 1) r *= b;
    return r;
}
