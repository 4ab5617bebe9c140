"""Benchmark of the symfix acceptance workload (see test_graph_trainer_unbacked.py).

    python test/distributed/bench_graph_trainer.py [--attn flex|sdpa] [--repeats 3]
        [--steps 40] [--world 1] [--static-only] [--beyond-upstream] [--size 1]
        [--large-size 8] [--no-runtime-asserts]

Prints ONE JSON object (medians over ``--repeats``):
  trace_unbacked_s          make_fx capture of the one unbacked-batch/seq train step
  static_recompiles_total_s one static-shape capture per shape, summed over the K shapes
  step_unbacked_s           per-step run time of the unbacked graph (at ``step_shape``)
  step_static_s             per-step run time of the static graph captured for that shape
The two graphs' steps are timed interleaved (unbacked, static, static, unbacked, ...), so
that load from other processes hits both alike.  Both graphs get the ShapeEnv's deferred
runtime asserts (insert_deferred_runtime_asserts, as a graph trainer does before running
a graph whose sizes are unbacked; ``--no-runtime-asserts``: the graphs as make_fx left
them).  What the unbacked graph costs per step beyond the static one:
  assert_nodes, assert_nodes_static    _assert_scalar / sym_constrain_range* nodes
  sym_size_nodes, sym_size_nodes_static  aten.sym_size.int nodes
  sym_arith_nodes, sym_arith_nodes_static  Python operator nodes on SymInts (mul, ge, ...)
  fixed_cost_us             per-step time of those nodes, unbacked minus static, measured
                            in place (perf_counter around each node of an FX Interpreter
                            run, medians over runs); fixed_cost_by_kind_us splits it
  assert_cost_us            per-step time of the unbacked graph's _assert_scalar nodes
  bookkeeping_us, bookkeeping_static_us  per-step time of all those nodes in each graph
  step_unbacked_cpu_s, step_static_cpu_s, step_overhead_unbacked_vs_static_cpu
                            the step figures in process CPU time (time.process_time):
                            steadier than wall time on a machine shared with other jobs
  step_unbacked_large_s, step_static_large_s, step_overhead_unbacked_vs_static_large (and _cpu)
                            the same step ratio with the model ``--large-size`` times as
                            wide at ``large_step_shape`` (a step of 50 ms or more;
                            ``--large-size 0`` skips it), one run of ``--steps // 2``
                            steps; its ratios are the median of the ratios of the two
                            graphs' k-th steps, which ran one after the other
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
import operator
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
LARGE_STEP_SHAPE = (4, 128)
HINT = (4, 8)


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def _step_samples(caps, state, batch, steps):
    """Each captured graph's per-step (wall, CPU) seconds, the graphs run interleaved."""
    for cap in caps:
        cap.run(*state, batch)  # warm-up
    wall, cpu = [[] for _ in caps], [[] for _ in caps]
    order = list(range(len(caps)))
    for _ in range(steps):
        for i in order:
            c = time.process_time()
            wall[i].append(_timed(lambda cap=caps[i]: cap.run(*state, batch))[1])
            cpu[i].append(time.process_time() - c)
        order.reverse()
    return list(zip(wall, cpu))


def _step_times(caps, state, batch, steps):
    """Median per-step (wall, CPU) seconds of each captured graph, the graphs run interleaved."""
    return [(statistics.median(w), statistics.median(c))
            for w, c in _step_samples(caps, state, batch, steps)]


def _paired_ratio(a, b):
    # the median of the ratios of the two graphs' k-th steps, run one after the other: a slow
    # spell of the machine slows both steps of a pair, where it would tip one graph's median
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def add_runtime_asserts(cap):
    """The ShapeEnv's deferred runtime asserts (value ranges, torch._check) as graph nodes."""
    from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

    with M.stage("insert_deferred_runtime_asserts"):
        insert_deferred_runtime_asserts(cap.gm, cap.fake_mode.shape_env, "graph trainer step")
        cap.gm.recompile()
    return cap


