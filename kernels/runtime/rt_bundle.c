/* port-rt: load a bundle into the caller's arena, run training steps and evaluation.  No allocation, no
 * global state, nothing printed.  Layout of a bundle: port_rt.h. */
#include "port_rt.h"

#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#define PORT_RT_POSIX 1
#endif

#define PORT_RT_MAXU(a, b) ((a) > (b) ? (a) : (b))
#define PORT_RT_MINU(a, b) ((a) < (b) ? (a) : (b))
#define CALL_BYTES 288
#define STATE_BYTES 88

_Static_assert(sizeof(port_rt_call) == CALL_BYTES, "port_rt_call must be 288 bytes with no padding");
_Static_assert(sizeof(port_rt_state) == STATE_BYTES, "port_rt_state must be 88 bytes with no padding");

static uint64_t u64(const uint8_t *b, size_t off) {
    uint64_t v;
    memcpy(&v, b + off, 8);
    return v;
}
static int64_t i64(const uint8_t *b, size_t off) {
    int64_t v;
    memcpy(&v, b + off, 8);
    return v;
}
static uint32_t u32(const uint8_t *b, size_t off) {
    uint32_t v;
    memcpy(&v, b + off, 4);
    return v;
}

/* [off, off+n) inside [0, limit) */
static int inside(int64_t off, int64_t n, uint64_t limit) {
    return off >= 0 && n >= 0 && (uint64_t)off <= limit && (uint64_t)n <= limit - (uint64_t)off;
}

/* the bundle's run state (header bytes 176..264): the optimizer and its settings, the counters */
static const char *bad_state(const port_rt_state *s) {
    if (s->optimizer < 0 || s->optimizer > PORT_RT_OPT_ADAMW) return "run state: unknown optimizer";
    if (s->nesterov != 0 && s->nesterov != 1) return "run state: nesterov must be 0 or 1";
    /* at most FLT_MAX: the kernels take these settings as floats (a larger finite double is inf there) */
    const double v[5] = {s->lr, s->momentum, s->dampening, s->weight_decay, s->eps};
    for (int i = 0; i < 5; i++)
        if (!isfinite(v[i]) || v[i] < 0.0 || v[i] > PORT_RT_MAX_SETTING)
            return "run state: lr, momentum, dampening, weight decay and eps must be finite, in [0, 3.4e38]";
    if (!(s->beta1 >= 0.0 && s->beta1 < 1.0 && s->beta2 >= 0.0 && s->beta2 < 1.0))
        return "run state: AdamW betas must lie in [0, 1)";
    if (s->step < 0 || s->dropout_counter < 0) return "run state: negative step or dropout counter";
    return NULL;
}

/* the header or a section is wrong: why says which rule */
#define REFUSE(text)                                                     \
    do {                                                                 \
        if (why) {                                                       \
            why->call = -1;                                              \
            why->kernel = 0;                                             \
            why->field = "header";                                       \
            why->what = (text);                                          \
            why->value = why->bytes = why->limit = 0;                    \
        }                                                                \
        return PORT_RT_ERR_BUNDLE;                                       \
    } while (0)

