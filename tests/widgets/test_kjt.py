"""KJTView and BatchTrace: the drawn slices and routes equal hand-worked ones and the traffic protocol."""

import numpy as np
import torch

from rectoolkit.plan.traffic import batch_id_counter, step_traffic
from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata
from rectoolkit.sparse import KeyedJaggedTensor
from rectoolkit.viz.routing import route_matrices, routing_frame
from rectoolkit.widgets.kjt import BatchTrace, KJTView


def _kjt():
    # product: [1, 2, 1], [5]; user: [2, 3], [4, 1]
    return KeyedJaggedTensor(keys=["product", "user"], values=torch.tensor([1, 2, 1, 5, 2, 3, 4, 1]),
                             lengths=torch.tensor([3, 1, 2, 2]))


def test_kjt_view_slices():
    view = KJTView(_kjt())
    assert view.select("product", 0) == "product, sample 0: lengths[0] = 3, offsets[0] = 0, values[0:3] = [1, 2, 1]"
    assert view.select("user", None) == "user: lengths[2:4] = [2, 2], values[4:8] = [2, 3, 4, 1]"
    assert view.select(None, 1) == "sample 1: product -> values[3:4], user -> values[6:8]"
    view.select("user", 0)
    assert view.picture.value.count('class="rtk-hl"') == 1 + 2 + 1 + 1  # grid cell, 2 values, its length, its offset
    assert "[2, 3]" in view.picture.value


def test_kjt_view_shows_weights_of_a_weighted_kjt():
    kjt = KeyedJaggedTensor(keys=["product", "user"], values=torch.tensor([1, 2, 1, 5, 2, 3, 4, 1]),
                            lengths=torch.tensor([3, 1, 2, 2]),
                            weights=torch.tensor([0.5, 1.0, 2.0, 0.25, 1.5, 3.0, 0.75, 1.25]))
    view = KJTView(kjt)
    assert view.select("user", 1) == ("user, sample 1: lengths[3] = 2, offsets[3] = 6, values[6:8] = [4, 1], "
                                      "weights[6:8] = [0.75, 1.25]")
    assert 'class="rtk-label">weights</td>' in view.picture.value
    # selected: grid cell, its 2 values, its 2 weights, its length, its offset
    assert view.picture.value.count('class="rtk-hl"') == 1 + 2 + 2 + 1 + 1
    assert "weights" not in KJTView(_kjt()).picture.value


def _batches():
    return [
        KeyedJaggedTensor(keys=["f_big", "f_wide", "f_small"], values=torch.tensor([5, 700, 950, 3, 9, 1]),
                          lengths=torch.tensor([2, 1, 1, 1, 0, 1])),
        KeyedJaggedTensor(keys=["f_big", "f_wide", "f_small"], values=torch.tensor([650, 42, 7]),
                          lengths=torch.tensor([1, 0, 1, 0, 1, 0])),
    ]


def test_routes_hand_case(plan, tables):
    routes = routing_frame(plan, tables, _batches())
    big = routes[(routes.source_rank == 0) & (routes.table == "big")]
    # rank 0's big ids 5 | 700, 950: 5 stays on rank 0 (rows 0:600), 700 and 950 go to rank 1
    assert big[["owner_rank", "ids", "input_bytes", "output_bytes"]].values.tolist() == [
        [0, [5], 2 * 4 + 8, 2 * 8 * 4], [1, [700, 950], 2 * 4 + 16, 2 * 8 * 4]]
    small = routes[routes.table == "small"]
    assert small["input_bytes"].sum() == 0 and set(small["returns"]) == {"local lookup on the replica"}


def test_routes_equal_traffic_protocol(plan, tables):
    batches = _batches()
    routes = routing_frame(plan, tables, batches)
    inputs, outputs = route_matrices(routes, 2)
    expected = step_traffic(plan.plan[""], tables, 2, 2, [2, 2], batch_id_counter(batches))
    assert inputs.tolist() == expected["input_dist"].tolist()
    assert outputs.tolist() == expected["output_dist"].tolist()


def test_batch_trace_filters_redraw(plan, tables):
    trace = BatchTrace(plan, tables, _batches())
    all_links = len(trace.figure.data[0].link.value)
    trace.select(feature="f_big", source_rank=1)
    sankey = trace.figure.data[0]
    assert len(sankey.link.value) < all_links
    # rank 1's f_big ids: [650] -> rank 1's shard, none to rank 0; each route has an input and an output link
    assert list(sankey.link.source) == [1, 2, 1, 3] and list(sankey.link.value)[:3:2] == [8, 8 + 8]
    assert "1 ids" in trace.summary.value
    trace.measure_picker.value = "ids"
    assert list(trace.figure.data[0].link.value) == [0, 1]


def test_two_level_routes_go_through_gateway(tables):
    big = tables[0]
    plan = ShardingPlan({"": {"big": ParameterSharding("table_row_wise", ranks=[2, 3], shards=[
        ShardMetadata.on_rank(2, 0, 0, 500, 8), ShardMetadata.on_rank(3, 500, 0, 500, 8)])}})
    batch = KeyedJaggedTensor(keys=["f_big"], values=torch.tensor([1, 600]), lengths=torch.tensor([2]))
    routes = routing_frame(plan, [big], [batch] * 4, local_world_size=2)
    to_rank1 = routes[routes.source_rank == 1]
    assert to_rank1["return_rank"].tolist() == [3, 3]  # rank 1's partial sums meet at rank 3 (host 1, local 1)
    inputs, outputs = route_matrices(routes, 4)
    expected = step_traffic(plan.plan[""], [big], 4, 2, [1] * 4, batch_id_counter([batch] * 4))
    assert outputs.tolist() == expected["output_dist_intra"].tolist()
    assert np.array_equal(inputs, expected["input_dist"])
