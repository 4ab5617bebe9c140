"""What SDPA costs per call under a no-op TorchDispatchMode (as under DTensor,
FlopCounter or selective activation checkpointing), on CPU, 1x1x4x8 inputs.

    python test/bench_sdpa_dispatch_mode.py

Prints ONE JSON object, microseconds per call (the fastest of 7 runs of 2000 calls):
  plain_us           in a process that has traced nothing
  after_trace_us     the same, once a step over an unbacked sequence length has been compiled
                     (symfix 0013's Python SDPA kernel is registered while a FakeTensorMode
                     with a ShapeEnv is entered, as it is during such a trace)
"""

import json
import time

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode


class NoOp(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def per_call_us(q, calls=2000, runs=7):
    best = float("inf")
    with NoOp():
        for _ in range(runs):
            start = time.perf_counter()
            for _ in range(calls):
                F.scaled_dot_product_attention(q, q, q)
            best = min(best, time.perf_counter() - start)
    return best / calls * 1e6


if __name__ == "__main__":
    torch.manual_seed(0)
    q = torch.randn(1, 1, 4, 8)
    per_call_us(q, calls=200, runs=1)  # warm up
    plain = per_call_us(q)
    traced = q.clone()
    torch._dynamo.decorators.mark_unbacked(traced, 2)
    torch.compile(lambda t: (t * 2).sum(-2), backend="aot_eager", fullgraph=True)(traced)
    print(json.dumps({"plain_us": plain, "after_trace_us": per_call_us(q)}))
