"""What each `nasplat` subcommand does, given its parsed arguments; each returns the exit code."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from nasplat.core.rows import Status
from nasplat.engine.console import last_line
from nasplat.engine.result import ExperimentResult
from nasplat.experiment.file import experiment_spec, read_experiment_file
from nasplat.experiment.pipeline import is_pipeline, pipeline_home, resume_pipeline, run_pipeline
from nasplat.experiment.retrain import retrain
from nasplat.experiment.run import default_storage, resume, run_spec
from nasplat.storage import JOURNAL_FILE, ROWS_FILE, read_rows

# `nasplat export -o FILE`: the format a file's extension names (when --format is not given)
EXPORT_FORMATS = {".parquet": "parquet", ".csv": "csv", ".pt": "pt"}


def _summarise(result: ExperimentResult, top: int) -> None:
    """Trial counts, then the Pareto front with several objectives or constraints, else a table of the `top`
    trials."""
    counts = result.counts()
    several = len(result.metrics) > 1 or bool(result.constraints)
    print(f"trials: {sum(counts.values())} ({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))})"
          + ("" if several else _promotions(result)))
    if several:
        front = result.pareto_front()
        bounds = f" under {', '.join(str(c) for c in result.constraints)}" if result.constraints else ""
        print(f"Pareto front{bounds}: {len(front)} trials")
        _table([{"trial": r["trial_id"], **{m: r[m] for m in result.metrics}, "config": str(r["config"])[:80]}
                for r in front], width=80)
        return
    ranked = result.ranked()[:top]
    if not ranked:
        print("no trial reported a finite metric yet")
        return
    final = result.final_status()
    _table([{"trial": r["trial_id"], "best at step": r["step"], result.metric: r[result.metric],
             "status": final[r["trial_id"]], "config": str(r["config"])[:90]} for r in ranked], width=90)


def _table(rows: list[dict[str, object]], *, width: int) -> None:
    """`rows` as a plain-text table, columns up to `width` characters."""
    if not rows:
        return
    import pandas as pd

    with pd.option_context("display.max_colwidth", width, "display.width", 160):
        print(pd.DataFrame(rows).to_string(index=False))


def _promotions(result: ExperimentResult) -> str:
    """'; N promotions of paused trials' when any were resumed (ASHA's promote type), from the journal."""
    journal = result.path / JOURNAL_FILE if result.path is not None else None
    if journal is None or not journal.exists():
        return ""
    promoted = sum("resume" in entry for entry in read_rows(journal))
    return f"; {promoted} promotions of paused trials" if promoted else ""


def cmd_run(args: argparse.Namespace) -> int:
    """Read, check and run the experiment file; its folder is printed when it is created, the best trials at the
    end."""
    overrides = {"executor": args.executor, "storage": args.storage, "name": args.name}
    raw = read_experiment_file(args.experiment)
    if is_pipeline(raw):
        return _run_pipeline(raw, args)
    spec = {**raw, **{k: v for k, v in overrides.items() if v is not None}}
    defaulted = not args.no_storage and spec.get("storage") is None
    if args.no_storage or defaulted:
        spec["storage"] = None if args.no_storage else default_storage()
    experiment = experiment_spec(spec, source=str(args.experiment))
    if args.address:
        if experiment.executor != "ray":
            raise ValueError(f"--address needs executor 'ray', got executor={experiment.executor!r}")
        options = {**experiment.executor_options, "address": args.address}
        experiment = dataclasses.replace(experiment, executor_options=options)

    def announce(location: str) -> None:
        how = " (the default storage: --storage DIR for another, --no-storage for none)" if defaulted else ""
        print(f"experiment folder: {location}{how}", flush=True)

    result = run_spec(experiment, progress=not args.quiet, announce=announce)
    if result.path is not None:  # the experiment's own location (a URI's, not its local copy's)
        print(f"results: {result.location}  (nasplat status {result.location} · nasplat report {result.path})")
    _summarise(result, top=5)
    return _nothing_succeeded(result, "run")


def _run_pipeline(raw: dict, args: argparse.Namespace) -> int:
    """`nasplat run` of a pipeline file: its stages run (or go on) in turn, each announced; the retrain's result
    is summarised."""
    if args.no_storage or args.executor or args.address:
        raise ValueError(f"{args.experiment} is a pipeline: it needs storage (no --no-storage), and each stage names "
                         "its own `executor:` (no --executor, --address)")
    spec = {**raw, **({"name": args.name} if args.name else {})}
    results = run_pipeline(spec, storage=args.storage, source=str(args.experiment), progress=not args.quiet,
                           announce=lambda line: print(line, flush=True))
    retrained = results["retrain"]
    print(f"results: {retrained.location}  (nasplat report {retrained.location})")
    _summarise(retrained, top=1)
    return _nothing_succeeded(retrained, "run")


def cmd_resume(args: argparse.Namespace) -> int:
    """Finish a killed experiment (or a pipeline, from its folder's `pipeline.json`), then print its best trials."""
    home = pipeline_home(args.folder)
    if home is not None:
        retrained = resume_pipeline(home, progress=not args.quiet, announce=lambda line: print(line, flush=True))
        print(f"results: {retrained['retrain'].location}")
        _summarise(retrained["retrain"], top=1)
        return _nothing_succeeded(retrained["retrain"], "resume")
    result = resume(args.folder, progress=not args.quiet, allow_pickle=args.trust_pickle)
    print(f"results: {result.location}")
    _summarise(result, top=5)
    return _nothing_succeeded(result, "resume")


def cmd_retrain(args: argparse.Namespace) -> int:
    """Train the experiment's chosen architecture standalone from scratch, as an experiment of its own."""
    result = retrain(args.folder, trainer=args.trainer, trial=args.trial, epochs=args.epochs,
                     max_steps=args.max_steps, storage=args.storage, name=args.name, seed=args.seed,
                     progress=not args.quiet, allow_pickle=args.trust_pickle)
    print(f"results: {result.location}  (nasplat export {result.location} --format pt)")
    _summarise(result, top=1)
    return _nothing_succeeded(result, "retrain")


def _nothing_succeeded(result: ExperimentResult, command: str) -> int:
    """The exit code of a finished run: 1, after one line on stderr naming the first errors, when trials failed
    and none completed, stopped or paused (nothing in the search could succeed), or when a trial's last checkpoint
    could not be written (`_last_checkpoints_lost`); else 0."""
    final = result.final_status()
    if Status.FAILED not in final.values() or any(
            s in (Status.COMPLETED, Status.STOPPED, Status.PAUSED) for s in final.values()):
        return _last_checkpoints_lost(result, command)
    errors: dict[int, str] = {}
    for row in result.rows:
        if row.get("status") == Status.FAILED and row["trial_id"] not in errors:
            errors[row["trial_id"]] = last_line(str(row.get("error") or "(no error recorded)"))
    first = "; ".join(f"trial {t}: {e}" for t, e in list(errors.items())[:3])
    print(f"nasplat {command}: error: no trial succeeded ({len(errors)} failed); first errors: {first}",
          file=sys.stderr)
    return 1


def _last_checkpoints_lost(result: ExperimentResult, command: str) -> int:
    """1, after one line on stderr, when the last checkpoint of some trial was due and could not be written (its
    trained state is not stored; nothing loads an older one unasked); else 0."""
    lost = result.lost_checkpoints()
    if not lost:
        return 0
    trial, step, why = lost[0]
    more = f" (and {len(lost) - 1} more trials)" if len(lost) > 1 else ""
    print(f"nasplat {command}: error: the last checkpoint of trial {trial} (step {step}){more} could not be written: "
          f"{why}; its trained state is not stored (an older checkpoint is used only when asked for by --step)",
          file=sys.stderr)
    return 1


def cmd_status(args: argparse.Namespace) -> int:
    """Print an experiment folder's objectives and best trials; with --importance each decision's importance."""
    result = ExperimentResult.load(args.folder)
    objectives = ", ".join(f"{m} ({d})" for m, d in zip(result.metrics, result.modes))
    print(f"experiment {Path(args.folder).name}: metric {objectives}")
    _summarise(result, top=args.top)
    if args.importance:
        from nasplat.integrations import param_importances

        importances = param_importances(result, evaluator=args.importance)
        print(f"decision importance for {result.metric} (Optuna, {args.importance}):")
        for name, value in importances.items():
            print(f"  {name:<40} {value:.3f}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Write the HTML report (with a ground truth when given) and print its path: into the experiment folder, else
    where `-o` says (`-` prints the page itself), else beside the current folder when the folder cannot be
    written, with a note why."""
    from nasplat.report import render_report
    from nasplat.report.output import write_page

    folder = Path(args.folder)
    if not (folder / ROWS_FILE).exists():
        raise FileNotFoundError(f"{folder} is not an experiment folder: no {ROWS_FILE} in it")
    limit = {} if args.ground_truth_max_rows is None else {"ground_truth_max_rows": args.ground_truth_max_rows}
    page = render_report(folder, ground_truth=args.ground_truth, ground_truth_metric=args.ground_truth_metric, **limit)
    if args.output == "-":
        sys.stdout.write(page)
        return 0
    path, note = write_page(folder, page, args.output)
    print(f"report: {path}" + (f" ({note})" if note else ""))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """`--format parquet|csv`: the rows as a table; `pt`: a trial's weights. Without --format, the format the
    output's extension names (`.parquet`, `.csv`, `.pt`), else `pt` with `--trial` or `--step`, else parquet."""
    fmt = _export_format(args.format, args.output, weights=args.trial is not None or args.step is not None)
    if fmt != "pt":
        if args.trial is not None or args.step is not None:
            given = f"--format {fmt}" if args.format else f"-o {args.output} ({fmt})"
            raise ValueError(f"--trial and --step choose a checkpoint: they need --format pt, got {given}")
        from nasplat.integrations.export import export_rows

        print(f"exported: {export_rows(args.folder, fmt, args.output, force=args.force)}")
        return 0
    return _export_weights(args)


def _export_format(given: str | None, output: str | None, *, weights: bool) -> str:
    """The export format: `given`, which must agree with the output's known extension; else that extension's."""
    suffix = Path(output).suffix.lower() if output else ""
    implied = EXPORT_FORMATS.get(suffix)
    if given is not None and implied is not None and given != implied:
        raise ValueError(f"--format {given} does not match the output {output} (a {suffix} file holds {implied}): "
                         f"drop --format, or name the output *.{given}")
    return given or implied or ("pt" if weights else "parquet")


def _export_weights(args: argparse.Namespace) -> int:
    """Write a trial's trained state with its config, step and metrics into one file plain `torch.load` reads."""
    import torch

    result = ExperimentResult.load(args.folder)
    try:
        checkpoint = result.find_checkpoint(args.trial, args.step)
    except LookupError as exc:
        raise ValueError(str(exc)) from None
    row = next((r for r in result.rows if r["trial_id"] == checkpoint.trial_id and r["step"] == checkpoint.step
                and r.get("status") not in (Status.FAILED, Status.RETRIED)), {})
    from nasplat.core.rows import RESERVED
    from nasplat.integrations.export import check_output, write_output
    from nasplat.storage.checkpoints import load_checkpoint

    output = check_output(args.output or f"trial-{checkpoint.trial_id}-step-{checkpoint.step}.pt", force=args.force)
    assert checkpoint.uri is not None  # latest_checkpoint finds only durable checkpoints: each has its uri
    state = load_checkpoint(checkpoint.uri, allow_pickle=args.trust_pickle)
    exported = {"config": row.get("config"), "state_dict": state,
                "trial_id": checkpoint.trial_id, "step": checkpoint.step,
                "metrics": {k: v for k, v in row.items() if k not in RESERVED}}
    write_output(output, lambda f: torch.save(exported, f), force=args.force)
    print(f"exported trial {checkpoint.trial_id} at step {checkpoint.step} ({result.metric}="
          f"{row.get(result.metric)}) to {output}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve the report live over HTTP until interrupted."""
    from nasplat.report.serve import serve_forever

    serve_forever(args.folder, port=args.port, host=args.host, allow_hosts=tuple(args.allow_host))
    return 0
