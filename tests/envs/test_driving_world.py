"""Tests of the 2-D driving world: scenarios, geometry, trajectory checks, expert, BEV raster."""

import numpy as np
import pytest

from mmrl.envs.driving.geometry import box_corners, boxes_overlap, ego_to_world, project_to_polyline, world_to_ego
from mmrl.envs.driving.render import render_bev
from mmrl.envs.driving.world import SPLITS, check_trajectory, expert_trajectory, make_scenario


def test_boxes_overlap_golden():
    a = box_corners(np.array(0.0), np.array(0.0), np.array(0.0), 4.0, 2.0)
    touching = box_corners(np.array(3.9), np.array(0.0), np.array(0.0), 4.0, 2.0)
    apart = box_corners(np.array(4.1), np.array(0.0), np.array(0.0), 4.0, 2.0)
    # a box rotated 45° whose corner reaches into a's corner region without overlap
    diag = box_corners(np.array(3.2), np.array(2.2), np.array(np.pi / 4), 2.0, 2.0)
    assert boxes_overlap(a, touching) and not boxes_overlap(a, apart) and not boxes_overlap(a, diag)


def test_frames_round_trip_and_projection():
    p = np.array([[3.0, 4.0], [-1.0, 2.0]])
    e = world_to_ego(p, np.array([1.0, 1.0]), np.pi / 2)
    np.testing.assert_allclose(e[0], [3.0, -2.0])  # ego faces north: east is to its right (y < 0)
    np.testing.assert_allclose(ego_to_world(e, np.array([1.0, 1.0]), np.pi / 2), p, atol=1e-12)
    line = np.array([[0.0, 0.0], [10.0, 0.0]])
    s, lat, h = project_to_polyline(np.array([[4.0, 1.5]]), line)
    np.testing.assert_allclose([s[0], lat[0], h[0]], [4.0, 1.5, 0.0])


@pytest.mark.parametrize("split", SPLITS)
def test_scenarios_are_seeded_and_valid(split):
    a, b = make_scenario(3, split), make_scenario(3, split)
    np.testing.assert_array_equal(a.ego, b.ego)
    assert [g.x for g in a.agents] == [g.x for g in b.agents] and a.instruction == b.instruction
    assert a.road.drivable.contains(__import__("shapely").Point(a.ego[:2]))
    img = render_bev(a)
    assert img.shape == (64, 64, 3) and img.dtype == np.uint8


def test_splits_differ_and_ood_properties():
    assert not np.allclose(make_scenario(0, "train").ego, make_scenario(0, "test").ego)
    assert {make_scenario(s, "ood_layout").road.layout for s in range(6)} <= {"s_curve", "t_junction"}
    assert any(g.static for g in make_scenario(0, "ood_obstacles").agents)
    assert len(make_scenario(0, "ood_dense").agents) >= 8
    w = make_scenario(0, "ood_weather")
    assert not np.array_equal(render_bev(w), render_bev(w, apply_weather=False))
    with pytest.raises(ValueError, match="unknown split"):
        make_scenario(0, "val")


@pytest.mark.parametrize("garbage", [[[np.nan, 0.0]], "abc", [[1e6, 0.0]], np.zeros((3, 3)), [], None])
def test_check_trajectory_is_total(garbage):
    result = check_trajectory(make_scenario(0), garbage, 0.5)
    assert not result.valid and result.reason and not result.collision


def test_check_detects_collision_and_offroad():
    sc = make_scenario(0, "ood_obstacles")  # a construction zone in the ego's lane
    straight = [[8.0 * 0.5 * k, 0.0] for k in range(1, 13)]  # 6 s straight at 8 m/s
    route_ego = sc.to_ego(sc.route)
    ahead = route_ego[route_ego[:, 0] > 0][::4][:12]
    along = check_trajectory(sc, ahead, 0.5)
    assert along.valid and along.collision  # drives through the cones
    sideways = check_trajectory(make_scenario(1), [[0.0, 5.0 * k] for k in range(1, 7)], 0.5)
    assert sideways.offroad and sideways.offroad_time is not None
    assert check_trajectory(sc, straight, 0.5).valid


def test_expert_is_mostly_safe_and_on_road():
    bad = 0
    for seed in range(8):
        sc = make_scenario(seed, "test")
        wp = expert_trajectory(sc, 3.0, 0.5)
        assert wp.shape == (6, 2) and np.isfinite(wp).all()
        chk = check_trajectory(sc, wp, 0.5)
        bad += chk.collision or chk.offroad
        assert chk.progress_m > 0
    assert bad <= 1
