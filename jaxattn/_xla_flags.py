"""XLA CPU settings (opt-in, per process): elemental emitters for faster compiles, small
while loops compiled whole for faster solver loops."""

import importlib.util
import mmap
import os
import re
from collections.abc import Callable, MutableMapping

__all__ = [
    "ELEMENTAL_CPU_EMITTERS",
    "SMALL_LOOP_BYTES",
    "SMALL_LOOP_OPTION",
    "prefer_fast_cpu_compiles",
    "prefer_fast_cpu_loops",
]

ELEMENTAL_CPU_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
_NAMED = re.compile(r"(^|\s)--xla_cpu_use_fusion_emitters(=|\s|$)")
# XLA retired its elemental CPU emitters, and with them the flag, between jaxlib 0.11.0 and
# 0.11.1 (the flag's registration is in jaxlib 0.11.0's libjax_common.so and gone from
# 0.11.1 and 0.11.2). XLA aborts the process on an unknown flag in XLA_FLAGS (seen with
# jaxlib 0.11.2: "Unknown flag in XLA_FLAGS"), so the flag is only ever added below 0.11.1.
_LAST_WITH_FLAG = (0, 11, 0)


def _knows_elemental_flag(version: str | None = None) -> bool:
    """Whether the installed jaxlib (or `version`, a version string) still accepts
    `--xla_cpu_use_fusion_emitters`; `False` for a version that cannot be read."""
    if version is None:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as installed

        try:
            version = installed("jaxlib")
        except PackageNotFoundError:
            return False
    parts = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return parts is not None and tuple(map(int, parts.groups())) <= _LAST_WITH_FLAG


def prefer_fast_cpu_compiles(environ: MutableMapping[str, str] | None = None) -> bool:
    """Ask XLA's CPU compiler for its elemental emitters instead of its fusion emitters,
    by appending `--xla_cpu_use_fusion_emitters=false` to `XLA_FLAGS`.

    On the CPU, compilation dominates short runs. `experiments/bench_compile.py` measured
    on 2 cores (2026-12-03) XLA compile times of 0.55-0.78× for sweeps and 0.5× for
    `simulate` (PLGA programs 0.75-1.12×), with outputs equal to 2e-12 and the same
    regimes; run times are 0.65-1.4× (particle sweeps run about 1.25-1.5× slower, so a
    long particle sweep in your own session may prefer the default). The `jaxattn` command
    calls this when it starts, and the test suite does; a library import never does (it
    changes no global setting). Call it yourself, before anything runs on JAX, to get the
    same in a notebook or script. It has no effect on GPUs and TPUs. From jaxlib 0.11.1 on,
    XLA has no elemental emitters and no such flag (it would abort on it), so this does
    nothing there.

    **Arguments:** `environ`: the environment to edit, a mutable mapping of strings
    (default `os.environ`, e.g. a copy prepared for a subprocess).

    **Returns:** `True` if the flag was added. `False`, and nothing is edited, when
    `XLA_FLAGS` already names `--xla_cpu_use_fusion_emitters` (your choice is kept), when
    `XLA_FLAGS` names a flags file (a value not starting with `-`, which XLA reads as a file
    name), when the installed jaxlib is 0.11.1 or later (or its version is unreadable), or,
    for `os.environ`, when JAX's backends have already started (XLA reads its flags once, at
    start: nothing would change; a `UserWarning` says so).

    **Raises:** `TypeError` for an `environ` that is not a mutable mapping, or whose
    `XLA_FLAGS` is not a string.
    """
    return _append_flag(
        "prefer_fast_cpu_compiles", environ, ELEMENTAL_CPU_EMITTERS, _NAMED, _knows_elemental_flag
    )


# XLA's CPU runtime runs a compiled program as a sequence of kernels ("thunks"), dispatching
# every kernel of a while loop's body on every iteration (~0.1 us each). A solver step of a
# particle sweep is ~125 kernels. XLA's small-while-loop pass instead compiles a while loop
# whose buffers total at most this many bytes into one kernel (1 kB by default). 16 MiB
# holds a one-slot particle member's solve with its whole-state saves up to n ~ 4000 tokens
# (d = 2, 201 saves, float64) and leaves loops that carry model weights (PLGA decode and
# training at real sizes) to the default runtime.
SMALL_LOOP_BYTES = 1 << 24
_SMALL_LOOP_KEY = "xla_cpu_small_while_loop_byte_threshold"
SMALL_LOOP_OPTION = f"--xla_backend_extra_options={_SMALL_LOOP_KEY}={SMALL_LOOP_BYTES}"
# Any --xla_backend_extra_options is the user's: a second one would replace or merge with
# theirs depending on XLA's version, so it is left alone.
_NAMED_EXTRA = re.compile(r"(^|\s)--xla_backend_extra_options(=|\s|$)")


