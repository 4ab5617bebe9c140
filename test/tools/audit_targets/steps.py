"""Small graph-trainer steps for `symfix audit` (test/tools/test_symfix_audit.py).

Each ``*_target`` returns ``(fn, args)``; ``mark_unbacked`` marks say which sizes are unbacked.
"""

import torch
import torch.nn.functional as F
from torch._dynamo.decorators import mark_unbacked

B, S, H, D, V = 2, 8, 2, 16, 32


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _tokens(hint_b=B, hint_s=S):
    tokens = torch.randint(0, V, (2, hint_b, hint_s))  # token ids and labels
    mark_unbacked(tokens, 1, hint_override=hint_b, min=1)
    mark_unbacked(tokens, 2, hint_override=hint_s, min=1)
    return tokens


def clean_target():
    """A linear layer and a loss over unbacked batch and sequence: traces clean on 2.13.0."""
    w = torch.randn(V, D)

    def step(tokens, w):
        x = F.embedding(tokens[0], w)
        logits = x @ w.t()
        return F.cross_entropy(logits.reshape(-1, V), tokens[1].reshape(-1))

    return step, (_tokens(), w)


def nested_make_fx_target():
    """A step that traces a part of itself again with make_fx (a graph pass inside the step),
    over several inputs that share an unbacked batch (shape_id)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    a, b = torch.randn(B, D), torch.randn(B, D)
    for t in (a, b):
        mark_unbacked(t, 0, hint_override=B, shape_id="batch", min=1)

    def part(x, y):
        n = x.shape[0]
        return (x + y).view(n * D).sum() / n

    def step(x, y):
        inner = make_fx(part, record_module_stack=False)(x, y)
        return inner(x, y)

    return step, (a, b)


def _flex_hop(q, k, v, block_mask_tuple):
    from torch._higher_order_ops.flex_attention import flex_attention as flex_hop
    from torch.nn.attention.flex_attention import _identity

    opts = {"OUTPUT_LOGSUMEXP": True, "OUTPUT_MAX": False}
    return flex_hop(q, k, v, _identity, block_mask_tuple, (D // H) ** -0.5, opts)[0]


def _flex_train(q, k, v, block_mask):
    # The public flex_attention refuses backward on CPU; its compiled HOP entry does not.
    return torch.compile(_flex_hop, backend="eager", fullgraph=True)(
        q, k, v, block_mask.as_tuple())


def flex_step_target():
    """A training step: embedding, flex attention with an in-graph causal block mask, loss over
    unbacked batch and sequence, gradients."""
    from torch.nn.attention.flex_attention import create_block_mask

    w = {"embed": torch.randn(V, D), "wqkv": torch.randn(3 * D, D) / D ** 0.5,
         "head": torch.randn(V, D) / D ** 0.5}

    def step(tokens, embed, wqkv, head):
        params = [p.requires_grad_() for p in (embed, wqkv, head)]
        b, s = tokens.shape[1:]
        x = F.embedding(tokens[0], params[0])
        qkv = (x @ params[1].t()).view(b, s, 3, H, D // H).permute(2, 0, 3, 1, 4)
        bm = create_block_mask(causal, None, None, s, s, device="cpu")
        o = _flex_train(qkv[0], qkv[1], qkv[2], bm).transpose(1, 2).reshape(b, s, D)
        loss = F.cross_entropy((o @ params[2].t()).reshape(-1, V), tokens[1].reshape(-1))
        return [loss, *torch.autograd.grad(loss, params)]

    return step, (_tokens(), w["embed"], w["wqkv"], w["head"])


def not_a_pair():
    return 42


def specialized_target():
    """The step pins its unbacked batch to the hint: the size is a constant in the graph."""
    x = torch.randn(8, D)
    mark_unbacked(x, 0, hint_override=8)

    def step(x):
        torch._check(x.shape[0] == 8)
        return x.sum(0)

    return step, (x,)


def user_branch_target():
    """The step branches on its unbacked batch: a data-dependent error no fix can remove."""
    x = torch.randn(B, D)
    mark_unbacked(x, 0, hint_override=B, min=1)

    def step(x):
        if x.shape[0] > 4:
            return x.sum()
        return x.mean()

    return step, (x,)


def flex_eager_loss_target():
    """Public flex_attention called as it is (no torch.compile), in-graph causal block mask, a
    loss over unbacked batch and sequence; no backward (CPU flex has none in eager)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    w = {"embed": torch.randn(V, D), "wqkv": torch.randn(3 * D, D) / D ** 0.5,
         "head": torch.randn(V, D) / D ** 0.5}

    def step(tokens, embed, wqkv, head):
        b, s = tokens.shape[1:]
        x = F.embedding(tokens[0], embed)
        qkv = (x @ wqkv.t()).view(b, s, 3, H, D // H).permute(2, 0, 3, 1, 4)
        bm = create_block_mask(causal, None, None, s, s, device="cpu")
        o = flex_attention(qkv[0], qkv[1], qkv[2], block_mask=bm)
        o = o.transpose(1, 2).reshape(b, s, D)
        return F.cross_entropy((o @ head.t()).reshape(-1, V), tokens[1].reshape(-1))

    return step, (_tokens(), w["embed"], w["wqkv"], w["head"])
