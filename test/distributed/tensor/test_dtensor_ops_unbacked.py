# Owner(s): ["oncall: distributed"]
import torch
import torch._dynamo
import torch.distributed as dist
from torch._dynamo.decorators import mark_unbacked
from torch._dynamo.testing import CompileCounterWithBackend
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore


class TestDTensorSeqShardUnbackedHints(TestCase):
    """
    Sequence-sharded activations with unbacked batch and sequence sizes: a
    [batch, seq, dim] DTensor sharded Shard(1) and flattened to tokens becomes
    _StridedShard(0, split_factor=batch), so the shardability bound of the
    next op is 2 * batch, symbolic. The hint-override policy of
    is_tensor_shardable must compare hints with hints, not guard on that
    bound. Fake process group, world size 2.
    """

    world_size = 2

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

    @staticmethod
    def _tokens_step(x):
        torch._check(x.shape[1] % 2 == 0)
        tokens = x.flatten(0, 1)
        return (tokens * 2 + 1).to_local()

    def _seq_sharded(self, batch, seq, batch_hint=None, seq_hint=None):
        local = torch.randn(batch, seq // self.world_size, 8)
        x = DTensor.from_local(local, self.mesh, [Shard(1)], run_check=False)
        compiled_in = DTensor.from_local(
            local.clone(), self.mesh, [Shard(1)], run_check=False
        )
        mark_unbacked(compiled_in, 0, hint_override=batch_hint)
        mark_unbacked(compiled_in, 1, hint_override=seq_hint)
        return x, compiled_in

    # Proof: stock 2.13.0 and 2.14.1 raise a data-dependent error on
    # 2*u0 <= 32 (hint of batch*seq against the symbolic bound 2*batch).

    def test_flattened_seq_shard_with_unbacked_hint_overrides(self):
        cnt = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(self._tokens_step, backend=cnt, fullgraph=True)
        for batch, seq in ((4, 8), (3, 6), (5, 12)):
            x, compiled_in = self._seq_sharded(batch, seq, batch_hint=4, seq_hint=8)
            out = compiled(compiled_in)
            self.assertEqual(out, self._tokens_step(x))
        # One graph for every batch and sequence length.
        self.assertEqual(cnt.frame_count, 1)

    # Guards: behaviour the hint policy must keep.

    def test_flattened_seq_shard_with_batch_hint_only(self):
        # The token count has no hint of its own: the hint policy stays out,
        # allow_unbacked_sharding decides as before.
        x, compiled_in = self._seq_sharded(4, 8, batch_hint=4)
        compiled = torch.compile(self._tokens_step, backend="aot_eager", fullgraph=True)
        self.assertEqual(compiled(compiled_in), self._tokens_step(x))


if __name__ == "__main__":
    run_tests()
