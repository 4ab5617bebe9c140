# Owner(s): ["oncall: distributed"]
import os
import subprocess
import sys
import tempfile

import torch
import torch._dynamo
import torch.distributed as dist
from torch._dynamo.decorators import mark_unbacked
from torch._dynamo.testing import CompileCounterWithBackend
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._utils import compute_global_tensor_info
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore


def _sin_of_local(x):
    # to_local() is the last DTensor op: its backward receives the local
    # gradient that AOTAutograd produced for the plain-tensor tail
    return (x.to_local() * 2).sin()


def _backward_capturing_grad(fn, x):
    # run fn(x).sum().backward() and return fn's output and the gradient of x
    # as autograd hands it over (the accumulated leaf .grad may be re-laid out)
    grads = []
    handle = x.register_hook(grads.append)
    out = fn(x)
    out.sum().backward()
    handle.remove()
    (grad,) = grads
    return out, grad


def _leaf_dtensor(local, mesh, placements, shape=None, stride=None):
    return (
        DTensor.from_local(
            local.clone(), mesh, placements, run_check=False, shape=shape, stride=stride
        )
        .detach()
        .requires_grad_()
    )


class TestDTensorToLocalBackwardSymbolic(TestCase):
    """
    to_local() backward keeps the forward DTensor layout when the gradient
    only spells the local layout differently, e.g. a stride (Max(1, u3), 1)
    against a saved (u1, 1), instead of raising a data-dependent error while
    recomputing the global stride (symfix backport of pytorch/pytorch#187026,
    issue #187025). Fake process group, world size 4.
    """

    world_size = 4

    def setUp(self):
        super().setUp()
        torch._dynamo.reset()
        dist.init_process_group(
            "fake", store=FakeStore(), rank=0, world_size=self.world_size
        )
        self.mesh = init_device_mesh("cpu", (self.world_size,))

    def tearDown(self):
        dist.destroy_process_group()
        torch._dynamo.reset()
        super().tearDown()

    def _check_grad_matches(self, compiled, eager):
        self.assertIsInstance(compiled, DTensor)
        self.assertEqual(compiled.placements, eager.placements)
        self.assertEqual(compiled.shape, eager.shape)
        self.assertEqual(compiled.stride(), eager.stride())
        self.assertEqual(compiled.to_local().shape, eager.to_local().shape)
        self.assertEqual(compiled.to_local(), eager.to_local())

    def _check_dtensor_input(self, placements, local_shape, unbacked_dims):
        cnt = CompileCounterWithBackend("aot_eager")
        fn = torch.compile(_sin_of_local, backend=cnt, fullgraph=True)
        # the second call has other sizes for the unbacked dims and reuses
        # the graph traced for the first
        for step in range(2):
            shape = [
                n + step if d in unbacked_dims else n for d, n in enumerate(local_shape)
            ]
            local = torch.randn(shape)

            x_eager = _leaf_dtensor(local, self.mesh, placements)
            out_eager, grad_eager = _backward_capturing_grad(_sin_of_local, x_eager)

            x = _leaf_dtensor(local, self.mesh, placements)
            for d in unbacked_dims:
                mark_unbacked(x, d)
            out, grad = _backward_capturing_grad(fn, x)

            self.assertEqual(out, out_eager)
            self.assertEqual(grad.placements, tuple(placements))
            self._check_grad_matches(grad, grad_eager)
            self._check_grad_matches(x.grad, x_eager.grad)
            self.assertEqual(grad.to_local(), 2 * torch.cos(2 * local))
        self.assertEqual(cnt.frame_count, 1)

    def test_dtensor_input_shard0_unbacked(self):
        self._check_dtensor_input([Shard(0)], (6, 5), unbacked_dims=(0, 1))

    def test_dtensor_input_shard1_unbacked(self):
        # the unbacked dims are the unsharded ones; the shard dim stays static
        self._check_dtensor_input([Shard(1)], (6, 3, 5), unbacked_dims=(0, 2))

    def test_dtensor_input_replicate_unbacked(self):
        self._check_dtensor_input([Replicate()], (6, 5), unbacked_dims=(0, 1))

    def test_from_local_in_graph_unbacked(self):
        mesh = self.mesh

        def fn(local):
            x = DTensor.from_local(local, mesh, [Replicate()], run_check=False)
            return _sin_of_local(x)

        local = torch.randn(6, 5)
        local_eager = local.clone().requires_grad_()
        out_eager = fn(local_eager)
        out_eager.sum().backward()

        local_c = local.clone().requires_grad_()
        mark_unbacked(local_c, 0)
        mark_unbacked(local_c, 1)
        out = torch.compile(fn, backend="aot_eager", fullgraph=True)(local_c)
        out.sum().backward()

        self.assertEqual(out, out_eager)
        self.assertEqual(local_c.grad, local_eager.grad)
        self.assertEqual(local_c.grad, 2 * torch.cos(2 * local))

    def test_grad_placements_change_unbacked(self):
        # a placement change never reuses the forward spec
        def fn(x):
            return (x.to_local(grad_placements=[Partial()]) * 2).sin()

        local = torch.randn(6, 5)
        x_eager = _leaf_dtensor(local, self.mesh, [Replicate()])
        _, grad_eager = _backward_capturing_grad(fn, x_eager)

        x = _leaf_dtensor(local, self.mesh, [Replicate()])
        mark_unbacked(x, 0)
        mark_unbacked(x, 1)
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        _, grad = _backward_capturing_grad(compiled, x)

        self.assertEqual(grad.placements, (Partial(),))
        self._check_grad_matches(grad, grad_eager)
        self.assertEqual(grad.to_local(), 2 * torch.cos(2 * local))

    def test_grad_placements_change_static(self):
        # eager and static-shape compile: the gradient gets the requested
        # placement and a stride recomputed from the local gradient
        def fn(x):
            return (x.to_local(grad_placements=[Partial()]) * 2).sin()

        local = torch.randn(6, 5)
        for compiled in (False, True):
            with self.subTest(compiled=compiled):
                torch._dynamo.reset()
                x = _leaf_dtensor(local, self.mesh, [Replicate()])
                f = (
                    torch.compile(fn, backend="aot_eager", fullgraph=True)
                    if compiled
                    else fn
                )
                _, grad = _backward_capturing_grad(f, x)
                self.assertEqual(grad.placements, (Partial(),))
                self.assertEqual(grad.shape, x.shape)
                self.assertEqual(grad.stride(), self._recomputed_stride(grad))
                self.assertEqual(grad.to_local(), 2 * torch.cos(2 * local))

    def test_static_shapes_match_eager(self):
        # no unbacked dims: compiled (static and backed-dynamic) grads keep the
        # same DTensor layout as eager
        for placements, shape in (
            ([Shard(0)], (6, 5)),
            ([Shard(1)], (6, 3, 5)),
            ([Replicate()], (6, 5)),
        ):
            for dynamic in (False, True):
                with self.subTest(placements=placements, dynamic=dynamic):
                    torch._dynamo.reset()
                    local = torch.randn(shape)
                    x_eager = _leaf_dtensor(local, self.mesh, placements)
                    _, grad_eager = _backward_capturing_grad(_sin_of_local, x_eager)
                    x = _leaf_dtensor(local, self.mesh, placements)
                    fn = torch.compile(
                        _sin_of_local,
                        backend="aot_eager",
                        fullgraph=True,
                        dynamic=dynamic,
                    )
                    _, grad = _backward_capturing_grad(fn, x)
                    self.assertEqual(grad.placements, tuple(placements))
                    self._check_grad_matches(grad, grad_eager)

    def _recomputed_stride(self, grad):
        _, stride = compute_global_tensor_info(
            grad.to_local(), grad.device_mesh, grad.placements
        )
        return tuple(stride)

    def test_transposed_grad_recomputes_stride(self):
        # the local gradient arrives column-major: the global stride is derived
        # from it, not copied from the forward spec
        local = torch.randn(2, 6)
        x = _leaf_dtensor(local, self.mesh, [Shard(0)])

        def fn(x):
            local = x.to_local()
            local.register_hook(lambda g: g.t().contiguous().t())
            return (local * 3).sin()

        _, grad = _backward_capturing_grad(fn, x)

        self.assertEqual(grad.placements, (Shard(0),))
        self.assertEqual(grad.shape, x.shape)
        self.assertFalse(grad.to_local().is_contiguous())
        self.assertNotEqual(grad.stride(), x.stride())
        self.assertEqual(grad.stride(), self._recomputed_stride(grad))
        self.assertEqual(grad.to_local(), 3 * torch.cos(3 * local))

    def test_uneven_shard_recomputes_stride(self):
        # rank 0 of an uneven Shard(1): global (6, 10), local (6, 3). The
        # forward spec's stride is not the one its local layout maps to, so the
        # gradient spec keeps being recomputed from the local gradient.
        local = torch.randn(6, 3)
        x = _leaf_dtensor(local, self.mesh, [Shard(1)], shape=(6, 10), stride=(10, 1))
        _, grad = _backward_capturing_grad(_sin_of_local, x)

        self.assertEqual(grad.placements, (Shard(1),))
        self.assertEqual(grad.shape, (6, 10))
        self.assertEqual(grad.stride(), self._recomputed_stride(grad))
        self.assertNotEqual(grad.stride(), x.stride())
        self.assertEqual(grad.to_local(), 2 * torch.cos(2 * local))

    def test_channels_last_shard_keeps_layout(self):
        # Shard(1) of a channels-last tensor: the gradient DTensor is
        # channels-last like the input, in eager and compiled
        local = torch.randn(2, 2, 3, 3).to(memory_format=torch.channels_last)

        def fn(x):
            local = x.to_local()
            return local * local

        for compiled in (False, True):
            with self.subTest(compiled=compiled):
                torch._dynamo.reset()
                x = _leaf_dtensor(local, self.mesh, [Shard(1)])
                self.assertTrue(x.is_contiguous(memory_format=torch.channels_last))
                f = (
                    torch.compile(fn, backend="aot_eager", fullgraph=True)
                    if compiled
                    else fn
                )
                _, grad = _backward_capturing_grad(f, x)
                self.assertEqual(grad.placements, (Shard(1),))
                self.assertEqual(grad.shape, x.shape)
                self.assertEqual(grad.stride(), x.stride())
                self.assertEqual(grad.stride(), self._recomputed_stride(grad))
                self.assertEqual(grad.to_local(), 2 * local)


