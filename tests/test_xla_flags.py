"""XLA CPU settings. `prefer_fast_cpu_compiles` (elemental emitters) and
`prefer_fast_cpu_loops`: XLA's small while loops compiled whole. The option is added once,
a user's own setting is kept, a jaxlib that does not know it is left alone, and it changes
no result (a sweep and `simulate` in a process without it give the same numbers)."""

import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn
import jaxattn._xla_flags as xf
from jaxattn._xla_flags import SMALL_LOOP_OPTION


def _before_and_after_start(name):
    """In a fresh process with no XLA_FLAGS: `jaxattn.<name>()` and the XLA_FLAGS it leaves,
    a JAX computation, then the same call again (JAX has started: nothing is added)."""
    code = (
        "import os, jax.numpy as jnp, jaxattn; os.environ.pop('XLA_FLAGS', None); "
        f"print(jaxattn.{name}(), os.environ.get('XLA_FLAGS')); "
        "print(float(jnp.ones(3).sum())); os.environ.pop('XLA_FLAGS'); "
        f"print(jaxattn.{name}(), os.environ.get('XLA_FLAGS'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_the_option_is_xlas_small_while_loop_threshold_of_16_mib():
    assert SMALL_LOOP_OPTION == (
        "--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=16777216"
    )
    assert xf.SMALL_LOOP_BYTES == 2**24


def test_the_option_is_known_by_the_name_in_the_library(tmp_path):
    lib = tmp_path / "libjax_common.so"
    lib.write_bytes(b"\x7fELF\x00...xla_cpu_small_while_loop_byte_threshold\x00...")
    assert xf._knows_small_loop_option(str(lib))
    lib.write_bytes(b"\x7fELF\x00...xla_cpu_small_while_loop\x00...")  # a prefix is not it
    assert not xf._knows_small_loop_option(str(lib))
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    assert not xf._knows_small_loop_option(str(empty))
    assert not xf._knows_small_loop_option(str(tmp_path / "missing.so"))
    assert not xf._knows_small_loop_option(str(tmp_path))  # a folder


def test_prefer_fast_cpu_loops_adds_the_option_once_and_keeps_a_users_choice():
    if not xf._knows_small_loop_option():
        pytest.skip("this jaxlib's XLA has no small-while-loop option (the next test covers it)")
    jnp.zeros(1).block_until_ready()  # this process's backends have started
    # A mapping other than this process's environment (e.g. a subprocess's) is still edited.
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert jaxattn.prefer_fast_cpu_loops(env) and not jaxattn.prefer_fast_cpu_loops(env)
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2 " + SMALL_LOOP_OPTION
    empty = {}
    assert jaxattn.prefer_fast_cpu_loops(empty) and empty == {"XLA_FLAGS": SMALL_LOOP_OPTION}
    for kept in (
        "--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=0",
        "--a=1\t--xla_backend_extra_options=xla_cpu_disable_loop_unrolling",
        "--xla_backend_extra_options xla_cpu_disable_loop_unrolling",
        " /tmp/xla_flags.txt",  # a flags file: appending would make XLA open another name
    ):
        user = {"XLA_FLAGS": kept}
        assert not jaxattn.prefer_fast_cpu_loops(user) and user["XLA_FLAGS"] == kept
    other = {"XLA_FLAGS": "--xla_backend_extra_options_x=1"}  # a look-alike name
    assert jaxattn.prefer_fast_cpu_loops(other)
    assert other["XLA_FLAGS"].endswith(" " + SMALL_LOOP_OPTION)
    with pytest.raises(TypeError, match="prefer_fast_cpu_loops: environ must be a mutable"):
        jaxattn.prefer_fast_cpu_loops(["XLA_FLAGS"])
    with pytest.raises(TypeError, match=r"environ\['XLA_FLAGS'\] must be a string, got int"):
        jaxattn.prefer_fast_cpu_loops({"XLA_FLAGS": 3})
    # This process's environment: appended in a fresh process, untouched once JAX has started.
    assert _before_and_after_start("prefer_fast_cpu_loops") == [
        "True",
        SMALL_LOOP_OPTION,
        "3.0",
        "False",
        "None",
    ]
    # The test suite runs with it (conftest), as the `jaxattn` command does.
    assert SMALL_LOOP_OPTION in os.environ.get("XLA_FLAGS", "")


def test_prefer_fast_cpu_loops_leaves_a_jaxlib_without_the_option_alone(monkeypatch):
    # XLA hands a backend option it does not know to LLVM, which aborts the process
    # ("Unknown command line argument").
    monkeypatch.setattr(xf, "_knows_small_loop_option", lambda library=None: False)
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert not jaxattn.prefer_fast_cpu_loops(env)
    assert env == {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


_SAME_RUN = """
import sys
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
from jaxattn.dynamics import AttentionDynamics, simulate, sweep

A = np.array([[[1.0, 0.4], [-0.3, 0.8]], [[0.2, -1.1], [0.9, 0.5]], [[-0.7, 0.2], [0.6, 1.3]]])
V = np.array([[[0.5, -0.8], [0.7, 0.1]], [[1.0, 0.3], [-0.2, 0.9]], [[0.4, 0.6], [-1.2, 0.3]]])
res = sweep(A, V, 1.0, 0, n=12, t1=20.0, num_save=41, time_scale="natural", progress=False)
x0 = jnp.stack([jnp.cos(jnp.arange(7.0)), jnp.sin(jnp.arange(7.0))], -1)
traj = simulate(AttentionDynamics(jnp.asarray(A[0]), jnp.asarray(V[0])), x0, t1=5.0,
                ts=jnp.linspace(0.0, 5.0, 11))
np.savez(sys.argv[1], R2=res.R2, steps=res.num_steps, regime=res.regime,
         xs=np.asarray(traj.xs), traj_steps=int(traj.num_steps))
"""


@pytest.mark.slow
def test_small_loops_compiled_whole_change_no_result(tmp_path):
    # The same sweep and trajectory in two fresh processes, one with the option and one
    # without: the same steps and regimes, and the same numbers (bitwise in practice; a
    # rounding-level margin allows for code generation choosing another instruction order).
    if not xf._knows_small_loop_option():
        pytest.skip("this jaxlib's XLA has no small-while-loop option")
    script = tmp_path / "run.py"
    script.write_text(_SAME_RUN)
    base = " ".join(w for w in os.environ.get("XLA_FLAGS", "").split() if "extra_options" not in w)
    out = {}
    for name, flags in (("default", base), ("whole", (base + " " + SMALL_LOOP_OPTION).strip())):
        path = tmp_path / f"{name}.npz"
        env = dict(os.environ, XLA_FLAGS=flags)
        subprocess.run([sys.executable, str(script), str(path)], env=env, check=True)
        out[name] = np.load(path)
    a, b = out["default"], out["whole"]
    np.testing.assert_array_equal(a["steps"], b["steps"])
    np.testing.assert_array_equal(a["regime"], b["regime"])
    assert int(a["traj_steps"]) == int(b["traj_steps"]) > 5
    assert a["steps"].min() > 10  # the members stepped: the loops ran
    np.testing.assert_allclose(b["R2"], a["R2"], rtol=0, atol=1e-13)
    np.testing.assert_allclose(b["xs"], a["xs"], rtol=0, atol=1e-13)


def test_prefer_fast_cpu_compiles_adds_the_flag_once_and_keeps_a_users_choice():
    import jax.numpy as jnp

    from jaxattn import prefer_fast_cpu_compiles
    from jaxattn._xla_flags import ELEMENTAL_CPU_EMITTERS, _knows_elemental_flag

    if not _knows_elemental_flag():
        pytest.skip("this jaxlib has no elemental CPU emitters (the next test covers it)")
    jnp.zeros(1).block_until_ready()  # this process's backends have started
    # A mapping other than this process's environment (e.g. a subprocess's) is still edited.
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert prefer_fast_cpu_compiles(env) and not prefer_fast_cpu_compiles(env)
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2 " + ELEMENTAL_CPU_EMITTERS
    for kept in (
        "--xla_cpu_use_fusion_emitters=true --xla_cpu_enable_fast_math=false",
        "--a=1\t--xla_cpu_use_fusion_emitters\t",
        " /tmp/xla_flags.txt",  # a flags file: appending would make XLA open another name
    ):
        user = {"XLA_FLAGS": kept}
        assert not prefer_fast_cpu_compiles(user) and user["XLA_FLAGS"] == kept
    # A look-alike name is not the flag.
    other = {"XLA_FLAGS": "--xla_cpu_use_fusion_emitters_x=1"}
    assert prefer_fast_cpu_compiles(other) and other["XLA_FLAGS"].endswith(ELEMENTAL_CPU_EMITTERS)
    with pytest.raises(TypeError, match="mutable mapping"):
        prefer_fast_cpu_compiles(["XLA_FLAGS"])
    with pytest.raises(TypeError, match=r"environ\['XLA_FLAGS'\] must be a string"):
        prefer_fast_cpu_compiles({"XLA_FLAGS": None})
    # This process's environment: appended in a fresh process, untouched once JAX has started.
    assert _before_and_after_start("prefer_fast_cpu_compiles") == [
        "True",
        ELEMENTAL_CPU_EMITTERS,
        "3.0",
        "False",
        "None",
    ]
    # The test suite runs with it (conftest), as the `jaxattn` command does.
    assert "--xla_cpu_use_fusion_emitters" in os.environ.get("XLA_FLAGS", "")


def test_prefer_fast_cpu_compiles_leaves_a_jaxlib_without_the_flag_alone(monkeypatch):
    # XLA aborts the process on a flag it does not know (jaxlib 0.11.2: "Unknown flag in
    # XLA_FLAGS"); the elemental emitters and their flag are gone from jaxlib 0.11.1 on.
    import jaxattn._xla_flags as xf

    assert [
        xf._knows_elemental_flag(v)
        for v in (
            "0.7.2",
            "0.10.2",
            "0.11.0",
            "0.11.1",
            "0.11.2",
            "0.12.0",
            "1.0.0",
            "0.11.1.dev20260901",
            "0.10.2rc1",
            "unknown",
            "",
        )
    ] == [True, True, True, False, False, False, False, False, True, False, False]
    monkeypatch.setattr(xf, "_knows_elemental_flag", lambda version=None: False)
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert not xf.prefer_fast_cpu_compiles(env)
    assert env == {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


@pytest.mark.parametrize("name", ["prefer_fast_cpu_loops", "prefer_fast_cpu_compiles"])
def test_a_call_after_jax_started_warns_and_changes_nothing(name, monkeypatch):
    known = {
        "prefer_fast_cpu_loops": xf._knows_small_loop_option,
        "prefer_fast_cpu_compiles": xf._knows_elemental_flag,
    }[name]
    jnp.zeros(1).block_until_ready()  # this process's backends have started
    monkeypatch.setenv("XLA_FLAGS", "")
    if not known():  # this jaxlib has no use for it: nothing to warn about
        assert getattr(jaxattn, name)() is False
        return
    with pytest.warns(UserWarning, match=rf"{name}: JAX has already started .* nothing was") as w:
        assert getattr(jaxattn, name)() is False
    assert [x.filename for x in w] == [__file__]
    assert os.environ["XLA_FLAGS"] == ""
