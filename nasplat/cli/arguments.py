"""The `nasplat` command line: its subcommands, their options and help, and usage errors as one line."""

from __future__ import annotations

import argparse
from typing import NoReturn

from nasplat.cli.commands import (
    EXPORT_FORMATS,
    cmd_export,
    cmd_report,
    cmd_resume,
    cmd_retrain,
    cmd_run,
    cmd_serve,
    cmd_status,
)
from nasplat.controllers import CONTROLLERS
from nasplat.executors import DEFAULT_EXECUTOR, EXECUTORS
from nasplat.integrations import CALLBACKS
from nasplat.schedulers import SCHEDULERS


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
    """The `nasplat` argument parser: one subparser per command, each naming its `cmd_*` function."""
    top = _Parser(prog="nasplat", description="Population and architecture search on Ray.")
    top.add_argument("--debug", action="store_true", help="show the traceback of an error instead of one line")
    debug = _Parser(add_help=False)  # `--debug` also after the command; the default stays top's
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
    resume.add_argument("--trust-pickle", action="store_true",
                        help="load an experiment stored as a pickle (experiment.pkl: live Python objects), which runs "
                             "code from the folder: only for folders you trust")
    resume.set_defaults(func=cmd_resume)
    again = sub.add_parser("retrain", parents=[debug],
                           help="train the architecture a search chose standalone from scratch (a new experiment)")
    again.add_argument("folder", help="the search's experiment folder (a supernet search, DARTS/GDAS, or any)")
    again.add_argument("--trainer", help="the standalone trainer, module:Class (default: the search trainer's "
                                         "RETRAIN_TRAINER)")
    again.add_argument("--trial", type=int, help="retrain this trial's architecture (default: the best trial's)")
    again.add_argument("--epochs", type=int, help="the config's `epochs` (default: the search's, else the "
                                                  "trainer's own); the retrain runs that many steps")
    again.add_argument("--max-steps", type=int, help="the most steps the retrain runs (default: its epochs)")
    again.add_argument("--trust-pickle", action="store_true",
                       help="allow a folder whose experiment is a pickle (experiment.pkl): loading it runs code")
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
                        "format (default: <experiment name>.<format> for rows, trial-<id>-step-<k>.pt for weights, "
                        "both here); never inside an experiment folder")
    export.add_argument("--format", choices=list(dict.fromkeys(EXPORT_FORMATS.values())),
                        help="parquet or csv: the rows, one column per decision; pt: {config, state_dict, trial_id, "
                        "step, metrics} for torch.load (default: the output's extension, else pt with --trial or "
                        "--step, else parquet; a --format the extension contradicts is refused)")
    export.add_argument("--force", action="store_true", help="replace the output if it exists (default: refuse)")
    export.add_argument("--trust-pickle", action="store_true",
                        help="with pt: load a checkpoint holding Python objects other than tensors, arrays and plain "
                             "values, which runs code from the folder: only for folders you trust")
    export.set_defaults(func=cmd_export)
    report = sub.add_parser("report", parents=[debug],
                            help="write a self-contained HTML report (into the experiment folder by default)")
    report.add_argument("folder")
    report.add_argument("-o", "--output", help="the file to write, - for standard output (default: "
                        "<folder>/report.html; ./<folder name>-report.html when the folder cannot be written)")
    report.add_argument("--ground-truth", help="standalone results of the same architectures (an experiment folder "
                        "or a .csv/.json/.jsonl/.parquet table): adds this search's metric against theirs, with the "
                        "rank correlation")
    report.add_argument("--ground-truth-metric", help="the ground truth's column to compare with (default: the "
                        "experiment's metric)")
    report.add_argument("--ground-truth-max-rows", type=int, help="refuse a ground-truth table of more rows "
                        "(default: 1,000,000, nasplat.report.oneshot.MAX_GROUND_TRUTH_ROWS; a Parquet file's count is "
                        "read from its metadata before any row)")
    report.set_defaults(func=cmd_report)
    serve = sub.add_parser("serve", parents=[debug], help="serve the report live while the experiment runs")
    serve.add_argument("folder")
    serve.add_argument("--port", type=int, default=8265 + 100)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--allow-host", action="append", default=[], metavar="NAME[:PORT]",
                       help="also answer requests naming this host (at the served port unless given), e.g. the "
                       "local end of a tunnel; by default only localhost, 127.0.0.1, [::1] and --host are answered, "
                       "against DNS rebinding")
    serve.set_defaults(func=cmd_serve)
    return top
