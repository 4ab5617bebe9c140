"""Steps for `symfix audit --replay` (test/tools/test_symfix_audit.py): the captured graph run
at other sizes and in other modes against eager.

Each ``*_target`` returns ``(fn, args)``; ``mark_unbacked`` marks say which sizes are unbacked.
"""

import torch
import torch.nn.functional as F
from torch._dynamo.decorators import mark_unbacked

B, D, V = 2, 8, 16


def pad_channels_last_target():
    """F.pad of a channels-last batch, then .contiguous(): on stock 2.13.0 the capture (with
    the fixes that let it trace) takes the padded tensor for contiguous and drops the
    .contiguous(); the graph returns channels-last strides where eager's are contiguous
    (symfix 0031 prims-channels-last-unbacked-batch)."""
    x = torch.randn(B, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    mark_unbacked(x, 0, hint_override=B)  # min 0: the batch may be empty

    def step(x):
        y = F.pad(x, (1, 1), value=0.5)
        return y.contiguous() * 2

    return step, (x,)


def select_inductor_target():
    """Column 5 of a batch of rows whose width is unbacked, compiled by Inductor: where a row
    is 5 wide or less eager raises IndexError; on stock 2.13.0 Inductor's code never runs the
    select's range check (a runtime assert over the input's size) and reads past the row
    (symfix 0093 inductor-input-size-runtime-asserts)."""
    x = torch.randn(3, 8)
    mark_unbacked(x, 1, hint_override=8, min=1)

    def step(x):
        return x[:, 5] * 2

    return step, (x,)


def clean_target():
    """Embedding, a linear layer, a loss over unbacked batch and sequence (weights that need
    grad): the same results as eager at every size and in every mode."""
    tokens = torch.randint(0, V, (2, B, 4))  # token ids and labels
    mark_unbacked(tokens, 1, hint_override=B, min=1)
    mark_unbacked(tokens, 2, hint_override=4, min=1)
    w = torch.randn(V, D, requires_grad=True)

    def step(tokens, w):
        logits = F.embedding(tokens[0], w) @ w.t()
        return F.cross_entropy(logits.reshape(-1, V), tokens[1].reshape(-1))

    return step, (tokens, w)


def diagonal_inductor_target():
    """The diagonal above the main one of a square whose side is unbacked, compiled by Inductor
    as a graph trainer compiles its step: on stock 2.13.0 Inductor's code returns it empty at
    every size (evaluate_min's GCD shortcut took its length for 0; symfix 0024
    inductor-diagonal-unbacked-length)."""
    x = torch.randn(5, 5)
    mark_unbacked(x, 0, hint_override=5, shape_id="side")
    mark_unbacked(x, 1, hint_override=5, shape_id="side")

    def step(x):
        torch._check(x.size(0) == x.size(1))
        return torch.diagonal(x, 1) * 2

    return step, (x,)


def training_step_target(warm: bool = True):
    """A training step of a model and its optimizer (SGD with momentum), passed as arguments:
    the padded channels-last batch of pad_channels_last_target feeds a linear layer; the step
    returns the loss and the features.  On stock 2.13.0 the graph drops the .contiguous() and
    its flatten raises where eager's runs (symfix 0031).  ``warm``: the optimizer's state
    exists before the capture (one eager step), as a trainer makes it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3 * 4 * 7, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(B, 3, 4, 5).contiguous(memory_format=torch.channels_last)

    def step(model, opt, x):
        y = F.pad(x, (1, 1), value=0.5).contiguous() * 2
        loss = model(y.flatten(1)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach(), y

    if warm:
        step(model, opt, x)
    mark_unbacked(x, 0, hint_override=B)
    return step, (model, opt, x)


def cold_optimizer_target():
    """training_step_target captured before the optimizer's first step: the momentum buffers
    the step creates are values of the graph that no input holds, so a replay keeps none."""
    return training_step_target(warm=False)


def parameter_data_target():
    """A step that replaces a parameter's .data: make_fx records no op for it, so the graph
    leaves the parameter as it was where eager doubles it (the step's output too, but at
    the empty batch)."""
    model = torch.nn.Linear(D, V)
    x = torch.randn(B, D)
    mark_unbacked(x, 0, hint_override=B, min=1)

    def step(model, x):
        model.weight.data = model.weight.data * 2
        return model(x).sum()

    return step, (model, x)


def _accumulating_step(model, opt, x, sched=None):
    loss = model(x).square().mean()
    loss.backward()  # no zero_grad: grads accumulate from step to step
    opt.step()
    if sched is not None:
        sched.step()
    return loss.detach()


def accumulation_target(sched: bool = False):
    """A training step that keeps its grads (no zero_grad) with Adam's foreach update (lists of
    tensors updated in place), its state and grads made by one eager step first."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(D, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=True)
    x = torch.randn(B, D)
    args = (model, opt, x, torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)) if sched else (
        model, opt, x)
    _accumulating_step(*args)
    mark_unbacked(x, 0, hint_override=B)
    return _accumulating_step, args


def scheduler_target():
    """accumulation_target with a scheduler that halves the lr each step: the graph holds the
    lr of its trace (a float), so its optimizer's lr stays where eager's halves."""
    return accumulation_target(sched=True)


def trainer_object_target():
    """The model and optimizer as attributes of a trainer object: refused (the audit lifts the
    state of the modules and optimizers the arguments hold)."""
    class Trainer:
        def __init__(self):
            self.model = torch.nn.Linear(D, V)
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    x = torch.randn(B, D)
    mark_unbacked(x, 0, hint_override=B)
    return (lambda trainer, x: trainer.model(x).sum()), (Trainer(), x)
