"""The fbgemm backend: one SplitTableBatchedEmbeddingBagsCodegen (TBE) for all tables, optimizer fused.

Imported only when fbgemm_gpu loads (see backend.fbgemm_available). Weights live in the TBE's own storage
(`weights_host` on CPU, `weights_dev` on CUDA); the kernel's `table_weights` are Parameters viewing it.
Ids are checked by BatchedEmbeddingKernel.prepare_ids before the TBE runs (an error naming the feature, table
and id); the TBE's own bounds check is off: on CPU it is a slower single pass than the per-feature min/max, on
CUDA a FATAL check would be a device assert that poisons the context.

Any feature order works. fbgemm's TBE gives wrong updates (or raises, for row-wise Adagrad on CPU) when the
features of one table are not next to each other in `feature_table_map`, so the TBE is built with the
features sorted by table (stable) and each batch is permuted into that order on the way in (lengths, ids,
weights: fbgemm's permute_2D_sparse_data) and back on the way out (output columns, or output rows with
pooling "none"). When the map is already grouped by table, as in the collections, nothing is permuted.

    >>> kernel = FbgemmBatchedEmbedding([TableSpec(8, 4)], optimizer=FusedOptimizerConfig("sgd", lr=1.0))
    >>> out = kernel(torch.tensor([3, 3]), torch.tensor([0, 2]))
    >>> out.shape
    torch.Size([1, 4])
"""

from __future__ import annotations

from typing import Dict, List

import torch

from rectoolkit.kernels.batched_embedding import BatchedEmbeddingKernel, TableSpec  # noqa: F401 (doctest)
from rectoolkit.kernels.batched_embedding import pad_bags, segment_positions, take_segments
from rectoolkit.kernels.fused_optimizers import FusedOptimizerConfig, optimizer_state_names  # noqa: F401
from rectoolkit.kernels.optimizer_state import EmbOptimType


def _fbgemm_optim_type(optimizer: EmbOptimType):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType as FbgemmOptimType

    return {
        EmbOptimType.SGD: FbgemmOptimType.EXACT_SGD,
        EmbOptimType.ADAGRAD: FbgemmOptimType.EXACT_ADAGRAD,
        EmbOptimType.ROWWISE_ADAGRAD: FbgemmOptimType.EXACT_ROWWISE_ADAGRAD,
        EmbOptimType.ADAM: FbgemmOptimType.ADAM,
    }[optimizer]


