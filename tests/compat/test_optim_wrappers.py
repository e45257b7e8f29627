"""torchrec.optim's wrappers against TorchRec 1.8 on the same model and gradients: WarmupOptimizer gives the same lr
and weights at every step for every policy (and resumes from a state_dict at the same point), GradientClippingOptimizer
the same clipped weights and total norm for every mode; CombinedOptimizer.load_state_dict with a sub-optimizer
keyed "" restores each sub-optimizer's own state and groups, as TorchRec's does."""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist

import rectoolkit.optim.warmup as ours_warmup
from rectoolkit.optim import (CombinedOptimizer, GradientClipping, GradientClippingOptimizer, KeyedOptimizerWrapper,
                              WarmupOptimizer, WarmupPolicy, WarmupStage)

torchrec_optim = pytest.importorskip("torchrec.optim", reason="differential tests need TorchRec 1.8")
pytestmark = pytest.mark.torchrec

STEPS = 14


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.nn.Parameter(torch.randn(3, 2, generator=g)), "b": torch.nn.Parameter(torch.randn(4, generator=g))}


def _grads(step):
    g = torch.Generator().manual_seed(100 + step)
    return {"a": torch.randn(3, 2, generator=g) * (step + 1), "b": torch.randn(4, generator=g)}


def _keyed(lib_wrapper, params, optimizer=torch.optim.SGD, **kwargs):
    return lib_wrapper(params, lambda p: optimizer(p, lr=0.1, **kwargs))


def _stages(lib):
    P = lib.WarmupPolicy
    return {
        "linear+poly": [lib.WarmupStage(P.LINEAR, max_iters=3, value=0.2), lib.WarmupStage(P.POLY, max_iters=8, value=2.0)],
        "constant+step": [lib.WarmupStage(P.CONSTANT, max_iters=2, value=0.5, lr_scale=2.0),
                          lib.WarmupStage(P.STEP, max_iters=9, value=0.7, decay_iters=3)],
        "invsqrt": [lib.WarmupStage(P.LINEAR, max_iters=1, value=0.1), lib.WarmupStage(P.INVSQRT, max_iters=6)],
        "cosine": [lib.WarmupStage(P.COSINE_ANNEALING_WARM_RESTARTS, max_iters=10, value=0.1, sgdr_period=4)],
        "interpolate": [lib.WarmupStage(P.INTERPOLATE, max_iters=7, value=1.0, start_interpolating_iters=2,
                                        end_value=0.25), lib.WarmupStage(P.NONE, max_iters=9)],
        "none": [],
    }


def _run(optimizer, params, steps, start=0):
    lrs, weights = [], []
    for step in range(start, start + steps):
        for name, grad in _grads(step).items():
            params[name].grad = grad.clone()
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        weights.append(torch.cat([p.detach().flatten().clone() for p in params.values()]))
    return lrs, weights


@pytest.mark.parametrize("case", sorted(_stages(ours_warmup)))
def test_warmup_follows_torchrecs_schedule_and_resumes(case):
    from torchrec.optim import warmup as theirs
    from torchrec.optim.keyed import KeyedOptimizerWrapper as TorchRecKeyed

    their_params, my_params = _params(), _params()
    their_opt = theirs.WarmupOptimizer(_keyed(TorchRecKeyed, their_params), _stages(theirs)[case], lr=0.3)
    my_opt = WarmupOptimizer(_keyed(KeyedOptimizerWrapper, my_params), _stages(ours_warmup)[case], lr=0.3)
    their_lrs, their_weights = _run(their_opt, their_params, STEPS)
    my_lrs, my_weights = _run(my_opt, my_params, STEPS)
    assert my_lrs == pytest.approx(their_lrs, rel=1e-12, abs=0)
    for mine, expected in zip(my_weights, their_weights):
        torch.testing.assert_close(mine, expected, rtol=0, atol=0)

    # save mid-schedule, load into a fresh optimizer: the same lrs from there on as TorchRec's
    saved = my_opt.state_dict()
    assert saved["state"]["__warmup"]["warmup"].tolist() == their_opt.state_dict()["state"]["__warmup"]["warmup"].tolist()
    resumed = WarmupOptimizer(_keyed(KeyedOptimizerWrapper, my_params), _stages(ours_warmup)[case], lr=0.3)
    resumed.load_state_dict(saved)
    their_more, _ = _run(their_opt, their_params, 4, start=STEPS)
    mine_more, _ = _run(resumed, my_params, 4, start=STEPS)
    assert mine_more == pytest.approx(their_more, rel=1e-12, abs=0)