def node_kind(node):
    """The kind of a call_function node whose cost is shape bookkeeping, else None."""
    t = node.target
    if t in (torch.ops.aten._assert_scalar.default, torch.ops.aten.sym_constrain_range.default,
             torch.ops.aten.sym_constrain_range_for_size.default):
        return "assert"
    if t is torch.ops.aten.sym_size.int:
        return "sym_size"
    if getattr(t, "__module__", None) in ("_operator", "operator") or t in (
            torch.sym_float, torch.sym_int, torch.sym_max, torch.sym_min, torch.sym_not):
        return "sym_arith"
    return None


def count_node_kinds(gm):
    counts = {"assert": 0, "sym_size": 0, "sym_arith": 0}
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is not operator.getitem:
            kind = node_kind(n)
            if kind:
                counts[kind] += 1
    return counts


class _TimedInterpreter(torch.fx.Interpreter):
    """Runs the graph node by node and adds each bookkeeping node's time to its kind."""

    def __init__(self, gm):
        super().__init__(gm)
        self.kind = {n.name: node_kind(n) for n in gm.graph.nodes if n.op == "call_function"
                     and n.target is not operator.getitem}
        self.spent = {}

    def run_node(self, n):
        self.current = self.kind.get(n.name)
        return super().run_node(n)

    def call_function(self, target, args, kwargs):
        if self.current is None:
            return target(*args, **kwargs)
        t = time.perf_counter()  # the node's own call, without the Interpreter's overhead
        out = target(*args, **kwargs)
        self.spent[self.current] = self.spent.get(self.current, 0.0) + time.perf_counter() - t
        return out


def node_kind_times(cap, state, batch, runs):
    """Median per-step seconds spent in each kind of bookkeeping node."""
    params, momentum = state
    samples = {}
    for _ in range(runs):
        flat = [params[n]._local_tensor for n in cap.names]
        flat += [momentum[n]._local_tensor for n in cap.names]
        interp = _TimedInterpreter(cap.gm)
        with torch.no_grad():
            interp.run(*flat, batch)
        for kind in ("assert", "sym_size", "sym_arith"):
            samples.setdefault(kind, []).append(interp.spent.get(kind, 0.0))
    return {k: statistics.median(v) for k, v in samples.items()}


def _capture(state, args, batch, unbacked):
    torch._dynamo.reset()
    cap = M.capture(*state, batch, attn=args.attn, unbacked=unbacked,
                    hint=HINT if unbacked else None, beyond_upstream=args.beyond_upstream)
    return add_runtime_asserts(cap) if args.runtime_asserts else cap


