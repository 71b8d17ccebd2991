from testbed.plan.schedules import build_schedule, one_f_one_b


def test_every_stage_runs_each_microbatch_forward_then_backward():
    for name in ("1f1b", "gpipe"):
        for pp in range(1, 6):
            for m in range(1, 9):
                for acts in build_schedule(name, pp, m):
                    assert sorted(a.microbatch for a in acts if a.op == "F") == list(range(m))
                    assert sorted(a.microbatch for a in acts if a.op == "B") == list(range(m))
                    for i in range(m):
                        assert acts.index(("F", i, 0)) < acts.index(("B", i, 0))


def test_1f1b_warmup_and_in_flight_limit():
    acts = one_f_one_b(0, 4, 8)
    assert [str(a) for a in acts[:5]] == ["F0", "F1", "F2", "F3", "B0"]
    in_flight = peak = 0
    for a in acts:
        in_flight += 1 if a.op == "F" else -1
        peak = max(peak, in_flight)
    assert peak == 4  # stage 0 holds at most pp activations
    assert [str(a) for a in one_f_one_b(3, 4, 3)] == ["F0", "B0", "F1", "B1", "F2", "B2"]


def test_extra_warmup_keeps_more_in_flight_and_rejects_increasing_extras():
    import pytest

    from testbed.plan.schedules import build_schedule

    acts = build_schedule("1f1b", 4, 12, [5, 3, 3, 0])
    assert [str(a) for a in acts[0][:9]] == ["F0", "F1", "F2", "F3", "F4", "F5", "F6", "F7", "F8"]
    assert str(acts[3][1]) == "B0"
    with pytest.raises(ValueError):
        build_schedule("1f1b", 3, 8, [0, 2, 0])


def test_warmup_covers_a_round_trip_at_the_pipelines_bottleneck_rate():
    """Little's law: a round trip holds the microbatches that enter during it, one per compute time, or one per
    busiest-hop time when a WAN link is the bottleneck (then more in flight would only delay)."""
    from testbed.plan.build import latency_warmup

    args = ([1.0] * 4, [10.0, 0.0, 0.0], [80.0] * 4, [1.0] * 4, 16, "1f1b")
    assert latency_warmup(*args) == [10, 0, 0, 0]
    assert latency_warmup(*args, busy_s=5.0) == [2, 0, 0, 0]
    assert latency_warmup(*args, busy_s=0.5) == [10, 0, 0, 0]  # compute is the bottleneck: as without
