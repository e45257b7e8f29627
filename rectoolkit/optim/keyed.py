"""Optimizers whose parameters and state are keyed by parameter name (TorchRec's KeyedOptimizer family).

A model with fused embeddings has two optimizers: the fused one (updates happen inside backward; its
step() only pushes hyper-parameters such as lr) and an ordinary one for the dense part. CombinedOptimizer
steps and zero_grads both, and its state_dict is keyed by "<optimizer key>.<parameter name>".

    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> dense = KeyedOptimizerWrapper({"w": w}, lambda params: torch.optim.SGD(params, lr=0.5))
    >>> combined = CombinedOptimizer([("dense", dense)])
    >>> (w * w).sum().backward(); combined.step(); combined.zero_grad()
    >>> w.tolist(), list(combined.params)
    ([0.0, 0.0], ['dense.w'])
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from copy import deepcopy
from typing import Any, Callable, Collection, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import torch


class KeyedOptimizer(torch.optim.Optimizer):
    """A torch Optimizer view with `params` (name -> tensor), `state` (tensor -> dict) and `param_groups`.

    state_dict() keys state by parameter name instead of position, so it survives re-sharding and
    reordering. Subclasses implement step() and zero_grad().
    """

    def __init__(self, params: Mapping[str, torch.Tensor], state: Mapping[Any, Any],
                 param_groups: Collection[Mapping[str, Any]]) -> None:
        # torch.optim.Optimizer.__init__ would call add_param_group; set the members it would create instead.
        self._optimizer_step_pre_hooks: Dict[int, Callable] = OrderedDict()
        self._optimizer_step_post_hooks: Dict[int, Callable] = OrderedDict()
        self._optimizer_state_dict_pre_hooks: Dict[int, Callable] = OrderedDict()
        self._optimizer_state_dict_post_hooks: Dict[int, Callable] = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks: Dict[int, Callable] = OrderedDict()
        self._optimizer_load_state_dict_post_hooks: Dict[int, Callable] = OrderedDict()
        self._keyed_state = state
        self._keyed_param_groups = param_groups
        self._keyed_params = dict(params)
        self.defaults: Dict[str, Any] = {"_save_param_groups": False}
        known = {id(p) for p in self._keyed_params.values()}
        strangers = [k for k in state if id(k) not in known]
        if strangers:
            raise ValueError(f"KeyedOptimizer: {len(strangers)} state keys are not among the params {list(self._keyed_params)}")

    # Properties so that subclasses (fused, combined) can compute them on demand.
    @property
    def params(self) -> Mapping[str, torch.Tensor]:
        return self._keyed_params

    @property
    def state(self) -> Mapping[Any, Any]:
        return self._keyed_state

    @property
    def param_groups(self) -> Collection[Mapping[str, Any]]:
        return self._keyed_param_groups

    def _key_of(self) -> Dict[int, str]:
        return {id(param): key for key, param in self.params.items()}

    def state_dict(self) -> Dict[str, Any]:
        """{"state": {param name: {state name: tensor}}, "param_groups": [...]} (groups if save_param_groups)."""
        key_of = self._key_of()
        result: Dict[str, Any] = {"state": {key_of[id(p)]: dict(s) for p, s in self.state.items()}}
        if self.defaults.get("_save_param_groups"):
            result["param_groups"] = [
                {"params": sorted(key_of[id(p)] for p in group["params"]),
                 **{k: deepcopy(v) for k, v in group.items() if k != "params"}}
                for group in self.param_groups
            ]
        return result

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Copy saved state into this optimizer's tensors in place; names must match. As in TorchRec, the state
        must exist first (most optimizers create it on their first step): call `init_state()` before loading
        into an optimizer that has not stepped, rather than have the saved state dropped."""
        key_of = self._key_of()
        saved = state_dict["state"]
        have = {key_of[id(param)] for param in self.state}
        unheld = sorted(name for name, param_state in saved.items() if param_state and name not in have)
        if unheld:
            raise ValueError(
                f"optimizer state_dict holds state for {len(unheld)} parameter(s) this {type(self).__name__} has no "
                f"state for yet ({unheld[:5]}{' ...' if len(unheld) > 5 else ''}; it holds state for {len(have)}): its "
                "state is created on its first step. Call init_state() (or step once) before load_state_dict, as "
                "TorchRec requires; loading now would drop the saved state")
        for param, param_state in self.state.items():
            name = key_of[id(param)]
            if name not in saved:
                raise ValueError(f"optimizer state_dict has no state for parameter {name!r}; it has {sorted(saved)[:10]}")
            for state_name, value in param_state.items():
                if state_name not in saved[name]:
                    raise ValueError(f"optimizer state_dict: parameter {name!r} lacks state {state_name!r}")
                if isinstance(value, torch.Tensor):
                    self._load_state_tensor(value, saved[name][state_name], f"{name!r} {state_name!r}")
                else:
                    param_state[state_name] = deepcopy(saved[name][state_name])
        for group, saved_group in zip(self.param_groups, state_dict.get("param_groups", [])):
            for k, v in saved_group.items():
                if k != "params":
                    group[k] = deepcopy(v)
        self.post_load_state_dict()

    def _load_state_tensor(self, value: torch.Tensor, saved: Any, where: str) -> None:
        """Copy one saved state tensor into this optimizer's (the sharded fused optimizer loads ShardedTensors)."""
        with torch.no_grad():
            value.copy_(saved)

    def post_load_state_dict(self) -> None:
        """Hook for subclasses (the fused optimizer pushes lr into its kernel)."""

    def save_param_groups(self, save: bool) -> None:
        self.defaults["_save_param_groups"] = save

    def add_param_group(self, param_group: Any) -> None:
        raise NotImplementedError("KeyedOptimizer: parameter groups are fixed at construction")

    def init_state(self, sparse_grad_parameter_names: Optional[Iterable[str]] = None) -> None:
        """Materialize lazy state by stepping once with zero gradients (TorchRec's init_state: any gradient the
        parameters hold is replaced, so the step moves no weight unless the optimizer decays weights). The
        parameters named in `sparse_grad_parameter_names` (this optimizer's keys) get sparse zero gradients, for
        optimizers that take only those (torch.optim.SparseAdam); a name it has no parameter of is warned about
        (TorchRec ignores it: a model's name given to a CombinedOptimizer, whose keys carry the optimizer's key)."""
        sparse = set(sparse_grad_parameter_names or ())
        unknown = sorted(sparse - set(self.params))
        if unknown:
            warnings.warn(f"{type(self).__name__}.init_state: sparse_grad_parameter_names {unknown} name no parameter "
                          f"of this optimizer (its keys: {sorted(self.params)[:10]}); those get dense gradients, if "
                          "any: give the optimizer's own keys", stacklevel=2)
        from torch.distributed._shard.sharded_tensor import ShardedTensor

        for key, param in self.params.items():
            if param.requires_grad and not isinstance(param, ShardedTensor):  # (a sharded fused table: its own)
                grad = torch.zeros_like(param)
                param.grad = grad.to_sparse() if key in sparse else grad
        self.step()
        self.zero_grad(set_to_none=True)

    def __getstate__(self) -> Dict[str, Any]:
        return self.__dict__

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)


