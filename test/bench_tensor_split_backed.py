"""What tensor_split into 64 sections over a backed dynamic size costs to compile and to call
(symfix 0036 runs its Python kernel only where a size is unbacked; elsewhere the C++ kernel
runs, as on stock).

    python test/bench_tensor_split_backed.py

Prints ONE JSON object: per backend (aot_eager, inductor), the median of 3 compiles (s, no FX
graph or AOTAutograd cache) and of the compiled call (µs, the fastest of 5 runs of 200 calls).
"""

import json
import statistics
import time

import torch
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config


def step(x):
    return [t * (i + 1) for i, t in enumerate(torch.tensor_split(x, 64))]


def measure(backend):
    compiles = []
    for _ in range(3):
        torch._dynamo.reset()
        compiled = torch.compile(step, backend=backend, dynamic=True)
        with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(
            enable_autograd_cache=False
        ):
            start = time.perf_counter()
            compiled(torch.randn(1000, 8))
            compiles.append(time.perf_counter() - start)
    x = torch.randn(1003, 8)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(200):
            compiled(x)
        best = min(best, (time.perf_counter() - start) / 200)
    return {"compile_s": statistics.median(compiles), "call_us": best * 1e6}


if __name__ == "__main__":
    print(json.dumps({backend: measure(backend) for backend in ("aot_eager", "inductor")}))
