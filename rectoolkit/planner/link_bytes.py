"""Closed forms of the bytes each rank moves over intra- and inter-host links for the byte patterns of the engine's
collectives (the search prices options with them, batched: rectoolkit.planner.cost.CostModel.fill_many; tested
equal to pricing rectoolkit.plan.traffic's matrices)."""

from __future__ import annotations

from typing import Tuple

import numpy as np


def xy_link_bytes(x: np.ndarray, y: np.ndarray, local_world_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """Bytes each rank sends plus receives over intra- and inter-host links for M[i, j] = x[i] + y[j], i != j.
    x, y: [..., W] (a batch of matrices along the leading axes)."""
    W, L = x.shape[-1], local_world_size
    H = W // L
    lead = x.shape[:-1]
    host_x = np.repeat(x.reshape(lead + (H, L)).sum(axis=-1), L, axis=-1)
    host_y = np.repeat(y.reshape(lead + (H, L)).sum(axis=-1), L, axis=-1)
    total_x, total_y = x.sum(axis=-1, keepdims=True), y.sum(axis=-1, keepdims=True)
    intra = (L - 1) * (x + y) + host_y - y + host_x - x
    inter = (W - L) * (x + y) + total_y - host_y + total_x - host_x
    return intra, inter


def ring_link_bytes(chunks: np.ndarray, local_world_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """Bytes each rank sends plus receives over intra- and inter-host links when a buffer cut into `chunks` ([..., W]
    bytes, chunk k rank k's) is all-reduced around a ring (rectoolkit.plan.traffic.allreduce_values_to): rank r sends
    rank r + 1 all the chunks but chunk r + 1 in the reduce-scatter and all but chunk r + 2 in the all-gather.

        >>> intra, inter = ring_link_bytes(np.array([3.0, 3.0, 2.0, 2.0]), 2)  # 10 bytes, hosts {0, 1} and {2, 3}
        >>> intra.tolist(), inter.tolist()  # rank 1 sends 16 to rank 2 (across), receives 15 from rank 0 (inside)
        ([15.0, 15.0, 15.0, 15.0], [14.0, 16.0, 16.0, 14.0])
    """
    W = chunks.shape[-1]
    sent = 2 * chunks.sum(axis=-1, keepdims=True) - np.roll(chunks, -1, axis=-1) - np.roll(chunks, -2, axis=-1)
    received = np.roll(sent, 1, axis=-1)
    hosts = np.arange(W) // local_world_size
    same_next, same_prev = hosts == np.roll(hosts, -1), hosts == np.roll(hosts, 1)
    intra = np.where(same_next, sent, 0.0) + np.where(same_prev, received, 0.0)
    inter = np.where(same_next, 0.0, sent) + np.where(same_prev, 0.0, received)
    return intra, inter
