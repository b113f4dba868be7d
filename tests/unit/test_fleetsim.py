"""The fleet simulation (bench/fleetsim.py) and the capacity model (bench/capacity.py) at
small sizes: they run the project's own assignment code and keep their promises."""

from __future__ import annotations

from bench import capacity
from bench.fleetsim import Model, change, cross_check, rolling_restart, zone_outage


def test_a_join_and_a_leave_move_the_ideal_share_and_settle():
    model = Model()
    join, leave = change(12, 240, model, "join"), change(12, 240, model, "leave")
    assert join["moved"] in (18, 19) and leave["moved"] == 20
    assert join["publishes"] == leave["publishes"] == 1
    assert join["zk"]["writes"] > join["moved"] and join["zk"]["bytes_read"] > 0


def test_every_shard_is_owned_again_after_a_zone_outage_and_a_rolling_restart():
    model = Model()
    outage = zone_outage(9, 90, model)
    assert outage["killed"] == 3 and outage["unowned_at_end"] == 0
    assert model.expiry_s < outage["all_owned_after_s"] < model.expiry_s + 3
    rolling = rolling_restart(6, 48, model)
    assert rolling["members_restarted"] == 6
    assert 0 < rolling["longest_unowned_s"] < model.stop_s + model.restart_s + 3


def test_the_cross_check_reports_relative_errors():
    out = cross_check(Model(), {"planned_leave_pause_s": 1.5, "kill_9_pause_s": 6.0,
                                "moves_n4_join": 12, "moves_n4_leave": 16})
    assert out["relative_error"]["moves_n4_join"] == 0.0
    assert set(out["relative_error"]) == {"planned_leave_pause_s", "kill_9_pause_s", "moves_n4_join",
                                          "moves_n4_leave"}


def test_the_capacity_model_plans_seed_002():
    inputs = capacity.Inputs(fire_jobs_per_s=16_518, fleet_1_jobs_per_s=1_301)
    plan = capacity.plan(inputs, capacity.Target())
    assert plan["pollers"] == 13 and plan["shards"] == 104
    check = capacity.check(inputs, {1: 1301, 2: 2917, 4: 4823})
    assert check["points"]["1"]["error"] == 0.0 and check["max_abs_error"] < 0.12
