"""Benchmark of the symfix acceptance workload (see test_graph_trainer_unbacked.py).

    python test/distributed/bench_graph_trainer.py [--attn flex|sdpa] [--repeats 3]
        [--steps 5] [--world 1] [--static-only] [--beyond-upstream]

Prints ONE JSON object (medians over ``--repeats``):
  trace_unbacked_s          make_fx capture of the one unbacked-batch/seq train step
  static_recompiles_total_s one static-shape capture per shape, summed over the K shapes
  step_unbacked_s           per-step run time of the unbacked graph (at ``step_shape``)
  step_static_s             per-step run time of the static graph captured for that shape
By default the upstream-compatible model runs (constant one-block BlockMask, S <= 128;
data-parallel loss), which 2.14.1 can capture too; ``--beyond-upstream`` runs the form that
needs symfix's own fixes (BlockMask built in the graph with create_block_mask, output layers
and loss on Shard(1) sequence-sharded activations).
With ``--world 1`` (default, cheapest) the process runs alone in a 1-rank gloo group,
so DTensor's collectives are no-ops (and with ``--beyond-upstream`` the output layers'
Shard(1) sequence sharding is plain Replicate); ``--world 2`` spawns 2 ranks and reports
rank 0.
On a torch that cannot capture the unbacked step (stock 2.13.0; 2.14.1 with
``--beyond-upstream``) the object carries "error" (the failing layer) and the exit code is 1.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _graph_trainer_model as M  # noqa: E402

SHAPES = [(1, 1), (1, 5), (2, 16), (3, 7), (3, 16)]
STEP_SHAPE = (2, 16)
HINT = (4, 8)


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def _step_time(cap, state, batch, steps):
    cap.run(*state, batch)  # warm-up
    times = []
    for _ in range(steps):
        times.append(_timed(lambda: cap.run(*state, batch))[1])
    return statistics.median(times)


def _bench(rank, world, port, args, out_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if world > 1:
        torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (world,))
    res = {
        "torch": torch.__version__,
        "attn": args.attn,
        "beyond_upstream": args.beyond_upstream,
        "world": world,
        "shapes": [list(s) for s in SHAPES],
        "step_shape": list(STEP_SHAPE),
        "repeats": args.repeats,
        "steps": args.steps,
    }
    samples = {k: [] for k in ("trace_unbacked_s", "static_recompiles_total_s", "step_unbacked_s", "step_static_s")}
    try:
        step_batch = M.make_batch(*STEP_SHAPE, seed=rank)
        for _ in range(args.repeats):
            state = M.sharded_state(mesh)
            if not args.static_only:
                torch._dynamo.reset()
                cap, t = _timed(lambda state=state: M.capture(
                    *state, M.make_batch(*HINT, seed=0), attn=args.attn, hint=HINT,
                    beyond_upstream=args.beyond_upstream))
                samples["trace_unbacked_s"].append(t)
                samples["step_unbacked_s"].append(_step_time(cap, state, step_batch, args.steps))

            total, static_cap = 0.0, None
            for shape in SHAPES:
                torch._dynamo.reset()
                c, t = _timed(lambda state=state, shape=shape: M.capture(
                    *state, M.make_batch(*shape, seed=0), attn=args.attn, unbacked=False,
                    beyond_upstream=args.beyond_upstream))
                total += t
                if tuple(shape) == STEP_SHAPE:
                    static_cap = c
            if static_cap is None:
                torch._dynamo.reset()
                static_cap = M.capture(*state, step_batch, attn=args.attn, unbacked=False,
                                       beyond_upstream=args.beyond_upstream)
            samples["static_recompiles_total_s"].append(total)
            samples["step_static_s"].append(_step_time(static_cap, state, step_batch, args.steps))
        for k, v in samples.items():
            res[k] = statistics.median(v) if v else None
        if not args.static_only:
            res["speedup_trace_vs_static_recompiles"] = (
                res["static_recompiles_total_s"] / res["trace_unbacked_s"]
            )
            res["step_overhead_unbacked_vs_static"] = res["step_unbacked_s"] / res["step_static_s"]
    except M.StageError as e:
        res["error"] = f"layer '{e.stage}': {type(e.exc).__name__}: {str(e.exc)[:300]}"
        res.update({k: (statistics.median(v) if v else None) for k, v in samples.items()})
    finally:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--attn", choices=("flex", "sdpa"), default="flex")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--static-only", action="store_true",
                   help="only the static-shape captures (what a torch without the fixes can do)")
    p.add_argument("--beyond-upstream", action="store_true",
                   help="in-graph create_block_mask and sequence-sharded loss "
                        "(needs symfix 0008/0009/0010; fails on 2.14.1)")
    args = p.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out_path = os.path.join(d, "bench.json")
        port = M._free_port()
        if args.world == 1:
            _bench(0, 1, port, args, out_path)
        else:
            mp.start_processes(
                _bench, args=(args.world, port, args, out_path), nprocs=args.world,
                join=True, start_method="spawn",
            )
        with open(out_path) as f:
            res = json.load(f)
    print(json.dumps(res, sort_keys=True))
    return 1 if "error" in res else 0


if __name__ == "__main__":
    sys.exit(main())
