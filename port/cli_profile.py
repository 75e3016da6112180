"""`port profile`: measure op costs on this machine's accelerators (modeled for absent ones).

    port profile CONFIG [-o profiles/<device>/<model>.json] [--max-time S] [--quick] [--fresh]
    port profile CONFIG --calibrate [--calibration-out FILE]
    port profile --merge a.json b.json -o out.json [--device NAME]
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("profile")
    def profile_cmd(
        inputs: List[Path] = typer.Argument(..., help="An experiment YAML (or, with --merge, profile JSON files)."),
        output: Optional[Path] = typer.Option(None, "-o", "--output",
                                              help="Profile file (default profiles/<device>/<model>.json)."),
        max_time: Optional[float] = typer.Option(None, "--max-time", help="Time budget in seconds; entries not "
                                                 "reached get modeled values (measured=false)."),
        quick: bool = typer.Option(False, "--quick", help="Fewer, shorter timing blocks (3 x ~5 ms)."),
        blocks: Optional[int] = typer.Option(None, "--blocks", min=1, help="Timing blocks per entry."),
        block_ms: Optional[float] = typer.Option(None, "--block-ms", help="Target length of one block (ms)."),
        threads: Optional[int] = typer.Option(None, "--threads", min=1, help="Override every accelerator's threads."),
        fresh: bool = typer.Option(False, "--fresh", help="Ignore an existing output file (no reuse)."),
        calibrate_: bool = typer.Option(False, "--calibrate", help="Fit roofline efficiency per op kind on the "
                                        "present accelerators; print the fit error."),
        calibration_out: Optional[Path] = typer.Option(None, "--calibration-out",
                                                       help="Calibration file (default profiles/<device>/calibration.json)."),
        merge: bool = typer.Option(False, "--merge", help="Merge the given profile files into -o."),
        device: Optional[str] = typer.Option(None, "--device", help="Device name or YAML (overrides the config's; "
                                             "with --merge: the merged device's name)."),
        no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
    ) -> None:
        """Profile every op signature x variant x accelerator of a model (measured where present)."""
        from rich.console import Console
        from .errors import ConfigError, ProfileError
        con = Console(highlight=False, soft_wrap=True)

        if merge:
            from .profile import merge_profiles, save_profile
            if output is None:
                raise ProfileError("--merge needs -o OUT.json")
            if len(inputs) < 2:
                raise ProfileError("--merge needs at least two profile files")
            merged = merge_profiles(inputs, device=device)
            save_profile(merged, output)
            con.print(f"merged {len(inputs)} profiles ({len(merged.entries)} entries, "
                      f"{sum(e.measured for e in merged.entries)} measured) -> {output}")
            return
        if len(inputs) != 1:
            raise ConfigError("give one experiment config (several files only with --merge)")

        import torch
        from . import models
        from .config import ROOT, load_device, load_experiment, resolve_device
        from .graph import trace
        from .profile import calibrate, profile_with_report, save_calibration, save_profile
        from .profile.core import (DEFAULT_BLOCK_MS, DEFAULT_BLOCKS, DEFAULT_WARMUP_MS, QUICK_BLOCK_MS,
                                   QUICK_BLOCKS, QUICK_WARMUP_MS)

        cfg_path = inputs[0]
        cfg = load_experiment(cfg_path)
        dev = load_device(device) if device else resolve_device(cfg, cfg_path)
        model = models.load(cfg.model.name, **({"num_classes": cfg.num_classes} if ":" not in cfg.model.name else {}),
                            **cfg.model.kwargs)
        example = torch.randn(cfg.batch_size, *cfg.input_shape)
        graph = trace(model, example, optimizer=cfg.optimizer.name, trainable=cfg.train.trainable, name=cfg.model.name)
        out = output or (ROOT / "profiles" / dev.name / f"{cfg.name}.json")
        cache = None
        if out.exists() and not fresh:
            from .profile import load_profile
            try:   # refused with a clear error when corrupt, truncated or for another device
                cache = load_profile(out, device=dev.name)
            except ProfileError as e:
                raise ProfileError(f"{e} (existing output reused as a cache; pass --fresh to overwrite it)") from None
        nb = blocks or (QUICK_BLOCKS if quick else DEFAULT_BLOCKS)
        bm = block_ms or (QUICK_BLOCK_MS if quick else DEFAULT_BLOCK_MS)
        wm = QUICK_WARMUP_MS if quick else DEFAULT_WARMUP_MS
        opt_kw = {"lr": cfg.optimizer.lr, "momentum": cfg.optimizer.momentum,
                  "weight_decay": cfg.optimizer.weight_decay}
        if cfg.optimizer.name == "adamw":
            opt_kw = {"lr": cfg.optimizer.lr, "betas": cfg.optimizer.betas, "eps": cfg.optimizer.eps,
                      "weight_decay": cfg.optimizer.weight_decay}
        prof, rep = profile_with_report(graph, dev, cache=cache, max_time_s=max_time, blocks=nb, block_ms=bm,
                                        warmup_ms=wm, threads=threads or cfg.train.threads,
                                        progress=not no_progress, optimizer_kwargs=opt_kw)
        save_profile(prof, out)
        for n in rep.notes:
            con.print(f"note: {n}")
        for f in rep.failed:
            con.print(f"[yellow]failed (modeled instead):[/] {f}")
        n_meas = sum(e.measured for e in prof.entries)
        con.print(f"{cfg.name} on {dev.name}: {len(prof.entries)} entries: {rep.measured} measured now, "
                  f"{rep.reused} reused from {out.name if cache is not None else 'cache'}, {rep.modeled} modeled "
                  f"({rep.absent_modeled} for absent accelerators, {rep.budget_modeled} not reached in the time "
                  f"budget, {len(rep.failed)} failed); {n_meas} measured in total; {rep.seconds:.1f} s; "
                  f"threads {prof.threads}")
        if rep.budget_modeled:
            con.print(f"[yellow]--max-time reached: {rep.budget_modeled} entries got modeled values "
                      f"(measured=false); re-run to measure them (finished entries are reused)[/]")
        con.print(f"wrote {out}")
        if calibrate_:
            cal = calibrate(graph, dev, prof)
            if not cal.efficiency:
                con.print("calibration: no measured entries on a present accelerator")
                return
            for acc in sorted(cal.efficiency):
                con.print(f"calibration {acc}: {cal.entries[acc]} entries, median |model-measured|/measured "
                          f"{cal.error_before[acc]:.0%} with default efficiencies -> {cal.error_after[acc]:.0%} "
                          f"calibrated (launch overhead fitted {cal.launch_us[acc]:.1f} us)")
                for kind, e in sorted(cal.efficiency[acc].items()):
                    con.print(f"  {kind:32s} efficiency {e:7.3f}   fit error {cal.per_kind_error[acc][kind]:.0%}")
            cpath = calibration_out or (ROOT / "profiles" / dev.name / "calibration.json")
            save_calibration(cal, cpath)
            con.print(f"wrote {cpath}; to use it in the device YAML, add under each accelerator:\n{cal.yaml_snippet()}")