def _partial_sum_step(x):
    # all-reduce in forward (Partial -> Replicate); both to_local() calls
    # take the default same-placement backward
    local = x.to_local()
    mesh = x.device_mesh
    summed = (
        DTensor.from_local(local.sin(), mesh, [Partial()], run_check=False)
        .redistribute(mesh, [Replicate()])
        .to_local()
    )
    return summed * local


def _gloo_rank_main(rank, world_size, init_file):
    # one rank of TestDTensorToLocalBackwardSymbolicGloo, run in its own
    # process: compiled (unbacked local dims) vs. eager with real collectives
    from torch.testing import assert_close

    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        torch.manual_seed(rank)
        local = torch.randn(3, 4)

        x_eager = _leaf_dtensor(local, mesh, [Shard(0)])
        out_eager, grad_eager = _backward_capturing_grad(_partial_sum_step, x_eager)

        x = _leaf_dtensor(local, mesh, [Shard(0)])
        mark_unbacked(x, 0)
        mark_unbacked(x, 1)
        fn = torch.compile(_partial_sum_step, backend="aot_eager", fullgraph=True)
        out, grad = _backward_capturing_grad(fn, x)

        assert_close(out, out_eager)
        assert grad.placements == (Shard(0),), grad.placements
        assert grad.shape == grad_eager.shape, (grad.shape, grad_eager.shape)
        assert grad.stride() == grad_eager.stride(), (
            grad.stride(),
            grad_eager.stride(),
        )
        assert_close(grad.to_local(), grad_eager.to_local())
        assert_close(x.grad.to_local(), x_eager.grad.to_local())
        # the forward all-reduce makes the gradient depend on the other ranks
        summed = torch.zeros_like(local)
        for r in range(world_size):
            torch.manual_seed(r)
            summed += torch.randn(3, 4).sin()
        assert_close(grad.to_local(), summed + local.cos() * local)
    finally:
        dist.destroy_process_group()


class TestDTensorToLocalBackwardSymbolicGloo(TestCase):
    """
    The same backward with real collectives: 2 gloo ranks, compiled with
    unbacked local dims, gradients compared with eager. Each rank is a fresh
    interpreter running this file (independent of how the test runner
    imported it).
    """

    world_size = 2

    def test_to_local_backward_unbacked_matches_eager(self):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        with tempfile.TemporaryDirectory() as tmp:
            init_file = os.path.join(tmp, "store")
            procs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        os.path.abspath(__file__),
                        _GLOO_RANK_FLAG,
                        str(rank),
                        str(self.world_size),
                        init_file,
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=env,
                    text=True,
                )
                for rank in range(self.world_size)
            ]
            outputs = []
            try:
                for proc in procs:
                    outputs.append(proc.communicate(timeout=300)[0])
            finally:
                for proc in procs:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
        for rank, (proc, output) in enumerate(zip(procs, outputs)):
            self.assertEqual(
                proc.returncode, 0, msg=f"rank {rank} failed:\n{output[-6000:]}"
            )


_GLOO_RANK_FLAG = "--gloo-rank"

if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == _GLOO_RANK_FLAG:
        _gloo_rank_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        run_tests()
