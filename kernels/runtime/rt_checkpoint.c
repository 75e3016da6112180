/* port-rt checkpoints in the Python Trainer's format 2 (port/train/checkpoint.py):
 *   "PORTCKPT" | u32 2 | u64 header length | SHA-256 (header, padding, data) | JSON header | zero padding to 64 |
 *   the tensors (each 64-byte aligned).
 * The bundle carries the header's fixed members and its "tensors" array exactly as the Python writer formats
 * them (json.dumps with sorted keys), so a header is written by filling in the counters and read by finding
 * them (a small JSON reader: the members' values); the tensors array must match the bundle's byte for byte, and
 * every field is range-checked (port_rt_check_checkpoint) before anything is restored. */
#include "port_rt.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

/* ---- a small JSON reader: the value span of an object's member (strings, nesting and escapes honoured) ---- */
static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

static const char *skip_string(const char *p, const char *end) {   /* p at '"': just past the closing quote */
    for (p++; p < end; p++) {
        if (*p == '\\') p++;
        else if (*p == '"') return p + 1;
    }
    return NULL;
}

static const char *skip_value(const char *p, const char *end) {
    if (p >= end) return NULL;
    if (*p == '"') return skip_string(p, end);
    if (*p == '{' || *p == '[') {
        int depth = 0;
        while (p < end) {
            if (*p == '"') {
                if (!(p = skip_string(p, end))) return NULL;
                continue;
            }
            if (*p == '{' || *p == '[') depth++;
            else if (*p == '}' || *p == ']') {
                if (--depth == 0) return p + 1;
                if (depth < 0) return NULL;
            }
            p++;
        }
        return NULL;
    }
    const char *q = p;
    while (q < end && !strchr(",}] \t\r\n", *q)) q++;
    return q > p ? q : NULL;
}

/* The value [*v, *ve) of member key of the object [obj, end) (the last one, as Python's json keeps); 0 if found,
 * 1 if absent, -1 if the object is malformed. */
static int member(const char *obj, const char *end, const char *key, const char **v, const char **ve) {
    size_t kl = strlen(key);
    int found = 1;
    const char *p = skip_ws(obj, end);
    if (p >= end || *p != '{') return -1;
    p = skip_ws(p + 1, end);
    if (p < end && *p == '}') return 1;
    while (p < end) {
        if (*p != '"') return -1;
        const char *ks = p + 1, *ke;
        if (!(p = skip_string(p, end))) return -1;
        ke = p - 1;
        p = skip_ws(p, end);
        if (p >= end || *p != ':') return -1;
        p = skip_ws(p + 1, end);
        const char *vs = p;
        if (!(p = skip_value(p, end))) return -1;
        if ((size_t)(ke - ks) == kl && memcmp(ks, key, kl) == 0) {
            *v = vs;
            *ve = p;
            found = 0;
        }
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p = skip_ws(p + 1, end);
            continue;
        }
        return p < end && *p == '}' ? found : -1;
    }
    return -1;
}

/* an integer in [lo, hi] (hi up to 2^64 - 1, lo down to -2^63); -1 if not */
static int parse_int(const char *p, const char *end, int64_t lo, uint64_t hi, uint64_t *out) {
    int neg = 0;
    uint64_t x = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end || end - p > 20) return -1;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9') return -1;
        uint64_t d = (uint64_t)(*p - '0');
        if (x > (UINT64_MAX - d) / 10) return -1;
        x = x * 10 + d;
    }
    if (neg ? (lo >= 0 || x > (uint64_t)(-(lo + 1)) + 1) : x > hi) return -1;
    *out = neg ? (uint64_t)0 - x : x;
    return 0;
}

/* a finite JSON number in (lo, hi] (open) or [lo, hi] */
static int parse_num(const char *p, const char *end, double lo, int lo_open, double hi) {
    char buf[48];
    if (end - p <= 0 || end - p >= (long)sizeof buf) return -1;
    for (const char *q = p; q < end; q++)   /* a JSON number: no NaN, Infinity, hex or spaces */
        if (!strchr("0123456789+-.eE", *q)) return -1;
    memcpy(buf, p, (size_t)(end - p));
    buf[end - p] = 0;
    char *stop = NULL;
    double v = strtod(buf, &stop);
    if (!stop || *stop || !isfinite(v) || v < lo || (lo_open && v == lo) || v > hi) return -1;
    return 0;
}

