/* PORT's OpenCL kernels (the ``opencl`` backend, port/exec/backends/opencl.py): forward and backward of the CNN
 * zoo's ops, float32, OpenCL C 1.2.
 *
 * Memory: every tensor lives in one buffer per host allocation (the executor's arena, wrapped with
 * CL_MEM_USE_HOST_PTR on unified memory) and is passed as that buffer plus a byte offset (OPND); F/L give the
 * typed pointer. Contract as the C kernels (kernels/include/port_kernels.h): weight gradients accumulate
 * (+=), input gradients overwrite; element-wise kernels may run in place (output == input).
 */
/* one operand: its buffer and the byte offset of the tensor in it (several operands may share one buffer) */
#define OPND(a) __global char *a##_m, long a##_o
#define F(a) ((__global float *)(a##_m + a##_o))
#define L(a) ((__global long *)(a##_m + a##_o))

/* ---- element-wise ------------------------------------------------------------------------------------ */
__kernel void add(OPND(oy), OPND(oa), OPND(ob), long n) {
    long i = get_global_id(0);
    if (i < n) F(oy)[i] = F(oa)[i] + F(ob)[i];
}

__kernel void act_fwd(OPND(oy), OPND(ox), long n, int kind) {
    long i = get_global_id(0);
    if (i >= n) return;
    float x = F(ox)[i];
    float y;
    if (kind == 0) y = x > 0.0f ? x : 0.0f;                          /* relu */
    else if (kind == 1) y = fmin(fmax(x, 0.0f), 6.0f);                /* relu6 */
    else y = x * fmin(fmax(x + 3.0f, 0.0f), 6.0f) / 6.0f;            /* hardswish */
    F(oy)[i] = y;
}

/* s: what the forward saved (relu: x or y, relu6: x or y, hardswish: x), as the torch binding reads it */
__kernel void act_bwd(OPND(odx), OPND(ody), OPND(os), long n, int kind) {
    long i = get_global_id(0);
    if (i >= n) return;
    float s = F(os)[i], dy = F(ody)[i];
    float dx;
    if (kind == 0) dx = s > 0.0f ? dy : 0.0f;
    else if (kind == 1) dx = (s > 0.0f && s < 6.0f) ? dy : 0.0f;
    else dx = s < -3.0f ? 0.0f : (s <= 3.0f ? dy * (s / 3.0f + 0.5f) : dy);
    F(odx)[i] = dx;
}

/* ---- GEMM: C[m, n] (+)= sum_k A[m, k] B[k, n], any strides (transposes are strides), 16 x 16 tiles ------- */
#define TS 16
__kernel void gemm(OPND(oc), OPND(oa), OPND(ob), int Md, int Nd, int Kd, int sam, int sak, int sbk, int sbn,
                   int scm, int scn, int beta) {
    __local float As[TS][TS];
    __local float Bs[TS][TS + 1];
    int lm = get_local_id(0), ln = get_local_id(1);
    int m = get_group_id(0) * TS + lm, n = get_group_id(1) * TS + ln;
    __global const float *A = F(oa), *B = F(ob);
    float acc = 0.0f;
    for (int k0 = 0; k0 < Kd; k0 += TS) {
        int ka = k0 + ln, kb = k0 + lm;
        As[lm][ln] = (m < Md && ka < Kd) ? A[(long)m * sam + (long)ka * sak] : 0.0f;
        Bs[lm][ln] = (kb < Kd && n < Nd) ? B[(long)kb * sbk + (long)n * sbn] : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TS; k++) acc += As[lm][k] * Bs[k][ln];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (m < Md && n < Nd) {
        __global float *C = F(oc) + (long)m * scm + (long)n * scn;
        *C = beta ? *C + acc : acc;
    }
}

