# Owner(s): ["oncall: distributed"]
"""OpInfo ops as DTensors with unbacked sizes: upstream's scoreboard of what a graph trainer's step
is made of, run on every base symfix carries.

Each op's first sample whose tensors have a size >= 2, converted to DTensors on a fake process
group of 2 ranks (DTensorConverter's first and last sharding choices: all replicated, then each
tensor sharded on its last evenly shardable dim), every size >= 2 of every DTensor marked unbacked,
compiled with ``torch.compile(backend="eager", fullgraph=True)``, as upstream's test does: the
compiled result's global shape and dtype must equal eager DTensor's, and its values the plain
tensors' result (``check_op``). Random ops are seeded before the call, not inside the op, as in
test_ops_unbacked.py. The eager backend runs DTensor's own dispatch when the graph
runs, so this measures the capture, as upstream's test does; the strategies a capture chose are
replayed under aot_eager by the fixes' tests (test_dtensor_ops_unbacked.py).

Which ops are expected to fail is data, per base, beside the manifests:
``patches/<base>/dtensor_unbacked.toml``: ``[xfail]``, the ops that fail with every fix of the
series, each with why; ``[fixed]``, the ops that fail on the stock release and pass with the fix
named. On a symfix build each op's test expects ``[xfail]`` to fail (an unexpected success
fails it) and every other op to pass; on the stock release every op runs as it is, and exactly
the ops of ``[xfail]`` and ``[fixed]`` fail: the matrix runs those of ``[fixed]`` as the fixes'
proofs. ``[upstream-xfail-passing]``: ops upstream's
own list (``ops_unbacked_dtensor_dde``) expects to fail that pass on the stock release here.
"""

import sys
from pathlib import Path

import torch
import torch._dynamo
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed._tensor.common_dtensor import DTensorConverter
from torch.testing._internal.distributed.fake_pg import FakeStore

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # test/: the base-op scoreboard
from test_ops_unbacked import (  # noqa: E402 - its op list, data and checks serve both
    _describe,
    _seeded_outside,
    _tensors,
    expected_to_fail,
    op_key,
    OPS,
    Skip,
    UNINITIALIZED,
)

WORLD_SIZE = 2


def _sample(op):
    for s in op.sample_inputs("cpu", torch.float32, requires_grad=False):
        if any(d >= 2 for t in _tensors((s.input, s.args, s.kwargs)) for d in t.shape):
            return (s.input, *s.args), s.kwargs
    raise Skip("no sample with a size >= 2")


def _layouts(op, mesh):
    args, kwargs = _sample(op)
    combos = list(DTensorConverter(mesh, args, kwargs).sharding_combs)
    return combos[:1] + combos[1:][-1:]


def _convert(mesh, args, kwargs, combo):
    conv = DTensorConverter(mesh, args, kwargs)
    conv.sharding_combs = iter([combo])
    dargs, dkwargs = next(conv)
    if not conv.successful():
        raise Skip("DTensorConverter cannot convert its tensors")
    return dargs, dkwargs


def _mark_unbacked(tree):
    for t in _tensors(tree):
        if isinstance(t, DTensor):
            for dim, size in enumerate(t.shape):
                if size >= 2:
                    torch._dynamo.decorators.mark_unbacked(t, dim)


def _comparable(t):
    t = t.to_local() if isinstance(t, DTensor) else t
    return t.to(torch.complex64) if t.dtype == torch.complex32 else t  # no CPU kernels


def _rank0_view(full, placements):
    """What rank 0 holds of the global value ``full`` under ``placements``; None under Partial."""
    for p in placements:
        if p.is_partial():
            return None
        if p.is_shard():
            full = full.chunk(WORLD_SIZE, p.dim)[0]  # Shard splits as torch.chunk does
    return full


def _same(a, b) -> bool:
    a, b = _comparable(a), _comparable(b)
    return a.shape == b.shape and (torch.equal(a, b) or (
        a.is_floating_point() or a.is_complex()) and torch.allclose(a, b, equal_nan=True))


def _expected_locals(out, plain):
    """Rank 0's part of the plain-tensor result, under ``out``'s placements (None: not known)."""
    return [_rank0_view(p, o.placements) if isinstance(o, DTensor) else p
            for o, p in zip(_tensors(out), _tensors(plain))]


def check_op(testcase, op, mesh):
    """Compile each layout of ``op``'s sample; the first difference from eager raises.

    Global shape and dtype must equal eager DTensor's, and rank 0's local values the part of the
    plain-tensor result that the compiled result's placements give it. Which placements to choose
    is sharding propagation's policy: where eager's choice depends on a size, the graph's may
    differ, its values may not. Where eager DTensor itself differs from the plain result (random
    ops), the compiled result must equal eager's under the same placements.
    """
    def run(a, k):
        return op(*a, **k)

    for combo in _layouts(op, mesh):
        args, kwargs = _sample(op)
        dargs, dkwargs = _convert(mesh, args, kwargs, combo)
        try:
            torch.manual_seed(0)
            plain = run(args, kwargs)
            torch.manual_seed(0)
            ref = run(dargs, dkwargs)
        except Exception as e:  # noqa: BLE001 - eager refuses it: nothing to compare
            raise Skip(f"eager raises {type(e).__name__}") from None
        _mark_unbacked((dargs, dkwargs))
        torch._dynamo.reset()
        torch.manual_seed(0)
        got = torch.compile(run, backend="eager", fullgraph=True)(dargs, dkwargs)
        msg = f"{op_key(op)} with placements {[str(p) for p in combo]}"
        testcase.assertEqual(_describe(got), _describe(ref), msg=msg)
        if op.name in UNINITIALIZED:
            continue
        if all(e is None or _same(r, e) for r, e in zip(_tensors(ref), _expected_locals(ref, plain))):
            expected = _expected_locals(got, plain)
        else:  # compare with eager where it reproduces itself (a fake collective's output does not)
            torch.manual_seed(0)
            again = _tensors(run(dargs, dkwargs))
            expected = [r if _same(r, a) and (not isinstance(g, DTensor) or g.placements == r.placements)
                        else None for g, r, a in zip(_tensors(got), _tensors(ref), again)]
        for i, (g, e) in enumerate(zip(_tensors(got), expected)):
            if e is not None:
                testcase.assertTrue(_same(g, e), msg=f"{msg}: output {i} differs from eager")


class TestUnbackedDTensorOps(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE)
        cls.mesh = init_device_mesh("cpu", (WORLD_SIZE,))

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()
        torch._dynamo.reset()
        super().tearDownClass()

    @ops([expected_to_fail(op, "dtensor_unbacked.toml", "TestUnbackedDTensorOps",
                           "test_unbacked_dtensor") for op in OPS], allowed_dtypes=(torch.float32,))
    def test_unbacked_dtensor(self, device, dtype, op):
        try:
            with _seeded_outside():
                check_op(self, op, self.mesh)
        except Skip as e:
            self.skipTest(str(e))


instantiate_device_type_tests(TestUnbackedDTensorOps, globals(), only_for=("cpu",))

if __name__ == "__main__":
    run_tests()