static int refuse(port_rt_ckpt_problem *why, const char *key, const char *want, const char *v, const char *ve) {
    if (why) {
        why->key = key;
        why->want = want;
        why->value = v;
        why->value_bytes = v && ve > v ? (uint32_t)(ve - v < 80 ? ve - v : 80) : 0;
    }
    return PORT_RT_ERR_CHECKPOINT;
}

#define MAX_COUNT ((uint64_t)1 << 53)
#define MAX_SETTING PORT_RT_MAX_SETTING

int port_rt_check_checkpoint(const port_rt *rt, const uint8_t *ck, uint64_t n, port_rt_ckpt_problem *why) {
    if (!rt || !ck) return PORT_ERR_NULL;
    if (!rt->ckpt_table) return PORT_ERR_UNSUPPORTED;
    uint32_t ver;
    uint64_t hl;
    if (n < CK_PREFIX || memcmp(ck, "PORTCKPT", 8) != 0) return refuse(why, "magic", "\"PORTCKPT\"", NULL, NULL);
    memcpy(&ver, ck + 8, 4);
    memcpy(&hl, ck + 12, 8);
    if (ver != 2) return refuse(why, "format version", "2", NULL, NULL);
    if (hl > n - CK_PREFIX) return refuse(why, "header length", "at most the file's size", NULL, NULL);
    uint64_t data0 = CK_PREFIX + hl + pad64(CK_PREFIX + hl);
    if (data0 + rt->ckpt_data_bytes != n)
        return refuse(why, "size", "the header, its padding and this bundle's tensor bytes", NULL, NULL);
    uint8_t h[32];
    port_sha256(h, ck + CK_PREFIX, n - CK_PREFIX);
    if (memcmp(h, ck + 20, 32) != 0) return refuse(why, "checksum", "the SHA-256 of the header and data", NULL, NULL);
    const char *j = (const char *)ck + CK_PREFIX, *end = j + hl, *v = NULL, *ve = NULL, *o = NULL, *oe = NULL;
    uint64_t x;
    /* the tensors array must be the bundle's, byte for byte: same names, kinds, dtypes, shapes, offsets */
    if (member(j, end, "tensors", &v, &ve) || (uint64_t)(ve - v) != rt->ckpt_tensors_len ||
        memcmp(v, rt->ckpt_tensors, rt->ckpt_tensors_len) != 0)
        return refuse(why, "tensors", "this bundle's tensor table", v, ve);
    if (member(j, end, "graph_digest", &v, &ve) || ve - v != 66 || v[0] != '"' || memcmp(v + 1, rt->graph_digest, 64))
        return refuse(why, "graph_digest", "this bundle's graph digest", v, ve);
    if (member(j, end, "format", &v, &ve) || parse_int(v, ve, 2, 2, &x))
        return refuse(why, "format", "2", v, ve);
    if (member(j, end, "data_bytes", &v, &ve) || parse_int(v, ve, 0, rt->ckpt_data_bytes, &x) ||
        x != rt->ckpt_data_bytes)
        return refuse(why, "data_bytes", "this bundle's checkpoint data bytes", v, ve);
    if (member(j, end, "step", &v, &ve) || parse_int(v, ve, 0, MAX_COUNT, &x))
        return refuse(why, "step", "an integer in [0, 2^53]", v, ve);
    int has = member(j, end, "bn_batches", &v, &ve);
    if (has < 0 || (has == 0 && parse_int(v, ve, 0, MAX_COUNT, &x)))
        return refuse(why, "bn_batches", "an integer in [0, 2^53]", v, ve);
    if (member(j, end, "rng", &o, &oe)) return refuse(why, "rng", "an object {seed, dropout_counter}", o, oe);
    v = ve = NULL;
    if (member(o, oe, "dropout_counter", &v, &ve) || parse_int(v, ve, 0, MAX_COUNT, &x))
        return refuse(why, "rng.dropout_counter", "an integer in [0, 2^53]", v, ve);
    v = ve = NULL;
    if (member(o, oe, "seed", &v, &ve) || parse_int(v, ve, INT64_MIN, UINT64_MAX, &x))
        return refuse(why, "rng.seed", "an integer in [-2^63, 2^64)", v, ve);
    has = member(j, end, "optimizer", &o, &oe);
    if (has < 0) return refuse(why, "optimizer", "an object of optimizer settings", o, oe);
    if (has == 0) {
        /* the Python reader's rule (port/train/optim.py): eps > 0; lr >= 0 as torch.optim allows (a schedule may
           start at 0); every setting a finite float32 */
        static const char *const open_keys[] = {"eps"}, *const closed_keys[] = {"lr", "momentum", "dampening",
                                                                                "weight_decay"};
        static const char *const open_names[] = {"optimizer.eps"},
                                 *const closed_names[] = {"optimizer.lr", "optimizer.momentum",
                                                          "optimizer.dampening", "optimizer.weight_decay"};
        for (int i = 0; i < 1; i++) {
            v = ve = NULL;
            int st = member(o, oe, open_keys[i], &v, &ve);
            if (st < 0 || (st == 0 && parse_num(v, ve, 0.0, 1, MAX_SETTING)))
                return refuse(why, open_names[i], "a finite number in (0, 3.4e38] (a float32)", v, ve);
        }
        for (int i = 0; i < 4; i++) {
            v = ve = NULL;
            int st = member(o, oe, closed_keys[i], &v, &ve);
            if (st < 0 || (st == 0 && parse_num(v, ve, 0.0, 0, MAX_SETTING)))
                return refuse(why, closed_names[i], "a finite number in [0, 3.4e38] (a float32)", v, ve);
        }
        v = ve = NULL;
        int st = member(o, oe, "betas", &v, &ve);
        if (st < 0) return refuse(why, "optimizer.betas", "two finite numbers in [0, 1)", v, ve);
        if (st == 0) {   /* [b1, b2] */
            const char *p = skip_ws(v + 1, ve), *c = p;
            while (c < ve && *c != ',') c++;
            const char *q = c < ve ? skip_ws(c + 1, ve) : ve, *r = q;
            while (r < ve && *r != ']' && *r != ' ') r++;
            const char *ce = c;
            while (ce > p && ce[-1] == ' ') ce--;
            if (*v != '[' || c >= ve || parse_num(p, ce, 0.0, 0, 0.9999999999999999) ||
                parse_num(q, r, 0.0, 0, 0.9999999999999999) || skip_ws(r, ve) != ve - 1)
                return refuse(why, "optimizer.betas", "two finite numbers in [0, 1)", v, ve);
        }
    }
    return PORT_OK;
}

