"""The public workloads (table sets shared by benchmarks and examples), loaded as configs.

    >>> w = load_workload("small3")
    >>> [t.name for t in w.tables], w.batch_size_per_rank
    (['large_table', 'wide_table', 'small_table'], 32)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Dict, List, Union

from rectoolkit.modules.configs import EmbeddingBagConfig, PoolingType

WORKLOAD_NAMES = ("dlrm26", "small3")


@dataclass
class Workload:
    """A named set of tables with the mean pooling factor of each feature and a batch size per rank."""

    name: str
    tables: List[EmbeddingBagConfig]
    pooling_factors: Dict[str, float]  # feature name -> mean ids per sample
    batch_size_per_rank: int
    dense_features: int = 0
    id_distribution: Dict[str, object] = field(default_factory=lambda: {"kind": "uniform"})


def load_workload(name_or_path: Union[str, Path]) -> Workload:
    """Load a workload by name ("dlrm26", "small3") or from a JSON file in the same format."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise FileNotFoundError(f"workload file {path} does not exist")
        text = path.read_text()
    elif str(name_or_path) in WORKLOAD_NAMES:
        text = resources.files("rectoolkit.data.workloads").joinpath(f"{name_or_path}.json").read_text()
    else:
        raise ValueError(f"unknown workload {name_or_path!r}: use one of {WORKLOAD_NAMES} or a path to a .json file")
    raw = json.loads(text)
    tables, pooling_factors = [], {}
    for entry in raw["tables"]:
        tables.append(
            EmbeddingBagConfig(
                name=entry["name"],
                num_embeddings=int(entry["num_embeddings"]),
                embedding_dim=int(entry["embedding_dim"]),
                feature_names=list(entry["feature_names"]),
                pooling=PoolingType(entry.get("pooling", "SUM")),
            )
        )
        for feature in entry["feature_names"]:
            pooling_factors[feature] = float(entry.get("pooling_factor", 1.0))
    return Workload(
        name=raw.get("name", path.stem),
        tables=tables,
        pooling_factors=pooling_factors,
        batch_size_per_rank=int(raw["batch_size_per_rank"]),
        dense_features=int(raw.get("dense_features", 0)),
        id_distribution=dict(raw.get("id_distribution", {"kind": "uniform"})),
    )
