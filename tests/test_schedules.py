from testbed.plan.schedules import build_schedule, one_f_one_b


def test_every_stage_runs_each_microbatch_forward_then_backward():
    for name in ("1f1b", "gpipe"):
        for pp in range(1, 6):
            for m in range(1, 9):
                for acts in build_schedule(name, pp, m):
                    assert sorted(a.microbatch for a in acts if a.op == "F") == list(range(m))
                    assert sorted(a.microbatch for a in acts if a.op == "B") == list(range(m))
                    for i in range(m):
                        assert acts.index(("F", i)) < acts.index(("B", i))


def test_1f1b_warmup_and_in_flight_limit():
    acts = one_f_one_b(0, 4, 8)
    assert [str(a) for a in acts[:5]] == ["F0", "F1", "F2", "F3", "B0"]
    in_flight = peak = 0
    for a in acts:
        in_flight += 1 if a.op == "F" else -1
        peak = max(peak, in_flight)
    assert peak == 4  # stage 0 holds at most pp activations
    assert [str(a) for a in one_f_one_b(3, 4, 3)] == ["F0", "B0", "F1", "B1", "F2", "B2"]
