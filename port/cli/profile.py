"""`port profile`: measure op costs on this machine's accelerators (modeled for absent ones).

    port profile CONFIG [-o PATH] [--max-time S] [--quick] [--fresh]    (default PATH: the location rule,
                                                                        profiles/<device>/<config name>.json)
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
    ) -> None:
        """Profile every op signature x variant x accelerator of a model (measured where present) and write
        it where `port solve` and `port train` look for it."""
        from port import pipeline as P
        from port.errors import ConfigError, ProfileError

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
