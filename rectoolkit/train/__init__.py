"""The demo training recipe: DLRM, synthetic Zipf click data, a Criteo TSV reader, metrics, the loop.

    from rectoolkit.train import TrainConfig, train
    rectoolkit.launch(train, 2, TrainConfig(steps=200, batch_size=256, max_rows=10_000), on_metrics=print)

Under torchrun: `torchrun --standalone --nproc-per-node 2 -m rectoolkit.train --workload dlrm26 --steps 100`.
"""

from rectoolkit.train.criteo import CriteoTSV, parse_criteo_line
from rectoolkit.train.data import Batch, SyntheticData, zipf_ids
from rectoolkit.train.loop import TrainConfig, build_model, make_tables, shard_model, train
from rectoolkit.train.metrics import Throughput, auc, log_loss
from rectoolkit.train.model import DLRM, DenseArch, InteractionArch, OverArch, SparseArch

__all__ = [
    "Batch",
    "CriteoTSV",
    "DLRM",
    "DenseArch",
    "InteractionArch",
    "OverArch",
    "SparseArch",
    "SyntheticData",
    "Throughput",
    "TrainConfig",
    "auc",
    "build_model",
    "log_loss",
    "make_tables",
    "parse_criteo_line",
    "shard_model",
    "train",
    "zipf_ids",
]