/* ---- GEMM with B and C contiguous along n (sbn = scn = 1; the convolutions' products), batched:
 * C[z] (+)= sum_{q < Q} A[z + q] B[z + q] for z = get_global_id(2), where A[z] is A + z * sza floats (B, C alike):
 * Q = 1 a batch of independent products, one launch (global size 1 in dim 2) and Q > 1 a sum of Q products (a
 * weight gradient over the images). Each work-item computes a block of GR rows x 8 columns in float8 registers:
 * a CPU device (PoCL) runs the tiled kernel above at ~1 GFLOP/s a core (work-group barriers and local memory
 * become loops and stores there) and this one at ~25 (AMD EPYC, 1 thread, 2026-11-29); a GPU runs either.
 * Products are a * b + acc, not fma(): where the target has no FMA instruction fma() is a library call (PoCL:
 * 5x slower). Blocks that overrun the matrix (m0 + GR > Md or n0 + 8 > Nd) take the scalar path. ------------ */
#define GR 8
__kernel void gemm_n8(OPND(oc), OPND(oa), OPND(ob), int Md, int Nd, int Kd, int sam, int sak, int sbk, int scm,
                      int beta, long sza, long szb, long szc, int Q) {
    int n0 = get_global_id(0) * 8, m0 = get_global_id(1) * GR;
    long z = get_global_id(2);
    if (n0 >= Nd || m0 >= Md) return;
    __global const float *A = F(oa) + z * sza + (long)m0 * sam, *B = F(ob) + z * szb + n0;
    __global float *C = F(oc) + z * szc + (long)m0 * scm + n0;
    if (m0 + GR <= Md && n0 + 8 <= Nd) {
        float8 acc[GR];
        for (int r = 0; r < GR; r++) acc[r] = (float8)(0.0f);
        for (int q = 0; q < Q; q++)
            for (int k = 0; k < Kd; k++) {
                float8 b = vload8(0, B + q * szb + (long)k * sbk);
                __global const float *a = A + q * sza + (long)k * sak;
                for (int r = 0; r < GR; r++) acc[r] += (float8)(a[(long)r * sam]) * b;
            }
        for (int r = 0; r < GR; r++) {
            float8 c = acc[r];
            if (beta) c += vload8(0, C + (long)r * scm);
            vstore8(c, 0, C + (long)r * scm);
        }
        return;
    }
    int ml = min(GR, Md - m0), nl = min(8, Nd - n0);
    for (int r = 0; r < ml; r++)
        for (int j = 0; j < nl; j++) {
            float acc = 0.0f;
            for (int q = 0; q < Q; q++)
                for (int k = 0; k < Kd; k++)
                    acc += A[q * sza + (long)r * sam + (long)k * sak] * B[q * szb + (long)k * sbk + j];
            __global float *c = C + (long)r * scm + j;
            *c = beta ? *c + acc : acc;
        }
}

/* ---- convolution: im2col / col2im of images z = get_global_id(2) (x: one image every szx floats, col: one
 * matrix every szc floats), one work-item per row of output pixels (im2col: oh = get_global_id(0) for column
 * row r = (c, kh, kw) = get_global_id(1)) or input pixels (col2im: ih, c), so that the index arithmetic (integer
 * divisions: PoCL's CPU device spent 18 ns an element on them) is paid per row. col element (r, p), p = (oh, ow),
 * at r * sr + p * sp: sr = HO * WO, sp = 1 the [C*KH*KW, HO*WO] matrix, sr = 1, sp = C*KH*KW its transpose -- */
__kernel void im2col(OPND(ocol), OPND(ox), int C, int H, int W, int KH, int KW, int SH, int SW, int PH,
                     int PW, int HO, int WO, long sr, long sp, long szx, long szc) {
    int oh = get_global_id(0), r = get_global_id(1);
    long z = get_global_id(2);
    if (oh >= HO || r >= C * KH * KW) return;
    int kw = r % KW, kh = (r / KW) % KH, c = r / (KW * KH);
    int ih = oh * SH - PH + kh;
    __global float *col = F(ocol) + z * szc + r * sr + (long)oh * WO * sp;
    if (ih < 0 || ih >= H) {
        for (int ow = 0; ow < WO; ow++) col[ow * sp] = 0.0f;
        return;
    }
    __global const float *xr = F(ox) + z * szx + ((long)c * H + ih) * W;
    for (int ow = 0; ow < WO; ow++) {
        int iw = ow * SW - PW + kw;
        col[ow * sp] = (iw >= 0 && iw < W) ? xr[iw] : 0.0f;
    }
}

