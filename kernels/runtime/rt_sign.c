/* Signed bundles: a bundle followed by a 64-byte trailer holding HMAC-SHA-256 under a shared key (layout:
 * port_rt.h).  No allocation, no POSIX: the Cortex-M4 build compiles it too. */
#include "port_rt.h"

#include <string.h>

#define SIG_MAGIC "PORTSIG\0"
#define SIG_VERSION 1u
#define SIG_HMAC_SHA256 1u

static uint64_t rd64(const uint8_t *b) {
    uint64_t v;
    memcpy(&v, b, 8);
    return v;
}
static uint32_t rd32(const uint8_t *b) {
    uint32_t v;
    memcpy(&v, b, 4);
    return v;
}

int port_rt_bundle_split(const uint8_t *f, uint64_t n, uint64_t *bundle_bytes, int *is_signed) {
    if (!f || !bundle_bytes || !is_signed) return PORT_ERR_NULL;
    if (n < PORT_RT_HEADER_BYTES + 32 || memcmp(f, "PORTRTB\0", 8) != 0) return PORT_RT_ERR_BUNDLE;
    uint64_t total = rd64(f + 16);
    if (total == n) {
        *bundle_bytes = n;
        *is_signed = 0;
        return PORT_OK;
    }
    if (n < PORT_RT_SIG_BYTES || total != n - PORT_RT_SIG_BYTES || memcmp(f + total, SIG_MAGIC, 8) != 0)
        return PORT_RT_ERR_BUNDLE;
    *bundle_bytes = total;
    *is_signed = 1;
    return PORT_OK;
}

void port_rt_key_id(uint8_t *out, const void *key, uint64_t key_bytes) {
    static const char what[] = "port-rt key id";
    uint8_t h[32];
    port_hmac_sha256(h, key, key_bytes, what, sizeof what - 1);
    memcpy(out, h, 8);
}

int port_rt_bundle_verify(const uint8_t *f, uint64_t n, const void *key, uint64_t key_bytes) {
    if (!f || (!key && key_bytes)) return PORT_ERR_NULL;
    uint64_t total = 0;
    int is_signed = 0;
    int st = port_rt_bundle_split(f, n, &total, &is_signed);
    if (st != PORT_OK) return st;
    if (!is_signed) return PORT_RT_ERR_UNSIGNED;
    const uint8_t *t = f + total;
    if (rd32(t + 8) != SIG_VERSION || rd32(t + 12) != SIG_HMAC_SHA256 || rd64(t + 24) != 0)
        return PORT_RT_ERR_SIGNATURE;
    uint8_t tag[32], diff = 0;
    port_hmac_sha256(tag, key, key_bytes, f, total + 32);
    for (int i = 0; i < 32; i++) diff |= (uint8_t)(tag[i] ^ t[32 + i]);   /* constant time */
    return diff ? PORT_RT_ERR_SIGNATURE : PORT_OK;
}
