"""Bad input to the `jaxattn` command: a one-line error naming the flag and the problem, a
non-zero exit (2 for a usage error, argparse's and ours), never a traceback.

Every refused case here fails before anything is solved or compiled: `simulate` checks its
matrices before it starts JAX's backend (`check_backend`, patched here to fail loudly), and
`map` checks its axes and values before `regime_map` (patched likewise).
"""

import json
import pickle

import numpy as np
import pytest

import jaxattn.dynamics._cli as cli_simulate
import jaxattn.dynamics._regime_map as regime_map_module
from jaxattn.cli import main
from jaxattn.dynamics._cli import _load_matrix


class _Unpickled:
    """Unpickling this creates the file `marker`: proof that a file was unpickled."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def no_solve(monkeypatch):
    """Fail the test if `simulate` gets past its input checks or `map` reaches `regime_map`."""

    def refuse(*args, **kwargs):
        raise AssertionError("the bad input was not refused before the solve")

    monkeypatch.setattr(cli_simulate, "check_backend", refuse)
    monkeypatch.setattr(regime_map_module, "regime_map", refuse)


def _one_line_error(capsys, command):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"jaxattn {command}: error:"), err[0]
    assert "Traceback" not in err[0]
    return err[0]


def _write(path, content):
    """Write `content` (bytes, text, or an array saved by NumPy by the suffix) to `path`."""
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    elif path.suffix == ".npz":
        np.savez(path, **content)
    else:
        np.save(path, content, allow_pickle=True)
    return path


def _truncated(tmp_path, suffix):
    good = tmp_path / f"good{suffix}"
    if suffix == ".npz":
        np.savez(good, A=np.eye(3))
    else:
        np.save(good, np.eye(3))
    data = good.read_bytes()
    return data[: len(data) // 2]


_TRUNCATED = object()  # content: a good file of that suffix cut in half

# (file name, content, words the message must hold besides the flag and the file name)
_BAD_FILES = [
    ("trunc.npz", _TRUNCATED, ["cannot read a matrix", "BadZipFile"]),
    ("trunc.npy", _TRUNCATED, ["cannot read a matrix"]),
    ("empty.npz", b"", ["cannot read a matrix"]),
    ("empty.npy", b"", ["cannot read a matrix"]),
    ("binary.json", b"\xff\xfe\x00[[1", ["cannot read a matrix"]),
    ("cut.json", "[[1, 2], [3", ["cannot read a matrix"]),
    ("complex.npy", np.eye(2) * (1 + 1j), ["complex", "must be real"]),
    ("complex.npz", {"M": np.eye(2) * 1j}, ["complex", "must be real"]),
    ("strings.npy", np.array([["a", "b"], ["c", "d"]]), ["not hold an array of real numbers"]),
    ("strings.json", json.dumps([["a", "b"], ["c", "d"]]), ["not hold an array of real numbers"]),
    ("dates.npy", np.zeros((2, 2), "datetime64[D]"), ["not hold an array of real numbers"]),
    ("inf.npy", np.array([[np.inf, 0.0], [0.0, 1.0]]), ["non-finite"]),
    ("nan.json", "[[NaN, 0], [0, 1]]", ["non-finite"]),
    ("rect.npy", np.ones((2, 3)), ["square d×d", "(2, 3)"]),
    ("one.json", "[[1.0]]", ["square d×d", "(1, 1)"]),
    ("cube.npy", np.ones((2, 2, 2)), ["square d×d", "(2, 2, 2)"]),
    ("vector.json", "[1, 2]", ["square d×d", "(2,)"]),
    ("two.npz", {"X": np.eye(2), "Y": np.eye(2)}, ["holds ['X', 'Y']", "name the array"]),
    ("matrix.txt", "1 0\n0 1\n", ["must be .json, .npy or .npz"]),
]


@pytest.mark.parametrize("flag", ["--A", "--V"])
@pytest.mark.parametrize("name, content, words", _BAD_FILES, ids=[b[0] for b in _BAD_FILES])
def test_simulate_refuses_a_bad_matrix_file(tmp_path, capsys, no_solve, flag, name, content, words):
    if content is _TRUNCATED:
        content = _truncated(tmp_path, name[-4:])
    path = _write(tmp_path / name, content)
    rc = main(["simulate", flag, str(path), "--out", str(tmp_path / "out")])
    assert rc == 2
    line = _one_line_error(capsys, "simulate")
    assert f"error: {flag}: " in line and str(path) in line
    for word in words:
        assert word in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["--A", "--V"])
def test_simulate_never_unpickles(tmp_path, capsys, no_solve, flag):
    """An object array saved with pickling, and a bare pickle named .npy, are refused
    without running the pickle (allow_pickle=False): the marker file is never created."""
    marker = tmp_path / "unpickled"
    obj = np.empty((2, 2), dtype=object)
    obj[:] = [[_Unpickled(marker), 1.0], [0.0, 1.0]]
    bare = tmp_path / "bare.npy"
    bare.write_bytes(pickle.dumps(_Unpickled(marker)))
    objects = _write(tmp_path / "obj.npy", obj)
    for path, word in [(objects, "allow_pickle=False"), (bare, "not a NumPy .npz archive or .npy")]:
        assert main(["simulate", flag, str(path), "--out", str(tmp_path / "out")]) == 2
        line = _one_line_error(capsys, "simulate")
        assert f"error: {flag}: cannot read a matrix from {path}" in line and word in line
    assert not marker.exists()


@pytest.mark.parametrize(
    "files, extra, words",
    [
        ({"--A": np.eye(3), "--V": np.eye(2)}, [], ["--A and --V", "same shape"]),
        ({"--A": np.eye(2)}, ["--d", "3"], ["--d 3", "does not match"]),
        ({"--V": np.eye(4)}, ["--d", "2"], ["--d 2", "does not match"]),
    ],
)
def test_simulate_refuses_matrices_of_the_wrong_size(
    tmp_path, capsys, no_solve, files, extra, words
):
    args = []
    for flag, M in files.items():
        args += [flag, str(_write(tmp_path / f"{flag[2:]}.npy", M))]
    assert main(["simulate", *args, *extra, "--out", str(tmp_path / "out")]) == 2
    line = _one_line_error(capsys, "simulate")
    for word in words:
        assert word in line


@pytest.mark.parametrize("flag", ["--d", "--n", "--num-save", "--max-steps", "--seed"])
def test_simulate_integer_flags_refuse_fractions(capsys, flag):
    # argparse's usage error: exit 2, the flag and the value named
    with pytest.raises(SystemExit) as exc:
        main(["simulate", flag, "2.5"])
    assert exc.value.code == 2
    kind = "seed" if flag == "--seed" else "int"
    assert f"argument {flag}: invalid {kind} value: '2.5'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["simulate", "map"])
def test_a_seed_beyond_64_bits_is_a_usage_error(capsys, command):
    # (it used to end in an OverflowError from inside jax.random)
    with pytest.raises(SystemExit) as exc:
        main([command, *(["case4"] if command == "map" else []), "--seed", str(2**70)])
    assert exc.value.code == 2
    assert "outside [0, 2**32 - 1], the seeds that give distinct keys" in capsys.readouterr().err


def test_simulate_refuses_a_tolerance_or_an_output_folder_before_solving(
    tmp_path, capsys, no_solve
):
    afile = _write(tmp_path / "afile", "x")
    for argv, words in [
        (["--rtol", "10"], "--rtol: rtol must be below 1"),
        (["--out", str(afile)], f"--out {str(afile)!r} is a file; give a folder"),
        (["--out", str(afile / "sub")], "lies below"),
        (["--out", ""], "--out is empty; give a folder"),
    ]:
        assert main(["simulate", *argv]) == 2
        assert words in _one_line_error(capsys, "simulate")


def test_map_refuses_an_infinite_axis_end_without_numpy_warnings(tmp_path, capsys, no_solve):
    import warnings

    for axis, words in [
        ("v11=-inf:1:3", "its ends must be finite numbers"),
        ("v11=-1e308:1e308:3", "hi - lo = inf overflows"),
    ]:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # linspace's inf arithmetic warned first
            assert main(["map", "case4", "--x", axis, *_MAP, "--out", str(tmp_path)]) == 2
        assert words in _one_line_error(capsys, "map")


def test_map_seed_range_depends_on_the_inits(tmp_path, capsys, no_solve):
    # the members' seeds seed·inits + k must be sweep seeds, in [0, 2**32)
    argv = ["map", "case4", "--n", "4", "--inits", "4", "--no-progress", "--out", str(tmp_path)]
    assert main(argv + ["--seed", str(2**30)]) == 2
    assert "--seed must be in [0, 1073741822] with --inits 4" in _one_line_error(capsys, "map")


def test_an_output_folder_that_cannot_be_written_is_refused_first(tmp_path, monkeypatch):
    import os

    from jaxattn import _cli_args

    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    for path, words in [
        ("   ", "--out is blank"),
        (str(tmp_path / "dangling"), "is a link to nothing"),
    ]:
        with pytest.raises(ValueError, match=words):
            _cli_args.check_out_folder("--out", path)

    def refuse(*args, **kwargs):  # a folder without write permission (root ignores chmod)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(_cli_args.tempfile, "TemporaryFile", refuse)
    with pytest.raises(ValueError, match="nothing can be written in .* \\(Permission denied\\)"):
        _cli_args.check_out_folder("--out", str(tmp_path / "new" / "sub"))


def test_matrix_files_that_are_accepted(tmp_path):
    """Integers and booleans read as float64; an .npz takes the array named after the
    flag, else its only array; the reader goes by content, so a .npy holding an .npz works."""
    ints = _load_matrix(str(_write(tmp_path / "ints.npy", np.array([[1, 2], [3, 4]]))), "A")
    assert ints.dtype == np.float64 and ints.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert _load_matrix(str(_write(tmp_path / "b.npy", np.eye(2, dtype=bool))), "V").sum() == 2
    z = _write(tmp_path / "both.npz", {"A": np.eye(2), "V": 2 * np.eye(3)})
    assert _load_matrix(str(z), "V").shape == (3, 3)
    only = _write(tmp_path / "only.npz", {"arr_0": 3 * np.eye(2)})
    assert _load_matrix(str(only), "A")[0, 0] == 3.0
    assert _load_matrix(str(_write(tmp_path / "m.json", "[[1, 0.5], [0, 1]]")), "A")[0, 1] == 0.5


@pytest.mark.parametrize("suffix", [".npz", ".npy"])
def test_every_truncation_of_a_matrix_file_is_a_named_error(tmp_path, suffix):
    """Cut a good file at every length: each cut is a ValueError naming the flag and the
    file (BadZipFile, EOFError, zlib and header errors included), never another type."""
    good = tmp_path / f"good{suffix}"
    if suffix == ".npz":
        np.savez_compressed(good, A=np.arange(9.0).reshape(3, 3))
    else:
        np.save(good, np.arange(9.0).reshape(3, 3))
    data = good.read_bytes()
    cut = tmp_path / f"cut{suffix}"
    for k in range(len(data)):
        cut.write_bytes(data[:k])
        with pytest.raises(ValueError, match="^--A: ") as err:
            _load_matrix(str(cut), "A")
        assert str(cut) in str(err.value) and "\n" not in str(err.value)


_MAP = ["--n", "4", "--inits", "1", "--num-save", "20", "--no-progress"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["random", "--x", "d=2:4:3"], ["--x 'd=2:4:3'", "d cannot be an axis", "--set d="]),
        (["random", "--x", "a0=0,1", "--y", "d=2,3"], ["--y 'd=2,3'", "d cannot be an axis"]),
        (["random", "--x", "d=2:3:3"], ["--x 'd=2:3:3'", "d cannot be an axis"]),
        (["random", "--set", "d=2.5"], ["--set 'd=2.5'", "integer", "fractional value 2.5"]),
        (["random", "--x", "draw=0:1:3"], ["--x 'draw=0:1:3'", "integer", "fractional value 0.5"]),
        (["random", "--set", "draw=0.5"], ["--set 'draw=0.5'", "integer", "fractional value 0.5"]),
        (["random", "--set", "d=1"], ["--set 'd=1'", "dimension", "must be >= 2, got 1"]),
        (["random", "--set", "draw=-1"], ["--set 'draw=-1'", "must be >= 0, got -1"]),
        (["random", "--set", "d=1e300"], ["--set 'd=1e300'", "GiB", "smaller d"]),
        (["random", "--x", "n=4,8"], ["--x 'n=4,8'", "unknown parameter 'n'", "--n"]),
        (["case4", "--set", "beta=nan"], ["--set 'beta=nan'", "finite"]),
        (["case4", "--set", "beta=inf"], ["--set 'beta=inf'", "finite"]),
        (["case4", "--set", "gamma=1"], ["--set 'gamma=1'", "unknown parameter 'gamma'"]),
    ],
)
def test_map_refuses_bad_parameter_values(tmp_path, capsys, no_solve, argv, words):
    assert main(["map", *argv, *_MAP, "--out", str(tmp_path / "m")]) == 2
    line = _one_line_error(capsys, "map")
    for word in words:
        assert word in line
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("flag", ["--n", "--inits", "--num-save", "--seed", "--lyapunov"])
def test_map_integer_flags_refuse_fractions(capsys, flag):
    with pytest.raises(SystemExit) as exc:
        main(["map", "case4", flag, "2.5"])
    assert exc.value.code == 2
    kind = "seed" if flag == "--seed" else "int"
    assert f"argument {flag}: invalid {kind} value: '2.5'" in capsys.readouterr().err


def test_map_passes_whole_integer_parameters_on(tmp_path, monkeypatch):
    """Accepted integer values reach `regime_map` as they were given (whole numbers), with
    d held fixed; nothing is solved here."""
    seen = {}

    def fake_regime_map(family, axes, *, fixed, **kwargs):
        seen.update(family=family, axes=axes, fixed=fixed)
        raise ValueError("stop here")

    monkeypatch.setattr(regime_map_module, "regime_map", fake_regime_map)
    argv = ["map", "random", "--x", "draw=0:3:4", "--set", "d=3", "--method", "particles"]
    assert main([*argv, *_MAP, "--out", str(tmp_path / "m")]) == 2
    ((name, values),) = seen["axes"]
    assert seen["family"] == "random" and name == "draw"
    np.testing.assert_array_equal(values, [0.0, 1.0, 2.0, 3.0])
    assert seen["fixed"] == {"d": 3.0}


def test_random_bytes_and_a_json_object_get_plain_reasons(tmp_path):
    # NumPy calls bytes without a .npy header "pickled data" and advises allow_pickle=True;
    # the message says what the file is not instead. A JSON object is not a matrix.
    junk = tmp_path / "junk.npy"
    junk.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=r"--A: cannot read .*junk.npy \(not a NumPy") as e:
        _load_matrix(str(junk), "A")
    assert "allow_pickle=True" not in str(e.value) and "unsafely" not in str(e.value)
    obj = tmp_path / "obj.json"
    obj.write_text('{"A": [[1, 0], [0, 1]]}')
    with pytest.raises(ValueError, match=r"--A: .*obj.json .*a nested list of numbers"):
        _load_matrix(str(obj), "A")


def test_regime_map_refuses_a_base_seed_beyond_the_sweep_seeds():
    # (it used to end in an OverflowError from the int64 seeds, or name derived seeds)
    for seed in (2**61, -1, 2.5):
        with pytest.raises(ValueError, match=r"regime_map: seed must be an integer in \[0, "):
            regime_map_module.regime_map("case4", {"v11": [0.0, 1.0]}, inits=3, seed=seed)
