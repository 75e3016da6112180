/* PORT's one random number generator and the kernels that draw from it: dropout, bernoulli (stochastic depth's
 * per-sample keep mask) and, through port__rng_keep, attention dropout (transformer.c).
 *
 * The generator is Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3",
 * SC'11; the Random123 reference, whose known-answer vectors tests/kernels/test_rng.py checks).  A draw is a pure
 * function of (seed, stream, element index e): word e % 4 of Philox4x32-10 with
 *     key     = (seed & 0xffffffff, seed >> 32)
 *     counter = (e / 4 & 0xffffffff, e / 4 >> 32, stream & 0xffffffff, stream >> 32).
 * So a mask does not depend on the thread count, the tile order or the backend: the C kernels, port-rt and the
 * torch engines (port/ops/random.py, the same function vectorised in torch) draw the same bits, and a backward
 * or a re-run in the same step can draw a forward's values again from (seed, stream) alone.  PORT's calls take
 * seed = the run's seed and stream = port_rt_rng_stream(forward passes done, graph op id).
 * A draw u (uint32) passes a probability p where u >= ceil(p 2^32) (keep, dropout) or u < ceil(q 2^32)
 * (a one of bernoulli(q)): the same integer threshold everywhere (port__rng_threshold). */
#include "internal.h"

#include <math.h>

uint64_t port__rng_threshold(double p) {
    if (!(p > 0.0)) return 0;
    if (p >= 1.0) return (uint64_t)1 << 32;
    return (uint64_t)ceil(p * 4294967296.0);   /* exact: p has at most 53 bits */
}

/* Philox4x32-10 of the counter c (in place) under the key (k0, k1) */
static inline void philox(uint32_t c[4], uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
        c[1] = (uint32_t)p1;
        c[3] = (uint32_t)p0;
        c[0] = n0;
        c[2] = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

/* the four draws of block q (elements 4q .. 4q+3) */
static inline void rng_block(uint32_t w[4], uint64_t q, uint64_t seed, uint64_t stream) {
    w[0] = (uint32_t)q;
    w[1] = (uint32_t)(q >> 32);
    w[2] = (uint32_t)stream;
    w[3] = (uint32_t)(stream >> 32);
    philox(w, (uint32_t)seed, (uint32_t)(seed >> 32));
}

void port_philox4x32_10(uint32_t *out, const uint32_t *ctr, const uint32_t *key) {
    if (!out || !ctr || !key) return;
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    philox(c, key[0], key[1]);
    memcpy(out, c, sizeof c);
}

/* Calls fn(i, word of element e0 + i) for i in [0, n), one Philox block per 4 elements: the block loop of every
 * kernel here (a macro so that the body inlines). */
#define RNG_EACH(e0, n, seed, stream, body)                                          \
    do {                                                                             \
        uint64_t q_ = (uint64_t)(e0) >> 2, end_ = (uint64_t)(e0) + (uint64_t)(n);    \
        for (uint64_t b_ = q_ * 4; b_ < end_; b_ += 4, q_++) {                       \
            uint32_t w_[4];                                                          \
            rng_block(w_, q_, seed, stream);                                         \
            for (int l_ = 0; l_ < 4; l_++) {                                         \
                uint64_t e_ = b_ + (uint64_t)l_;                                     \
                if (e_ < (uint64_t)(e0) || e_ >= end_) continue;                     \
                int64_t i = (int64_t)(e_ - (uint64_t)(e0));                          \
                uint32_t u = w_[l_];                                                 \
                body                                                                 \
            }                                                                        \
        }                                                                            \
    } while (0)

/* Elements per parallel chunk (a multiple of 4: chunks start on Philox blocks) */
#define RNG_CHUNK 4096

void port__rng_keep(uint8_t *keep, int64_t n, uint64_t e0, uint64_t seed, uint64_t stream, uint64_t thr) {
    RNG_EACH(e0, n, seed, stream, keep[i] = (uint64_t)u >= thr;);
}

port_status port_rng_u32(uint32_t *out, int64_t count, int64_t offset, uint64_t seed, uint64_t stream) {
    PORT_NOTNULL(out);
    PORT_CHECK(count >= 0 && offset >= 0, PORT_ERR_SHAPE);
    RNG_EACH(offset, count, seed, stream, out[i] = u;);
    return PORT_OK;
}

port_status port_dropout_forward(float *y, uint8_t *mask, const float *x, int64_t count, float p, uint64_t seed,
                                 uint64_t stream) {
    PORT_NOTNULL(y);
    PORT_NOTNULL(x);
    PORT_NOTNULL(mask);
    PORT_CHECK(count >= 0, PORT_ERR_SHAPE);
    PORT_CHECK(p >= 0.0f && p < 1.0f, PORT_ERR_ARG);
    float scale = (float)(1.0 / (1.0 - (double)p));
    uint64_t thr = port__rng_threshold(p);
    int64_t chunks = (count + RNG_CHUNK - 1) / RNG_CHUNK;
#pragma omp parallel for schedule(static) if (count > PORT_PAR_MIN)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t e0 = c * RNG_CHUNK, n = PORT_MIN(RNG_CHUNK, count - e0);
        float *yc = y + e0;
        const float *xc = x + e0;
        uint8_t *mc = mask + e0;
        RNG_EACH(e0, n, seed, stream,
                 uint8_t keep = (uint64_t)u >= thr;
                 mc[i] = keep;
                 yc[i] = (xc[i] * (float)keep) * scale;);   /* as torch: input * mask * scale */
    }
    return PORT_OK;
}

port_status port_dropout_backward(float *dx, const float *dy, const uint8_t *mask, int64_t count, float p) {
    PORT_NOTNULL(dx);
    PORT_NOTNULL(dy);
    PORT_NOTNULL(mask);
    PORT_CHECK(count >= 0, PORT_ERR_SHAPE);
    PORT_CHECK(p >= 0.0f && p < 1.0f, PORT_ERR_ARG);
    float scale = (float)(1.0 / (1.0 - (double)p));
#pragma omp parallel for simd schedule(static) if (count > PORT_PAR_MIN)
    for (int64_t i = 0; i < count; i++) dx[i] = (dy[i] * (float)mask[i]) * scale;   /* as torch: grad*mask*scale */
    return PORT_OK;
}

port_status port_bernoulli_forward(float *y, int64_t count, float prob, uint64_t seed, uint64_t stream) {
    PORT_NOTNULL(y);
    PORT_CHECK(count >= 0, PORT_ERR_SHAPE);
    PORT_CHECK(prob >= 0.0f && prob <= 1.0f, PORT_ERR_ARG);
    uint64_t thr = port__rng_threshold(prob);
    int64_t chunks = (count + RNG_CHUNK - 1) / RNG_CHUNK;
#pragma omp parallel for schedule(static) if (count > PORT_PAR_MIN)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t e0 = c * RNG_CHUNK, n = PORT_MIN(RNG_CHUNK, count - e0);
        float *yc = y + e0;
        RNG_EACH(e0, n, seed, stream, yc[i] = (uint64_t)u < thr ? 1.0f : 0.0f;);
    }
    return PORT_OK;
}