int port_rt_bundle_check_why(const uint8_t *b, uint64_t n, uint64_t *arena_bytes, port_rt_call_problem *why) {
    if (!b) return PORT_ERR_NULL;
    if (n < PORT_RT_HEADER_BYTES + 32) REFUSE("shorter than a header and a checksum");
    if (memcmp(b, "PORTRTB\0", 8) != 0) REFUSE("wrong magic (not a port-rt bundle)");
    uint32_t ver = u32(b, 8);
    if ((ver < 1 || ver > PORT_RT_BUNDLE_VERSION) || u32(b, 12) != PORT_RT_HEADER_BYTES)
        REFUSE("unknown format version or header size");
    for (size_t z = ver == 1 ? 424 : ver == 2 ? 440 : 456; z < PORT_RT_HEADER_BYTES; z++)   /* reserved: zero */
        if (b[z]) REFUSE("reserved header bytes are not zero");
    if (u64(b, 16) != n) REFUSE("the size field differs from the file size");
    uint8_t h[32];
    port_sha256(h, b, n - 32);
    if (memcmp(h, b + n - 32, 32) != 0) REFUSE("SHA-256 checksum mismatch (a damaged or truncated file)");
    uint64_t A = u64(b, 24), P = u64(b, 32), body = n - 32;
    if (A == 0 || P > A || A > ((uint64_t)1 << 62)) REFUSE("arena or persistent bytes out of range");
    uint32_t flags = u32(b, 76);
    if (flags & ~(uint32_t)(PORT_RT_FLAG_NO_IMAGE | PORT_RT_FLAG_IGNORE_INDEX)) REFUSE("unknown header flags");
    if (ver == 1 && (flags & PORT_RT_FLAG_IGNORE_INDEX)) REFUSE("unknown header flags");
    uint32_t dtype = u32(b, 424);
    int64_t L = u32(b, 428) ? (int64_t)u32(b, 428) : 1;
    if (dtype != PORT_RT_INPUT_F32 && dtype != PORT_RT_INPUT_I64) REFUSE("unknown input dtype");
    if (!(flags & PORT_RT_FLAG_NO_IMAGE) && !inside((int64_t)u64(b, 40), (int64_t)P, body))
        REFUSE("the persistent image lies outside the file");
    uint64_t nc = (uint64_t)u32(b, 56) + u32(b, 60), co = u64(b, 48);
    if (co % 8 || !inside((int64_t)co, (int64_t)(nc * CALL_BYTES), body))
        REFUSE("the call table lies outside the file");
    uint64_t zo = u64(b, 64), nz = u32(b, 72);
    if (zo % 8 || !inside((int64_t)zo, (int64_t)(nz * 16), body)) REFUSE("the zero ranges lie outside the file");
    for (uint64_t i = 0; i < nz; i++)
        if (!inside(i64(b, zo + 16 * i), i64(b, zo + 16 * i + 8), A)) REFUSE("a zero range lies outside the arena");
    int64_t batch = i64(b, 128), classes = i64(b, 136);
    if (batch <= 0 || classes <= 0 || batch > ((int64_t)1 << 31) || classes > ((int64_t)1 << 31) ||
        L > ((int64_t)1 << 24) || batch * L > ((int64_t)1 << 31))
        REFUSE("batch, classes or labels per sample out of range");
    int64_t rows = batch * L, esz = dtype == PORT_RT_INPUT_I64 ? 8 : 4;
    if (rows > ((int64_t)1 << 62) / 4 / classes) REFUSE("batch, classes or labels per sample out of range");
    if (!inside(i64(b, 80), i64(b, 88), A) || i64(b, 88) <= 0 || i64(b, 88) % (batch * esz) ||
        !inside(i64(b, 96), i64(b, 104), A) || i64(b, 104) != rows * 8 || !inside(i64(b, 112), 4, A) ||
        !inside(i64(b, 120), rows * classes * 4, A) || !inside(i64(b, 144), i64(b, 88), A) ||
        !inside(i64(b, 152), rows * classes * 4, A) || (i64(b, 160) != -1 && !inside(i64(b, 160), 4, A)) ||
        (i64(b, 168) != -1 && !inside(i64(b, 168), rows * 8, A)))
        REFUSE("an input, label, loss or logits slot lies outside the arena");
    if (i64(b, 80) % esz || i64(b, 96) % 8 || i64(b, 112) % 4 || i64(b, 120) % 4 || i64(b, 144) % esz ||
        i64(b, 152) % 4 || (i64(b, 160) != -1 && i64(b, 160) % 4) || (i64(b, 168) != -1 && i64(b, 168) % 8))
        REFUSE("an input, label, loss or logits slot is not aligned to its element size");
    if (ver == 3) {   /* the extra inputs: each a whole batch inside the arena, aligned to its element size */
        uint64_t k = u32(b, 440), to = u64(b, 448);
        if (k < 1 || k > PORT_RT_MAX_EXTRA_INPUTS || u32(b, 444)) REFUSE("extra inputs: count out of range");
        if (to % 8 || to < PORT_RT_HEADER_BYTES || !inside((int64_t)to, (int64_t)(32 * k), body))
            REFUSE("the extra-input table lies outside the file");
        for (uint64_t i = 0; i < k; i++) {
            int64_t off = i64(b, to + 32 * i), eoff = i64(b, to + 32 * i + 8), nb = i64(b, to + 32 * i + 16);
            uint32_t dt = u32(b, to + 32 * i + 24);
            if ((dt != PORT_RT_INPUT_F32 && dt != PORT_RT_INPUT_I64) || u32(b, to + 32 * i + 28))
                REFUSE("extra inputs: unknown dtype");
            int64_t e = dt == PORT_RT_INPUT_I64 ? 8 : 4;
            if (nb <= 0 || nb % (batch * e) || !inside(off, nb, A) || !inside(eoff, nb, A))
                REFUSE("an extra input's slot lies outside the arena");
            if (off % e || eoff % e) REFUSE("an extra input's slot is not aligned to its element size");
        }
    }
    port_rt_state state;
    memcpy(&state, b + 176, STATE_BYTES);
    const char *bs = bad_state(&state);
    if (bs) REFUSE(bs);
    uint64_t ko = u64(b, 392);
    if (ko) {   /* the checkpoint template */
        uint64_t kn = u32(b, 400), fl = u32(b, 404), tl = u32(b, 408), db = u64(b, 416);
        if (ko % 8 || !inside((int64_t)ko, (int64_t)(kn * 24 + fl + tl), body) || db > ((uint64_t)1 << 62))
            REFUSE("the checkpoint template lies outside the file");
        for (uint64_t i = 0; i < kn; i++) {
            int64_t ao = i64(b, ko + 24 * i), nb = i64(b, ko + 24 * i + 8), dof = i64(b, ko + 24 * i + 16);
            if (!inside(ao, nb, P) || !inside(dof, nb, db)) REFUSE("a checkpointed tensor lies outside its region");
        }
    }
    for (uint64_t i = 0; i < nc; i++) {   /* every call: the call rule (rt_check.c) */
        port_rt_call c;
        memcpy(&c, b + co + i * CALL_BYTES, CALL_BYTES);
        if (port_rt_call_check(&c, A, P, why) != PORT_OK) {
            if (why) why->call = (int32_t)i;
            return PORT_RT_ERR_BUNDLE;
        }
    }
    if (arena_bytes) *arena_bytes = A;
    return PORT_OK;
}

