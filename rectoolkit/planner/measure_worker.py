"""The worker side of rectoolkit.planner.measure: what every rank of `measure_plans`' launch runs (shard every plan,
count one step's bytes, warm up, then timed blocks alternating round by round, phase steps, load probes); the
measure module's docstring says what is timed and why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

import torch

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.plan.types import ShardingPlan
from rectoolkit.planner.load import SyntheticStep, measure_load

GROUP_PHASES = ("input_dist", "lookup", "output_dist")  # timed per sharding-type group
PROBE_STEPS_BETWEEN_BLOCKS = 4  # synthetic load-probe steps after every plan's block of timed steps


@dataclass
class RunSpec:
    """Everything the workers need (picklable)."""

    plans: Dict[str, ShardingPlan]
    tables: List[EmbeddingBagConfig]
    pooling_factors: Dict[str, float]
    batch_size: int
    num_batches: int
    zipf_alpha: float
    seed: int
    optimizer: str
    lr: float
    local_world_size: int
    steps: int
    warmup: int
    rounds: int
    phase_steps: int


def make_batches(spec: RunSpec, rank: int, world_size: int) -> list:
    """The `num_batches` KJTs of one rank (the same wherever they are made: the caller makes rank r's too)."""
    from rectoolkit.train.data import SyntheticData

    data = SyntheticData(spec.tables, spec.pooling_factors, spec.batch_size, dense_features=0,
                         zipf_alpha=spec.zipf_alpha, seed=spec.seed, rank=rank, world_size=world_size)
    return [data.batch(step).sparse_features for step in range(spec.num_batches)]


class PhaseClock:
    """Times input_dist / lookup / output_dist of every sharding-type group of a sharded collection, each after
    a barrier, and what the caller adds (forward_other, backward: group "", the whole collection).

    Installs wrappers as instance attributes of the groups (their forward calls self.input_dist etc.), and
    only records while `active`.
    """

    def __init__(self, collection: Any, pg: Any) -> None:
        import torch.distributed as dist

        self._dist, self._pg = dist, pg
        self.active = False
        self.times: Dict[Tuple[str, str], List[float]] = {}  # (group, phase) -> [wall ms, cpu ms]
        self.barrier_ms = self.barrier_cpu_ms = 0.0
        for key, group in collection.groups.items():
            for phase in GROUP_PHASES:
                setattr(group, phase, self._wrap(key, phase, getattr(group, phase)))

    def reset(self) -> None:
        self.times = {}
        self.barrier_ms = self.barrier_cpu_ms = 0.0

    def barrier(self) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self._dist.barrier(group=self._pg)
        self.barrier_ms += 1000 * (time.perf_counter() - wall)
        self.barrier_cpu_ms += 1000 * (time.process_time() - cpu)

    def add(self, group: str, phase: str, wall_s: float, cpu_s: float) -> None:
        entry = self.times.setdefault((group, phase), [0.0, 0.0])
        entry[0] += 1000 * wall_s
        entry[1] += 1000 * cpu_s

    def total_ms(self, index: int) -> float:
        """Wall (index 0) or CPU (1) ms recorded so far."""
        return sum(entry[index] for entry in self.times.values())

    def _wrap(self, group: str, phase: str, method):
        def timed(*args):
            if not self.active:
                return method(*args)
            self.barrier()
            wall, cpu = time.perf_counter(), time.process_time()
            out = method(*args)
            self.add(group, phase, time.perf_counter() - wall, time.process_time() - cpu)
            return out

        return timed


class PlanRunner:
    """One plan on this rank: its DistributedModelParallel, a step, and the measurements of its steps."""

    def __init__(self, name: str, plan: ShardingPlan, spec: RunSpec, ctx: Any) -> None:
        from rectoolkit.distributed import DistributedModelParallel
        from rectoolkit.modules.embedding_modules import EmbeddingBagCollection

        self.name = name
        ebc = EmbeddingBagCollection(spec.tables, device="meta", optimizer=spec.optimizer, lr=spec.lr)
        try:
            self.model = DistributedModelParallel(ebc, plan=plan, device=ctx.device,
                                                  local_world_size=spec.local_world_size)
        except ValueError as error:
            raise ValueError(f"plan {name!r} cannot be sharded on rank {ctx.rank}: {error}") from error
        # no fused optimizer: DATA_PARALLEL replicas (dense kernel, as TorchRec's) and shards planned "dense"
        plain = self.model.dense_parameters()
        self.dense_optimizer = torch.optim.SGD(plain, lr=spec.lr) if plain else None
        self.clock = PhaseClock(self.model.sharded_modules[""], self.model.env.pg)
        self.steps: List[Tuple[int, int, float, float]] = []  # (round, step, wall ms, cpu ms)
        self.phases: List[Tuple[int, int, str, str, float, float]] = []  # (round, step, group, phase, wall, cpu)

    def forward(self, kjt: Any) -> torch.Tensor:
        return self.model(kjt).values()

    def backward(self, out: torch.Tensor) -> None:
        out.sum().backward()
        if self.dense_optimizer is not None:
            self.dense_optimizer.step()
            self.dense_optimizer.zero_grad(set_to_none=True)

    def timed_step(self, kjt: Any, round_index: int, step: int) -> None:
        self.clock.barrier()
        wall, cpu = time.perf_counter(), time.process_time()
        self.backward(self.forward(kjt))
        self.steps.append((round_index, step, 1000 * (time.perf_counter() - wall), 1000 * (time.process_time() - cpu)))

    def phase_step(self, kjt: Any, round_index: int, step: int) -> None:
        clock = self.clock
        clock.reset()
        clock.barrier()
        barrier_wall, barrier_cpu = clock.barrier_ms, clock.barrier_cpu_ms
        clock.active = True
        wall, cpu = time.perf_counter(), time.process_time()
        out = self.forward(kjt)
        forward_wall, forward_cpu = time.perf_counter() - wall, time.process_time() - cpu
        clock.active = False
        # what the forward spent outside the groups' phases and the barriers between them
        clock.add("", "forward_other", forward_wall - (clock.barrier_ms - barrier_wall + clock.total_ms(0)) / 1000,
                  forward_cpu - (clock.barrier_cpu_ms - barrier_cpu + clock.total_ms(1)) / 1000)
        clock.barrier()
        wall, cpu = time.perf_counter(), time.process_time()
        self.backward(out)
        clock.add("", "backward", time.perf_counter() - wall, time.process_time() - cpu)
        for (group, phase), (wall_ms, cpu_ms) in clock.times.items():
            self.phases.append((round_index, step, group, phase, wall_ms, cpu_ms))

    def count_step(self, kjt: Any) -> Dict[str, Any]:
        """One step with fresh byte counters: the bytes matrices (a collective), calls, memory."""
        self.model.reset_bytes_sent()
        self.backward(self.forward(kjt))
        calls = dict(self.model.env.stats.calls)
        matrices = {name: m.tolist() for name, m in self.model.bytes_sent().items()}
        return {"bytes": matrices, "calls": calls, "memory": self.model.memory_usage()}


def measure_worker(ctx: Any, spec: RunSpec) -> Dict[str, Any]:
    """Runs on every rank: shard every plan, count, warm up, then alternate timed blocks round by round."""
    torch.manual_seed(spec.seed)
    batches = make_batches(spec, ctx.rank, ctx.world_size)
    runners = [PlanRunner(name, plan, spec, ctx) for name, plan in spec.plans.items()]
    counted = {}
    for runner in runners:
        counted[runner.name] = runner.count_step(batches[0])
        for step in range(spec.warmup - 1):
            runner.backward(runner.forward(batches[(step + 1) % len(batches)]))
    ctx.report(stage="warm", plans=len(runners))
    load_before = measure_load()  # before any timed step: the machine's slowdown the estimates are scaled by
    during = SyntheticStep()  # a few synthetic steps after every plan's block: the load while the plans ran
    during_alone = SyntheticStep(alone=True)  # and as many with rank 0 working alone (LoadProbe.factor_alone)
    step_index = 0
    for round_index in range(spec.rounds):
        order = runners if round_index % 2 == 0 else runners[::-1]
        for runner in order:
            # one untimed step first: the other plans' blocks have evicted this plan's tables from the caches,
            # which a training job running one plan does not see
            runner.backward(runner.forward(batches[step_index % len(batches)]))
            for _ in range(spec.steps):
                runner.timed_step(batches[step_index % len(batches)], round_index, step_index)
                step_index += 1
            for _ in range(spec.phase_steps):
                runner.phase_step(batches[step_index % len(batches)], round_index, step_index)
                step_index += 1
            during.run(PROBE_STEPS_BETWEEN_BLOCKS)
            during_alone.run(PROBE_STEPS_BETWEEN_BLOCKS)
        ctx.report(stage="round", round=round_index)
    return {"plans": {runner.name: {"steps": runner.steps, "phases": runner.phases, **counted[runner.name]}
                      for runner in runners},
            "load": {"before": load_before.to_dict(), "during": during.probe(alone=during_alone).to_dict()}}
