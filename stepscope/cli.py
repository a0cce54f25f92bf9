"""The `stepscope` command. Each subcommand lives in the module of the part it drives, named with
its argument adder and runner in COMMANDS; the module is imported only when its subcommand runs,
so `stepscope sidecar` never loads the operator and nothing loads torch."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import NamedTuple

from stepscope import __version__, settings


class Command(NamedTuple):
    """A subcommand: the module of the part it drives (imported only when it runs), the names of
    that module's argument adder and runner, and its help."""

    module: str
    help: str
    add_arguments: str = "add_arguments"
    run: str = "run"


COMMANDS: dict[str, Command] = {
    "demo": Command(
        "stepscope.local.demo",
        "run a 4-rank CPU training, capture 3 steps through a real sidecar, diagnose it (--scenario NAME: a known "
        "fault)",
    ),
    "capture": Command(
        "stepscope.local.capture", "capture steps of every training process on this machine through its sidecar"
    ),
    "watch": Command(
        "stepscope.local.watch",
        "watch the training on this machine through its sidecar and capture by itself when it slows down or hangs",
    ),
    "sidecar": Command("stepscope.sidecar.daemon", "run the sidecar daemon (control endpoint, uploader, NVML sampler)"),
    "analyze": Command(
        "stepscope.analysis",
        "diagnose a captured session (directory or object-store URI) and write the report",
        "add_analyze_arguments",
        "run_analyze",
    ),
    "diff": Command(
        "stepscope.analysis",
        "compare two captured sessions or traces: kernels and functions added, removed, slower, faster",
        "add_diff_arguments",
        "run_diff",
    ),
    "operator": Command("stepscope.operator.command", "run the Kubernetes operator (kopf)"),
    "get": Command(
        "stepscope.operator.sessions.report_command",
        "list ProfileSessions like kubectl get does",
        "add_get_arguments",
        "run_get",
    ),
    "report": Command(
        "stepscope.operator.sessions.report_command",
        "download a session's report from the object store and print or open it",
        "add_report_arguments",
        "run_report",
    ),
}


def _build_parser(command: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stepscope", description="On-demand profiling and diagnosis of distributed PyTorch training."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--version", action="version", version=f"stepscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, spec in COMMANDS.items():
        p = sub.add_parser(name, help=spec.help, description=spec.help)
        if name == command:
            module = importlib.import_module(spec.module)
            getattr(module, spec.add_arguments)(p)
            p.set_defaults(_run=getattr(module, spec.run))
            if name == "analyze":
                p.add_argument(
                    "--session",
                    metavar="NS/NAME",
                    help=(
                        "analyse a ProfileSession in the cluster and leave its result in its store (what the analysis "
                        "Job runs)"
                    ),
                )
                p.add_argument(
                    "--shards",
                    type=int,
                    metavar="N",
                    help=(
                        f"with --session: summarise shard ${settings.SHARD_INDEX_ENV} of N of its raw traces into its "
                        "store (what a pod of the shard Job runs)"
                    ),
                )
    return parser


def _run_session_analysis(session: str, shards: int | None) -> int:
    """`stepscope analyze --session NS/NAME [--shards N]`, the analysis Job's entry point (and its
    shard Job's, which the Job controller tells its index through the environment). It lives on the
    operator's side (it reads the session and leaves its result in the store) and is reached from here, the one
    module above both, so that the analysis never imports the operator."""
    namespace, _, name = session.partition("/")
    if not namespace or not name:
        print(f"stepscope analyze: --session wants NAMESPACE/NAME, got {session!r}", file=sys.stderr)
        return 2
    if shards is None:
        from stepscope.operator.sessions.analysis_job import run_session_analysis

        return run_session_analysis(namespace, name)
    index = settings.shard_index()
    if shards < 1 or not index.isdigit() or int(index) >= shards:
        print(
            f"stepscope analyze: --shards {shards} wants N >= 1 and ${settings.SHARD_INDEX_ENV} in 0..N-1 (an Indexed "
            f"Job sets it), got {index!r}",
            file=sys.stderr,
        )
        return 2
    from stepscope.operator.sessions.analysis_job import run_session_shard

    return run_session_shard(namespace, name, int(index), shards)


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _main(sys.argv[1:] if argv is None else argv)
        finally:
            sys.stdout.flush()  # here, where a closed pipe can still be caught (also after --help)
    except BrokenPipeError:
        # The reader went away (`stepscope analyze ... | head`): nothing to report. stdout goes to
        # /dev/null so that the interpreter's own flush at exit does not fail again (Python docs, signal).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _main(argv: list[str]) -> int:
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = _build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    if args.command == "analyze" and args.session:
        return _run_session_analysis(args.session, args.shards)
    if args.command == "analyze" and args.shards is not None:
        print("stepscope analyze: --shards goes with --session", file=sys.stderr)
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
