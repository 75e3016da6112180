/* port-rt: train or evaluate a compiled PORT bundle without Python.
 *
 *   port-rt info  BUNDLE
 *   port-rt train BUNDLE --data FILE [--steps N] [--threads T] [--gemm blas|vendored]
 *                        [--spill-dir DIR] [--every K] [--checkpoint FILE [--resume]]
 *   port-rt eval  BUNDLE --data FILE [--threads T] [--gemm blas|vendored] [--checkpoint FILE]
 *
 * --checkpoint FILE: train writes it (atomically) after the last step; --resume (train) and eval read it first.
 * Checkpoints are the Python Trainer's format, so `port train --resume` and port-rt continue each other.
 *
 * train prints one line per step ("step I loss L ms T"), then a summary with the arena size and the process's
 * peak resident memory (VmHWM).  Batches are taken in order from the data file, wrapping around: the batch of
 * step i (counted from the bundle's or checkpoint's step) holds samples (i*B + j) mod n.  Exit codes: 0 ok, 2 bad input (file, bundle, data, arguments), 1 a kernel failed.
 * Data file layout: port/exec/bundle.py.  Bundle layout: port_rt.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "port_rt.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

typedef struct {
    const uint8_t *x;        /* n samples of sample_elems elements of elem_bytes (4: float32, 8: int64 ids) */
    const int64_t *y;        /* n x labels labels */
    uint64_t n, sample_elems, elem_bytes, labels, classes, file_bytes;
    uint32_t dtype, has_ignore;
    int64_t ignore;
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
    uint32_t ver, rank, dtype = 0, labels = 1, flags = 0;
    int64_t ignore = 0;
    if (n < 64 + 32 || memcmp(b, "PORTDATA", 8) != 0) goto bad;
    memcpy(&ver, b + 8, 4);
    memcpy(&rank, b + 12, 4);
    memcpy(&cnt, b + 16, 8);
    memcpy(shape, b + 24, 32);
    memcpy(&cls, b + 56, 8);
    if (ver == 2) {   /* format 2: a 128-byte header with the x dtype, labels per sample and ignore index */
        if (n < 128 + 32) goto bad;
        hb = 128;
        memcpy(&dtype, b + 64, 4);
        memcpy(&labels, b + 68, 4);
        memcpy(&ignore, b + 72, 8);
        memcpy(&flags, b + 80, 4);
    }
    if ((ver != 1 && ver != 2) || rank < 1 || rank > 4 || cnt == 0 || cls == 0 || dtype > 1 || labels == 0 ||
        labels > (1u << 24) || flags > 1 || cnt > ((uint64_t)1 << 40))
        goto bad;
    uint64_t per = 1, esz = dtype ? 8 : 4;
    for (uint32_t i = 0; i < rank; i++) {
        if (shape[i] == 0 || shape[i] > (1u << 30)) goto bad;
        per *= shape[i];
        if (per > ((uint64_t)1 << 40)) goto bad;
    }
    if (per > (n / esz) / cnt) goto bad;
    uint64_t xb = cnt * per * esz, yoff = hb + xb + ((64 - (hb + xb) % 64) % 64);
    if (labels > n / 8 / cnt || yoff + cnt * labels * 8 + 32 != n) goto bad;
    uint8_t h[32];
    port_sha256(h, b, n - 32);
    if (memcmp(h, b + n - 32, 32) != 0) goto bad;
    /* every label a class index (or the ignore index), checked once: eval would count a bad one as a miss */
    for (uint64_t i = 0; i < cnt * labels; i++) {
        int64_t v;
        memcpy(&v, b + yoff + i * 8, 8);
        if ((v < 0 || (uint64_t)v >= cls) && !((flags & 1) && v == ignore)) {
            fprintf(stderr, "port-rt: %s: label %lld of sample %llu is not a class index (0..%llu%s). Fix: write "
                            "the data with labels in range (port.exec.bundle.write_data checks them)\n", path,
                    (long long)v, (unsigned long long)(i / labels), (unsigned long long)(cls - 1),
                    (flags & 1) ? " or the ignore index" : "");
            return 2;
        }
    }
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
    return 0;
