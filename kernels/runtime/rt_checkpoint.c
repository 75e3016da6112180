/* port-rt checkpoints in the Python Trainer's format 2 (port/train/checkpoint.py):
 *   "PORTCKPT" | u32 2 | u64 header length | SHA-256 (header, padding, data) | JSON header | zero padding to 64 |
 *   the tensors (each 64-byte aligned).
 * The bundle carries the header's fixed members and its "tensors" array exactly as the Python writer formats
 * them (json.dumps with sorted keys), so a header is written by filling in the counters and read by finding
 * them; the tensors array must match the bundle's byte for byte. */
#include "port_rt.h"

#include <stdio.h>
#include <string.h>

#define CK_PREFIX 52   /* magic 8 + version 4 + header length 8 + sha256 32 */

static uint64_t pad64(uint64_t n) { return (64 - n % 64) % 64; }

static int header_json(const port_rt *rt, char *out, uint64_t cap, uint64_t *len) {
    /* members in any order: the reader parses JSON */
    int k = snprintf(out, cap, "{%.*s, \"bn_batches\": %lld, \"data_bytes\": %llu, \"format\": 2, "
                     "\"rng\": {\"dropout_counter\": %lld, \"seed\": %llu}, \"step\": %lld, \"tensors\": ",
                     (int)rt->ckpt_fixed_len, rt->ckpt_fixed, (long long)rt->state.dropout_counter,
                     (unsigned long long)rt->ckpt_data_bytes, (long long)rt->state.dropout_counter,
                     (unsigned long long)rt->state.seed, (long long)rt->state.step);
    if (k < 0 || (uint64_t)k + rt->ckpt_tensors_len + 1 >= cap) return PORT_RT_ERR_CHECKPOINT;
    memcpy(out + k, rt->ckpt_tensors, rt->ckpt_tensors_len);
    out[k + rt->ckpt_tensors_len] = '}';
    *len = (uint64_t)k + rt->ckpt_tensors_len + 1;
    return PORT_OK;
}

uint64_t port_rt_checkpoint_bytes(const port_rt *rt) {
    if (!rt || !rt->ckpt_table) return 0;
    uint64_t h = rt->ckpt_fixed_len + rt->ckpt_tensors_len + 256;
    return CK_PREFIX + h + 64 + rt->ckpt_data_bytes;
}

int port_rt_write_checkpoint(const port_rt *rt, uint8_t *out, uint64_t n, uint64_t *written) {
    if (!rt || !out || !written) return PORT_ERR_NULL;
    if (!rt->ckpt_table) return PORT_ERR_UNSUPPORTED;
    uint64_t hl = 0;
    if (n < CK_PREFIX) return PORT_RT_ERR_CHECKPOINT;
    int st = header_json(rt, (char *)out + CK_PREFIX, n - CK_PREFIX, &hl);
    if (st != PORT_OK) return st;
    uint64_t data0 = CK_PREFIX + hl + pad64(CK_PREFIX + hl), total = data0 + rt->ckpt_data_bytes;
    if (total > n) return PORT_RT_ERR_CHECKPOINT;
    memcpy(out, "PORTCKPT", 8);
    uint32_t ver = 2;
    memcpy(out + 8, &ver, 4);
    memcpy(out + 12, &hl, 8);
    memset(out + CK_PREFIX + hl, 0, (size_t)(data0 - CK_PREFIX - hl));
    memset(out + data0, 0, (size_t)rt->ckpt_data_bytes);
    for (uint32_t i = 0; i < rt->ckpt_n; i++) {
        const int64_t *e = rt->ckpt_table + 3 * i;   /* arena offset, bytes, data offset */
        memcpy(out + data0 + e[2], rt->arena + e[0], (size_t)e[1]);
    }
    port_sha256(out + 20, out + CK_PREFIX, total - CK_PREFIX);
    *written = total;
    return PORT_OK;
}

/* the last occurrence of key in [s, s+n) before limit, or NULL */
static const char *find_last(const char *s, uint64_t n, const char *key) {
    size_t kl = strlen(key);
    const char *hit = NULL;
    for (uint64_t i = 0; i + kl <= n; i++)
        if (memcmp(s + i, key, kl) == 0) hit = s + i;
    return hit;
}

static int parse_int(const char *p, const char *end, long long *v) {
    int neg = 0;
    unsigned long long x = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9') return -1;
    for (; p < end && *p >= '0' && *p <= '9'; p++) x = x * 10 + (unsigned long long)(*p - '0');
    *v = neg ? -(long long)x : (long long)x;
    return 0;
}

int port_rt_read_checkpoint(port_rt *rt, const uint8_t *ck, uint64_t n) {
    if (!rt || !ck) return PORT_ERR_NULL;
    if (!rt->ckpt_table) return PORT_ERR_UNSUPPORTED;
    uint32_t ver;
    uint64_t hl;
    if (n < CK_PREFIX || memcmp(ck, "PORTCKPT", 8) != 0) return PORT_RT_ERR_CHECKPOINT;
    memcpy(&ver, ck + 8, 4);
    memcpy(&hl, ck + 12, 8);
    if (ver != 2 || hl > n - CK_PREFIX) return PORT_RT_ERR_CHECKPOINT;
    uint64_t data0 = CK_PREFIX + hl + pad64(CK_PREFIX + hl);
    if (data0 + rt->ckpt_data_bytes != n) return PORT_RT_ERR_CHECKPOINT;
    uint8_t h[32];
    port_sha256(h, ck + CK_PREFIX, n - CK_PREFIX);
    if (memcmp(h, ck + 20, 32) != 0) return PORT_RT_ERR_CHECKPOINT;
    const char *j = (const char *)ck + CK_PREFIX, *end = j + hl;
    /* the tensors array must be the bundle's, byte for byte: same names, kinds, dtypes, shapes, offsets */
    const char *t = find_last(j, hl, "\"tensors\": ");
    if (!t || (uint64_t)(end - (t + 11)) < rt->ckpt_tensors_len ||
        memcmp(t + 11, rt->ckpt_tensors, rt->ckpt_tensors_len) != 0)
        return PORT_RT_ERR_CHECKPOINT;
    const char *g = find_last(j, hl, "\"graph_digest\": \"");
    if (!g || end - (g + 17) < 64 || memcmp(g + 17, rt->graph_digest, 64) != 0) return PORT_RT_ERR_CHECKPOINT;
    const char *ps = find_last(j, (uint64_t)(t - j), "\"step\": ");
    const char *pc = find_last(j, hl, "\"dropout_counter\": ");
    const char *pz = find_last(j, hl, "\"seed\": ");
    long long step, counter, seed;
    if (!ps || !pc || !pz || parse_int(ps + 8, end, &step) || parse_int(pc + 19, end, &counter) ||
        parse_int(pz + 8, end, &seed) || step < 0 || counter < 0)
        return PORT_RT_ERR_CHECKPOINT;
    for (uint32_t i = 0; i < rt->ckpt_n; i++) {
        const int64_t *e = rt->ckpt_table + 3 * i;
        memcpy(rt->arena + e[0], ck + data0 + e[2], (size_t)e[1]);
    }
    rt->state.step = step;
    rt->state.dropout_counter = counter;
    rt->state.seed = (uint64_t)seed;
    return PORT_OK;
}
