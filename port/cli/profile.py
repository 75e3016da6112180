"""`port profile`: measure op costs on this machine's accelerators (modeled for absent ones).

    port profile CONFIG [-o PATH] [--max-time S] [--quick] [--fresh]    (default PATH: the location rule,
                                                                        profiles/<device>/<config name>.json)
    port profile CONFIG --calibrate [--calibration-out FILE]
    port profile --merge a.json b.json -o out.json [--device NAME]
    port profile --all-modeled [-o DIR]     (the committed profiles of the modeled devices, profiles/README.md)
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, List, Optional

import typer


def committed_set() -> list[tuple[Path, str]]:
    """(shipped config, modeled device) pairs whose profiles the repository commits under profiles/: every
    device description marked ``modeled: true``, for every shipped config named after a zoo model, plus each
    shipped config on its own device when that device is modeled (configs/digits_m4.yaml on cortex-m4f)."""
    from port import config as C
    from port import models
    modeled = [n for n in C.device_names() if C.load_device(n, present_only=False).modeled]
    pairs = []
    for path in sorted(C.CONFIG_DIR.glob("*.yaml")):
        own = C.load_experiment(path).device
        pairs += [(path, d) for d in modeled if path.stem in models.ZOO or d == own]
    return pairs


def regenerate_modeled(out_dir: Path, echo: Callable[[str], None] = typer.echo,
                       pairs: Optional[list[tuple[Path, str]]] = None) -> list[Path]:
    """Write the committed set (``pairs``, default committed_set()) under ``out_dir`` (the location rule's layout,
    <device>/<config name>.json): fully modeled profiles (the roofline model: deterministic), whose ``host``
    record keeps only what identifies the graph, so that the same code writes the same bytes. Returns the paths."""
    import itertools

    from port import config as C
    from port import pipeline as P
    from port.cost.io import save_profile
    from port.cost.roofline import modeled_profile

    written = []
    for cpath, group in itertools.groupby(committed_set() if pairs is None else pairs, key=lambda pair: pair[0]):
        built = None
        for _, dev_name in group:
            job = P.load_job(cpath, device=dev_name)
            built = built or P.build_graph(job)      # the graph does not depend on the device
            g, dev = built.graph, C.load_device(dev_name, present_only=False)
            prof = modeled_profile(g, dev)
            prof = dataclasses.replace(prof, host=(("kind", "modeled"), ("graph", g.name),
                                                   ("graph_digest", g.digest()), ("batch_size", str(g.batch_size))))
            path = out_dir / P.profile_location(job.name, dev.name).relative_to(P.PROFILE_DIR)
            save_profile(prof, path)
            echo(f"wrote {path} ({len(prof.entries)} entries)")
            written.append(path)
    return written


def register(app: typer.Typer) -> None:
    @app.command("profile")
    def profile_cmd(
        inputs: Optional[List[Path]] = typer.Argument(None, help="An experiment YAML (or, with --merge, profile "
                                                      "JSON files)."),
        output: Optional[Path] = typer.Option(None, "-o", "--output", "--profile",
                                              help="Profile file (default profiles/<device>/<config name>.json)."),
        max_time: Optional[float] = typer.Option(None, "--max-time", help="Time budget in seconds; entries not "
                                                 "reached get modeled values (measured=false)."),
        quick: bool = typer.Option(False, "--quick", help="Fewer, shorter timing blocks (3 x ~5 ms)."),
        blocks: Optional[int] = typer.Option(None, "--blocks", min=1, help="Timing blocks per entry."),
        block_ms: Optional[float] = typer.Option(None, "--block-ms", help="Target length of one block (ms)."),
        threads: Optional[int] = typer.Option(None, "--threads", min=1, help="Override every accelerator's threads."),
        fresh: bool = typer.Option(False, "--fresh", help="Ignore an existing profile file (no reuse)."),
        calibrate_: bool = typer.Option(False, "--calibrate", help="Fit roofline efficiency per op kind on the "
                                        "present accelerators; print the fit error."),
        calibration_out: Optional[Path] = typer.Option(None, "--calibration-out",
                                                       help="Calibration file (default profiles/<device>/calibration.json)."),
        merge: bool = typer.Option(False, "--merge", help="Merge the given profile files into -o."),
        device: Optional[str] = typer.Option(None, "--device", help="Device name or YAML (overrides the config's; "
                                             "with --merge: the merged device's name)."),
        no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
        all_modeled: bool = typer.Option(False, "--all-modeled", help="Regenerate the committed profiles of the "
                                         "modeled devices for the shipped zoo configs under -o DIR (default "
                                         "profiles/); see profiles/README.md."),
    ) -> None:
        """Profile every op signature x variant x accelerator of a model (measured where present) and write
        it where `port solve` and `port train` look for it."""
        from port import pipeline as P
        from port.errors import ConfigError, ProfileError

        inputs = inputs or []
        if all_modeled:
            if inputs or merge:
                raise ConfigError("--all-modeled takes no CONFIG and no --merge (it writes every committed "
                                  "profile; -o DIR picks the folder)")
            written = regenerate_modeled(output if output is not None else P.PROFILE_DIR)
            typer.echo(f"{len(written)} modeled profiles written")
            return
        if merge:
            if output is None:
                raise ProfileError("--merge needs -o OUT.json")
            merged = P.merge_profile_files(inputs, output, device)
            typer.echo(f"merged {len(inputs)} profiles ({len(merged.entries)} entries, "
                       f"{sum(e.measured for e in merged.entries)} measured) -> {output}")
            return
        from port.config import ProfileOptions, validate_options
        validate_options(ProfileOptions, {"max_time_s": max_time, "blocks": blocks, "block_ms": block_ms,
                                          "threads": threads})
        if len(inputs) != 1:
            raise ConfigError("give one experiment config (several files only with --merge)")
        job = P.load_job(inputs[0], device=device, profile=output)
        built = P.build_graph(job)
        path = job.profile_path
        step, rep = P.profile_to_file(job, built.graph, fresh=fresh, quick=quick, blocks=blocks, block_ms=block_ms,
                                      threads=threads, max_time_s=max_time, progress=not no_progress,
                                      echo=typer.echo)
        prof = step.profile
        for n in rep.notes:
            typer.echo(f"note: {n}")
        for f in rep.failed:
            typer.echo(f"failed (modeled instead): {f}")
        typer.echo(f"{job.name} on {job.device.name}: {len(prof.entries)} entries: {rep.measured} measured now, "
                   f"{rep.reused} reused, {rep.modeled} modeled ({rep.absent_modeled} for absent accelerators, "
                   f"{rep.budget_modeled} not reached in the time budget, {len(rep.failed)} failed); "
                   f"{sum(e.measured for e in prof.entries)} measured in total; {rep.seconds:.1f} s; "
                   f"threads {prof.threads}")
        if rep.budget_modeled:
            typer.echo(f"--max-time reached: {rep.budget_modeled} entries got modeled values (measured=false); "
                       f"re-run to measure them (finished entries are reused)")
        bud = P.resolve_budget(job, built.graph, prof)
        typer.echo(bud.peak_line())
        typer.echo(f"wrote {path}")
        if calibrate_:
            from port.cost.calibrate import calibrate, save_calibration
            cal = calibrate(built.graph, job.device, prof)
            if not cal.efficiency:
                typer.echo("calibration: no measured entries on a present accelerator")
                return
            for acc in sorted(cal.efficiency):
                typer.echo(f"calibration {acc}: {cal.entries[acc]} entries, median |model-measured|/measured "
                           f"{cal.error_before[acc]:.0%} with default efficiencies -> {cal.error_after[acc]:.0%} "
                           f"calibrated (launch overhead fitted {cal.launch_us[acc]:.1f} us)")
                for kind, e in sorted(cal.efficiency[acc].items()):
                    typer.echo(f"  {kind:32s} efficiency {e:7.3f}   fit error {cal.per_kind_error[acc][kind]:.0%}")
            cpath = calibration_out or (P.PROFILE_DIR / job.device.name / "calibration.json")
            save_calibration(cal, cpath)
            typer.echo(f"wrote {cpath}; to use it in the device YAML, add under each accelerator:\n"
                       f"{cal.yaml_snippet()}")