int port_rt_read_checkpoint(port_rt *rt, const uint8_t *ck, uint64_t n) {
    int st = port_rt_check_checkpoint(rt, ck, n, NULL);
    if (st != PORT_OK) return st;
    uint64_t hl, step, counter, seed;
    memcpy(&hl, ck + 12, 8);
    const char *j = (const char *)ck + CK_PREFIX, *end = j + hl, *v, *ve, *o, *oe;
    /* checked above: present and in range */
    if (member(j, end, "step", &v, &ve) || parse_int(v, ve, 0, MAX_COUNT, &step) ||
        member(j, end, "rng", &o, &oe) || member(o, oe, "dropout_counter", &v, &ve) ||
        parse_int(v, ve, 0, MAX_COUNT, &counter) || member(o, oe, "seed", &v, &ve) ||
        parse_int(v, ve, INT64_MIN, UINT64_MAX, &seed))
        return PORT_RT_ERR_CHECKPOINT;
    uint64_t data0 = CK_PREFIX + hl + pad64(CK_PREFIX + hl);
    for (uint32_t i = 0; i < rt->ckpt_n; i++) {
        const int64_t *e = rt->ckpt_table + 3 * i;
        memcpy(rt->arena + e[0], ck + data0 + e[2], (size_t)e[1]);
    }
    rt->state.step = (int64_t)step;
    rt->state.dropout_counter = (int64_t)counter;
    rt->state.seed = seed;
    return PORT_OK;
}
