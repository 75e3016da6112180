/* port-rt: train or evaluate a compiled PORT bundle without Python.
 *
 *   port-rt info  BUNDLE [--key FILE [--require-signed]]
 *   port-rt train BUNDLE --data FILE [--steps N] [--threads T] [--gemm blas|vendored] [--spill-dir DIR]
 *                        [--every K] [--checkpoint FILE [--resume]] [--key FILE [--require-signed]]
 *   port-rt eval  BUNDLE --data FILE [--threads T] [--gemm blas|vendored] [--checkpoint FILE]
 *                        [--key FILE [--require-signed]]
 *
 * --checkpoint FILE: train writes it (atomically: a temporary file, fsync, rename, the directory fsync'ed) every
 * --every K steps, after the last step, and when SIGINT or SIGTERM stops it (after the step under way; then it
 * exits 130 / 143 as `port train` does; a second signal stops at once).  Train holds FILE.lock (flock, the
 * holder's PID inside) while it runs: a second train on the same checkpoint exits 2 naming that PID.
 * --resume (train) and eval read the checkpoint first; every header field is range-checked (the key named).
 * Checkpoints are the Python Trainer's format, so `port train --resume` and port-rt continue each other.
 * --threads T: at most max(64, 4 x this machine's online CPUs) (more only slows the barriers; huge counts crash
 * the OpenMP runtime).  --key FILE verifies a signed bundle (`port compile --sign-key FILE`; HMAC-SHA-256, layout
 * in port_rt.h) and warns about an unsigned one; --require-signed (needs --key) refuses unsigned bundles.
 *
 * train prints one line per --every K steps ("step I loss L ms T"), then a summary with the arena size and the
 * process's peak resident memory (VmHWM).  Batches are taken in order from the data file, wrapping around: the
 * batch of step i (counted from the bundle's or checkpoint's step) holds samples (i*B + j) mod n.  Every label
 * (a class index, or the bundle's ignore index) and every token id (below the vocabulary of the embedding that
 * reads it) of the data file is checked before the first step.  Exit codes: 0 ok, 2 bad input (file, bundle,
 * signature, data, arguments, checkpoint in use), 1 a kernel failed, 130 / 143 stopped by SIGINT / SIGTERM.
 * Data file layout: port/exec/bundle.py.  Bundle layout: port_rt.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "port_rt.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void *read_file(const char *path, uint64_t *n) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size <= 0) {
        close(fd);
        return NULL;
    }
    void *buf = NULL;
    if (posix_memalign(&buf, 64, (size_t)sb.st_size) != 0) {
        close(fd);
        return NULL;
    }
    size_t got = 0;
    while (got < (size_t)sb.st_size) {
        ssize_t k = read(fd, (char *)buf + got, (size_t)sb.st_size - got);
        if (k <= 0) {
            free(buf);
            close(fd);
            return NULL;
        }
        got += (size_t)k;
    }
    close(fd);
    *n = (uint64_t)sb.st_size;
    return buf;
}

static long vm_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0) {
            v = strtol(line + kl, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

typedef struct {             /* one further input of every sample (format 3: an attention mask ...) */
    const uint8_t *x;        /* n samples of elems elements of elem_bytes */
    uint64_t elems, elem_bytes;
    uint32_t dtype;
} data_extra_t;

typedef struct {
    const uint8_t *x;        /* n samples of sample_elems elements of elem_bytes (4: float32, 8: int64 ids) */
    const int64_t *y;        /* n x labels labels */
    uint64_t n, sample_elems, elem_bytes, labels, classes, file_bytes;
    uint32_t dtype, has_ignore, n_extra;
    int64_t ignore;
    data_extra_t extra[PORT_RT_MAX_EXTRA_INPUTS];
} data_t;