int port_rt_bundle_check(const uint8_t *b, uint64_t n, uint64_t *arena_bytes) {
    return port_rt_bundle_check_why(b, n, arena_bytes, NULL);
}

int port_rt_load(port_rt *rt, const uint8_t *b, uint64_t n, uint8_t *arena, uint64_t arena_bytes) {
    if (!rt || !b || !arena) return PORT_ERR_NULL;
    uint64_t A = 0;
    int st = port_rt_bundle_check(b, n, &A);
    if (st != PORT_OK) return st;
    if (((uintptr_t)b) % 8) return PORT_RT_ERR_BUNDLE;   /* the call table is read in place */
    if (arena_bytes < A || ((uintptr_t)arena) % 64) return PORT_RT_ERR_ARENA;
    memset(rt, 0, sizeof *rt);
    rt->bundle = b;
    rt->bundle_bytes = n;
    rt->arena = arena;
    rt->arena_bytes = A;
    rt->persistent_bytes = u64(b, 32);
    rt->calls = (const port_rt_call *)(const void *)(b + u64(b, 48));
    rt->n_train = u32(b, 56);
    rt->n_eval = u32(b, 60);
    rt->zero = (const int64_t *)(const void *)(b + u64(b, 64));
    rt->n_zero = u32(b, 72);
    int64_t *io[12] = {&rt->input_offset, &rt->input_bytes, &rt->label_offset, &rt->label_bytes,
                       &rt->loss_offset, &rt->logits_offset, &rt->batch, &rt->classes, &rt->eval_input_offset,
                       &rt->eval_logits_offset, &rt->eval_loss_offset, &rt->eval_label_offset};
    for (int i = 0; i < 12; i++) *io[i] = i64(b, 80 + 8 * (size_t)i);   /* header bytes 80..176, in order */
    memcpy(&rt->state, b + 176, STATE_BYTES);
    memcpy(rt->graph_digest, b + 264, 64);
    memcpy(rt->plan_digest, b + 328, 64);
    rt->spill_fd = -1;
    rt->failed_call = -1;
    rt->input_dtype = u32(b, 424);
    rt->labels_per_sample = u32(b, 428) ? (int64_t)u32(b, 428) : 1;
    rt->has_ignore_index = (u32(b, 76) & PORT_RT_FLAG_IGNORE_INDEX) != 0;
    rt->ignore_index = rt->has_ignore_index ? i64(b, 432) : 0;
    rt->inputs_bytes = rt->input_bytes;
    if (u32(b, 8) == 3) {
        rt->n_extra_inputs = u32(b, 440);
        rt->extra_inputs = b + u64(b, 448);
        for (uint32_t i = 0; i < rt->n_extra_inputs; i++)
            rt->inputs_bytes += i64(rt->extra_inputs, 32 * (size_t)i + 16);
    }
    uint64_t ko = u64(b, 392);
    if (ko) {
        rt->ckpt_n = u32(b, 400);
        rt->ckpt_fixed_len = u32(b, 404);
        rt->ckpt_tensors_len = u32(b, 408);
        rt->ckpt_data_bytes = u64(b, 416);
        rt->ckpt_table = (const int64_t *)(const void *)(b + ko);
        rt->ckpt_fixed = (const char *)(b + ko + 24 * (uint64_t)rt->ckpt_n);
        rt->ckpt_tensors = rt->ckpt_fixed + rt->ckpt_fixed_len;
    }
    if (!(u32(b, 76) & PORT_RT_FLAG_NO_IMAGE)) {   /* else the arena already holds the persistent state */
        memset(arena, 0, (size_t)A);
        memcpy(arena, b + u64(b, 40), (size_t)rt->persistent_bytes);
    }
    return PORT_OK;
}

