"""The 2D trade-off figure: one point per sharding group size that fits (memory per rank across, the estimated step
up), a segment from the group's own step to it (the sync's share), sizes that do not fit named, bad input refused."""

import pandas as pd
import pytest

import rectoolkit as rtk
from rectoolkit.planner.topology import Topology
from rectoolkit.planner.two_dimensional import compare_sharding_group_sizes
from rectoolkit.viz import two_dimensional_figure


def test_each_size_that_fits_is_a_point_at_its_memory_and_step():
    tables = [rtk.EmbeddingBagConfig(name=f"t{i}", num_embeddings=1000, embedding_dim=16, feature_names=[f"f{i}"])
              for i in range(4)]
    frame = compare_sharding_group_sizes(tables, Topology(world_size=4, compute_device="cpu", ddr_cap=150_000),
                                         batch_size=8, sync_interval=2)
    fig = two_dimensional_figure(frame)
    gaps, points = fig.data
    fits = frame[frame["fits"]]
    assert list(points.text) == ["G=2 (2 replicas)", "G=4 (1 replica)"]
    assert list(points.x) == fits["max_memory_bytes"].tolist() and list(points.y) == fits["step_ms"].tolist()
    # each segment runs from the group's own step up to the whole step, at the size's memory
    assert list(gaps.y) == [fits["group_step_ms"].iloc[0], fits["step_ms"].iloc[0], None,
                            fits["group_step_ms"].iloc[1], fits["step_ms"].iloc[1], None]
    assert fits["step_ms"].iloc[0] > fits["group_step_ms"].iloc[0]  # G=2 pays a sync
    assert fig.layout.title.text.endswith("(G=1 does not fit)")


def test_a_frame_without_the_columns_or_without_a_size_that_fits_is_refused():
    with pytest.raises(KeyError, match=r"no column\(s\) \['replicas', 'fits'"):
        two_dimensional_figure(pd.DataFrame({"sharding_group_size": [1], "step_ms": [1.0], "group_step_ms": [1.0],
                                             "max_memory_bytes": [1.0]}))
    frame = pd.DataFrame({"sharding_group_size": [1], "replicas": [2], "fits": [False], "step_ms": [None],
                          "group_step_ms": [None], "max_memory_bytes": [None], "why": ["too big"]})
    with pytest.raises(ValueError, match="no sharding group size fits"):
        two_dimensional_figure(frame)