static int load_data(const char *path, data_t *d, void **owner) {
    uint64_t n = 0;
    uint8_t *b = read_file(path, &n);
    if (!b) {
        fprintf(stderr, "port-rt: cannot read data file %s: %s\n", path, strerror(errno));
        return 2;
    }
    *owner = b;
    uint64_t cnt, shape[4], cls, hb = 64;
    uint32_t ver, rank, dtype = 0, labels = 1, flags = 0, k = 0;
    int64_t ignore = 0;
    if (n < 64 + 32 || memcmp(b, "PORTDATA", 8) != 0) goto bad;
    memcpy(&ver, b + 8, 4);
    memcpy(&rank, b + 12, 4);
    memcpy(&cnt, b + 16, 8);
    memcpy(shape, b + 24, 32);
    memcpy(&cls, b + 56, 8);
    if (ver == 2 || ver == 3) {   /* format 2: a 128-byte header with the x dtype, labels, ignore index */
        if (n < 128 + 32) goto bad;
        hb = 128;
        memcpy(&dtype, b + 64, 4);
        memcpy(&labels, b + 68, 4);
        memcpy(&ignore, b + 72, 8);
        memcpy(&flags, b + 80, 4);
    }
    if (ver == 3) {   /* format 3: a 256-byte header; at 128 the extra inputs' count and {dtype, elements} */
        if (n < 256 + 32) goto bad;
        hb = 256;
        memcpy(&k, b + 128, 4);
        if (k < 1 || k > PORT_RT_MAX_EXTRA_INPUTS) goto bad;
    }
    if (ver < 1 || ver > 3 || rank < 1 || rank > 4 || cnt == 0 || cls == 0 || dtype > 1 || labels == 0 ||
        labels > (1u << 24) || flags > 1 || cnt > ((uint64_t)1 << 40))
        goto bad;
    uint64_t per = 1, esz = dtype ? 8 : 4;
    for (uint32_t i = 0; i < rank; i++) {
        if (shape[i] == 0 || shape[i] > (1u << 30)) goto bad;
        per *= shape[i];
        if (per > ((uint64_t)1 << 40)) goto bad;
    }
    if (per > (n / esz) / cnt) goto bad;
    uint64_t xb = cnt * per * esz, at = hb + xb;   /* at: the end of the sections read so far */
    for (uint32_t i = 0; i < k; i++) {   /* each extra input's samples, 64-byte aligned after the previous */
        uint32_t edt, ez;
        uint64_t el;
        memcpy(&edt, b + 136 + 16 * (size_t)i, 4);
        memcpy(&ez, b + 140 + 16 * (size_t)i, 4);
        memcpy(&el, b + 144 + 16 * (size_t)i, 8);
        uint64_t e = edt ? 8 : 4, start = at + (64 - at % 64) % 64;
        if (edt > 1 || ez || el == 0 || el > ((uint64_t)1 << 40) || el > (n / e) / cnt || start > n ||
            cnt * el * e > n - start)
            goto bad;
        d->extra[i].x = b + start;
        d->extra[i].elems = el;
        d->extra[i].elem_bytes = e;
        d->extra[i].dtype = edt;
        at = start + cnt * el * e;
    }
    uint64_t yoff = at + ((64 - at % 64) % 64);
    if (labels > n / 8 / cnt || yoff > n || cnt * labels * 8 + 32 != n - yoff) goto bad;
    uint8_t h[32];
    port_sha256(h, b, n - 32);
    if (memcmp(h, b + n - 32, 32) != 0) goto bad;
    d->x = b + hb;
    d->y = (const int64_t *)(const void *)(b + yoff);
    d->n = cnt;
    d->sample_elems = per;
    d->elem_bytes = esz;
    d->labels = labels;
    d->classes = cls;
    d->dtype = dtype;
    d->has_ignore = flags & 1;
    d->ignore = ignore;
    d->file_bytes = n;
    d->n_extra = k;
    return 0;
bad:
    fprintf(stderr, "port-rt: %s is not a valid port-rt data file (magic, version, sizes or checksum). Fix: "
                    "write it again with `port compile ... --data` (port.exec.bundle.write_data)\n", path);
    return 2;
}

/* Why the loader refused a bundle: the call (index, kernel), its field, the rule and the values (exit 2). */
static int bundle_refused(const char *path, const uint8_t *bundle, uint64_t bn) {
    port_rt_call_problem why;
    memset(&why, 0, sizeof why);
    why.call = -1;
    port_rt_bundle_check_why(bundle, bn, NULL, &why);
    if (why.call < 0) {
        fprintf(stderr, "port-rt: %s: not a valid bundle: %s. Fix: compile it again with `port compile`\n", path,
                why.what ? why.what : "refused by the loader");
        return 2;
    }
    const char *name = port_rt_kernel_name(why.kernel);
    fprintf(stderr, "port-rt: %s: not a valid bundle: call %d (kernel %d, %s): %s: %s (value %lld, extent %lld "
                    "bytes, bound %lld). Fix: compile it again with `port compile`\n", path, (int)why.call,
            (int)why.kernel, name ? name : "unknown", why.field ? why.field : "?", why.what ? why.what : "refused",
            (long long)why.value, (long long)why.bytes, (long long)why.limit);
    return 2;
}

static const char *rt_error(int st) {
    switch (st) {
    case PORT_RT_ERR_BUNDLE: return "not a valid bundle (magic, version, size, checksum or an offset outside the arena)";
    case PORT_RT_ERR_ARENA: return "the arena is too small or misaligned";
    case PORT_RT_ERR_LABEL: return "a label is not a class index";
    case PORT_RT_ERR_PAGING: return "paging failed (no spill file, or its I/O failed)";
    case PORT_RT_ERR_NONFINITE: return "the loss is not finite (training diverged); the update was not applied";
    default: return port_status_string(st);
    }
}