bad:
    fprintf(stderr, "port-rt: %s is not a valid port-rt data file (magic, version, sizes or checksum). Fix: "
                    "write it again with `port compile ... --data` (port.exec.bundle.write_data)\n", path);
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
    fprintf(stderr, "usage: port-rt info BUNDLE\n"
                    "       port-rt train BUNDLE --data FILE [--steps N] [--threads T] [--gemm blas|vendored] "
                    "[--spill-dir DIR] [--every K] [--checkpoint FILE [--resume]]\n"
                    "       port-rt eval BUNDLE --data FILE [--threads T] [--gemm blas|vendored] "
                    "[--checkpoint FILE]\n");
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
    if (argc < 3) {
        usage();
        return 2;
    }
    const char *cmd = argv[1], *bpath = argv[2], *dpath = NULL, *spill_dir = "/tmp", *ckpath = NULL;
    int resume = 0;
    long steps = 10, threads = 0, every = 1;
    int gemm = -1;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--resume")) {
            resume = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "port-rt: option %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--data")) dpath = v;
        else if (!strcmp(a, "--checkpoint")) ckpath = v;
        else if (!strcmp(a, "--spill-dir")) spill_dir = v;
        else if (!strcmp(a, "--gemm")) {
            if (!strcmp(v, "blas")) gemm = PORT_GEMM_BLAS;
            else if (!strcmp(v, "vendored")) gemm = PORT_GEMM_VENDORED;
            else {
                fprintf(stderr, "port-rt: --gemm %s: expected blas or vendored\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--steps") || !strcmp(a, "--threads") || !strcmp(a, "--every")) {
            long x = strtol(v, &end, 10);
            if (!*v || *end || x < (strcmp(a, "--threads") ? 1 : 0) || x > 100000000) {
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
    if (threads > 0) port_set_num_threads((int)threads);
    if (gemm >= 0 && port_set_gemm_backend(gemm) != PORT_OK) {
        fprintf(stderr, "port-rt: --gemm blas: this build has no BLAS (built without OpenBLAS)\n");
        return 2;
    }
    uint64_t bn = 0;
    uint8_t *bundle = read_file(bpath, &bn);
    if (!bundle) {
        fprintf(stderr, "port-rt: cannot read bundle %s: %s\n", bpath, strerror(errno));
        return 2;
    }
    uint64_t A = 0;
    int st = port_rt_bundle_check(bundle, bn, &A);
    if (st != PORT_OK) {
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
               "calls, batch %lld, %lld classes, step %lld, graph %.16s, plan %.16s\n",
               bpath, (unsigned long long)bn, (unsigned long long)A, (unsigned long long)rt.persistent_bytes,
               rt.n_train, rt.n_eval, (long long)rt.batch, (long long)rt.classes, (long long)rt.state.step,
               rt.graph_digest, rt.plan_digest);
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
    if (ckpath && (resume || !strcmp(cmd, "eval"))) {
        uint64_t cn = 0;
        uint8_t *ck = read_file(ckpath, &cn);
        if (!ck) {
            fprintf(stderr, "port-rt: cannot read checkpoint %s: %s\n", ckpath, strerror(errno));
            return 2;
        }
        if ((st = port_rt_read_checkpoint(&rt, ck, cn)) != PORT_OK) {
            fprintf(stderr, "port-rt: %s is not a checkpoint of this bundle (magic, version, checksum, graph or "
                            "tensors differ; status %d). Fix: train without --resume, or use the checkpoint this "
                            "bundle's model wrote\n", ckpath, st);
            return 2;
        }
        free(ck);
        printf("resumed from %s at step %lld\n", ckpath, (long long)rt.state.step);
    }
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
    uint8_t *xb = NULL;
    float *logits = NULL;
    int64_t *yb = NULL;
    if (posix_memalign((void **)&xb, 64, (size_t)rt.input_bytes) || posix_memalign((void **)&yb, 64, B * L * 8) ||
        posix_memalign((void **)&logits, 64, B * L * (uint64_t)rt.classes * 4)) {
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
    long n_batches = !strcmp(cmd, "eval") ? (long)((d.n + B - 1) / B) : steps;
    double total_ms = 0.0;
    int64_t correct = 0, seen = 0;
    int64_t step0 = !strcmp(cmd, "eval") ? 0 : rt.state.step;
    for (long s = 0; s < n_batches; s++) {
        for (uint64_t j = 0; j < B; j++) {
            uint64_t k = ((uint64_t)(step0 + s) * B + j) % d.n;
            memcpy(xb + j * sample_bytes, d.x + k * sample_bytes, sample_bytes);
            memcpy(yb + j * L, d.y + k * L, L * 8);
        }
        double t0 = now_ms();
        float loss = 0.0f;
        st = !strcmp(cmd, "eval") ? port_rt_evaluate(&rt, xb, yb, logits, NULL) : port_rt_step(&rt, xb, yb, &loss);
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
        if (!strcmp(cmd, "eval")) {
            /* the last batch wraps around: only the samples not seen yet count; rows (samples, or tokens of a
             * sequence model) whose label is the ignore index do not count */
            uint64_t valid = (uint64_t)s * B + B <= d.n ? B : d.n - (uint64_t)s * B;
            for (uint64_t r = 0; r < valid * L; r++) {
                if (rt.has_ignore_index && yb[r] == rt.ignore_index) continue;
                int64_t best = 0;
                for (int64_t c = 1; c < rt.classes; c++)
                    if (logits[r * rt.classes + c] > logits[r * rt.classes + best]) best = c;
                correct += best == yb[r];
                seen += 1;
            }
        } else if ((s + 1) % every == 0 || s + 1 == n_batches) {
            printf("step %lld loss %.9g ms %.3f\n", (long long)rt.state.step, (double)loss, ms);
        }
    }
    if (ckpath && !strcmp(cmd, "train")) {
        uint64_t cap = port_rt_checkpoint_bytes(&rt), got = 0;
        uint8_t *buf = cap ? malloc((size_t)cap) : NULL;
        if (!buf || port_rt_write_checkpoint(&rt, buf, cap, &got) != PORT_OK) {
            fprintf(stderr, "port-rt: cannot build the checkpoint (the bundle has no checkpoint template?)\n");
            return 1;
        }
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", ckpath, (long)getpid());
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
            return 2;
        }
        free(buf);
        printf("checkpoint %s at step %lld\n", ckpath, (long long)rt.state.step);
    }
    if (!strcmp(cmd, "eval"))
        printf("eval %s %lld correct %lld accuracy %.6f ms %.3f\n", L > 1 ? "tokens" : "samples", (long long)seen,
               (long long)correct,
               seen ? (double)correct / (double)seen : 0.0, total_ms);
    printf("summary arena_bytes %llu bundle_bytes %llu data_bytes %llu vmhwm_kb %ld vmrss_kb %ld vmexe_kb %ld "
           "vmlib_kb %ld mean_step_ms %.4f\n",
           (unsigned long long)A, (unsigned long long)bn,
           (unsigned long long)d.file_bytes, vm_kb("VmHWM:"), vm_kb("VmRSS:"),
           vm_kb("VmExe:"), vm_kb("VmLib:"), n_batches ? total_ms / (double)n_batches : 0.0);
    return 0;
}
