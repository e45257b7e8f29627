"""Embedding modules with TorchRec's names: table configs, EmbeddingBagCollection, EmbeddingCollection."""

from rectoolkit.modules.configs import DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
from rectoolkit.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from rectoolkit.modules import (  # noqa: F401
    activation, crossnet, deepfm, embedding_tower, feature_processor_, fp_embedding_modules, mc_embedding_modules,
    mc_modules, mlp, regroup)
from rectoolkit.modules.crossnet import CrossNet, LowRankCrossNet, LowRankMixtureCrossNet, VectorCrossNet
from rectoolkit.modules.deepfm import DeepFM, FactorizationMachine
from rectoolkit.modules.embedding_tower import EmbeddingTower, EmbeddingTowerCollection
from rectoolkit.modules.feature_processor_ import PositionWeightedModule, PositionWeightedModuleCollection
from rectoolkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from rectoolkit.modules.mc_embedding_modules import (
    ManagedCollisionEmbeddingBagCollection, ManagedCollisionEmbeddingCollection)
from rectoolkit.modules.mc_modules import (
    DistanceLFU_EvictionPolicy, LFU_EvictionPolicy, LRU_EvictionPolicy, ManagedCollisionCollection,
    MCHManagedCollisionModule)
from rectoolkit.modules.mlp import MLP, Perceptron


def __getattr__(name: str):
    """`rectoolkit.modules.embedding_configs` and `.utils` (TorchRec's paths), imported on first use."""
    if name in ("embedding_configs", "utils"):
        import importlib

        return importlib.import_module(f"rectoolkit.modules.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
