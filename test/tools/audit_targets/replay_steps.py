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


def module_argument_target():
    """A step that takes its model as an argument: refused by --replay (its parameters would be
    constants of the graph); pass them as tensors instead."""
    model = torch.nn.Linear(D, V)
    x = torch.randn(B, D)
    mark_unbacked(x, 0, hint_override=B, min=1)
    return (lambda model, x: model(x).sum()), (model, x)
