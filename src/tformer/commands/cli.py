"""The `tformer` command line: a thin dispatcher over `tformer.commands.*`.

Each sub-command lives in its own module exposing `HELP`, `add_arguments(parser)`
and `run(args) -> int`, so commands import their heavy dependencies only when used.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys
import time
from pathlib import Path

from tformer import __version__
from tformer.errors import OS_ERRORS, USER_ERRORS, Terminated, sigterm_interrupts  # one line, no traceback
from tformer.nn.kernels.allocator import keep_freed_memory

# (command name, module under tformer.commands)
COMMANDS = [
    ("info", "info"),
    ("train", "train"),
    ("eval", "eval"),
    ("generate", "generate"),
    ("predict", "predict"),
    ("rerank", "rerank"),
    ("embed", "embed"),
    ("similarity", "similarity"),
    ("search", "search"),
    ("index", "index"),
    ("mine", "mine"),
    ("attention", "attention"),
    ("plot-positions", "plot_positions"),
    ("export", "export"),
    ("bench", "bench"),
    ("serve", "serve"),
]

def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="tformer",
        description="Transformer encoder and encoder-decoder: train, run, inspect, benchmark.",
    )
    parser.add_argument("--version", action="version", version=f"tformer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands: dict[str, argparse.ArgumentParser] = {}
    for name, module_name in COMMANDS:
        try:
            module = importlib.import_module(f"tformer.commands.{module_name}")
        except ModuleNotFoundError as e:
            if e.name == f"tformer.commands.{module_name}":
                continue  # command not part of this build
            raise
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        # Sub-actions (`index build`) cannot be parsed intermixed; the rest are.
        p.set_defaults(_run=module.run, command=name,
                       _intermixed=getattr(module, "INTERMIXED", True))
        commands[name] = p
    return parser, commands


# The arguments that name a file or folder, by their dest in every command: "" there was read
# as ".", the current folder (MODEL_DIR "" said "config.json: no such file", `search --model ""`
# took the index's own model, `train --data ""` named a file '.').
PATH_ARGUMENTS = frozenset({"config", "run_dir", "model_dir", "model", "file", "corpus", "data",
                            "valid", "test", "from_pretrained", "out", "html", "onnx", "hf", "json",
                            "index", "vectors", "texts", "query_vectors"})


def _empty_path(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The first path argument given as "", named as the user wrote it (--data, MODEL_DIR), or
    None; a sub-command's (`index build`) too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None and (found := _empty_path(chosen, args)):
                return found
        elif action.dest in PATH_ARGUMENTS and getattr(args, action.dest, None) == "":
            named = action.option_strings[0] if action.option_strings else action.metavar
            return named or action.dest.upper()
    return None


def _os_error(e: OSError) -> str:
    """The machine's refusal in one line, naming the file (then its notes: what a full disk left,
    tformer.training.loop): the error's own, or for a full disk or a read-only filesystem met by a
    plain write (no file in the error), the write begun last."""
    return "; ".join([_os_refusal(e), *getattr(e, "__notes__", ())])


def _os_refusal(e: OSError) -> str:
    import errno

    from tformer.storage import files

    if e.errno in (errno.EEXIST, errno.ENOTDIR) and e.filename:
        path = Path(e.filename)
        blocking = next((q for q in (path, *path.parents) if q.exists()), None)  # the nearest that is
        if blocking is not None and not blocking.is_dir():
            wanted = f" (for {path})" if blocking != path else ""
            return f"{blocking}: is a file, where a folder is needed{wanted}"
    if e.filename:
        return f"{e.filename}: {e.strerror or e}"
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG) and files.last_step:
        return f"{e.strerror or e} ({files.last_step})"
    return str(e.strerror or e)


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. Called without `argv` (the `tformer` script, `python -m
    tformer`) it is the whole process and ends it itself (``exit_now``)."""
    rc = _command(argv)
    if argv is None:
        exit_now(rc)
    return rc


