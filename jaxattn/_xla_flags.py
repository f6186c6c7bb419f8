"""XLA's elemental CPU emitters for faster compiles (opt-in, per process)."""

import os
import re
from collections.abc import MutableMapping

__all__ = ["ELEMENTAL_CPU_EMITTERS", "prefer_fast_cpu_compiles"]

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
    start: nothing would change).

    **Raises:** `TypeError` for an `environ` that is not a mutable mapping, or whose
    `XLA_FLAGS` is not a string.
    """
    env = os.environ if environ is None else environ
    if not isinstance(env, MutableMapping):
        raise TypeError(
            f"prefer_fast_cpu_compiles: environ must be a mutable mapping such as os.environ "
            f"or a dict, got {type(env).__name__}."
        )
    flags = env.get("XLA_FLAGS", "")
    if not isinstance(flags, str):
        raise TypeError(
            f"prefer_fast_cpu_compiles: environ['XLA_FLAGS'] must be a string, got "
            f"{type(flags).__name__}."
        )
    if _NAMED.search(flags) or (flags.strip() and not flags.strip().startswith("-")):
        return False
    if not _knows_elemental_flag():
        return False
    if env is os.environ:
        from jax._src import xla_bridge

        if getattr(xla_bridge, "backends_are_initialized", lambda: False)():
            return False
    env["XLA_FLAGS"] = (flags + " " + ELEMENTAL_CPU_EMITTERS).strip()
    return True
