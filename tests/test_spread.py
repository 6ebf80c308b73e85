"""The one timer's rounds and the verdicts drawn from their spread (correctness only, never timing)."""

from __future__ import annotations

import pytest

from solutions.bench.spread import Spread, speedup
from solutions.bench.timing import alternating_ms, alternating_runs


def test_speedup_is_the_median_of_paired_ratios_with_their_range():
    s = speedup([13.0, 12.0, 14.0, 30.0, 12.5], [10.0, 10.0, 10.0, 25.0, 10.0])
    assert (s.ratio, s.low, s.high) == (pytest.approx(1.25), pytest.approx(1.2), pytest.approx(1.4))
    assert s.runs == 5
    assert s.verdict == "faster"
    assert str(s) == "1.25x, 1.20-1.40 over 5 alternated runs: faster"


def test_rounds_pair_by_position_so_a_slow_minute_cancels():
    # The machine slowed 3x in round 2 for both sides: unpaired medians would blur it, paired ratios do not.
    s = speedup([10.0, 30.0, 10.0], [5.0, 15.0, 5.0])
    assert (s.ratio, s.low, s.high) == (2.0, 2.0, 2.0)


@pytest.mark.parametrize(
    ("baseline", "candidate", "verdict"),
    [
        pytest.param([10, 10, 10], [11, 12, 11], "slower", id="every-round-slower"),
        pytest.param([10, 10, 10], [9, 11, 9.5], "not distinguishable here", id="spread-straddles-one"),
        pytest.param([10, 10, 10], [10, 10, 10], "not distinguishable here", id="equal"),
    ],
)
def test_verdict_follows_the_spread_not_the_median(baseline, candidate, verdict):
    assert speedup(baseline, candidate).verdict == verdict


def test_bad_rounds_are_refused_with_the_problem_named():
    with pytest.raises(ValueError, match="at least 3"):
        speedup([1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="same alternated rounds"):
        speedup([1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match="positive and finite"):
        speedup([1.0, 0.0, 3.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="at least 1"):
        alternating_runs({"a": lambda: None}, 0)


def test_spread_states_median_and_range():
    s = Spread.of([3.0, 1.0, 2.0, 10.0])
    assert (s.median, s.low, s.high, s.runs) == (2.5, 1.0, 10.0, 4)
    assert s.format("tok/s", 0) == "2 tok/s (1-10)"


def test_alternating_runs_calls_each_candidate_once_per_round_in_turn():
    calls = []
    runs = alternating_runs({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3)
    assert calls == ["a", "b"] * 4  # one warm-up call each, then three rounds
    assert [len(t) for t in runs.values()] == [3, 3] and all(t >= 0 for ts in runs.values() for t in ts)
    assert set(alternating_ms({"a": lambda: None}, 3, min)) == {"a"}