def exit_now(rc: int) -> None:
    """End the process with status `rc` without tearing the interpreter down: Python's own exit
    frees every module and collects all garbage, which with torch, tokenizers and matplotlib
    loaded took 6 s after a 60 s training run on a busy 2-core machine, past its budget. What
    an exit owes still happens: the atexit functions (temporary files', tqdm's, torch.distributed's
    and multiprocessing's cleanups), then the standard streams are flushed."""
    try:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except BrokenPipeError:  # the reader went away: nothing more to say to it
        pass
    finally:
        os._exit(rc)


def _command(argv: list[str] | None) -> int:
    started = command_started(argv)
    parser, commands = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in commands:
        # Intermixed: options may sit between positional texts (`embed DIR a --k 3 b`).
        p = commands[argv[0]]
        intermixed = p.get_default("_intermixed")
        args = (p.parse_intermixed_args if intermixed else p.parse_args)(argv[1:])
    else:
        args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    if empty := _empty_path(commands[args.command], args):
        print(f"tformer {args.command}: error: {empty}: expected a path, got '' (an unset shell "
              "variable?); '.' names the current folder", file=sys.stderr)
        return 2
    args.started = started  # what a budget (train --max-minutes) counts from
    try:
        # tformer.nn.kernels.allocator: on the CPU a step's tensors are not faulted in afresh each time
        keep_freed_memory(_device_type(args))
        with sigterm_interrupts():  # `kill`, `timeout`, a scheduler: every command stops as on Ctrl-C
            rc = int(args._run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return rc
    except BrokenPipeError:
        _quiet_stdout()
        return 1
    except USER_ERRORS as e:
        # A raw OS refusal (errno set: mkdir met a file where a folder was needed) reads as the
        # machine's, naming the path; tformer's own (no errno) as written.
        shown = _os_error(e) if isinstance(e, OSError) and e.errno is not None else e
        print(f"tformer {args.command}: error: {shown}", file=sys.stderr)
        return 2
    except OS_ERRORS as e:
        print(f"tformer {args.command}: error: {_os_error(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # (its message, if any, says how to go on)
        # Ctrl-C: 130; SIGTERM (taken as a Ctrl-C): 143, 128 + the signal, as the shells say
        what, rc = ("terminated", 143) if isinstance(e, Terminated) else ("interrupted", 130)
        print(f"tformer {args.command}: {what}" + (f"; {e}" if str(e) else ""), file=sys.stderr)
        return rc


def _device_type(args: argparse.Namespace) -> str:
    """Where the command's model will run ("cpu", "cuda", "mps"), from --device; "auto" asks
    torch, but only for a command that has --device (the NumPy engine never imports torch)."""
    spec = getattr(args, "device", None)
    if spec is None and (args.command != "train" or getattr(args, "engine", "torch") == "numpy"):
        return "cpu"  # no --device: the command runs on the CPU, if at all
    if spec in (None, "auto"):
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(spec).split(":")[0]  # a misspelled device is refused by the command itself


def command_started(argv: list[str] | None) -> float:
    """When the command started, as a time.perf_counter() reading: for `tformer ...` itself
    (no argv given), the process's start (/proc/self/stat on Linux), so that the interpreter's
    start and the imports count too; for main(argv) called in a longer-lived process, now."""
    now = time.perf_counter()
    if argv is not None:
        return now
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start_ticks = int(after_name[19])  # field 22, starttime, in clock ticks after boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return now
    age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    return now - min(max(age, 0.0), 60.0)  # (a clock that disagrees: at most a minute)


def _quiet_stdout() -> None:
    """The reader of our output went away (`tformer info RUN | head`): as Python's docs advise,
    point stdout at /dev/null so the flush at exit does not fail again, and say nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real descriptor (a captured stdout): nothing to flush
        pass


if __name__ == "__main__":
    main()
