"""The knee simulation (benchmarks/knee_sim.py, issue 21) on hand-made inputs, no fleet: the
service-time fit recovers known costs, a lone request takes its batch's time plus the path, the
sidecar's token budget and in-flight permits shape the batches, and on uneven workers the pull
queue's knee is above round-robin push's and at most what capacity allows."""

from __future__ import annotations

import pytest

from benchmarks import knee_sim
from benchmarks.knee_load import Arrival, scaled_schedule

TRUTH = knee_sim.ServiceModel(0.004, 0.002, 2e-5, 1e-8)


def batches() -> list[tuple[list[int], float]]:
    shapes = [[12], [30], [12] * 8, [200] * 4, [256] * 16, [40, 60, 256], [256] * 32, [80] * 3]
    return [(lengths, TRUTH.seconds(lengths)) for lengths in shapes]


def calibration(path_s: float = 0.01) -> knee_sim.Calibration:
    return knee_sim.Calibration(
        points={"fast": batches(), "slow": [(x, 2 * s) for x, s in batches()]},
        path_s=path_s,
        query_tokens=[14, 20, 9, 31] * 4,
        passage_tokens=[256, 180, 220, 256] * 8,
    )


def test_the_fit_recovers_the_costs_it_was_made_from() -> None:
    fitted = knee_sim.ServiceModel.fit(batches())
    assert max(fitted.relative_errors(batches())) < 1e-6
    assert fitted.seconds([256] * 16) == pytest.approx(TRUTH.seconds([256] * 16), rel=1e-6)
    assert calibration().slow_factor() == pytest.approx(2.0, rel=1e-6)
    with pytest.raises(ValueError, match="at least 4"):
        knee_sim.ServiceModel.fit(batches()[:3])


def test_a_lone_request_takes_its_batch_and_the_path() -> None:
    worker = knee_sim.SimWorker(TRUTH, factor=3.0)
    arrivals = [Arrival(1.0, False, (0,))]
    for mode in ("pull", "push-rr", "push-lo"):
        step = knee_sim.simulate(
            mode, arrivals, [(14,)], [worker], seconds=2.0, path_s=0.05, rate=0.5
        )
        assert step.answered == step.sent == 1
        assert step.small_latency == [pytest.approx(3.0 * TRUTH.seconds([14]) + 0.05)]


def test_batches_follow_the_token_budget_and_the_permits() -> None:
    # Ten requests at once on one worker, 100 tokens each, a 250-token budget, 2 permits: the
    # first two find the worker waiting and go alone (one permit each); the other eight queue
    # and go two by two as permits come back.
    arrivals = [Arrival(0.0, True, (i,)) for i in range(10)]
    sidecar = knee_sim.SidecarModel(max_batch_tokens=250, inflight=2)
    step = knee_sim.simulate(
        "pull", arrivals, [(100,)] * 10, [knee_sim.SimWorker(TRUTH)], seconds=1.0,
        sidecar=sidecar,
    )  # fmt: skip
    assert step.answered == 10 and step.worker_tokens == [1000.0]
    busy = 2 * TRUTH.seconds([100]) + 4 * TRUTH.seconds([100, 100])
    assert sorted(step.bulk_latency)[-1] == pytest.approx(busy)  # one batch at a time
    assert step.cpu_s == [pytest.approx(busy)]


def test_pull_beats_round_robin_on_uneven_workers_within_capacity() -> None:
    cal = calibration()
    load = knee_sim.Load(seconds=20.0, bulk_share=0.1, bulk_size=8)
    fleet = [knee_sim.SimWorker(TRUTH, f) for f in knee_sim.spread(8, 3.0)]
    knees = {
        mode: knee_sim.knee_rate(mode, cal, fleet, load, bound_s=0.5, seed=0, iterations=8)
        for mode in ("pull", "push-rr")
    }
    assert knees["pull"] > 1.2 * knees["push-rr"] > 0
    capacity = sum(1 / w.factor for w in fleet) / TRUTH.seconds([14])
    assert knees["pull"] < capacity
    # The arrivals the search compares are one process, only sooner at a higher rate.
    slow, fast = (scaled_schedule(r, 20.0, 0.1, 8, (16, 32), seed=0) for r in (5.0, 10.0))
    assert [a.texts for a in fast[: len(slow)]] == [a.texts for a in slow]


def test_a_busy_worker_holds_the_message_it_polled_for_while_another_is_idle() -> None:
    """The sidecar's idle poll takes one message whatever its slots: a busy worker that has
    waited longest gets the next request and holds it until its batch ends, while the other
    worker is idle. With ``ahead=0`` (a pull only with a free slot) the idle worker takes it."""
    long, short = [256] * 32, [14]
    arrivals = [Arrival(0.0, True, (0,)), Arrival(0.01, False, (1,)), Arrival(0.05, False, (2,))]
    sizes = [tuple(long), tuple(short), tuple(short)]
    fleet = [knee_sim.SimWorker(TRUTH), knee_sim.SimWorker(TRUTH)]
    latency = {}
    for ahead in (1, 0):
        sidecar = knee_sim.SidecarModel(inflight=1, ahead=ahead)
        step = knee_sim.simulate("pull", arrivals, sizes, fleet, seconds=1.0, sidecar=sidecar)
        assert step.answered == 3
        latency[ahead] = max(step.small_latency)
    held = TRUTH.seconds(long) - 0.05 + TRUTH.seconds(short)  # behind the long batch
    assert latency[1] == pytest.approx(held)
    assert latency[0] == pytest.approx(TRUTH.seconds(short))  # the idle worker, at once