static int page(port_rt *rt, const port_rt_call *c) {
#ifdef PORT_RT_POSIX
    if (rt->spill_fd < 0) return PORT_RT_ERR_PAGING;
    uint8_t *p = rt->arena + c->ptr[0];
    size_t left = (size_t)c->iv[0];
    off_t at = (off_t)c->iv[1];
    while (left) {
        ssize_t k = c->kernel == PORT_RT_PAGE_OUT ? pwrite(rt->spill_fd, p, left, at)
                                                  : pread(rt->spill_fd, p, left, at);
        if (k <= 0) return PORT_RT_ERR_PAGING;
        p += k;
        at += k;
        left -= (size_t)k;
    }
    return PORT_OK;
#else
    (void)rt; (void)c;
    return PORT_RT_ERR_PAGING;
#endif
}

static int run_call(port_rt *rt, uint32_t i) {
    const port_rt_call *c = &rt->calls[i];
    uint8_t *a = rt->arena;
    for (int z = 0; z < 2; z++)
        if (c->zero_bytes[z]) memset(a + c->zero_offset[z], 0, (size_t)c->zero_bytes[z]);
    int st;
    if (c->kernel == PORT_RT_PAGE_OUT || c->kernel == PORT_RT_PAGE_IN) {
        st = page(rt, c);
    } else {
        void *ptrs[PORT_RT_MAX_PTRS];
        for (int k = 0; k < PORT_RT_MAX_PTRS; k++) ptrs[k] = c->ptr[k] < 0 ? NULL : a + c->ptr[k];
        st = port_rt_exec(c, ptrs, c->ws_bytes ? a + c->ws_offset : NULL, &rt->state);
    }
    if (st != PORT_OK) rt->failed_call = (int32_t)i;
    return st;
}

#ifdef _OPENMP
/* The calling thread's share [lo, hi) of total units cut evenly over its team */
static void team_share(uint64_t total, uint64_t *lo, uint64_t *hi) {
    uint64_t nt = (uint64_t)omp_get_num_threads(), id = (uint64_t)omp_get_thread_num();
    *lo = total * id / nt;
    *hi = total * (id + 1) / nt;
}
#endif

/* The step's gradient zeroing: byte ranges of the arena (the persistent gradients), cut evenly over the threads
 * when they add up to 1 MiB or more (one thread's memset reaches about half the machine's write bandwidth). */