class FbgemmBatchedEmbedding(BatchedEmbeddingKernel):
    """fbgemm TBE kernel (CPU or CUDA) with a fused SGD / Adagrad / row-wise Adagrad / Adam (CUDA only)."""

    backend = "fbgemm"
    # How a variable-batch (VBE) call runs on CPU: "torch" (the pure-torch VBE lookup on this TBE's weights and
    # state; the default, see _variable_batch_forward), "fbgemm" (fbgemm's VBE TBE: slow metadata on CPU) or "pad"
    cpu_variable_batch = "torch"

    def __init__(self, tables, feature_table_map=None, pooling="sum", optimizer=None, device=None,
                 dtype=torch.float32, ids_out_of_range="error", feature_names=None) -> None:
        super().__init__(tables, feature_table_map, pooling, optimizer, device, dtype, ids_out_of_range, feature_names)
        if optimizer is None:
            raise ValueError("the fbgemm kernel needs a fused optimizer; dense gradients use TorchBatchedEmbedding")
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            BoundsCheckMode,
            EmbeddingLocation,
            PoolingMode,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        # The TBE's features, sorted by table (stable); kernel_order[k] is the caller's feature at TBE position k.
        self.kernel_order = sorted(range(self.num_features), key=lambda f: self.feature_table_map[f])
        self.permuted = self.kernel_order != list(range(self.num_features))
        kernel_dims = [self.feature_dims[f] for f in self.kernel_order]
        kernel_starts = [sum(kernel_dims[:k]) for k in range(self.num_features)]
        position = {f: k for k, f in enumerate(self.kernel_order)}
        self._kernel_order_int = torch.tensor(self.kernel_order, dtype=torch.int32, device=self.device)
        self._caller_order = [position[f] for f in range(self.num_features)]
        self._output_columns = torch.cat([  # the caller's column c reads TBE output column _output_columns[c]
            torch.arange(kernel_starts[position[f]], kernel_starts[position[f]] + self.feature_dims[f])
            for f in range(self.num_features)]).to(self.device)
        on_cuda = self.device.type == "cuda"
        location = EmbeddingLocation.DEVICE if on_cuda else EmbeddingLocation.HOST
        compute = ComputeDevice.CUDA if on_cuda else ComputeDevice.CPU
        self.tbe = SplitTableBatchedEmbeddingBagsCodegen(
            embedding_specs=[(t.num_embeddings, t.embedding_dim, location, compute) for t in self.tables],
            feature_table_map=[self.feature_table_map[f] for f in self.kernel_order],
            optimizer=_fbgemm_optim_type(optimizer.optimizer),
            learning_rate=optimizer.lr,
            eps=optimizer.eps,
            beta1=optimizer.beta1,
            beta2=optimizer.beta2,
            weight_decay=optimizer.weight_decay,
            gradient_clipping=optimizer.gradient_clipping,
            max_gradient=optimizer.max_gradient,
            pooling_mode=PoolingMode.SUM if self.pooled else PoolingMode.NONE,
            bounds_check_mode=BoundsCheckMode.NONE,
            device=self.device,
            table_names=[t.name or f"table_{i}" for i, t in enumerate(self.tables)],
        )
        self._tbe_lr = optimizer.lr
        self.table_weights = [torch.nn.Parameter(view) for view in self.split_embedding_weights()]

    def split_embedding_weights(self) -> List[torch.Tensor]:
        return self.tbe.split_embedding_weights()

    def split_optimizer_states(self) -> List[Dict[str, torch.Tensor]]:
        names = optimizer_state_names(self.optimizer.optimizer)
        if not names:
            return [{} for _ in self.tables]
        states = self.tbe.split_optimizer_states()
        return [{name: tensor for name, tensor in zip(names, per_table)} for per_table in states]

    def set_learning_rate(self, lr: float) -> None:
        super().set_learning_rate(lr)
        if lr != self._tbe_lr:
            self.tbe.set_learning_rate(float(lr))
            self._tbe_lr = float(lr)

    @property
    def num_updates(self) -> int:
        return int(self.tbe.iter.item()) if hasattr(self, "tbe") else 0

    @num_updates.setter
    def num_updates(self, value: int) -> None:
        pass  # the TBE counts its own steps (self.tbe.iter)

    def forward(self, indices, offsets, per_sample_weights=None, batch_size_per_feature=None) -> torch.Tensor:
        ids, offsets, batch_size, ids_per_feature = self.prepare_ids(indices, offsets, batch_size_per_feature)
        if self.optimizer.lr != self._tbe_lr:  # someone changed optimizer.lr directly
            self.set_learning_rate(self.optimizer.lr)
        if per_sample_weights is not None:
            if not self.pooled:
                raise ValueError("per_sample_weights need pooling 'sum' (weighted bags)")
            per_sample_weights = per_sample_weights.to(device=self.device, dtype=torch.float32)
        if batch_size_per_feature is not None:
            return self._variable_batch_forward(ids, offsets, per_sample_weights, ids_per_feature,
                                                [int(b) for b in batch_size_per_feature])
        kernel_ids, kernel_offsets, kernel_weights, positions = ids, offsets, per_sample_weights, None
        if self.permuted:
            kernel_ids, kernel_offsets, kernel_weights, positions = self._to_kernel_order(ids, offsets, per_sample_weights, batch_size)
        out = self.tbe(kernel_ids, kernel_offsets, per_sample_weights=kernel_weights)
        if not self.permuted:
            return out
        if self.pooled:
            return out.index_select(1, self._output_columns)
        inverse = torch.empty_like(positions)
        inverse[positions] = torch.arange(positions.numel(), device=positions.device)
        return out.index_select(0, inverse)

    def _to_kernel_order(self, ids: torch.Tensor, offsets: torch.Tensor, per_sample_weights, batch_size: int):
        """(ids, offsets, weights) permuted from the caller's feature order to the TBE's, and, when the output
        rows or the weights' gradient need it, the caller's position of every permuted id (else None)."""
        num_ids = ids.numel()
        lengths = offsets.diff().view(self.num_features, batch_size)
        need_positions = not self.pooled or (per_sample_weights is not None and per_sample_weights.requires_grad)
        if need_positions:
            positions = torch.arange(num_ids, device=ids.device)
            kernel_lengths, positions, _ = torch.ops.fbgemm.permute_2D_sparse_data(
                self._kernel_order_int, lengths, positions, None, num_ids)
            kernel_ids = ids.index_select(0, positions)
            kernel_weights = per_sample_weights.index_select(0, positions) if per_sample_weights is not None else None
        else:
            positions = None
            kernel_lengths, kernel_ids, kernel_weights = torch.ops.fbgemm.permute_2D_sparse_data(
                self._kernel_order_int, lengths, ids, per_sample_weights, num_ids)
        kernel_offsets = torch.ops.fbgemm.asynchronous_complete_cumsum(kernel_lengths.reshape(-1))
        return kernel_ids, kernel_offsets, kernel_weights, positions

    def _variable_batch_forward(self, ids: torch.Tensor, offsets: torch.Tensor, per_sample_weights,
                                ids_per_feature: torch.Tensor, bags: List[int]) -> torch.Tensor:
        """VBE: fbgemm's variable-batch TBE (one rank, `batch_size_per_feature_per_rank`); the features are
        taken in the TBE's order (whole segments of bags and ids) and the flat output's blocks put back.
        fbgemm's VBE has SGD, row-wise Adagrad and Adam only, and on CPU its per-call metadata
        (fbgemm::generate_vbe_metadata) costs far more than the lookup (measured: 140 ms for 26 features of
        2 to 512 bags, against 2 ms for the padded lookup). So on CPU (`cpu_variable_batch` "torch", the default)
        the pure-torch kernel's VBE mode runs on this TBE's own weights and optimizer state (the same update rules);
        where it cannot share them (tables not stored in dim order), with "pad", and for the optimizers fbgemm's
        VBE lacks (Adagrad), every feature is padded to the largest batch size with empty bags (no ids), the plain
        TBE runs, and each feature's own rows are kept."""
        if self.cpu_variable_batch not in ("torch", "fbgemm", "pad"):
            raise ValueError(f"cpu_variable_batch must be 'torch', 'fbgemm' or 'pad', got {self.cpu_variable_batch!r}")
        on_cpu = self.device.type == "cpu"
        native = self.optimizer.optimizer in (EmbOptimType.SGD, EmbOptimType.ROWWISE_ADAGRAD, EmbOptimType.ADAM) \
            and (not on_cpu or self.cpu_variable_batch == "fbgemm")
        sharing = self._torch_kernel_on_my_storage() if on_cpu and self.cpu_variable_batch == "torch" else None
        if sharing is not None:
            return sharing(ids, offsets, per_sample_weights, batch_size_per_feature=bags)
        if not native:
            B = max(bags, default=0)
            lengths = pad_bags(offsets.diff(), bags, B).reshape(-1)
            padded_offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=self.device)
            torch.cumsum(lengths, 0, out=padded_offsets[1:])
            out = self.forward(ids, padded_offsets, per_sample_weights)
            width, column = out.shape[1], 0
            kept = [torch.zeros(0, dtype=torch.int64, device=self.device)]  # positions in out of each feature's rows
            for n, dim in zip(bags, self.feature_dims):
                rows = torch.arange(n, device=self.device).unsqueeze(1) * width
                kept.append((rows + torch.arange(column, column + dim, device=self.device)).reshape(-1))
                column += dim
            return out.reshape(-1).index_select(0, torch.cat(kept))
        if not self.permuted:
            return self.tbe(ids, offsets, per_sample_weights=per_sample_weights,
                            batch_size_per_feature_per_rank=[[b] for b in bags])
        order = self.kernel_order
        bag_positions = segment_positions(torch.tensor(bags, device=self.device), self._kernel_order_int.long())
        id_positions = segment_positions(ids_per_feature, self._kernel_order_int.long())
        lengths = offsets.diff().index_select(0, bag_positions)
        kernel_offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(lengths, 0, out=kernel_offsets[1:])
        kernel_weights = per_sample_weights.index_select(0, id_positions) if per_sample_weights is not None else None
        out = self.tbe(ids.index_select(0, id_positions), kernel_offsets, per_sample_weights=kernel_weights,
                       batch_size_per_feature_per_rank=[[bags[f]] for f in order])
        return take_segments(out, [bags[f] * self.feature_dims[f] for f in order], self._caller_order)

    def _torch_kernel_on_my_storage(self):
        """A TorchBatchedEmbedding that looks up and updates this TBE's CPU weights and state in place (built once),
        or None when the layouts differ."""
        if self.device.type != "cpu":
            return None
        if not hasattr(self, "_sharing"):
            from rectoolkit.kernels.batched_embedding import TorchBatchedEmbedding
            from rectoolkit.kernels.fused_optimizers import optimizer_state_names

            names = optimizer_state_names(self.optimizer.optimizer)
            kernel = TorchBatchedEmbedding(
                self.tables, self.feature_table_map, "sum", self.optimizer, self.device, self.dtype, "unchecked",
                self.feature_names, storage=self.tbe.weights_host,
                state_storage={name: getattr(self.tbe, f"{name}_host") for name in names})
            same = [a.data_ptr() == b.data_ptr() for a, b in zip(kernel.split_embedding_weights(), self.split_embedding_weights())]
            for mine, theirs in zip(kernel.split_optimizer_states(), self.split_optimizer_states()):
                same += [mine[name].data_ptr() == theirs[name].data_ptr() and mine[name].numel() == theirs[name].numel()
                         for name in names]
            self._sharing = kernel if all(same) else None
        return self._sharing