def test_warmup_refuses_a_stage_that_ends_before_the_previous():
    with pytest.raises(ValueError, match=r"stage 1 \(LINEAR\) ends at max_iters=2, not after the previous stage's 3"):
        WarmupOptimizer(_keyed(KeyedOptimizerWrapper, _params()),
                        [WarmupStage(WarmupPolicy.LINEAR, max_iters=3), WarmupStage(WarmupPolicy.LINEAR, max_iters=2)])


CLIPPING = [("NORM", 2.0, False), ("NORM", "inf", False), ("NORM", 1.0, False), ("VALUE", 2.0, True),
            ("NONE", 2.0, True), ("VALUE", 2.0, False)]


@pytest.mark.parametrize("mode,norm_type,track", CLIPPING)
def test_clipping_matches_torchrecs(mode, norm_type, track):
    from torchrec.optim import clipping as theirs
    from torchrec.optim.keyed import KeyedOptimizerWrapper as TorchRecKeyed

    their_params, my_params = _params(), _params()
    their_opt = theirs.GradientClippingOptimizer(_keyed(TorchRecKeyed, their_params, torch.optim.Adagrad),
                                                 theirs.GradientClipping[mode], max_gradient=1.5, norm_type=norm_type,
                                                 track_grad_norm=track)
    my_opt = GradientClippingOptimizer(_keyed(KeyedOptimizerWrapper, my_params, torch.optim.Adagrad),
                                       GradientClipping[mode], max_gradient=1.5, norm_type=norm_type,
                                       track_grad_norm=track)
    for step in range(5):
        for params in (their_params, my_params):
            for name, grad in _grads(step).items():
                params[name].grad = grad.clone()
        their_opt.step()
        my_opt.step()
        for name in my_params:
            torch.testing.assert_close(my_params[name].grad, their_params[name].grad)
            torch.testing.assert_close(my_params[name].detach(), their_params[name].detach())
        if their_opt.last_total_grad_norm is None:
            assert my_opt.last_total_grad_norm is None
        else:
            torch.testing.assert_close(my_opt.last_total_grad_norm, their_opt.last_total_grad_norm)


def test_global_clipping_over_a_process_group_matches_torchrecs(tmp_path):
    from torchrec.optim import clipping as theirs
    from torchrec.optim.keyed import KeyedOptimizerWrapper as TorchRecKeyed

    started_here = not dist.is_initialized()
    if started_here:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp_path, 'rendezvous')}", rank=0,
                                world_size=1, timeout=datetime.timedelta(seconds=60))
    try:
        pg = dist.new_group([0])
        their_params, my_params = _params(), _params()
        opts = []
        for lib_opt, lib_keyed, params, clip in (
                (theirs.GradientClippingOptimizer, TorchRecKeyed, their_params, theirs.GradientClipping.NORM),
                (GradientClippingOptimizer, KeyedOptimizerWrapper, my_params, GradientClipping.NORM)):
            opts.append(lib_opt(_keyed(lib_keyed, params), clip, max_gradient=0.5, enable_global_grad_clip=True,
                                param_to_pgs={params["a"]: [pg]}))
        for params in (their_params, my_params):
            for name, grad in _grads(3).items():
                params[name].grad = grad.clone()
        for opt in opts:
            opt.step()
        torch.testing.assert_close(opts[1].last_total_grad_norm, opts[0].last_total_grad_norm)
        for name in my_params:
            torch.testing.assert_close(my_params[name].detach(), their_params[name].detach())
    finally:
        if started_here:
            dist.destroy_process_group()