def _knows_small_loop_option(library: str | None = None) -> bool:
    """Whether XLA in the installed jaxlib (or in `library`, a path to a shared library)
    knows the backend option `xla_cpu_small_while_loop_byte_threshold`: its name is in the
    library's text. XLA passes a backend option it does not know to LLVM, which aborts the
    process ("Unknown command line argument"), so the option is only added when present.
    `False` when the library cannot be found or read."""
    if library is None:
        spec = importlib.util.find_spec("jaxlib")
        if spec is None or spec.origin is None:
            return False
        library = os.path.join(os.path.dirname(spec.origin), "libjax_common.so")
    try:
        with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(_SMALL_LOOP_KEY.encode()) >= 0
    except (OSError, ValueError):
        return False


def prefer_fast_cpu_loops(environ: MutableMapping[str, str] | None = None) -> bool:
    """Ask XLA's CPU compiler to compile small while loops whole, by appending
    `--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=16777216` to
    `XLA_FLAGS` (`SMALL_LOOP_OPTION`).

    XLA's CPU runtime runs a program as a sequence of kernels and dispatches every kernel of
    a while loop's body on every iteration; a diffrax solver step of a particle sweep was
    ~125 of them (~60 since sweeps step with `UnrolledTsit5`), and their dispatch was most
    of a step. With the option, a while loop whose buffers total at most `SMALL_LOOP_BYTES`
    (16 MiB) becomes one kernel: particle sweeps (512 pairs, n = 256) ran 1.3x faster on
    one core with bitwise the same results (1.6x before `UnrolledTsit5`;
    `experiments/bench_compaction.py --loops`). The `jaxattn` command calls this when it
    starts, and the test suite does; a library import never does (it changes no global
    setting). Call it yourself, before anything runs on JAX, to get the same in a notebook
    or script. It has no effect on GPUs and TPUs.

    **Arguments:** `environ`: the environment to edit, a mutable mapping of strings
    (default `os.environ`, e.g. a copy prepared for a subprocess).

    **Returns:** `True` if the option was added. `False`, and nothing is edited, when
    `XLA_FLAGS` already names `--xla_backend_extra_options` (your choice is kept), when it
    names a flags file (a value not starting with `-`), when the installed jaxlib's XLA does
    not know the option (XLA would abort on it), or, for `os.environ`, when JAX's backends
    have already started (XLA reads its flags once, at start; a `UserWarning` says so).

    **Raises:** `TypeError` for an `environ` that is not a mutable mapping, or whose
    `XLA_FLAGS` is not a string.
    """
    return _append_flag(
        "prefer_fast_cpu_loops", environ, SMALL_LOOP_OPTION, _NAMED_EXTRA, _knows_small_loop_option
    )


def _append_flag(
    where: str,
    environ: MutableMapping[str, str] | None,
    flag: str,
    named: re.Pattern,
    known: Callable[[], bool],
) -> bool:
    """Append `flag` to `environ["XLA_FLAGS"]` unless `named` finds the user's own setting,
    `XLA_FLAGS` names a flags file, `known()` says this jaxlib would abort on it, or (for
    `os.environ`) JAX's backends have already read their flags."""
    env = os.environ if environ is None else environ
    if not isinstance(env, MutableMapping):
        raise TypeError(
            f"{where}: environ must be a mutable mapping such as os.environ "
            f"or a dict, got {type(env).__name__}."
        )
    flags = env.get("XLA_FLAGS", "")
    if not isinstance(flags, str):
        raise TypeError(
            f"{where}: environ['XLA_FLAGS'] must be a string, got {type(flags).__name__}."
        )
    if named.search(flags) or (flags.strip() and not flags.strip().startswith("-")):
        return False
    if not known():
        return False
    if env is os.environ:
        from jax._src import xla_bridge

        if getattr(xla_bridge, "backends_are_initialized", lambda: False)():
            from ._warn import warn_at_caller  # JAX has started: importing it costs nothing

            warn_at_caller(
                f"{where}: JAX has already started and XLA read XLA_FLAGS then; nothing was "
                "changed. Call it first thing in the script or notebook (before anything "
                f"runs on JAX), or start Python with XLA_FLAGS='{flag}'."
            )
            return False
    env["XLA_FLAGS"] = (flags + " " + flag).strip()
    return True
