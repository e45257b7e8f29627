"""PlacementBoard and plan edits: a move changes the plan, the drawn state, and tells listeners."""

import pytest

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata
from rectoolkit.widgets.assets import ASSET_NAMES, SOURCE_DIR, STATIC_DIR, asset_path
from rectoolkit.widgets.board import PlacementBoard
from rectoolkit.plan.edits import MoveError, move_shard


def test_front_end_has_one_copy_and_the_build_ships_it(tmp_path):
    """widgets/ is the only copy in the repository; setup.py's build_py puts it into the package."""
    import subprocess
    import sys

    assert not STATIC_DIR.exists() or not any(STATIC_DIR.iterdir()), f"{STATIC_DIR}: a second copy in the tree"
    assert asset_path("placement_board.js") == SOURCE_DIR / "placement_board.js"
    repo = SOURCE_DIR.parent
    result = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)], cwd=repo,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    for name in ASSET_NAMES:
        shipped = tmp_path / "rectoolkit" / "widgets" / "static" / name
        assert shipped.read_bytes() == (SOURCE_DIR / name).read_bytes(), name


def test_board_state_matches_plan(plan, tables):
    board = PlacementBoard(plan, tables, capacity_bytes=20000)
    assert [c["rank"] for c in board.columns] == [0, 1]
    # rank 0: big rows 0:600 (19200 B) + wide cols 8:16 (3200 B) + small replica (80 B)
    assert board.columns[0]["bytes"] == 22480 and board.columns[0]["over"] is True
    assert board.columns[1]["bytes"] == 16080 and board.columns[1]["over"] is False
    ids = {s["id"]: s for s in board.shards}
    assert set(ids) == {"big/0", "big/1", "wide/0", "wide/1", "small/0", "small/1"}
    assert ids["small/0"]["movable"] is False and ids["wide/0"]["movable"] is True


def test_drop_from_front_end_moves_shard(plan, tables):
    board = PlacementBoard(plan, tables)
    heard = []
    board.on_move(lambda new_plan, table, index, rank: heard.append((table, index, rank, new_plan)))
    board.move_request = {"id": "wide/0", "rank": 0, "nonce": 1}  # what the ES module sends on a drop
    assert heard[0][:3] == ("wide", 0, 0)
    assert board.plan.plan[""]["wide"].ranks == [0, 0]
    assert plan.plan[""]["wide"].ranks == [1, 0]  # the input plan is not changed
    assert board.columns[0]["bytes"] == 22480 + 3200
    assert board.message_kind == "info" and "moved wide" in board.message


def test_forbidden_moves_show_a_message(plan, tables):
    board = PlacementBoard(plan, tables)
    assert board.move("small", 0, 1) is False
    assert board.message_kind == "error" and "DATA_PARALLEL" in board.message
    assert board.move("big", 0, 1) is False  # rank 1 already holds big's other row block
    assert "one row block per rank" in board.message
    assert board.move("wide", 0, 5) is False and "ranks are 0..1" in board.message
    board.move_request = {"id": "garbage", "rank": 0, "nonce": 2}
    assert board.message_kind == "error"
    assert board.plan is plan  # nothing changed


def test_two_level_moves_stay_in_host():
    ps = ParameterSharding("table_row_wise", ranks=[0, 1], shards=[
        ShardMetadata.on_rank(0, 0, 0, 5, 4), ShardMetadata.on_rank(1, 5, 0, 5, 4)])
    plan = ShardingPlan({"": {"t": ps}})
    with pytest.raises(MoveError, match="inside host 0"):
        move_shard(plan, "t", 0, 2, world_size=4, local_world_size=2)
    moved = move_shard(plan, "t", 0, 2, world_size=4, local_world_size=4)
    assert [s.rank for s in moved.plan[""]["t"].shards] == [2, 1]


def test_board_colours_follow_the_placement_view_and_replicas_refuse_with_a_message(plan, tables):
    from rectoolkit.viz.placement import shard_placement_traces
    from rectoolkit.viz.frames import placement_frame
    from rectoolkit.viz.style import REPLICATED_COLOR

    board = PlacementBoard(plan, tables, world_size=2)
    placement_view = {t["name"]: t.get("fillcolor") for t in shard_placement_traces(placement_frame(plan, tables), 2)[0]}
    for shard in board.shards:
        if shard["type"] == "data_parallel":
            assert shard["color"] == REPLICATED_COLOR == placement_view["replicated (data parallel)"]
            assert "replica" in shard["label"] and shard["movable"] is False
        else:
            assert shard["color"] == placement_view[f"rank {shard['rank']}"]
    board.move_request = {"id": "small/0", "rank": 1, "nonce": 1}  # what a drop in the browser sends
    assert board.message_kind == "error" and "DATA_PARALLEL" in board.message and "small" in board.message
    assert [s["rank"] for s in board.shards if s["table"] == "small"] == [0, 1]


def _contrast(text, background):
    """WCAG contrast ratio, worked out here from the definition (sRGB -> linear -> luminance)."""
    def luminance(color):
        channels = [int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        r, g, b = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * r + 0.7152 * g + 0.0722 * b
    high, low = sorted((luminance(text), luminance(background)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_block_labels_read_on_every_rank_colour():
    tables = [EmbeddingBagConfig(name=f"t{r}", num_embeddings=10, embedding_dim=4, feature_names=[f"f{r}"])
              for r in range(24)]
    plan = ShardingPlan({"": {f"t{r}": ParameterSharding("table_wise", ranks=[r], shards=[
        ShardMetadata.on_rank(r, 0, 0, 10, 4)]) for r in range(24)}})
    board = PlacementBoard(plan, tables, world_size=24)
    for shard in board.shards:
        chosen = _contrast(shard["text_color"], shard["color"])
        other = _contrast("#FFFFFF" if shard["text_color"] != "#FFFFFF" else "#111827", shard["color"])
        assert chosen >= other and chosen >= 4.0, (shard["rank"], shard["color"], shard["text_color"], chosen)
    light_green = [s for s in board.shards if s["color"] == "#B6E880"]
    assert light_green and light_green[0]["text_color"] == "#111827"  # white on it was unreadable
