"""The `nasplat` command: run, resume, retrain, status, export, report and serve experiments.

Every error is one line on stderr, `nasplat <command>: error: ...`, and exit code 2; `--debug` shows the
traceback instead. A `run` or `resume` that finished with trials failed and none completed, stopped or paused
(nothing could succeed) exits with code 1 after one line naming the first errors. Trainer and space modules are
found in the current folder, as with `python -m`. `nasplat run`
keeps its experiment under `--storage`, else the file's `storage`, else the default folder (`$NASPLAT_RESULTS`,
else `./nasplat_results`), and prints where at the start; `--no-storage` keeps nothing on disk.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from nasplat.controllers import CONTROLLERS
from nasplat.core.rows import Status
from nasplat.engine.console import last_line
from nasplat.engine.records import ExperimentFailed
from nasplat.engine.result import ExperimentResult
from nasplat.executors import DEFAULT_EXECUTOR, EXECUTORS
from nasplat.experiment.file import experiment_spec, read_experiment_file
from nasplat.experiment.run import default_storage, resume, run_spec
from nasplat.experiment.retrain import retrain
from nasplat.integrations import CALLBACKS
from nasplat.schedulers import SCHEDULERS
from nasplat.storage import JOURNAL_FILE, FolderInUse, read_rows

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
    spec = {**read_experiment_file(args.experiment), **{k: v for k, v in overrides.items() if v is not None}}
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


def cmd_resume(args: argparse.Namespace) -> int:
    result = resume(args.folder, progress=not args.quiet)
    print(f"results: {result.location}")
    _summarise(result, top=5)
    return _nothing_succeeded(result, "resume")


def cmd_retrain(args: argparse.Namespace) -> int:
    """Train the experiment's chosen architecture standalone from scratch, as an experiment of its own."""
    result = retrain(args.folder, trainer=args.trainer, trial=args.trial, epochs=args.epochs, storage=args.storage,
                     name=args.name, seed=args.seed, progress=not args.quiet)
    print(f"results: {result.location}  (nasplat export {result.location} --format pt)")
    _summarise(result, top=1)
    return _nothing_succeeded(result, "retrain")


def _nothing_succeeded(result: ExperimentResult, command: str) -> int:
    """The exit code of a finished run: 1, after one line on stderr naming the first errors, when trials failed
    and none completed, stopped or paused (nothing in the search could succeed); else 0."""
    final = result.final_status()
    if Status.FAILED not in final.values() or any(
            s in (Status.COMPLETED, Status.STOPPED, Status.PAUSED) for s in final.values()):
        return 0
    errors: dict[int, str] = {}
    for row in result.rows:
        if row.get("status") == Status.FAILED and row["trial_id"] not in errors:
            errors[row["trial_id"]] = last_line(str(row.get("error") or "(no error recorded)"))
    first = "; ".join(f"trial {t}: {e}" for t, e in list(errors.items())[:3])
    print(f"nasplat {command}: error: no trial succeeded ({len(errors)} failed); first errors: {first}",
          file=sys.stderr)
    return 1


