"""The settings a PlanExplorer starts from: a planner Topology's, if given, then the keyword arguments on top.

    >>> from rectoolkit.widgets.inputs import as_table_set
    >>> from rectoolkit.modules import EmbeddingBagConfig
    >>> tables = as_table_set([EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=100,
    ...                                           feature_names=["f0"])])
    >>> settings = initial_settings(tables, world_size=4, optimizer="adam")
    >>> settings.world_size, settings.local_world_size, settings.optimizer
    (4, 4, 'adam')
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from rectoolkit.plan.types import ShardingType
from rectoolkit.widgets import planning
from rectoolkit.widgets.inputs import TableSet
from rectoolkit.widgets.planning import AUTO, ExplorerSettings


def initial_settings(table_set: TableSet, topology: Any = None, world_size: Optional[int] = None,
                     local_world_size: Optional[int] = None, memory_gib: Optional[float] = None,
                     batch_size: Optional[int] = None, optimizer: str = "sgd", objective: str = "time",
                     compute_device: Optional[str] = None, forced: Optional[Dict[str, str]] = None
                     ) -> ExplorerSettings:
    """ExplorerSettings from `topology` (world size, ranks per host, memory per rank, batch size, device) and the
    arguments given (they win); without either, the batch size of `table_set` if it has one. Validated."""
    settings = ExplorerSettings()
    if compute_device is not None:
        settings.compute_device = compute_device
    if topology is not None:
        settings.world_size = int(getattr(topology, "world_size", settings.world_size))
        settings.local_world_size = int(getattr(topology, "local_world_size", None) or settings.world_size)
        settings.compute_device = str(getattr(topology, "compute_device", settings.compute_device))
        cap = getattr(topology, "hbm_cap" if settings.compute_device != "cpu" else "ddr_cap", None)
        if isinstance(cap, (list, tuple)):
            cap = min(cap)
        if cap:
            settings.memory_per_rank_gib = float(cap) / planning.GIB
        settings.batch_size = int(getattr(topology, "batch_size", None) or settings.batch_size)
    if world_size is not None:
        settings.world_size = world_size
        if local_world_size is None and topology is None:
            settings.local_world_size = world_size
    if local_world_size is not None:
        settings.local_world_size = local_world_size
    if memory_gib is not None:
        settings.memory_per_rank_gib = memory_gib
    if batch_size is not None:
        settings.batch_size = batch_size
    elif topology is None and table_set.batch_size:
        settings.batch_size = table_set.batch_size
    if compute_device is not None:
        settings.compute_device = compute_device
    settings.optimizer, settings.objective = optimizer, objective
    settings.forced = {k: ShardingType.parse(v).value for k, v in (forced or {}).items() if v != AUTO}
    return ExplorerSettings(**{**settings.__dict__})  # validates