def _large(mesh, rank, args, res):
    """Step ratio with a model ``args.large_size`` times as wide."""
    M.scale_model(args.large_size)
    try:
        state = M.sharded_state(mesh)
        batch = M.make_batch(*LARGE_STEP_SHAPE, seed=rank)
        caps = [_capture(state, args, M.make_batch(*HINT, seed=0), True),
                _capture(state, args, batch, False)]
        (u, uc), (st, sc) = _step_samples(caps, state, batch, max(10, args.steps // 2))
    finally:
        M.scale_model(args.size)
    med = statistics.median
    res.update(large_size=args.large_size, large_step_shape=list(LARGE_STEP_SHAPE),
               step_unbacked_large_s=med(u), step_static_large_s=med(st),
               step_overhead_unbacked_vs_static_large=_paired_ratio(u, st),
               step_unbacked_large_cpu_s=med(uc), step_static_large_cpu_s=med(sc),
               step_overhead_unbacked_vs_static_large_cpu=_paired_ratio(uc, sc))


def _bench(rank, world, args, out_path):
    if world > 1 or args.threads:
        torch.set_num_threads(args.threads or 1)
    M.init_gloo(rank, world, out_path + ".store")
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
        "size": args.size,
        "threads": torch.get_num_threads(),
        "runtime_asserts": args.runtime_asserts,
    }
    samples = {k: [] for k in ("trace_unbacked_s", "static_recompiles_total_s", "step_unbacked_s",
                               "step_static_s", "step_unbacked_cpu_s", "step_static_cpu_s")}
    try:
        M.scale_model(args.size)
        step_batch = M.make_batch(*STEP_SHAPE, seed=rank)
        for _ in range(args.repeats):
            state = M.sharded_state(mesh)
            cap = None
            if not args.static_only:
                cap, t = _timed(lambda state=state: _capture(
                    state, args, M.make_batch(*HINT, seed=0), True))
                samples["trace_unbacked_s"].append(t)

            total, static_cap = 0.0, None
            for shape in SHAPES:
                c, t = _timed(lambda state=state, shape=shape: _capture(
                    state, args, M.make_batch(*shape, seed=0), False))
                total += t
                if tuple(shape) == STEP_SHAPE:
                    static_cap = c
            if static_cap is None:
                static_cap = _capture(state, args, step_batch, False)
            samples["static_recompiles_total_s"].append(total)
            caps = [static_cap] if cap is None else [cap, static_cap]
            times = _step_times(caps, state, step_batch, args.steps)
            samples["step_static_s"].append(times[-1][0])
            samples["step_static_cpu_s"].append(times[-1][1])
            if cap is not None:
                samples["step_unbacked_s"].append(times[0][0])
                samples["step_unbacked_cpu_s"].append(times[0][1])
        for k, v in samples.items():
            res[k] = statistics.median(v) if v else None
        for k, v in count_node_kinds(static_cap.gm).items():
            res[f"{k}_nodes_static"] = v
        if not args.static_only:
            for k, v in count_node_kinds(cap.gm).items():
                res[f"{k}_nodes"] = v
            tu = node_kind_times(cap, state, step_batch, args.steps)
            ts = node_kind_times(static_cap, state, step_batch, args.steps)
            res["fixed_cost_by_kind_us"] = {k: (tu[k] - ts[k]) * 1e6 for k in tu}
            res["fixed_cost_us"] = sum(res["fixed_cost_by_kind_us"].values())
            res["assert_cost_us"] = tu["assert"] * 1e6
            res["bookkeeping_us"] = sum(tu.values()) * 1e6
            res["bookkeeping_static_us"] = sum(ts.values()) * 1e6
            res["speedup_trace_vs_static_recompiles"] = (
                res["static_recompiles_total_s"] / res["trace_unbacked_s"]
            )
            res["step_overhead_unbacked_vs_static"] = res["step_unbacked_s"] / res["step_static_s"]
            res["step_overhead_unbacked_vs_static_cpu"] = (
                res["step_unbacked_cpu_s"] / res["step_static_cpu_s"])
            if args.large_size:
                _large(mesh, rank, args, res)
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
    p.add_argument("--steps", type=int, default=40,
                   help="timed steps per graph and repeat (the graphs interleaved)")
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--static-only", action="store_true",
                   help="only the static-shape captures (what a torch without the fixes can do)")
    p.add_argument("--beyond-upstream", action="store_true",
                   help="in-graph create_block_mask and sequence-sharded loss "
                        "(needs symfix 0008/0009/0010; fails on 2.14.1)")
    p.add_argument("--size", type=int, default=1,
                   help="model width multiplier (1: the tiny acceptance model)")
    p.add_argument("--large-size", type=int, default=8,
                   help="width multiplier of the large-model step ratio (0: skip it)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (default 1: a shared machine's load then "
                        "slows both graphs alike; 0: torch's default)")
    p.add_argument("--no-runtime-asserts", dest="runtime_asserts", action="store_false",
                   help="run the graphs without insert_deferred_runtime_asserts")
    args = p.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out_path = os.path.join(d, "bench.json")
        if args.world == 1:
            _bench(0, 1, args, out_path)
        else:
            mp.start_processes(
                _bench, args=(args.world, args, out_path), nprocs=args.world,
                join=True, start_method="spawn",
            )
        with open(out_path) as f:
            res = json.load(f)
    print(json.dumps(res, sort_keys=True))
    return 1 if "error" in res else 0


if __name__ == "__main__":
    sys.exit(main())
