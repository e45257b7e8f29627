"""The wire protocol of a batch with a batch size per feature (VBE), by hand: every type carries each feature's own
bags (plus a 4-byte count per feature shard); the two-level types at both output levels, with a 4-byte count per
feature to each of the source's gateways."""

from __future__ import annotations

import torch

import rectoolkit as rtk
from rectoolkit.plan.traffic import batch_id_counter, batch_sizes_of, step_traffic

TABLES = [rtk.EmbeddingBagConfig(name="t_user", num_embeddings=10, embedding_dim=4, feature_names=["user"]),
          rtk.EmbeddingBagConfig(name="t_item", num_embeddings=10, embedding_dim=8, feature_names=["item"])]


def batches():
    """Rank 0: 1 user (3 ids), 4 items (1 id each); rank 1: 2 users (1 id each), 3 items (2 ids each)."""
    def vbe(user_lengths, item_lengths):
        lengths = torch.tensor(user_lengths + item_lengths)
        strides = [[len(user_lengths)], [len(item_lengths)]]
        return rtk.KeyedJaggedTensor(keys=["user", "item"], values=torch.arange(int(lengths.sum())) % 10,
                                     lengths=lengths, stride_per_key_per_rank=strides)
    return [vbe([3], [1, 1, 1, 1]), vbe([1, 1], [2, 2, 2])]


def on_rank(rank, sharding_type="table_wise"):
    return {t.name: rtk.ParameterSharding(sharding_type, ranks=[rank], shards=[
        rtk.ShardMetadata.on_rank(rank, 0, 0, t.num_embeddings, t.embedding_dim)]) for t in TABLES}


def test_table_wise_sends_each_feature_its_own_bags():
    m = step_traffic(on_rank(1), TABLES, 2, 2, batch_sizes_of(batches()), batch_id_counter(batches()))
    # rank 0 to rank 1: user 4 * (1 + 1) + 8 * 3 ids, item 4 * (1 + 4) + 8 * 4 ids
    # rank 1 to itself: user 4 * (1 + 2) + 8 * 2 ids, item 4 * (1 + 3) + 8 * 6 ids
    assert m["input_dist"].tolist() == [[0, 8 + 24 + 20 + 32], [0, 12 + 16 + 16 + 48]]
    # rank 1 returns 1 user row of 4 and 4 item rows of 8 to rank 0; 2 user rows and 3 item rows to itself
    assert m["output_dist"].tolist() == [[0, 0], [4 * (1 * 4 + 4 * 8), 4 * (2 * 4 + 3 * 8)]]
    assert m["output_dist_backward"].tolist() == m["output_dist"].T.tolist()


def test_two_level_types_send_each_feature_its_own_bags_at_both_levels():
    m = step_traffic(on_rank(1, "table_row_wise"), TABLES, 2, 2, batch_sizes_of(batches()),
                     batch_id_counter(batches()))
    assert batch_sizes_of(batches()) == [4, 3]
    # one host of 2 ranks: rank i's gateway is rank i itself, which hears one count per feature (user, item): 8 bytes.
    # To the owner, as table-wise: rank 0 4 * (1 + 1) + 8 * 3 and 4 * (1 + 4) + 8 * 4; rank 1 4 * (1 + 2) + 8 * 2
    # and 4 * (1 + 3) + 8 * 6
    assert m["input_dist"].tolist() == [[8, 8 + 24 + 20 + 32], [0, 8 + 12 + 16 + 16 + 48]]
    # rank 1 sends each source's partial sums to the source's gateway (itself): 1 user row of 4 and 4 item rows
    # of 8 for rank 0, 2 user rows and 3 item rows for rank 1; the gateways forward the same sizes
    for_rank_0, for_rank_1 = 4 * (1 * 4 + 4 * 8), 4 * (2 * 4 + 3 * 8)
    assert m["output_dist_intra"].tolist() == [[0, 0], [for_rank_0, for_rank_1]]
    assert m["output_dist_inter"].tolist() == [[for_rank_0, 0], [0, for_rank_1]]
    assert m["output_dist_inter_backward"].tolist() == m["output_dist_inter"].T.tolist()


def test_two_hosts_the_gateway_on_the_tables_host_hears_the_counts():
    # 2 hosts of 1 rank, both tables on host 1: rank 1 is every source's gateway there
    m = step_traffic(on_rank(1, "grid_shard"), TABLES, 2, 1, batch_sizes_of(batches()), batch_id_counter(batches()))
    assert m["input_dist"].tolist() == [[0, 8 + 84], [0, 8 + 92]]
    assert m["output_dist_intra"].tolist() == [[0, 0], [0, 4 * (1 * 4 + 4 * 8) + 4 * (2 * 4 + 3 * 8)]]
    assert m["output_dist_inter"].tolist() == [[0, 0], [4 * (1 * 4 + 4 * 8), 4 * (2 * 4 + 3 * 8)]]


def test_a_plain_batch_is_priced_as_before():
    plain = [rtk.KeyedJaggedTensor.from_lengths_sync(["user", "item"], torch.tensor([1, 2, 3]), torch.tensor([1, 0, 1, 1]))] * 2
    m = step_traffic(on_rank(0), TABLES, 2, 2, batch_sizes_of(plain), batch_id_counter(plain))
    assert m["input_dist"].tolist() == [[2 * 8 + 3 * 8, 0], [2 * 8 + 3 * 8, 0]]
    assert m["output_dist"].tolist() == [[4 * 2 * 12, 4 * 2 * 12], [0, 0]]
