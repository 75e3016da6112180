/* SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), plain and portable: bundles and checkpoints are checked with
 * them on devices without a crypto library. Checked against Python's hashlib and hmac in tests/e2e/test_rt.py and
 * tests/e2e/test_rt_sign.py. */
#include "port_rt.h"

#include <string.h>

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void block(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 |
               (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

/* A running SHA-256: whole blocks are hashed in place, a partial one waits in buf. */
typedef struct {
    uint32_t h[8];
    uint8_t buf[64];
    uint64_t n; /* bytes taken so far */
} sha256_ctx;

static void sha_init(sha256_ctx *c) {
    static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, H0, sizeof H0);
    c->n = 0;
}

static void sha_update(sha256_ctx *c, const void *data, uint64_t n) {
    const uint8_t *p = (const uint8_t *)data;
    size_t have = (size_t)(c->n % 64);
    c->n += n;
    if (have) {
        size_t take = 64 - have < n ? 64 - have : (size_t)n;
        memcpy(c->buf + have, p, take);
        p += take;
        n -= take;
        if (have + take < 64) return;
        block(c->h, c->buf);
    }
    for (; n >= 64; p += 64, n -= 64) block(c->h, p);
    if (n) memcpy(c->buf, p, (size_t)n);
}

static void sha_final(sha256_ctx *c, uint8_t *out) {
    uint8_t tail[128];
    size_t left = (size_t)(c->n % 64);
    memset(tail, 0, sizeof tail);
    memcpy(tail, c->buf, left);
    tail[left] = 0x80;
    size_t tl = left < 56 ? 64 : 128;
    uint64_t bits = c->n * 8;
    for (int i = 0; i < 8; i++) tail[tl - 1 - i] = (uint8_t)(bits >> (8 * i));
    block(c->h, tail);
    if (tl == 128) block(c->h, tail + 64);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->h[i];
    }
}

void port_sha256(uint8_t *out, const void *data, uint64_t n) {
    sha256_ctx c;
    sha_init(&c);
    sha_update(&c, data, n);
    sha_final(&c, out);
}

/* HMAC (RFC 2104) over SHA-256: H((K ^ opad) || H((K ^ ipad) || m)), K the key zero-padded to the 64-byte
 * block (a longer key is hashed first). Checked against Python's hmac and RFC 4231 in tests/e2e/test_rt_sign.py. */
void port_hmac_sha256(uint8_t *out, const void *key, uint64_t key_bytes, const void *data, uint64_t n) {
    uint8_t k[64], pad[64], inner[32];
    memset(k, 0, sizeof k);
    if (key_bytes > 64) port_sha256(k, key, key_bytes);
    else if (key_bytes) memcpy(k, key, (size_t)key_bytes);
    sha256_ctx c;
    for (int i = 0; i < 64; i++) pad[i] = (uint8_t)(k[i] ^ 0x36);
    sha_init(&c);
    sha_update(&c, pad, 64);
    sha_update(&c, data, n);
    sha_final(&c, inner);
    for (int i = 0; i < 64; i++) pad[i] = (uint8_t)(k[i] ^ 0x5c);
    sha_init(&c);
    sha_update(&c, pad, 64);
    sha_update(&c, inner, 32);
    sha_final(&c, out);
    memset(k, 0, sizeof k);
    memset(pad, 0, sizeof pad);
}