class KeyedOptimizerWrapper(KeyedOptimizer):
    """Wraps an ordinary torch optimizer over named parameters: KeyedOptimizerWrapper(dict(named_params), factory).

    The factory gets the parameters as a list, or (pass_params_dict=True, as TorchRec's) the name -> parameter
    mapping itself."""

    def __init__(self, params: Mapping[str, torch.Tensor], optim_factory: Callable[[Any], torch.optim.Optimizer],
                 pass_params_dict: bool = False) -> None:
        self._optimizer = optim_factory(params if pass_params_dict else list(params.values()))
        super().__init__(params, self._optimizer.state, self._optimizer.param_groups)

    @classmethod
    def from_optimizer(cls, optimizer: torch.optim.Optimizer, names: Mapping[int, str] | None = None) -> "KeyedOptimizerWrapper":
        """Wrap an existing torch optimizer; parameters are named by `names` (id -> name) or "group{i}.param{j}"."""
        params = {}
        for i, group in enumerate(optimizer.param_groups):
            for j, p in enumerate(group["params"]):
                params[(names or {}).get(id(p), f"group{i}.param{j}")] = p
        return cls(params, lambda _: optimizer)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Gradients dropped, as TorchRec's (its wrapper calls torch's zero_grad() whatever set_to_none says; here
        set_to_none=False zeroes them in place)."""
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:
        return self._optimizer.step(closure=closure)

    def set_optimizer_step(self, step: int) -> None:
        _forward(self._optimizer, "set_optimizer_step", step)

    def update_hyper_parameters(self, params_dict: Dict[str, Any]) -> None:
        _forward(self._optimizer, "update_hyper_parameters", params_dict)

    def __repr__(self) -> str:
        return repr(self._optimizer)


class OptimizerWrapper(KeyedOptimizer):
    """A KeyedOptimizer around another one, for optimizers that add a step of their own (WarmupOptimizer,
    GradientClippingOptimizer): it shares the wrapped optimizer's params, state and param_groups, and forwards
    step, zero_grad and (de)serialization to it (TorchRec's torchrec.optim.keyed.OptimizerWrapper).

        >>> w = torch.nn.Parameter(torch.ones(2))
        >>> inner = KeyedOptimizerWrapper({"w": w}, lambda params: torch.optim.SGD(params, lr=0.5))
        >>> OptimizerWrapper(inner).params is inner.params
        True
    """

    def __init__(self, optimizer: KeyedOptimizer) -> None:
        super().__init__({}, {}, [])
        self._optimizer = optimizer
        # the wrapped optimizer's own mappings (a combined optimizer computes them: then a snapshot, as TorchRec's)
        self._keyed_params = optimizer.params
        self._keyed_state = optimizer.state
        self._keyed_param_groups = optimizer.param_groups

    def __repr__(self) -> str:
        return repr(self._optimizer)

    def zero_grad(self, set_to_none: bool = False) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> None:
        self._optimizer.step(closure=closure)

    def add_param_group(self, param_group: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__}: parameter groups are fixed at construction")

    def state_dict(self) -> Dict[str, Any]:
        return self._optimizer.state_dict()

    def post_load_state_dict(self) -> None:
        self._optimizer.post_load_state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._optimizer.load_state_dict(state_dict)
        self._keyed_state = self._optimizer.state
        self._keyed_param_groups = self._optimizer.param_groups
        self.post_load_state_dict()

    def save_param_groups(self, save: bool) -> None:
        self._optimizer.save_param_groups(save)

    def set_optimizer_step(self, step: int) -> None:
        _forward(self._optimizer, "set_optimizer_step", step)

    def update_hyper_parameters(self, params_dict: Dict[str, Any]) -> None:
        _forward(self._optimizer, "update_hyper_parameters", params_dict)


class CombinedOptimizer(KeyedOptimizer):
    """Several keyed optimizers stepped as one: CombinedOptimizer([("dense", dense_opt), ("sparse", fused_opt)]).

    Plain torch optimizers are accepted too (wrapped with KeyedOptimizerWrapper.from_optimizer).
    """

    def __init__(self, optims: List[Union[KeyedOptimizer, torch.optim.Optimizer,
                                          Tuple[str, Union[KeyedOptimizer, torch.optim.Optimizer]]]]) -> None:
        self._optims: List[Tuple[str, KeyedOptimizer]] = []
        for entry in optims:
            key, opt = entry if isinstance(entry, tuple) else ("", entry)
            if not isinstance(opt, KeyedOptimizer):
                if not isinstance(opt, torch.optim.Optimizer):
                    raise TypeError(f"CombinedOptimizer: entry {key!r} is a {type(opt).__name__}, not an optimizer")
                opt = KeyedOptimizerWrapper.from_optimizer(opt)
            self._optims.append((key, opt))
        seen: Dict[str, str] = {}
        for key, opt in self._optims:
            for name in opt.params:
                full = self.prepend_opt_key(name, key)
                if full in seen:
                    raise ValueError(f"CombinedOptimizer: parameter key {full!r} appears twice; give the optimizers distinct keys")
                seen[full] = key
        super().__init__({}, {}, [])
        self.defaults = {"_save_param_groups": any(o.defaults.get("_save_param_groups") for _, o in self._optims)}

    @staticmethod
    def prepend_opt_key(name: str, opt_key: str) -> str:
        if not name:
            return opt_key
        return opt_key + ("." if opt_key else "") + name

    @property
    def optimizers(self) -> List[Tuple[str, KeyedOptimizer]]:
        return self._optims

    @property
    def params(self) -> Mapping[str, torch.Tensor]:
        return {self.prepend_opt_key(name, key): p for key, opt in getattr(self, "_optims", []) for name, p in opt.params.items()}

    @property
    def state(self) -> Mapping[Any, Any]:
        return {p: s for _, opt in getattr(self, "_optims", []) for p, s in opt.state.items()}

    @property
    def param_groups(self) -> Collection[Mapping[str, Any]]:
        return [group for _, opt in getattr(self, "_optims", []) for group in opt.param_groups]

    def step(self, closure: Any = None) -> None:
        for _, opt in self._optims:
            opt.step(closure=closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, opt in self._optims:
            opt.zero_grad(set_to_none=set_to_none)

    def set_optimizer_step(self, step: int) -> None:
        """Each optimizer that has a step count (the fused ones) starts counting from `step`, as TorchRec's."""
        for _, opt in self._optims:
            _forward(opt, "set_optimizer_step", step)

    def update_hyper_parameters(self, params_dict: Dict[str, Any]) -> None:
        for _, opt in self._optims:
            _forward(opt, "update_hyper_parameters", params_dict)

    def state_dict(self) -> Dict[str, Any]:
        result: Dict[str, Any] = {"state": {}}
        groups = []
        for key, opt in self._optims:
            sub = opt.state_dict()
            result["state"].update({self.prepend_opt_key(n, key): s for n, s in sub["state"].items()})
            for group in sub.get("param_groups", []):
                groups.append({**group, "params": [self.prepend_opt_key(n, key) for n in group["params"]]})
        if self.defaults.get("_save_param_groups"):
            result["param_groups"] = groups
        return result

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Each sub-optimizer gets the entries of its own parameters, matched by full key (not by prefix: a
        sub-optimizer keyed "" would otherwise claim every other one's entries and groups)."""
        for key, opt in self._optims:
            own = {self.prepend_opt_key(name, key): name for name in opt.params}
            sub: Dict[str, Any] = {"state": {own[n]: s for n, s in state_dict["state"].items() if n in own}}
            if "param_groups" in state_dict:
                sub["param_groups"] = [{**g, "params": [own[n] for n in g["params"]]}
                                       for g in state_dict["param_groups"] if g["params"] and g["params"][0] in own]
            try:
                opt.load_state_dict(sub)
            except ValueError as error:  # the sub-optimizer names its own keys: say whose they are
                if not key:
                    raise
                raise ValueError(f"{type(self).__name__}, optimizer {key!r} (its keys start {key + '.'!r}): "
                                 f"{error}") from error

    def save_param_groups(self, save: bool) -> None:
        self.defaults["_save_param_groups"] = save
        for _, opt in self._optims:
            opt.save_param_groups(save)

    def __repr__(self) -> str:
        return ",".join(f"{key}: {opt!r}" for key, opt in self._optims)


def _forward(optimizer: Any, method: str, argument: Any) -> None:
    """TorchRec's wrappers call `method` of the optimizers that have it (torch's own have neither
    set_optimizer_step nor update_hyper_parameters: TorchRec skips them too)."""
    if hasattr(optimizer, method):
        getattr(optimizer, method)(argument)


def in_backward_optimizer_filter(named_parameters: Iterable[Tuple[str, torch.Tensor]], include: bool = False):
    """Yield (name, param) pairs NOT updated by a fused/in-backward optimizer (or only those, with include=True)."""
    for name, param in named_parameters:
        if hasattr(param, "_in_backward_optimizers") == include:
            yield name, param