def test_combined_load_state_dict_with_an_empty_key():
    from torchrec.optim.keyed import CombinedOptimizer as TorchRecCombined, KeyedOptimizerWrapper as TorchRecKeyed

    def build(combined, keyed, lr_dense):
        torch.manual_seed(0)
        params = {"w": torch.nn.Parameter(torch.randn(3)), "v": torch.nn.Parameter(torch.randn(2))}
        unnamed = keyed({"w": params["w"]}, lambda p: torch.optim.Adagrad(p, lr=0.1))
        dense = keyed({"v": params["v"]}, lambda p: torch.optim.Adam(p, lr=lr_dense))
        opt = combined([("dense", dense), ("", unnamed)])  # the "" optimizer last: a prefix match takes dense's group
        opt.save_param_groups(True)
        return opt, params

    results = []
    for combined, keyed in ((TorchRecCombined, TorchRecKeyed), (CombinedOptimizer, KeyedOptimizerWrapper)):
        source, params = build(combined, keyed, lr_dense=0.5)
        for p in params.values():
            p.grad = torch.ones_like(p)
        source.step()
        target, _ = build(combined, keyed, lr_dense=0.01)
        for p in target.params.values():
            p.grad = torch.zeros_like(p)
        target.step()  # state exists before loading, as TorchRec requires
        target.load_state_dict(source.state_dict())
        results.append(target)
    theirs, mine = results
    assert [g["lr"] for g in mine.param_groups] == [g["lr"] for g in theirs.param_groups] == [0.5, 0.1]
    their_state, my_state = theirs.state_dict()["state"], mine.state_dict()["state"]
    assert sorted(my_state) == sorted(their_state) == ["dense.v", "w"]
    for key in their_state:
        for name, value in their_state[key].items():
            torch.testing.assert_close(my_state[key][name], value)


@pytest.mark.parametrize("optimizer, kwargs", [(torch.optim.Adam, {}), (torch.optim.SGD, {"momentum": 0.9})])
def test_load_state_dict_needs_the_state_first_and_init_state_moves_no_weight(optimizer, kwargs):
    """As in TorchRec: a KeyedOptimizer that has not stepped holds no state, so loading a saved state into it raises
    (rather than dropping the saved state, which a plain copy into existing tensors would); init_state() creates
    it with a zero-gradient step, whatever gradients the parameters held, and the load then restores it."""
    results = {}
    for lib, wrapper in [("ours", KeyedOptimizerWrapper), ("torchrec", torchrec_optim.KeyedOptimizerWrapper)]:
        trained = _params()
        source = _keyed(wrapper, trained, optimizer, **kwargs)
        for step in range(3):
            for name, grad in _grads(step).items():
                trained[name].grad = grad
            source.step()
        saved = source.state_dict()
        fresh = _params(seed=1)
        target = _keyed(wrapper, fresh, optimizer, **kwargs)
        with pytest.raises(ValueError):
            target.load_state_dict(saved)
        for name, grad in _grads(7).items():
            fresh[name].grad = grad  # a gradient left from elsewhere: init_state must not apply it
        before = {name: p.detach().clone() for name, p in fresh.items()}
        target.init_state()
        assert all(torch.equal(before[name], p) for name, p in fresh.items()), f"{lib}: init_state moved a weight"
        target.load_state_dict(saved)
        results[lib] = target.state_dict()["state"]
        assert {name: sorted(state) for name, state in results[lib].items()} == {
            name: sorted(state) for name, state in saved["state"].items()}
        for name, state in saved["state"].items():
            for key, value in state.items():
                assert torch.equal(torch.as_tensor(results[lib][name][key]), torch.as_tensor(value)), (lib, name, key)