static void usage(void) {
    fprintf(stderr, "usage: port-rt info BUNDLE [--key FILE [--require-signed]]\n"
                    "       port-rt train BUNDLE --data FILE [--steps N] [--threads T] [--gemm blas|vendored] "
                    "[--spill-dir DIR] [--every K] [--checkpoint FILE [--resume]] [--key FILE [--require-signed]]\n"
                    "       port-rt eval BUNDLE --data FILE [--threads T] [--gemm blas|vendored] "
                    "[--checkpoint FILE] [--key FILE [--require-signed]]\n");
}

/* SIGINT / SIGTERM only set a flag, which the loop checks after each step (the checkpoint it then writes is of
 * a whole step); a second signal stops at once (the previous checkpoint is intact). */
static volatile sig_atomic_t stop_signal = 0, writing_checkpoint = 0;
static char checkpoint_tmp[4200];   /* the temporary file a checkpoint is written to (removed by a second signal) */

static void on_signal(int sig) {
    if (stop_signal) {
        if (writing_checkpoint) unlink(checkpoint_tmp);
        _exit(128 + sig);
    }
    stop_signal = sig;
}

static void catch_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* --threads' ceiling, as port.exec.capi.max_threads: 4 x the online CPUs, at least 64 (past the CPU count threads
 * only wait at barriers; libgomp crashes or hangs trying to start millions) */
static long online_cpus(void) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus > 0 ? cpus : 1;
}

static long max_threads(void) {   /* and never above 1024 (port.exec.capi.MAX_THREADS) */
    long n = 4 * online_cpus() > 64 ? 4 * online_cpus() : 64;
    return n < 1024 ? n : 1024;
}

