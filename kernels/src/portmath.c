/* exp, log and integer powers from +, -, *, / and exact scalings only: the same bits on every ISA and C
 * library (glibc, newlib on a Cortex-M, ...), which libm's expf/log/pow do not promise. Accuracy: exp to
 * about 1e-16 relative before the final rounding to float, log to about 2 ulp of double. */
#include "internal.h"

#include <math.h>

#define LN2_HI 6.93147180369123816490e-01 /* ln 2, high part: kd * LN2_HI is exact for |kd| < 2^20 */
#define LN2_LO 1.90821492927058770002e-10
#define INV_LN2 1.44269504088896338700e+00

float port__expf(float xf) {
    if (xf != xf) return xf;
    if (xf > 88.73f) return INFINITY;
    if (xf < -104.0f) return 0.0f;
    double x = xf;
    double t = x * INV_LN2;
    double kd = (double)(int64_t)(t + (t >= 0 ? 0.5 : -0.5));
    double r = (x - kd * LN2_HI) - kd * LN2_LO; /* |r| <= ln2/2 */
    double p = 1.0 / 479001600.0;               /* 1/12!, Horner down to 1 */
    static const double inv_fact[12] = {1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0,
                                        1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5,
                                        1.0, 1.0};
    for (int i = 0; i < 12; i++) p = p * r + inv_fact[i];
    return (float)ldexp(p, (int)kd);            /* ldexp scales exactly */
}

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
    return (double)e * LN2_HI + ((double)e * LN2_LO + 2.0 * t * (1.0 + s));
}

double port__powi(double b, int64_t n) {
    double r = 1.0;
    for (; n > 0; n >>= 1, b *= b)
        if (n & 1) r *= b;
    return r;
}