/* dx[c, ih, :] = the sum of the col entries ([C*KH*KW, HO*WO]) that read row ih of channel c: the work-item
 * owns the row (no atomics), zeroes it and adds each (kh, kw) tap's entries in turn */
__kernel void col2im(OPND(odx), OPND(ocol), int C, int H, int W, int KH, int KW, int SH, int SW, int PH,
                     int PW, int HO, int WO, long szx, long szc) {
    int ih = get_global_id(0), c = get_global_id(1);
    long z = get_global_id(2);
    if (ih >= H || c >= C) return;
    long P = (long)HO * WO;
    __global float *dx = F(odx) + z * szx + ((long)c * H + ih) * W;
    for (int iw = 0; iw < W; iw++) dx[iw] = 0.0f;
    for (int kh = 0; kh < KH; kh++) {
        int t = ih + PH - kh;
        if (t < 0 || t % SH) continue;
        int oh = t / SH;
        if (oh >= HO) continue;
        for (int kw = 0; kw < KW; kw++) {
            __global const float *cr = F(ocol) + z * szc + (((long)c * KH + kh) * KW + kw) * P + (long)oh * WO;
            for (int ow = 0; ow < WO; ow++) {
                int iw = ow * SW - PW + kw;
                if (iw >= 0 && iw < W) dx[iw] += cr[ow];
            }
        }
    }
}

/* y[n, c, :] += b[c] */
__kernel void bias_add(OPND(oy), OPND(ob), int C, long P, long n) {
    long i = get_global_id(0);
    if (i < n) F(oy)[i] += F(ob)[(i / P) % C];
}

/* db[c] += sum over n, p of dy[n, c, p] (one work-item per channel) */
__kernel void bias_grad(OPND(odb), OPND(ody), int N, int C, long P) {
    int c = get_global_id(0);
    if (c >= C) return;
    float acc = 0.0f;
    for (int n = 0; n < N; n++)
        for (long p = 0; p < P; p++) acc += F(ody)[((long)n * C + c) * P + p];
    F(odb)[c] += acc;
}

/* ---- depthwise convolution (groups == C_in == C_out / mult), direct ----------------------------------- */
#define DW_GEOM int N, int C, int H, int W, int CO, int KH, int KW, int SH, int SW, int PH, int PW, int HO, int WO
__kernel void dw_fwd(OPND(oy), OPND(ox), OPND(ow_), DW_GEOM) {
    long i = get_global_id(0);
    if (i >= (long)N * CO * HO * WO) return;
    int ow = i % WO, oh = (i / WO) % HO, co = (i / ((long)WO * HO)) % CO, n = i / ((long)WO * HO * CO);
    int c = co / (CO / C);
    float acc = 0.0f;
    for (int kh = 0; kh < KH; kh++) {
        int ih = oh * SH - PH + kh;
        if (ih < 0 || ih >= H) continue;
        for (int kw = 0; kw < KW; kw++) {
            int iw = ow * SW - PW + kw;
            if (iw < 0 || iw >= W) continue;
            acc += F(ox)[(((long)n * C + c) * H + ih) * W + iw] * F(ow_)[((long)co * KH + kh) * KW + kw];
        }
    }
    F(oy)[i] = acc;
}

__kernel void dw_bwd_input(OPND(odx), OPND(ody), OPND(ow_), DW_GEOM) {
    long i = get_global_id(0);
    if (i >= (long)N * C * H * W) return;
    int iw = i % W, ih = (i / W) % H, c = (i / ((long)W * H)) % C, n = i / ((long)W * H * C);
    int mult = CO / C;
    float acc = 0.0f;
    for (int j = 0; j < mult; j++) {
        int co = c * mult + j;
        for (int kh = 0; kh < KH; kh++) {
            int t = ih + PH - kh;
            if (t < 0 || t % SH) continue;
            int oh = t / SH;
            if (oh >= HO) continue;
            for (int kw = 0; kw < KW; kw++) {
                int u = iw + PW - kw;
                if (u < 0 || u % SW) continue;
                int ow = u / SW;
                if (ow >= WO) continue;
                acc += F(ody)[(((long)n * CO + co) * HO + oh) * WO + ow] * F(ow_)[((long)co * KH + kh) * KW + kw];
            }
        }
    }
    F(odx)[i] = acc;
}