static void hex8(char *out, const uint8_t *b) {
    for (int i = 0; i < 8; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

#define KEY_MIN 32
#define KEY_MAX 4096

static uint8_t *read_key(const char *path, uint64_t *n) {
    errno = 0;
    uint8_t *k = read_file(path, n);
    if (!k) {
        fprintf(stderr, "port-rt: cannot read the key file %s: %s\n", path, errno ? strerror(errno) : "empty file");
        return NULL;
    }
    if (*n < KEY_MIN || *n > KEY_MAX) {
        fprintf(stderr, "port-rt: key file %s holds %llu bytes: a key is %d to %d bytes. Fix: make one with "
                        "`head -c 32 /dev/urandom > %s` and compile the bundle with `port compile ... --sign-key "
                        "%s`\n", path, (unsigned long long)*n, KEY_MIN, KEY_MAX, path, path);
        free(k);
        return NULL;
    }
    return k;
}

/* The signature checks (port_rt.h: signed bundles): *body is the bundle's own bytes of the file, status says
 * what was checked.  0, or the exit code after a message. */
static int check_signature(const char *bpath, const uint8_t *f, uint64_t n, const char *kpath, const uint8_t *key,
                           uint64_t kn, int require, uint64_t *body, char *status, size_t cap) {
    int is_signed = 0;
    if (port_rt_bundle_split(f, n, body, &is_signed) != PORT_OK) {
        fprintf(stderr, "port-rt: %s: %s. Fix: compile it again with `port compile`\n", bpath,
                rt_error(PORT_RT_ERR_BUNDLE));
        return 2;
    }
    if (!is_signed) {
        if (require) {
            fprintf(stderr, "port-rt: %s is unsigned and --require-signed refuses it (its SHA-256 guards against "
                            "accidents only: anyone can edit a bundle and hash it again). Fix: compile it with "
                            "`port compile ... --sign-key KEYFILE`\n", bpath);
            return 2;
        }
        if (key)
            fprintf(stderr, "port-rt: warning: %s is unsigned: --key %s has nothing to verify (its SHA-256 guards "
                            "against accidents only); --require-signed refuses unsigned bundles\n", bpath, kpath);
        snprintf(status, cap, "unsigned");
        return 0;
    }
    char theirs[17], mine[17];
    hex8(theirs, f + *body + 16);
    if (!key) {
        snprintf(status, cap, "signed (key id %s), not verified (no --key)", theirs);
        return 0;
    }
    uint8_t id[8];
    port_rt_key_id(id, key, kn);
    hex8(mine, id);
    if (port_rt_bundle_verify(f, n, key, kn) != PORT_OK) {
        fprintf(stderr, "port-rt: %s: the signature does not verify with --key %s: ", bpath, kpath);
        if (strcmp(theirs, mine))
            fprintf(stderr, "it was signed with another key (key id %s; this key's id is %s)", theirs, mine);
        else
            fprintf(stderr, "the bundle was changed after it was signed (the key ids match: %s)", mine);
        fprintf(stderr, ". Fix: use the key it was signed with, or compile it again with `port compile ... "
                        "--sign-key KEYFILE`\n");
        return 2;
    }
    snprintf(status, cap, "signed (key id %s), verified", theirs);
    return 0;
}

/* Hold CKPT.lock (flock, non-blocking; released when the process ends) with our PID inside.  0, or 2 after a
 * message naming the holder. */
static int lock_checkpoint(const char *ckpath) {
    char lp[4200];
    snprintf(lp, sizeof lp, "%s.lock", ckpath);
    int fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        fprintf(stderr, "port-rt: cannot create the lock file %s: %s (--checkpoint's directory)\n", lp,
                strerror(errno));
        return 2;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "";
        ssize_t k = pread(fd, pid, sizeof pid - 1, 0);
        pid[k > 0 ? k : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        fprintf(stderr, "port-rt: checkpoint %s is in use: process %s holds %s (another `port-rt train` on this "
                        "checkpoint). Fix: wait for it to end, or train with another --checkpoint\n", ckpath,
                pid[0] ? pid : "(PID not written yet)", lp);
        close(fd);
        return 2;
    }
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len)
        fprintf(stderr, "port-rt: warning: cannot write the PID into %s: %s\n", lp, strerror(errno));
    return 0;   /* fd stays open: the lock is held until exit */
}

/* The checkpoint, atomically: a temporary file beside it, fsync, rename over it, the directory fsync'ed. */
static int save_checkpoint(const port_rt *rt, const char *ckpath, uint8_t *buf, uint64_t cap) {
    uint64_t got = 0;
    if (port_rt_write_checkpoint(rt, buf, cap, &got) != PORT_OK) {
        fprintf(stderr, "port-rt: cannot build the checkpoint (the bundle has no checkpoint template?)\n");
        return 1;
    }
    char *tmp = checkpoint_tmp, dir[4200];
    snprintf(tmp, sizeof checkpoint_tmp, "%s.tmp.%ld", ckpath, (long)getpid());
    writing_checkpoint = 1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    uint64_t off = 0;
    while (fd >= 0 && off < got) {
        ssize_t k = write(fd, buf + off, (size_t)(got - off));
        if (k <= 0) break;
        off += (uint64_t)k;
    }
    if (fd < 0 || off != got || fsync(fd) != 0 || close(fd) != 0 || rename(tmp, ckpath) != 0) {
        fprintf(stderr, "port-rt: cannot write the checkpoint %s: %s\n", ckpath, strerror(errno));
        unlink(tmp);
        writing_checkpoint = 0;
        return 2;
    }
    writing_checkpoint = 0;
    snprintf(dir, sizeof dir, "%s", ckpath);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

/* The vocabulary of the embeddings that read the input token ids (the smallest; 0: none reads them). */
/* The smallest vocabulary of the embeddings that read input j (0: the input at header byte 80, j >= 1: extra input
 * j - 1) in the training or inference program; 0 when none reads it. */
static int64_t input_vocab(const port_rt *rt, uint32_t j) {
    int64_t v = 0, nb = rt->input_bytes, off[2] = {rt->input_offset, rt->eval_input_offset};
    if (j > 0) {
        const uint8_t *e = rt->extra_inputs + 32 * (size_t)(j - 1);
        memcpy(&off[0], e, 8);
        memcpy(&off[1], e + 8, 8);
        memcpy(&nb, e + 16, 8);
    }
    for (uint32_t i = 0; i < rt->n_train + rt->n_eval; i++) {
        const port_rt_call *c = &rt->calls[i];
        int64_t in = off[i >= rt->n_train];
        if ((c->kernel == PORT_RT_EMBEDDING_FORWARD || c->kernel == PORT_RT_EMBEDDING_BACKWARD_WEIGHT)) {
            int64_t ids = c->ptr[c->kernel == PORT_RT_EMBEDDING_FORWARD ? 1 : 2];
            if (ids >= in && ids < in + nb && c->iv[1] > 0 && (v == 0 || c->iv[1] < v)) v = c->iv[1];
        }
    }
    return v;
}

/* Every token id of input j below the vocabulary of the embeddings that read it: 0, or 2 after a message. */
static int check_ids(const char *dpath, const int64_t *ids, uint64_t n, uint64_t per, int64_t vocab, uint32_t j) {
    for (uint64_t i = 0; vocab > 0 && i < n * per; i++) {
        if (ids[i] >= 0 && ids[i] < vocab) continue;
        char which[48] = "";
        if (j) snprintf(which, sizeof which, " (input %u)", j + 1);
        fprintf(stderr, "port-rt: %s: record %llu position %llu%s has token id %lld: the model's embedding takes ids "
                        "0..%lld. Fix: tokenize with the model's vocabulary (%lld ids)\n", dpath,
                (unsigned long long)(i / per), (unsigned long long)(i % per), which, (long long)ids[i],
                (long long)vocab - 1, (long long)vocab);
        return 2;
    }
    return 0;
}

/* Every label a class index (or the bundle's ignore index) and every token id inside the vocabulary, before the
 * first step: 0, or 2 after a message naming the data file, the record and the value. */
static int check_data(const char *dpath, const data_t *d, const port_rt *rt) {
    for (uint64_t i = 0; i < d->n * d->labels; i++) {
        int64_t y = d->y[i];
        if ((y >= 0 && y < rt->classes) || (rt->has_ignore_index && y == rt->ignore_index)) continue;
        char at[64] = "", ign[64] = "";
        if (d->labels > 1) snprintf(at, sizeof at, " position %llu", (unsigned long long)(i % d->labels));
        if (rt->has_ignore_index) snprintf(ign, sizeof ign, " or the ignore index %lld", (long long)rt->ignore_index);
        fprintf(stderr, "port-rt: %s: record %llu%s has label %lld: not a class index 0..%lld%s. Fix: write the "
                        "data again with labels in range (port.exec.bundle.write_data checks them)\n", dpath,
                (unsigned long long)(i / d->labels), at, (long long)y, (long long)rt->classes - 1, ign);
        return 2;
    }
    int st = d->dtype == PORT_RT_INPUT_I64 ?
        check_ids(dpath, (const int64_t *)(const void *)d->x, d->n, d->sample_elems, input_vocab(rt, 0), 0) : 0;
    for (uint32_t j = 0; !st && j < d->n_extra; j++)
        if (d->extra[j].dtype == PORT_RT_INPUT_I64)
            st = check_ids(dpath, (const int64_t *)(const void *)d->extra[j].x, d->n, d->extra[j].elems,
                           input_vocab(rt, j + 1), j + 1);
    return st;
}

static int read_checkpoint(port_rt *rt, const char *ckpath) {
    uint64_t cn = 0;
    uint8_t *ck = read_file(ckpath, &cn);
    if (!ck) {
        fprintf(stderr, "port-rt: cannot read checkpoint %s: %s\n", ckpath, strerror(errno));
        return 2;
    }
    port_rt_ckpt_problem why = {0};
    int st = port_rt_check_checkpoint(rt, ck, cn, &why);
    if (st == PORT_OK) st = port_rt_read_checkpoint(rt, ck, cn);
    if (st != PORT_OK) {
        fprintf(stderr, "port-rt: %s is not a checkpoint of this bundle: %s%s%.*s%s: expected %s. Fix: train "
                        "without --resume, or use the checkpoint this bundle's model wrote\n", ckpath,
                why.key ? why.key : "status", why.value ? " = " : "", (int)why.value_bytes,
                why.value ? why.value : "", why.value_bytes == 80 ? "..." : "", why.want ? why.want : "a checkpoint");
        free(ck);
        return 2;
    }
    free(ck);
    printf("resumed from %s at step %lld\n", ckpath, (long long)rt->state.step);
    return 0;
}

int main(int argc, char **argv) {
#if defined(PORT_HAVE_OPENBLAS) && defined(__linux__)
    /* OpenBLAS starts its pthread pool when it loads, before main: its threads spin for a while (~0.1 s per
     * start) against the OpenMP workers, and port__gemm runs OpenBLAS single-threaded anyway.  Without
     * OPENBLAS_NUM_THREADS in the environment, set it to 1 and run again so no pool is created (a failed exec
     * just goes on). */
    if (!getenv("OPENBLAS_NUM_THREADS") && setenv("OPENBLAS_NUM_THREADS", "1", 1) == 0)
        execv("/proc/self/exe", argv);
#endif
    catch_signals();
    if (argc < 3) {
        usage();
        return 2;
    }
    const char *cmd = argv[1], *bpath = argv[2], *dpath = NULL, *spill_dir = "/tmp", *ckpath = NULL, *kpath = NULL;
    int resume = 0, require_signed = 0;
    long steps = 10, threads = 0, every = 1;
    int gemm = -1;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--resume")) {
            resume = 1;
            continue;
        }
        if (!strcmp(a, "--require-signed")) {
            require_signed = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "port-rt: option %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--data")) dpath = v;
        else if (!strcmp(a, "--checkpoint")) ckpath = v;
        else if (!strcmp(a, "--spill-dir")) spill_dir = v;
        else if (!strcmp(a, "--key")) kpath = v;
        else if (!strcmp(a, "--gemm")) {
            if (!strcmp(v, "blas")) gemm = PORT_GEMM_BLAS;
            else if (!strcmp(v, "vendored")) gemm = PORT_GEMM_VENDORED;
            else {
                fprintf(stderr, "port-rt: --gemm %s: expected blas or vendored\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--steps") || !strcmp(a, "--threads") || !strcmp(a, "--every")) {
            errno = 0;
            long x = strtol(v, &end, 10);
            if (!*v || *end || errno || x < (strcmp(a, "--threads") ? 1 : 0) || x > 100000000) {
                fprintf(stderr, "port-rt: %s %s: expected a positive integer\n", a, v);
                return 2;
            }
            if (!strcmp(a, "--steps")) steps = x;
            else if (!strcmp(a, "--threads")) threads = x;
            else every = x;
        } else {
            fprintf(stderr, "port-rt: unknown option %s\n", a);
            usage();
            return 2;
        }
        i++;
    }
    if (strcmp(cmd, "info") && strcmp(cmd, "train") && strcmp(cmd, "eval")) {
        usage();
        return 2;
    }
    if (threads > max_threads()) {
        fprintf(stderr, "port-rt: --threads %ld: at most %ld (the larger of 64 and 4 x this machine's %ld online "
                        "CPUs; past the CPU count threads only wait at barriers). Fix: --threads %ld or fewer, or 0 "
                        "for the default\n", threads, max_threads(), online_cpus(), online_cpus());
        return 2;
    }
    if (require_signed && !kpath) {
        fprintf(stderr, "port-rt: --require-signed needs --key FILE (the key the bundle was signed with: `port "
                        "compile ... --sign-key FILE`)\n");
        return 2;
    }
    if (ckpath && strlen(ckpath) > 4000) {
        fprintf(stderr, "port-rt: --checkpoint: a path of at most 4000 bytes\n");
        return 2;
    }
    if (threads > 0) port_set_num_threads((int)threads);
    if (gemm >= 0 && port_set_gemm_backend(gemm) != PORT_OK) {
        fprintf(stderr, "port-rt: --gemm blas: this build has no BLAS (built without OpenBLAS)\n");
        return 2;
    }
    uint64_t fn = 0, bn = 0, kn = 0;
    uint8_t *bundle = read_file(bpath, &fn), *key = NULL;
    if (!bundle) {
        fprintf(stderr, "port-rt: cannot read bundle %s: %s\n", bpath, strerror(errno));
        return 2;
    }
    if (kpath && !(key = read_key(kpath, &kn))) return 2;
    char sig[128];
    int st = check_signature(bpath, bundle, fn, kpath, key, kn, require_signed, &bn, sig, sizeof sig);
    if (st) return st;
    uint64_t A = 0;
    st = port_rt_bundle_check(bundle, bn, &A);
    if (st != PORT_OK) {
        if (st == PORT_RT_ERR_BUNDLE) return bundle_refused(bpath, bundle, bn);   /* names the call and its rule */
        fprintf(stderr, "port-rt: %s: %s. Fix: compile it again with `port compile`\n", bpath, rt_error(st));
        return 2;
    }
    void *arena = NULL;
    if (posix_memalign(&arena, 64, (size_t)A) != 0) {
        fprintf(stderr, "port-rt: cannot allocate the %llu-byte arena\n", (unsigned long long)A);
        return 1;
    }
    port_rt rt;
    if ((st = port_rt_load(&rt, bundle, bn, arena, A)) != PORT_OK) {
        fprintf(stderr, "port-rt: loading %s: %s\n", bpath, rt_error(st));
        return 2;
    }
    if (!strcmp(cmd, "info")) {
        printf("bundle %s: %llu bytes, arena %llu bytes (persistent %llu), %u training calls, %u inference "
               "calls, batch %lld, %lld classes, step %lld, graph %.16s, plan %.16s, %s\n",
               bpath, (unsigned long long)bn, (unsigned long long)A, (unsigned long long)rt.persistent_bytes,
               rt.n_train, rt.n_eval, (long long)rt.batch, (long long)rt.classes, (long long)rt.state.step,
               rt.graph_digest, rt.plan_digest, sig);
        return 0;
    }
    if (!dpath) {
        fprintf(stderr, "port-rt: %s needs --data FILE\n", cmd);
        return 2;
    }
    if (resume && !ckpath) {
        fprintf(stderr, "port-rt: --resume needs --checkpoint FILE\n");
        return 2;
    }
    int train = !strcmp(cmd, "train");
    if (ckpath && train && (st = lock_checkpoint(ckpath)) != 0) return st;
    if (ckpath && (resume || !train) && (st = read_checkpoint(&rt, ckpath)) != 0) return st;
    data_t d;
    void *downer = NULL;
    if ((st = load_data(dpath, &d, &downer)) != 0) return st;
    uint64_t B = (uint64_t)rt.batch, L = (uint64_t)rt.labels_per_sample;
    uint64_t sample_bytes = d.sample_elems * d.elem_bytes;
    if (d.dtype != rt.input_dtype || sample_bytes * B != (uint64_t)rt.input_bytes || d.classes != (uint64_t)rt.classes ||
        d.labels != L || (rt.has_ignore_index && d.has_ignore && d.ignore != rt.ignore_index)) {
        fprintf(stderr, "port-rt: %s holds samples of %llu %s, %llu label(s) each, %llu classes; the bundle takes "
                        "%lld %s per sample, %lld label(s) each, %lld classes. Fix: write the data for this bundle's "
                        "model (port.exec.bundle.write_data)\n", dpath, (unsigned long long)d.sample_elems,
                d.dtype ? "token ids" : "floats", (unsigned long long)d.labels, (unsigned long long)d.classes,
                (long long)(rt.input_bytes / (rt.input_dtype ? 8 : 4) / rt.batch),
                rt.input_dtype ? "token ids" : "floats", (long long)L, (long long)rt.classes);
        return 2;
    }
    int extras_fit = d.n_extra == rt.n_extra_inputs;
    for (uint32_t j = 0; extras_fit && j < d.n_extra; j++) {
        const uint8_t *e = rt.extra_inputs + 32 * (size_t)j;
        int64_t nb;
        uint32_t dt;
        memcpy(&nb, e + 16, 8);
        memcpy(&dt, e + 24, 4);
        extras_fit = dt == d.extra[j].dtype && d.extra[j].elems * d.extra[j].elem_bytes * B == (uint64_t)nb;
    }
    if (!extras_fit) {
        fprintf(stderr, "port-rt: %s holds %u input(s) a sample; the bundle's model takes %u (or their dtypes or "
                        "sizes differ). Fix: write the data with every input the model takes, in its order "
                        "(port.exec.bundle.write_data(path, (input_ids, attention_mask), y, ...))\n", dpath,
                d.n_extra + 1, rt.n_extra_inputs + 1);
        return 2;
    }
    if ((st = check_data(dpath, &d, &rt)) != 0) return st;
    uint8_t *xb = NULL, *ckbuf = NULL;
    float *logits = NULL;
    int64_t *yb = NULL;
    uint64_t ckcap = ckpath && train ? port_rt_checkpoint_bytes(&rt) : 0;
    if (ckpath && train && !ckcap) {
        fprintf(stderr, "port-rt: %s has no checkpoint template: compile it again with `port compile` to "
                        "checkpoint\n", bpath);
        return 2;
    }
    if (posix_memalign((void **)&xb, 64, (size_t)rt.inputs_bytes) || posix_memalign((void **)&yb, 64, B * L * 8) ||
        posix_memalign((void **)&logits, 64, B * L * (uint64_t)rt.classes * 4) ||
        (ckcap && !(ckbuf = malloc((size_t)ckcap)))) {
        fprintf(stderr, "port-rt: out of memory for one batch\n");
        return 1;
    }
    char spill_path[4096] = "";
    int has_pages = 0;
    for (uint32_t i = 0; i < rt.n_train; i++) has_pages |= rt.calls[i].kernel == PORT_RT_PAGE_OUT;
    if (has_pages) {
        snprintf(spill_path, sizeof spill_path, "%s/port-rt-spill-%ld.bin", spill_dir, (long)getpid());
        rt.spill_fd = open(spill_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (rt.spill_fd < 0) {
            fprintf(stderr, "port-rt: cannot create the spill file %s: %s (--spill-dir)\n", spill_path,
                    strerror(errno));
            return 2;
        }
        unlink(spill_path);   /* deleted on open: gone when the process ends */
    }
    long n_batches = !train ? (long)((d.n + B - 1) / B) : steps, done = 0;
    double total_ms = 0.0;
    int64_t correct = 0, seen = 0, saved = -1;
    double nll = 0.0;         /* eval: the counted rows' summed cross-entropy (nats) */
    int64_t step0 = !train ? 0 : rt.state.step;
    for (long s = 0; s < n_batches && !stop_signal; s++) {
        for (uint64_t j = 0; j < B; j++) {
            uint64_t k = ((uint64_t)(step0 + s) * B + j) % d.n;
            memcpy(xb + j * sample_bytes, d.x + k * sample_bytes, sample_bytes);
            memcpy(yb + j * L, d.y + k * L, L * 8);
            uint8_t *at = xb + B * sample_bytes;   /* the extra inputs' batches follow the first's, in order */
            for (uint32_t e = 0; e < d.n_extra; e++) {
                uint64_t eb = d.extra[e].elems * d.extra[e].elem_bytes;
                memcpy(at + j * eb, d.extra[e].x + k * eb, eb);
                at += B * eb;
            }
        }
        double t0 = now_ms();
        float loss = 0.0f;
        st = !train ? port_rt_evaluate(&rt, xb, yb, logits, NULL) : port_rt_step(&rt, xb, yb, &loss);
        double ms = now_ms() - t0;
        if (st != PORT_OK) {
            if (st == PORT_RT_ERR_LABEL)
                fprintf(stderr, "port-rt: batch %ld: label %lld at index %lld is not a class index (0..%lld)\n", s,
                        (long long)rt.bad_label, (long long)rt.bad_label_index, (long long)rt.classes - 1);
            else
                fprintf(stderr, "port-rt: batch %ld: %s%s%d\n", s, rt_error(st),
                        rt.failed_call >= 0 ? " at call " : "", rt.failed_call);
            return st == PORT_RT_ERR_LABEL || st == PORT_RT_ERR_NONFINITE ? 2 : 1;
        }
        total_ms += ms;
        done = s + 1;
        if (!train) {
            /* the last batch wraps around: only the samples not seen yet count; rows (samples, or tokens of a
             * sequence model) whose label is the ignore index do not count */
            uint64_t valid = (uint64_t)s * B + B <= d.n ? B : d.n - (uint64_t)s * B;
            for (uint64_t r = 0; r < valid * L; r++) {
                if (rt.has_ignore_index && yb[r] == rt.ignore_index) continue;
                const float *z = logits + r * rt.classes;
                int64_t best = 0;
                for (int64_t c = 1; c < rt.classes; c++)
                    if (z[c] > z[best]) best = c;
                double sum = 0.0;     /* cross-entropy of the row: log-sum-exp - z[y] (z[best] is the max) */
                for (int64_t c = 0; c < rt.classes; c++) sum += exp((double)z[c] - (double)z[best]);
                if (yb[r] >= 0 && yb[r] < rt.classes) nll += log(sum) + (double)z[best] - (double)z[yb[r]];
                correct += best == yb[r];
                seen += 1;
            }
        } else if ((s + 1) % every == 0 || s + 1 == n_batches) {
            printf("step %lld loss %.9g ms %.3f\n", (long long)rt.state.step, (double)loss, ms);
            if (ckbuf && (s + 1) % every == 0 && s + 1 < n_batches) {
                if ((st = save_checkpoint(&rt, ckpath, ckbuf, ckcap)) != 0) return st;
                saved = rt.state.step;
            }
            fflush(stdout);
        }
    }
    if (ckbuf) {
        if (saved != rt.state.step && (st = save_checkpoint(&rt, ckpath, ckbuf, ckcap)) != 0) return st;
        printf("checkpoint %s at step %lld\n", ckpath, (long long)rt.state.step);
    }
    if (stop_signal) {
        int sig = stop_signal;
        fprintf(stderr, "port-rt: %s after %ld of %ld %s%s%s\n", sig == SIGINT ? "SIGINT" : "SIGTERM", done,
                n_batches, train ? "steps" : "batches", ckbuf ? "; the checkpoint holds them: --resume continues"
                                                             : "", !ckbuf && train ? " (no --checkpoint: not saved)"
                                                                                    : "");
        fflush(stdout);
        return 128 + sig;
    }
    if (!train)
        printf("eval %s %lld correct %lld accuracy %.6f ms %.3f loss %.6f\n", L > 1 ? "tokens" : "samples",
               (long long)seen, (long long)correct, seen ? (double)correct / (double)seen : 0.0, total_ms,
               seen ? nll / (double)seen : 0.0);
    printf("summary arena_bytes %llu bundle_bytes %llu data_bytes %llu vmhwm_kb %ld vmrss_kb %ld vmexe_kb %ld "
           "vmlib_kb %ld mean_step_ms %.4f\n",
           (unsigned long long)A, (unsigned long long)bn,
           (unsigned long long)d.file_bytes, vm_kb("VmHWM:"), vm_kb("VmRSS:"),
           vm_kb("VmExe:"), vm_kb("VmLib:"), n_batches ? total_ms / (double)n_batches : 0.0);
    return 0;
}