def cmd_status(args: argparse.Namespace) -> int:
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
    from nasplat.report import build_report

    path = build_report(args.folder, ground_truth=args.ground_truth, ground_truth_metric=args.ground_truth_metric)
    print(f"report: {path}")
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

        print(f"exported: {export_rows(args.folder, fmt, args.output)}")
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
    from nasplat.storage.checkpoints import load_checkpoint

    exported = {"config": row.get("config"), "state_dict": load_checkpoint(checkpoint.uri),
                "trial_id": checkpoint.trial_id, "step": checkpoint.step,
                "metrics": {k: v for k, v in row.items() if k not in RESERVED}}
    output = Path(args.output or f"trial-{checkpoint.trial_id}-step-{checkpoint.step}.pt")
    torch.save(exported, output)
    print(f"exported trial {checkpoint.trial_id} at step {checkpoint.step} ({result.metric}="
          f"{row.get(result.metric)}) to {output}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from nasplat.report.serve import serve_forever

    serve_forever(args.folder, port=args.port, host=args.host)
    return 0


def _run_epilog() -> str:
    """The names an experiment file may use, from the registries (one line each), and where results go."""
    return "\n".join([
        f"controllers (controller:): {CONTROLLERS.help()}",
        f"schedulers (scheduler:): {SCHEDULERS.help()}",
        f"executors (executor:): {EXECUTORS.help()}; default: {DEFAULT_EXECUTOR}",
        f"callbacks (callbacks:): {CALLBACKS.help()}",
        "storage: --storage, else the file's `storage:`, else $NASPLAT_RESULTS, else ./nasplat_results",
        "(the experiment's folder is printed at the start); --no-storage keeps nothing on disk",
    ])


class _Parser(argparse.ArgumentParser):
    """Usage mistakes as one line, like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="nasplat", description="Population and architecture search on Ray.")
    top.add_argument("--debug", action="store_true", help="show the traceback of an error instead of one line")
    debug = argparse.ArgumentParser(add_help=False)  # `--debug` also after the command; the default stays top's
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", parents=[debug], help="run an experiment file (YAML)", epilog=_run_epilog(),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("experiment", help="path to experiment.yaml")
    run.add_argument("--executor", choices=list(EXECUTORS),
                     help=f"override the file's executor (default: the file's, else {DEFAULT_EXECUTOR})")
    run.add_argument("--address", help="attach to this Ray cluster (default: $RAY_ADDRESS, else a local Ray)")
    where = run.add_mutually_exclusive_group()
    where.add_argument("--storage", help="override the file's storage folder or URI (default: the file's, else "
                       "$NASPLAT_RESULTS, else ./nasplat_results)")
    where.add_argument("--no-storage", action="store_true",
                       help="keep nothing on disk: the results live in memory and are printed at the end")
    run.add_argument("--name", help="override the experiment name")
    run.add_argument("--quiet", action="store_true", help="no progress line")
    run.set_defaults(func=cmd_run)
    resume = sub.add_parser("resume", parents=[debug], help="finish a killed experiment from its folder")
    resume.add_argument("folder")
    resume.add_argument("--quiet", action="store_true")
    resume.set_defaults(func=cmd_resume)
    again = sub.add_parser("retrain", parents=[debug],
                           help="train the architecture a search chose standalone from scratch (a new experiment)")
    again.add_argument("folder", help="the search's experiment folder (a supernet search, DARTS/GDAS, or any)")
    again.add_argument("--trainer", help="the standalone trainer, module:Class (default: the search trainer's "
                                         "RETRAIN_TRAINER)")
    again.add_argument("--trial", type=int, help="retrain this trial's architecture (default: the best trial's)")
    again.add_argument("--epochs", type=int, help="the config's `epochs` (default: the trainer's own)")
    again.add_argument("--storage", help="where the new experiment goes (default: beside the folder)")
    again.add_argument("--name", help="its name (default: <the folder's name>-retrain)")
    again.add_argument("--seed", type=int, default=0)
    again.add_argument("--quiet", action="store_true")
    again.set_defaults(func=cmd_retrain)
    status = sub.add_parser("status", parents=[debug], help="a table of the best trials of an experiment folder")
    status.add_argument("folder")
    status.add_argument("--top", type=int, default=10)
    status.add_argument("--importance", nargs="?", const="fanova", choices=["fanova", "ped-anova"],
                        help="also print each decision's importance (Optuna's fANOVA, or PED-ANOVA)")
    status.set_defaults(func=cmd_status)
    export = sub.add_parser("export", parents=[debug],
                            help="write the rows as a table, or a trial's trained weights and config")
    export.add_argument("folder")
    export.add_argument("--trial", type=int, help="the trial to export (default: the best)")
    export.add_argument("--step", type=int, help="its latest checkpoint at or before this step (default: latest)")
    export.add_argument("-o", "--output", help="the file to write; its extension (.parquet, .csv, .pt) names the "
                        "format (default: <folder>/results.<format> for rows, trial-<id>-step-<k>.pt here for weights)")
    export.add_argument("--format", choices=list(dict.fromkeys(EXPORT_FORMATS.values())),
                        help="parquet or csv: the rows, one column per decision; pt: {config, state_dict, trial_id, "
                        "step, metrics} for torch.load (default: the output's extension, else pt with --trial or "
                        "--step, else parquet; a --format the extension contradicts is refused)")
    export.set_defaults(func=cmd_export)
    report = sub.add_parser("report", parents=[debug],
                            help="write a self-contained HTML report into the experiment folder")
    report.add_argument("folder")
    report.add_argument("--ground-truth", help="standalone results of the same architectures (an experiment folder "
                        "or a .csv/.json/.jsonl/.parquet table): adds this search's metric against theirs, with the "
                        "rank correlation")
    report.add_argument("--ground-truth-metric", help="the ground truth's column to compare with (default: the "
                        "experiment's metric)")
    report.set_defaults(func=cmd_report)
    serve = sub.add_parser("serve", parents=[debug], help="serve the report live while the experiment runs")
    serve.add_argument("folder")
    serve.add_argument("--port", type=int, default=8265 + 100)
    serve.add_argument("--host", default="127.0.0.1")
    serve.set_defaults(func=cmd_serve)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv`; returns the exit code (2 for any error, after one line on stderr)."""
    args = parser().parse_args(argv)
    _find_user_modules_here()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"nasplat {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            traceback.print_exc()
        else:
            print(f"nasplat {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2


def _one_line(exc: BaseException) -> str:
    """The error's message on one line; the exception's type for errors that are not plain bad input."""
    from nasplat.integrations import MissingExtra

    message = " ".join(str(exc).split()) or "(no message)"
    expected = (ValueError, TypeError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError)
    if isinstance(exc, (FolderInUse, ExperimentFailed, MissingExtra)) or (
            isinstance(exc, expected) and type(exc).__module__ == "builtins"):
        return message
    return f"{type(exc).__name__}: {message} (run with --debug for the traceback)"


def _find_user_modules_here() -> None:
    """Put the current folder first on the import path of this process and of the Ray workers it starts, so
    that `trainer: my_trainer:MyTrainer` finds ./my_trainer.py (as `python -m` would)."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if here not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([here, *filter(None, paths)])


if __name__ == "__main__":
    sys.exit(main())