static void zero_grads(port_rt *rt) {
    uint8_t *a = rt->arena;
    uint64_t total = 0;
    for (uint32_t z = 0; z < rt->n_zero; z++) total += rt->zero[2 * z + 1];
#ifdef _OPENMP
    if (total >= ((uint64_t)1 << 20) && omp_get_max_threads() > 1 && omp_get_level() == 0) {
#pragma omp parallel
        {
            uint64_t lo, hi, base = 0;
            team_share(total, &lo, &hi);
            for (uint32_t z = 0; z < rt->n_zero && base < hi; z++) {
                uint64_t n = rt->zero[2 * z + 1], s0 = PORT_RT_MAXU(lo, base), s1 = PORT_RT_MINU(hi, base + n);
                if (s0 < s1) memset(a + rt->zero[2 * z] + (s0 - base), 0, (size_t)(s1 - s0));
                base += n;
            }
        }
        return;
    }
#endif
    (void)total;
    for (uint32_t z = 0; z < rt->n_zero; z++) memset(a + rt->zero[2 * z], 0, (size_t)rt->zero[2 * z + 1]);
}

/* The late optimizer updates as one pass: they are element-wise (SGD, AdamW: element j of a parameter, its
 * gradient and its state buffers alone give element j's update), so the concatenation of their elements is cut
 * evenly over the threads and each thread runs the kernels on its sub-ranges -- the same bits as call by call,
 * without a parallel region per parameter (62 for ResNet-18, most of them too small to split) or the threads'
 * imbalance on the large ones.  PORT_RT_SERIAL where a late call is anything else (the caller runs them one by
 * one); else the status (the lowest failing call in rt->failed_call). */
#define PORT_RT_SERIAL (-1)
static int update_span(port_rt *rt, uint32_t i, int64_t off, int64_t len) {
    port_rt_call c = rt->calls[i];
    void *ptrs[PORT_RT_MAX_PTRS];
    c.iv[0] = len;
    for (int k = 0; k < PORT_RT_MAX_PTRS; k++)
        ptrs[k] = c.ptr[k] < 0 ? NULL : rt->arena + c.ptr[k] + (uint64_t)off * sizeof(float);
    return port_rt_exec(&c, ptrs, NULL, &rt->state);
}

static int updates_one_pass(port_rt *rt) {
#ifdef _OPENMP
    uint64_t total = 0;
    for (uint32_t i = 0; i < rt->n_train; i++) {
        const port_rt_call *c = &rt->calls[i];
        if (!(c->flags & PORT_RT_LATE_UPDATE)) continue;
        if ((c->kernel != PORT_RT_SGD_STEP && c->kernel != PORT_RT_ADAMW_STEP) || c->ws_bytes || c->zero_bytes[0] ||
            c->zero_bytes[1] || c->iv[0] < 0)
            return PORT_RT_SERIAL;
        total += (uint64_t)c->iv[0];
    }
    if (total < ((uint64_t)1 << 16) || omp_get_max_threads() < 2 || omp_get_level() > 0) return PORT_RT_SERIAL;
    int64_t failed = -1;
    int status = PORT_OK;
#pragma omp parallel
    {
        uint64_t lo, hi, base = 0;
        team_share(total, &lo, &hi);
        for (uint32_t i = 0; i < rt->n_train && base < hi; i++) {
            const port_rt_call *c = &rt->calls[i];
            if (!(c->flags & PORT_RT_LATE_UPDATE)) continue;
            uint64_t n = (uint64_t)c->iv[0], s0 = PORT_RT_MAXU(lo, base), s1 = PORT_RT_MINU(hi, base + n);
            if (s0 < s1) {
                int st = update_span(rt, i, (int64_t)(s0 - base), (int64_t)(s1 - s0));
                if (st != PORT_OK) {
#pragma omp critical(port_rt_update_failed)
                    if (failed < 0 || (int64_t)i < failed) { failed = i; status = st; }
                }
            }
            base += n;
        }
    }
    if (failed >= 0) rt->failed_call = (int32_t)failed;
    return status;
#else
    (void)rt;
    return PORT_RT_SERIAL;
#endif
}

static int check_labels(port_rt *rt, const int64_t *y) {
    for (int64_t i = 0; i < rt->batch * rt->labels_per_sample; i++) {
        if ((y[i] < 0 || y[i] >= rt->classes) && !(rt->has_ignore_index && y[i] == rt->ignore_index)) {
            rt->bad_label = y[i];
            rt->bad_label_index = i;
            return PORT_RT_ERR_LABEL;
        }
    }
    return PORT_OK;
}