__kernel void dw_bwd_weight(OPND(odw), OPND(ody), OPND(ox), DW_GEOM) {
    int i = get_global_id(0);
    if (i >= CO * KH * KW) return;
    int kw = i % KW, kh = (i / KW) % KH, co = i / (KW * KH);
    int c = co / (CO / C);
    float acc = 0.0f;
    for (int n = 0; n < N; n++)
        for (int oh = 0; oh < HO; oh++) {
            int ih = oh * SH - PH + kh;
            if (ih < 0 || ih >= H) continue;
            for (int ow = 0; ow < WO; ow++) {
                int iw = ow * SW - PW + kw;
                if (iw < 0 || iw >= W) continue;
                acc += F(ody)[(((long)n * CO + co) * HO + oh) * WO + ow] * F(ox)[(((long)n * C + c) * H + ih) * W + iw];
            }
        }
    F(odw)[i] += acc;
}

/* ---- batch norm (NCHW; one work-group of BN_WG work-items per channel) -------------------------------- */
#define BN_WG 64
inline float wg_sum(__local float *s, float v) {
    int l = get_local_id(0);
    s[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = BN_WG / 2; k > 0; k >>= 1) {
        if (l < k) s[l] += s[l + k];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float r = s[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
#define BN_IDX(j) (((long)((j) / HW) * C + c) * HW + (j) % HW)

/* training: batch statistics (two passes), y, stats = (mean, invstd), running statistics unless ``rerun`` */
__kernel void bn_fwd_train(OPND(oy), OPND(ostats), OPND(ox), OPND(ow), OPND(ob), OPND(orm), OPND(orv), int N, int C,
                           long HW, float eps, float mom, int rerun) {
    __local float s[BN_WG];
    int c = get_group_id(0), l = get_local_id(0);
    long cnt = (long)N * HW;
    float a = 0.0f;
    for (long j = l; j < cnt; j += BN_WG) a += F(ox)[BN_IDX(j)];
    float mean = wg_sum(s, a) / cnt;
    a = 0.0f;
    for (long j = l; j < cnt; j += BN_WG) { float d = F(ox)[BN_IDX(j)] - mean; a += d * d; }
    float var = wg_sum(s, a) / cnt;
    float inv = rsqrt(var + eps);
    float g = F(ow)[c], b = F(ob)[c];
    for (long j = l; j < cnt; j += BN_WG) { long k = BN_IDX(j); F(oy)[k] = (F(ox)[k] - mean) * inv * g + b; }
    if (l == 0) {
        F(ostats)[c] = mean;
        F(ostats)[C + c] = inv;
        if (!rerun) {
            F(orm)[c] = (1.0f - mom) * F(orm)[c] + mom * mean;
            F(orv)[c] = (1.0f - mom) * F(orv)[c] + mom * var * (float)cnt / (float)(cnt > 1 ? cnt - 1 : 1);
        }
    }
}

__kernel void bn_fwd_eval(OPND(oy), OPND(ox), OPND(ow), OPND(ob), OPND(orm), OPND(orv), int C, long HW, float eps,
                          long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    int c = (i / HW) % C;
    F(oy)[i] = (F(ox)[i] - F(orm)[c]) * rsqrt(F(orv)[c] + eps) * F(ow)[c] + F(ob)[c];
}

/* training backward: dx (when odx >= 0) and dgamma/dbeta += (when odg/odb >= 0); mean/invstd from stats,
 * or running statistics when ``eval`` (then stats = running mean, ``orv`` running var) */
__kernel void bn_bwd(OPND(odx), OPND(odg), OPND(odb), OPND(ody), OPND(ox), OPND(ostats), OPND(ow), OPND(orv), int N,
                     int C, long HW, float eps, int eval) {
    __local float s[BN_WG];
    int c = get_group_id(0), l = get_local_id(0);
    long cnt = (long)N * HW;
    float mean = eval ? F(ostats)[c] : F(ostats)[c];
    float inv = eval ? rsqrt(F(orv)[c] + eps) : F(ostats)[C + c];
    float a = 0.0f, b = 0.0f;
    for (long j = l; j < cnt; j += BN_WG) {
        long k = BN_IDX(j);
        float dy = F(ody)[k];
        a += dy;
        b += dy * (F(ox)[k] - mean) * inv;
    }
    float sdy = wg_sum(s, a), sdyx = wg_sum(s, b);
    if (l == 0) {
        if (odg_o >= 0) F(odg)[c] += sdyx;
        if (odb_o >= 0) F(odb)[c] += sdy;
    }
    if (odx_o < 0) return;
    float g = F(ow)[c];
    for (long j = l; j < cnt; j += BN_WG) {
        long k = BN_IDX(j);
        if (eval) F(odx)[k] = F(ody)[k] * g * inv;
        else F(odx)[k] = g * inv * (F(ody)[k] - sdy / cnt - (F(ox)[k] - mean) * inv * sdyx / cnt);
    }
}

/* ---- pooling --------------------------------------------------------------------------------------------- */
#define POOL_GEOM int H, int W, int KH, int KW, int SH, int SW, int PH, int PW, int HO, int WO, long n
__kernel void maxpool_fwd(OPND(oy), OPND(oidx), OPND(ox), POOL_GEOM) {
    long i = get_global_id(0);
    if (i >= n) return;
    int ow = i % WO, oh = (i / WO) % HO;
    long plane = i / ((long)WO * HO);
    __global const float *x = F(ox) + plane * H * W;
    float best = -INFINITY;
    long bi = -1;
    for (int kh = 0; kh < KH; kh++) {
        int ih = oh * SH - PH + kh;
        if (ih < 0 || ih >= H) continue;
        for (int kw = 0; kw < KW; kw++) {
            int iw = ow * SW - PW + kw;
            if (iw < 0 || iw >= W) continue;
            float v = x[(long)ih * W + iw];
            if (v > best || bi < 0 || isnan(v)) { best = v; bi = (long)ih * W + iw; }
            if (isnan(v)) { kh = KH; break; }
        }
    }
    F(oy)[i] = best;
    L(oidx)[i] = bi;
}

__kernel void maxpool_bwd(OPND(odx), OPND(ody), OPND(oidx), POOL_GEOM) {
    long i = get_global_id(0);    /* n: elements of dx */
    if (i >= n) return;
    int iw = i % W, ih = (i / W) % H;
    long plane = i / ((long)W * H);
    long me = (long)ih * W + iw;
    float acc = 0.0f;
    for (int oh = 0; oh < HO; oh++) {
        int t = ih + PH - oh * SH;
        if (t < 0 || t >= KH) continue;
        for (int ow = 0; ow < WO; ow++) {
            int u = iw + PW - ow * SW;
            if (u < 0 || u >= KW) continue;
            long o = plane * HO * WO + (long)oh * WO + ow;
            if (L(oidx)[o] == me) acc += F(ody)[o];
        }
    }
    F(odx)[i] = acc;
}

/* count_include_pad=True, no ceil mode, no divisor override (what the torch binding runs) */
__kernel void avgpool_fwd(OPND(oy), OPND(ox), POOL_GEOM) {
    long i = get_global_id(0);
    if (i >= n) return;
    int ow = i % WO, oh = (i / WO) % HO;
    long plane = i / ((long)WO * HO);
    int h0 = oh * SH - PH, w0 = ow * SW - PW;
    int h1 = min(h0 + KH, H + PH), w1 = min(w0 + KW, W + PW);
    float div = (float)((h1 - h0) * (w1 - w0));
    float acc = 0.0f;
    for (int ih = max(h0, 0); ih < min(h1, H); ih++)
        for (int iw = max(w0, 0); iw < min(w1, W); iw++) acc += F(ox)[plane * H * W + (long)ih * W + iw];
    F(oy)[i] = acc / div;
}

__kernel void avgpool_bwd(OPND(odx), OPND(ody), POOL_GEOM) {
    long i = get_global_id(0);
    if (i >= n) return;
    int iw = i % W, ih = (i / W) % H;
    long plane = i / ((long)W * H);
    float acc = 0.0f;
    for (int oh = 0; oh < HO; oh++) {
        int h0 = oh * SH - PH;
        if (ih < h0 || ih >= h0 + KH) continue;
        for (int ow = 0; ow < WO; ow++) {
            int w0 = ow * SW - PW;
            if (iw < w0 || iw >= w0 + KW) continue;
            int h1 = min(h0 + KH, H + PH), w1 = min(w0 + KW, W + PW);
            acc += F(ody)[plane * HO * WO + (long)oh * WO + ow] / (float)((h1 - h0) * (w1 - w0));
        }
    }
    F(odx)[i] = acc;
}

__kernel void gap_fwd(OPND(oy), OPND(ox), long HW, long planes) {
    long i = get_global_id(0);
    if (i >= planes) return;
    float acc = 0.0f;
    for (long j = 0; j < HW; j++) acc += F(ox)[i * HW + j];
    F(oy)[i] = acc / HW;
}

__kernel void gap_bwd(OPND(odx), OPND(ody), long HW, long n) {
    long i = get_global_id(0);
    if (i < n) F(odx)[i] = F(ody)[i / HW] / HW;
}

/* ---- softmax cross-entropy (mean over the batch, label smoothing ls) ----------------------------------- */
__kernel void xent_rows(OPND(orow), OPND(oprobs), OPND(oz), OPND(olab), int K, float ls, int N) {
    int r = get_global_id(0);
    if (r >= N) return;
    __global const float *z = F(oz) + (long)r * K;
    __global float *p = F(oprobs) + (long)r * K;
    float mx = -INFINITY;
    for (int k = 0; k < K; k++) mx = fmax(mx, z[k]);
    float se = 0.0f;
    for (int k = 0; k < K; k++) se += exp(z[k] - mx);
    float lse = mx + log(se), sl = 0.0f;
    for (int k = 0; k < K; k++) { p[k] = exp(z[k] - lse); sl += z[k] - lse; }
    long y = L(olab)[r];
    y = y < 0 ? 0 : (y >= K ? K - 1 : y);
    F(orow)[r] = -(1.0f - ls) * (z[y] - lse) - ls / K * sl;
}

__kernel void xent_mean(OPND(oloss), OPND(orow), int N) {
    if (get_global_id(0)) return;
    float acc = 0.0f;
    for (int r = 0; r < N; r++) acc += F(orow)[r];
    F(oloss)[0] = acc / N;
}

__kernel void xent_bwd(OPND(odl), OPND(oprobs), OPND(olab), OPND(oscale), int K, float ls, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    long r = i / K;
    int k = i % K;
    long y = L(olab)[r];
    float t = ls / K + (k == y ? 1.0f - ls : 0.0f);
    F(odl)[i] = (F(oprobs)[i] - t) * F(oscale)[0] / (float)(n / K);
}

/* ---- optimizer updates (PyTorch's SGD and AdamW, foreach=False) ---------------------------------------- */
__kernel void sgd(OPND(op), OPND(og), OPND(obuf), long n, float lr, float wd, float mom, float damp,
                  int nesterov, int first) {
    long i = get_global_id(0);
    if (i >= n) return;
    float p = F(op)[i];
    float d = F(og)[i] + (wd != 0.0f ? wd * p : 0.0f);
    if (obuf_o >= 0 && mom != 0.0f) {
        float b = first ? d : F(obuf)[i] * mom + (1.0f - damp) * d;
        F(obuf)[i] = b;
        d = nesterov ? d + mom * b : b;
    }
    F(op)[i] = p - lr * d;
}

__kernel void adamw(OPND(op), OPND(og), OPND(om1), OPND(om2), long n, float lr, float wd, float b1, float b2,
                    float eps, float bc1, float sbc2) {
    long i = get_global_id(0);
    if (i >= n) return;
    float g = F(og)[i];
    float p = F(op)[i] * (1.0f - lr * wd);
    float m = F(om1)[i] + (g - F(om1)[i]) * (1.0f - b1);
    float v = F(om2)[i] * b2 + (1.0f - b2) * g * g;
    F(om1)[i] = m;
    F(om2)[i] = v;
    F(op)[i] = p - (lr / bc1) * m / (sqrt(v) / sbc2 + eps);
}
