"""The `jaxattn` command. Each sub-command lives beside the code it drives and registers
itself here; heavy imports happen only when a sub-command runs."""

import argparse
import importlib
import sys
import warnings

# (module, register function): each adds its sub-parsers to the shared sub-parser set.
_COMMANDS = (
    ("jaxattn.dynamics._cli", "register"),  # simulate
    ("jaxattn.dynamics._cli_atlas", "register"),  # atlas
    ("jaxattn.dynamics._cli_map", "register"),  # map
    ("jaxattn.plga._cli", "register"),  # plga train / generate
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxattn",
        description="Dynamics of attention in JAX: particle flows on the sphere, regime "
        "atlas, Power Law Graph Attention (PLDR-LLM) training and collapse audits.",
        epilog="The command compiles with XLA's elemental CPU emitters (faster compiles): it "
        "appends --xla_cpu_use_fusion_emitters=false to XLA_FLAGS, which its subprocesses "
        "inherit, unless XLA_FLAGS already names that flag or a flags file, or jaxlib is "
        "0.11.1 or later (its XLA has no such emitters and would abort on the flag).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name, fn in _COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name:
                continue
            raise
        getattr(module, fn)(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 2
    # `plga train`, not `plga`: the command as typed, subcommand included
    command = " ".join(c for c in (args.command, getattr(args, "plga_command", None)) if c)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warning_printer(command, warnings.showwarning)
            return int(args.run(args) or 0)
    except (ValueError, OSError, UnicodeDecodeError) as err:
        # Bad input and unusable paths (missing file, --out naming a file, unreadable text)
        # are one-line errors; anything else is a bug and keeps its traceback.
        print(f"jaxattn {command}: error: {err}", file=sys.stderr)
        return 2


def _warning_printer(command: str, default):
    """A `warnings.showwarning` that prints the package's warnings (plain `UserWarning`s)
    as one line, `jaxattn COMMAND: warning: ...`: the source line a script's warning
    points at is, for the command, its entry script's `sys.exit(run())`. Other categories
    keep the default display."""

    def show(message, category, filename, lineno, file=None, line=None):
        if category is not UserWarning:
            return default(message, category, filename, lineno, file, line)
        text = " ".join(str(message).split())
        print(f"jaxattn {command}: warning: {text}", file=sys.stderr if file is None else file)

    return show


def run() -> int:
    """The `jaxattn` program: XLA's elemental CPU emitters (faster compiles, see
    `prefer_fast_cpu_compiles`) and small while loops compiled whole (faster solver loops,
    see `prefer_fast_cpu_loops`), then `main`. An `XLA_FLAGS` naming either setting wins."""
    from ._xla_flags import prefer_fast_cpu_compiles, prefer_fast_cpu_loops

    prefer_fast_cpu_compiles()
    prefer_fast_cpu_loops()
    return main()


if __name__ == "__main__":
    sys.exit(run())