uint64_t port_rt_struct_bytes(void) { return sizeof(port_rt); }

/* x (inputs_bytes: every input's whole batch, in order) into the training (eval = 0) or evaluation program's
 * input slots */
static void copy_inputs(port_rt *rt, const uint8_t *x, int eval) {
    uint8_t *a = rt->arena;
    memcpy(a + (eval ? rt->eval_input_offset : rt->input_offset), x, (size_t)rt->input_bytes);
    x += rt->input_bytes;
    for (uint32_t i = 0; i < rt->n_extra_inputs; i++) {
        const uint8_t *e = rt->extra_inputs + 32 * (size_t)i;
        int64_t nb = i64(e, 16);
        memcpy(a + i64(e, eval ? 8 : 0), x, (size_t)nb);
        x += nb;
    }
}

int port_rt_forward_backward(port_rt *rt, const void *x, const int64_t *y, float *loss) {
    if (!rt || !rt->arena || !x || !y || !loss) return PORT_ERR_NULL;
    rt->failed_call = -1;
    int st = check_labels(rt, y);
    if (st != PORT_OK) return st;
    uint8_t *a = rt->arena;
    copy_inputs(rt, (const uint8_t *)x, 0);
    memcpy(a + rt->label_offset, y, (size_t)rt->label_bytes);
    zero_grads(rt);
    for (uint32_t i = 0; i < rt->n_train; i++) {
        if (rt->calls[i].flags & PORT_RT_LATE_UPDATE) continue;
        if ((st = run_call(rt, i)) != PORT_OK) return st;
    }
    memcpy(loss, a + rt->loss_offset, 4);
    rt->state.dropout_counter += 1;
    return PORT_OK;
}

int port_rt_update(port_rt *rt) {
    if (!rt || !rt->arena) return PORT_ERR_NULL;
    rt->failed_call = -1;
    int st = updates_one_pass(rt);
    if (st != PORT_RT_SERIAL) {
        if (st != PORT_OK) return st;
        rt->state.step += 1;
        return PORT_OK;
    }
    for (uint32_t i = 0; i < rt->n_train; i++) {
        if (!(rt->calls[i].flags & PORT_RT_LATE_UPDATE)) continue;
        if ((st = run_call(rt, i)) != PORT_OK) return st;
    }
    rt->state.step += 1;
    return PORT_OK;
}

int port_rt_step(port_rt *rt, const void *x, const int64_t *y, float *loss) {
    int st = port_rt_forward_backward(rt, x, y, loss);
    if (st != PORT_OK) return st;
    if (!isfinite(*loss)) return PORT_RT_ERR_NONFINITE;   /* diverged: the update is not applied */
    return port_rt_update(rt);
}

int port_rt_evaluate(port_rt *rt, const void *x, const int64_t *y, float *logits, int64_t *correct) {
    if (!rt || !rt->arena || !x) return PORT_ERR_NULL;
    if (rt->n_eval == 0) return PORT_ERR_UNSUPPORTED;
    rt->failed_call = -1;
    uint8_t *a = rt->arena;
    copy_inputs(rt, (const uint8_t *)x, 1);
    if (y && rt->eval_label_offset >= 0) {   /* an inference program with a loss reads the labels */
        int st = check_labels(rt, y);
        if (st != PORT_OK) return st;
        memcpy(a + rt->eval_label_offset, y, (size_t)rt->label_bytes);
    }
    for (uint32_t i = rt->n_train; i < rt->n_train + rt->n_eval; i++) {
        int st = run_call(rt, i);
        if (st != PORT_OK) return st;
    }
    const float *lg = (const float *)(const void *)(a + rt->eval_logits_offset);
    int64_t rows = rt->batch * rt->labels_per_sample;
    if (logits) memcpy(logits, lg, (size_t)(rows * rt->classes) * 4);
    if (correct) {
        int64_t ok = 0;
        for (int64_t i = 0; y && i < rows; i++) {
            if (rt->has_ignore_index && y[i] == rt->ignore_index) continue;
            int64_t best = 0;
            for (int64_t k = 1; k < rt->classes; k++)
                if (lg[i * rt->classes + k] > lg[i * rt->classes + best]) best = k;
            ok += best == y[i];
        }
        *correct = ok;
    }
    return PORT_OK;
}
