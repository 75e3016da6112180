"""Benchmark of PORT's C convolution kernels against torch on CPU.

For every distinct convolution of CIFAR (3x32x32) ResNet-18 and MobileNetV2, at
several batch sizes and thread counts, in one run:
  * PORT forward / input-grad / weight-grad (raw ctypes path, algo=auto) vs
    torch.nn.functional.conv2d and torch.ops.aten.convolution_backward
    (medians over repeated timing blocks);
  * GFLOP/s, and %-of-BLAS: BLAS sgemm GFLOP/s on the layer's ideal single GEMM
    (M=c_out, N=batch*H_out*W_out, K=c_in*kh*kw) vs PORT's conv GFLOP/s;
  * share of the forward time outside GEMM (im2col) for im2col layers:
    1 - t(per-image GEMMs exactly as the conv issues them) / t(conv forward);
  * the patch8 variant (port.plan.variants: row bands of H_out // 8 whole output rows): workspace vs
    whole-tensor im2col workspace, and fwd+bwd time ratio; its targets hold on the network stems (the CIFAR
    stems and the 224x224 ImageNet stems of ResNet-18 and MobileNetV2, also in the table).

    python bench/kernels.py --quick     # < 3 min, batch 1 and 8
    python bench/kernels.py             # batch 1, 8, 32; threads 1 and 2
Writes the `## Kernels` section of bench/RESULTS.md (use --no-write to skip).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)
from port.exec import capi

capi.configure_openmp_env()  # before torch loads the OpenMP runtime (PORT's wait policy)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from port.plan import variants as V  # noqa: E402

sys.path.append(os.path.join(ROOT, "bench"))   # last: bench/profile.py shadows the stdlib module
from _results import checked_kernels, sgemm_gflops, write_section  # noqa: E402

K = checked_kernels()


# ----------------------------------------------------------------------------- layer lists
def resnet18_convs():
    """(name, c_in, h, w, c_out, k, stride, pad, groups) of CIFAR ResNet-18 (3x3 stem, no maxpool)."""
    L = [("stem", 3, 32, 32, 64, 3, 1, 1, 1)]
    c, hw = 64, 32
    for stage, (co, s) in enumerate(((64, 1), (128, 2), (256, 2), (512, 2)), 1):
        for blk in range(2):
            st = s if blk == 0 else 1
            L.append((f"l{stage}.{blk}.conv1", c, hw, hw, co, 3, st, 1, 1))
            ho = hw // st
            L.append((f"l{stage}.{blk}.conv2", co, ho, ho, co, 3, 1, 1, 1))
            if st != 1 or c != co:
                L.append((f"l{stage}.{blk}.short", c, hw, hw, co, 1, st, 0, 1))
            c, hw = co, ho
    return L


def mobilenetv2_convs():
    """CIFAR MobileNetV2 (stem stride 1, stage-2 stride 1, as in common CIFAR ports)."""
    cfg = [(1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
           (6, 160, 3, 2), (6, 320, 1, 1)]
    L = [("stem", 3, 32, 32, 32, 3, 1, 1, 1)]
    c, hw = 32, 32
    for i, (t, co, n, s) in enumerate(cfg):
        for j in range(n):
            st = s if j == 0 else 1
            pl = t * c
            L.append((f"b{i}.{j}.expand", c, hw, hw, pl, 1, 1, 0, 1))
            L.append((f"b{i}.{j}.dw", pl, hw, hw, pl, 3, st, 1, pl))
            ho = hw // st
            L.append((f"b{i}.{j}.project", pl, ho, ho, co, 1, 1, 0, 1))
            if st == 1 and c != co:
                L.append((f"b{i}.{j}.short", c, hw, hw, co, 1, 1, 0, 1))
            c, hw = co, ho
    L.append(("head", 320, 4, 4, 1280, 1, 1, 0, 1))
    return L


def imagenet_stems():
    """The 224x224 stems: ResNet-18's 7x7/2 (K = 147) and MobileNetV2's 3x3/2, where im2col is largest."""
    return [("resnet18-224", "stem", 3, 224, 224, 64, 7, 2, 3, 1), ("mobilenetv2-224", "stem", 3, 224, 224, 32, 3, 2, 1, 1)]


def distinct(layers, net):
    seen, out = set(), []
    for name, *shape in layers:
        if tuple(shape) not in seen:
            seen.add(tuple(shape))
            out.append((net, name, *shape))
    return out


# ----------------------------------------------------------------------------- timing
def timeit(fn, blocks, block_s):
    fn()  # warm-up
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, int(block_s / one))
    meds = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        meds.append((time.perf_counter() - t0) / inner)
    return statistics.median(meds)


def ok(st):
    if st != 0:
        raise RuntimeError(capi.status_string(st))


def bench_layer(layer, n, blocks, block_s, do_patch=True):
    net, name, ci, h, w, co, k, s, p, g = layer
    x = torch.randn(n, ci, h, w)
    wt = torch.randn(co, ci // g, k, k) * 0.1
    prm = K.conv2d_params(x.shape, wt.shape, s, p, g)
    ho, wo = capi.raw.port_conv2d_out_h(prm), capi.raw.port_conv2d_out_w(prm)
    P = ho * wo
    Kd = ci // g * k * k
    y, dy = torch.empty(n, co, ho, wo), torch.randn(n, co, ho, wo)
    dx, dw = torch.empty_like(x), torch.zeros_like(wt)
    ws_bytes = max(capi.raw.port_conv2d_workspace_bytes(prm, a) for a in (capi.CONV_AUTO, capi.CONV_IM2COL))
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8)
    R = capi.raw
    xp, wp, yp, dyp, dxp, dwp, wsp = (t.data_ptr() for t in (x, wt, y, dy, dx, dw, ws))

    def directions(algo, key):
        res[f"{key}_fwd"] = timeit(lambda: ok(R.port_conv2d_forward(yp, xp, wp, None, prm, algo, wsp,
                                                                    ws_bytes)), blocks, block_s)
        res[f"{key}_bwi"] = timeit(lambda: ok(R.port_conv2d_backward_input(dxp, dyp, wp, prm, algo, wsp,
                                                                           ws_bytes)), blocks, block_s)
        # the weight gradient as a training step runs it: its only writer overwrites it (no zeroing pass)
        res[f"{key}_bww"] = timeit(lambda: ok(R.port_conv2d_backward_weight_overwrite(dwp, None, dyp, xp, prm,
                                                                                      algo, wsp, ws_bytes)),
                                   blocks, block_s)

    res = {}
    auto = R.port_conv2d_resolve_algo(prm, capi.CONV_AUTO)
    res["algo"] = {capi.CONV_IM2COL: "im2col", capi.CONV_DIRECT: "direct", capi.CONV_WINOGRAD: "winograd"}[auto]
    directions(capi.CONV_AUTO, "port")           # what PORT runs by default (PORT_CONV_AUTO)
    if auto == capi.CONV_WINOGRAD:               # the im2col + GEMM path of the same layer, for the GEMM-rate target
        directions(capi.CONV_IM2COL, "im2col")
    else:
        res.update({f"im2col_{d}": res[f"port_{d}"] for d in ("fwd", "bwi", "bww")})
    cb = torch.ops.aten.convolution_backward
    with torch.no_grad():
        res["torch_fwd"] = timeit(lambda: F.conv2d(x, wt, None, s, p, 1, g), blocks, block_s)
        res["torch_bwi"] = timeit(lambda: cb(dy, x, wt, None, [s, s], [p, p], [1, 1], False,
                                             [0, 0], g, [True, False, False]), blocks, block_s)
        res["torch_bww"] = timeit(lambda: cb(dy, x, wt, None, [s, s], [p, p], [1, 1], False,
                                             [0, 0], g, [False, True, False]), blocks, block_s)
    flops = 2.0 * n * co * P * Kd
    res["flops"] = flops
    depthwise = g == ci == co
    res["gemm_bound"] = g == 1
    if g == 1:
        # ideal single BLAS GEMM of the layer: [co x Kd] x [Kd x n*P]
        a, b, c = torch.randn(co, Kd), torch.randn(Kd, n * P), torch.empty(co, n * P)
        ap, bp, cp = a.data_ptr(), b.data_ptr(), c.data_ptr()
        res["blas_fwd"] = timeit(lambda: R.port_sgemm(cp, ap, bp, 0, 0, co, n * P, Kd, 1.0, 0.0,
                                                      Kd, n * P, n * P), blocks, block_s)
    if res["algo"] != "direct":
        cols = torch.randn(Kd, P)
        cpp = cols.data_ptr()
        cog = co // g

        def gemms():
            for i in range(n):
                for gg in range(g):
                    R.port_sgemm(yp + 4 * (i * co + gg * cog) * P, wp + 4 * gg * cog * Kd, cpp, 0,
                                 0, cog, P, Kd, 1.0, 0.0, Kd, P, P)
        res["gemm_only_fwd"] = timeit(gemms, blocks, block_s)
        ws_im2col = R.port_conv2d_workspace_bytes(prm, capi.CONV_IM2COL)
        if do_patch:
            th, tw = V.patch_tile_hw("patch8", ho, wo)
            pws = R.port_conv2d_patch_workspace_bytes(prm, th, tw)
            pw_t = torch.empty(pws, dtype=torch.uint8)
            pwp = pw_t.data_ptr()

            def patch_all():
                ok(R.port_conv2d_patch_forward(yp, xp, wp, None, prm, th, tw, pwp, pws))
                ok(R.port_conv2d_patch_backward_input(dxp, dyp, wp, prm, th, tw, pwp, pws))
                ok(R.port_conv2d_patch_backward_weight(dwp, None, dyp, xp, prm, th, tw, pwp, pws))

            def whole_all():
                ok(R.port_conv2d_forward(yp, xp, wp, None, prm, 1, wsp, ws_bytes))
                ok(R.port_conv2d_backward_input(dxp, dyp, wp, prm, 1, wsp, ws_bytes))
                ok(R.port_conv2d_backward_weight(dwp, None, dyp, xp, prm, 1, wsp, ws_bytes))
            res["patch_t"] = timeit(patch_all, blocks, block_s)
            res["whole_t"] = timeit(whole_all, blocks, block_s)
            res["patch_ws_ratio"] = pws / ws_im2col
            res["tile"] = (th, tw)
    return res


# ----------------------------------------------------------------------------- reporting
def fmt_ms(t):
    return f"{t * 1e3:.3f}"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="short run (< 3 min): batch 1 and 8")
    ap.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    args = ap.parse_args(argv)
    layers = distinct(resnet18_convs(), "resnet18") + distinct(mobilenetv2_convs(), "mobilenetv2") + imagenet_stems()
    if args.quick:
        batches, threads, blocks, block_s = (1, 8), (1, 2), 3, 0.01
    else:
        batches, threads, blocks, block_s = (1, 8, 32), (1, 2), 7, 0.05
    rows = []
    load0 = os.getloadavg()
    t_start = time.time()
    sgemm_rate = {}
    for nt in threads:
        capi.set_num_threads(nt)
        sgemm_rate[nt] = sgemm_gflops()["port"]
        print(f"# threads={nt}: machine sgemm (PORT's GEMM, 2048^3) {sgemm_rate[nt]:.0f} GFLOP/s", flush=True)
        for n in batches:
            for layer in layers:
                r = bench_layer(layer, n, blocks, block_s)
                r.update(net=layer[0], name=layer[1], n=n, threads=nt, layer=layer)
                rows.append(r)
            print(f"# threads={nt} batch={n} done ({time.time() - t_start:.0f}s)", flush=True)
    capi.set_num_threads(os.cpu_count() or 1)
    load1 = os.getloadavg()

    lines = []
    hdr = ("| net | layer | cin>cout k/s/g | HxW | N | thr | PORT fwd/bwi/bww ms | torch fwd/bwi/bww ms"
           " | ratio | algo | PORT GF/s | %BLAS | % of sgemm im2col fwd/bwi/bww | effective % of sgemm fwd/bwi/bww"
           " | im2col % | patch ws | patch t |")
    lines += [hdr, "|" + "---|" * 17]
    for r in rows:
        _, _, ci, h, w, co, k, s, p, g = r["layer"]
        pt = r["port_fwd"] + r["port_bwi"] + r["port_bww"]
        tt = r["torch_fwd"] + r["torch_bwi"] + r["torch_bww"]
        r["ratio"] = pt / tt
        gf = r["flops"] / r["port_fwd"] / 1e9
        rate = sgemm_rate[r["threads"]]
        r["pct_sgemm"] = tuple(r["flops"] / r[f"im2col_{d}"] / 1e9 / rate for d in ("fwd", "bwi", "bww"))
        r["eff_sgemm"] = tuple(r["flops"] / r[f"port_{d}"] / 1e9 / rate for d in ("fwd", "bwi", "bww"))
        pct = f"{100 * r['blas_fwd'] / r['im2col_fwd']:.0f}" if "blas_fwd" in r else "-"
        if "blas_fwd" in r:
            r["pct_blas"] = r["blas_fwd"] / r["im2col_fwd"]
        im = (f"{100 * max(0.0, 1 - r['gemm_only_fwd'] / r['im2col_fwd']):.0f}"
              if "gemm_only_fwd" in r else "-")
        pws = f"{r['patch_ws_ratio']:.3f}" if "patch_ws_ratio" in r else "-"
        ptr = f"{r['patch_t'] / r['whole_t']:.2f}" if "patch_t" in r else "-"
        lines.append(
            f"| {r['net']} | {r['name']} | {ci}>{co} {k}/{s}/{g} | {h}x{w} | {r['n']} | "
            f"{r['threads']} | {fmt_ms(r['port_fwd'])}/{fmt_ms(r['port_bwi'])}/"
            f"{fmt_ms(r['port_bww'])} | {fmt_ms(r['torch_fwd'])}/{fmt_ms(r['torch_bwi'])}/"
            f"{fmt_ms(r['torch_bww'])} | {r['ratio']:.2f} | {r['algo']} | {gf:.1f} | {pct} | "
            f"{'/'.join(f'{100 * v:.0f}' for v in r['pct_sgemm']) if r['gemm_bound'] else '-'} | "
            f"{'/'.join(f'{100 * v:.0f}' for v in r['eff_sgemm']) if r['gemm_bound'] else '-'} | {im} | {pws} | "
            f"{ptr} |")

    summary = ["| N | threads | median PORT/torch (fwd+bwd) | worst | median %BLAS (GEMM layers) | "
               "median im2col share |", "|---|---|---|---|---|---|"]
    head = {}
    for nt in threads:
        for n in batches:
            sel = [r for r in rows if r["n"] == n and r["threads"] == nt]
            med = statistics.median(r["ratio"] for r in sel)
            worst = max(r["ratio"] for r in sel)
            pb = [r["pct_blas"] for r in sel if "pct_blas" in r]
            im = [max(0.0, 1 - r["gemm_only_fwd"] / r["im2col_fwd"]) for r in sel
                  if "gemm_only_fwd" in r]
            head[(n, nt)] = med
            summary.append(f"| {n} | {nt} | {med:.2f} | {worst:.2f} | "
                           f"{100 * statistics.median(pb):.0f}% | "
                           f"{100 * statistics.median(im):.0f}% |")
    b18 = [r["ratio"] for r in rows if r["n"] in (1, 8)]
    med18 = statistics.median(b18)
    gemm_rows = [r for r in rows if "pct_blas" in r]
    med_blas = statistics.median(r["pct_blas"] for r in gemm_rows)
    frac_blas70 = sum(r["pct_blas"] >= 0.7 for r in gemm_rows) / len(gemm_rows)
    patch = [r for r in rows if "patch_t" in r]
    stems = [r for r in patch if r["name"] == "stem"]
    ws_max = max(r["patch_ws_ratio"] for r in stems)
    pt_med = statistics.median(r["patch_t"] / r["whole_t"] for r in stems)
    pt_max = max(r["patch_t"] / r["whole_t"] for r in stems)
    pt_ok = sum(r["patch_t"] / r["whole_t"] <= 1.3 for r in stems) / len(stems)
    pt_all = statistics.median(r["patch_t"] / r["whole_t"] for r in patch)
    ws_all = max(r["patch_ws_ratio"] for r in patch)
    # GEMM-bound layers (groups == 1, 3x3 or larger: the 1x1 shortcuts move more memory than they compute) at
    # the largest thread count and batch >= 8: every direction's rate against the machine's sgemm rate
    nt_max, big = max(threads), [b for b in batches if b >= 8]
    gsel = [r for r in rows if r["gemm_bound"] and r["layer"][6] >= 3 and r["layer"][2] >= 16
            and r["threads"] == nt_max and r["n"] in big]
    dir_med = [statistics.median(r["pct_sgemm"][i] for r in gsel) for i in range(3)] if gsel else [0, 0, 0]
    dir_min = min(dir_med)
    eff_med = [statistics.median(r["eff_sgemm"][i] for r in gsel) for i in range(3)] if gsel else [0, 0, 0]
    n_wg = sum(r["algo"] == "winograd" for r in gsel)
    targets = [
        f"- GEMM-bound conv layers (groups 1, k >= 3, c_in >= 16; batch {'/'.join(map(str, big))}, {nt_max} "
        f"threads) against the machine's measured sgemm rate ({sgemm_rate[nt_max]:.0f} GFLOP/s): median forward "
        f"**{100 * dir_med[0]:.0f}%**, input gradient **{100 * dir_med[1]:.0f}%**, weight gradient "
        f"**{100 * dir_med[2]:.0f}%** on the im2col + GEMM path (target >= 70%: "
        f"{'MET' if dir_min >= 0.7 else 'NOT met'}); as PORT runs them by default (PORT_CONV_AUTO: Winograd on "
        f"{n_wg} of these {len(gsel)} points), direct-convolution FLOPs per second: median forward "
        f"**{100 * eff_med[0]:.0f}%**, input gradient **{100 * eff_med[1]:.0f}%**, weight gradient "
        f"**{100 * eff_med[2]:.0f}%** of the sgemm rate (effective rates: Winograd does 16/36 of the "
        f"multiply-adds)",
        f"- batch 1 and 8 PORT/torch fwd+bwd median ratio over layers: **{med18:.2f}** "
        f"(target <= 1.0: {'MET' if med18 <= 1.0 else 'NOT met'})",
        f"- GEMM-bound layers (groups=1) forward at %-of-BLAS-sgemm: median **{100 * med_blas:.0f}%**, "
        f"{100 * frac_blas70:.0f}% of (layer, batch, threads) points >= 70% "
        f"(target >= 70%: {'MET' if med_blas >= 0.7 else 'NOT met'} at the median)",
        f"- patch8 (row bands of H_out // 8 rows) on the network stems ({len(stems)} points: CIFAR and 224x224 "
        f"stems, every batch and thread count): workspace / whole im2col workspace max **{ws_max:.3f}** "
        f"(target <= 0.125: {'MET' if ws_max <= 0.125 else 'NOT met'}); fwd+bwd time ratio "
        f"median **{pt_med:.2f}x**, max {pt_max:.2f}x, {100 * pt_ok:.0f}% of points <= 1.3x "
        f"(target <= 1.3x: {'MET' if pt_med <= 1.3 else 'NOT met'} at the median); over all layers "
        f"workspace <= {ws_all:.3f}, time median {pt_all:.2f}x",
    ]
    headline = (f"HEADLINE kernels: GEMM-bound convs fwd/bwi/bww median "
                f"{'/'.join(f'{100 * v:.0f}' for v in dir_med)}% of the machine's sgemm rate on im2col (target >= 70%: "
                f"{'met' if dir_min >= 0.7 else 'NOT met'}), effective {'/'.join(f'{100 * v:.0f}' for v in eff_med)}% "
                f"as run (Winograd where AUTO picks it); PORT/torch conv fwd+bwd median ratio (batch 1,8) = {med18:.2f}; "
                f"GEMM layers median {100 * med_blas:.0f}% of BLAS; patch8 on the stems: ws <= {ws_max:.3f} "
                f"of whole (target 0.125) at median {pt_med:.2f}x time (target 1.3x) ({time.time() - t_start:.0f}s, "
                f"{'quick' if args.quick else 'full'})")
    from port.cost.measure import host_info
    env = (f"{host_info().get('cpu') or platform.machine()}, {os.cpu_count()} CPUs, torch "
           f"{torch.__version__}, AVX-512 microkernel: {bool(capi.raw.port_cpu_has_avx512())}")
    section = "\n".join([
        "## Kernels", "",
        f"`python bench/kernels.py{' --quick' if args.quick else ''}` -- {env}. Times are medians "
        f"over {blocks} timing blocks; ratio = PORT (fwd+bwd_input+bwd_weight; the weight gradient as a training "
        "step runs it, written over the buffer by its only writer: port_conv2d_backward_weight_overwrite) / torch "
        "(F.conv2d + aten.convolution_backward per direction). %BLAS = GFLOP/s of BLAS sgemm on "
        "the layer's single ideal GEMM [c_out x c_in*k*k] x [.. x N*Ho*Wo] relative to PORT's im2col "
        "forward; algo = what PORT_CONV_AUTO runs (PORT's times and ratio are for it; Winograd F(2x2,3x3) where "
        "each of its 16 GEMMs gets >= 64 tiles); % of sgemm im2col = direct-convolution FLOPs / time of the "
        "im2col + GEMM path; effective = the same FLOPs over the time of what AUTO runs; im2col % = im2col "
        "forward time outside the per-image GEMMs; patch = the patch8 variant (bands of H_out // 8 whole output "
        "rows, each band's rows split over the threads), workspace and fwd+bwd time relative to whole-tensor "
        f"im2col. GEMM backend: {capi.get_gemm_backend()} (the default). "
        f"Threads: one OpenMP pool shared by PORT and torch ({os.path.basename(capi.openmp_runtime() or '?')}, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'unset')}); OpenBLAS single-threaded, "
        "PORT splits large GEMMs over the pool. "
        f"Shared 2-vCPU VM (other jobs running: load average {load0[0]:.1f} at start, {load1[0]:.1f} at end), "
        "so 2-thread points cannot show a real speed-up: expect +-20% run to run.", "",
        "### Targets", "", *targets, "",
        "### Summary", "", *summary, "",
        "### Shortfalls and why", "",
        "- torch's CPU convolutions run on oneDNN (direct/JIT-ed kernels, blocked layouts). PORT runs im2col + "
        "GEMMs (its vendored GEMM or OpenBLAS, as kernels/src/common.c picks); maps under 256 output pixels (64 "
        "for the weight gradient) fold several images into one GEMM (workspace: the chunk's "
        "im2col block plus an output block), so late layers no longer run skinny per-image GEMMs that re-pack "
        "the whole weight matrix for 16 columns.",
        "- Depthwise convs are direct: stride 1 runs a stack of images per channel as one tall zero-padded plane "
        "(one flat loop per tap, vectorised at the CPU's widest ISA through target_clones), stride 2 a row loop "
        "vectorised along W; on 4x4 and 8x8 maps oneDNN's blocked-layout kernels stay about 2x faster.",
        "- Patch bands are whole output rows, so the GEMM writes y (and reads dy) in place: the workspace is "
        "the band's im2col only, at most 1/8 of the image's. Each band is eight times fewer GEMM columns than the "
        "image: on 32x32 maps (128-column GEMMs, K = 27) the fixed cost per GEMM call is what the time ratio "
        "measures; on 224x224 stems the bands are 1568 columns wide and cost little more than whole im2col.",
        "- Threads: one OpenMP pool (libgomp, shared with torch) with libgomp's default wait policy, as "
        "PyTorch's ops use; OpenBLAS is single-threaded and PORT splits large GEMMs over the pool, so two pools "
        "never spin against each other. Passive waiting (which `import port` used to set) cost every 2-thread "
        "region a futex wake-up (~150 us measured here), more than many whole kernels.",
        "- patch8 on small maps (an 8x8 output: bands of one row) degrades GEMM to 8-column products; the "
        "solver prices that (it is offered where H_out > 8) and picks it only to fit a budget.",
        "", "### Per layer", "", *lines, "", headline, ""])
    print("\n".join(["", *targets, "", *summary, ""]))
    if not args.no_write:   # the one section writer (a "## Kernels" quoted in another section's text is not it)
        write_section("Kernels", section.split("\n", 2)[2])
    print(headline)


if __name__ == "__main__":
    main()
