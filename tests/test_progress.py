"""Progress bars in a log file: a stream that is not a terminal gets a redraw every
`LOG_INTERVAL` seconds at most, a terminal tqdm's own pace."""

import io

from jaxattn._progress import LOG_INTERVAL, progress_bar


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _draws(text: str) -> int:
    # tqdm starts every redraw of a text bar with a carriage return
    return text.count("\r")


def test_a_log_gets_the_bar_at_start_and_end_only_within_the_interval():
    log = io.StringIO()
    bar = progress_bar(total=500, file=log, desc="sweep")
    for _ in range(500):
        bar.update(1)
    bar.close()
    assert bar.mininterval == LOG_INTERVAL and bar.maxinterval == LOG_INTERVAL
    text = log.getvalue()
    # the empty bar when it opens and the full one when it closes: no copy in between
    assert _draws(text) == 2, text
    assert "500/500" in text and text.endswith("\n")


def test_a_terminal_keeps_tqdm_pace_and_explicit_settings_win():
    bar = progress_bar(total=3, file=_Terminal())
    assert bar.mininterval == 0.1  # tqdm's own default
    bar.close()
    bar = progress_bar(total=3, file=io.StringIO(), mininterval=2.0)
    assert bar.mininterval == 2.0 and bar.maxinterval == LOG_INTERVAL
    bar.close()
    bar = progress_bar(total=3, file=io.StringIO(), mininterval=60.0)
    assert bar.maxinterval == 60.0  # never below the redraw interval
    bar.close()


def test_a_sweep_logged_to_a_file_draws_its_bar_twice_with_the_final_counts(capsys):
    # Postfixes (failures, lockstep efficiency) are set without a redraw of their own:
    # tqdm would otherwise redraw on every `set_postfix`, whatever its interval.
    import numpy as np

    from jaxattn.dynamics._sweep import sweep

    A = np.stack([np.eye(2), 2 * np.eye(2), -np.eye(2)])
    res = sweep(A, np.eye(2), 1.0, [0, 1, 2], method="ott_antonsen", chunk_size=1, t1=20.0)
    text = capsys.readouterr().err
    assert res.chunks_computed == 3
    assert _draws(text) == 2, text
    assert "3/3" in text and f"failed={int(res.failed.sum())}" in text
