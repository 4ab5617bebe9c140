# Owner(s): ["oncall: distributed"]
import itertools

import torch
from torch.distributed.tensor import Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.testing._internal.common_utils import run_tests, TestCase


def _chunked(size, mesh_shape, coordinate, dims_of_placements):
    """Rank ``coordinate``'s part of arange(size) sharded as torch.chunk does, level by level,
    and the offset DTensor gives it: its first element, or ``size`` when it holds nothing."""
    part = torch.arange(size)
    for mesh_dim, _ in enumerate(dims_of_placements):
        chunks = part.chunk(mesh_shape[mesh_dim])
        rank = coordinate[mesh_dim]
        part = chunks[rank] if rank < len(chunks) else part[:0]
    return len(part), (int(part[0]) if len(part) else size)


class TestShardOffsetsUnbacked(TestCase):
    """compute_local_shape_and_global_offset over an unbacked size: a shard's offset is a
    symbolic expression of the size, with no test of whether this rank's shard is empty
    (argmax/argmin of a DTensor read it)."""

    MESHES = [(2,), (3,), (2, 2), (2, 3), (3, 2)]

    # Guard: with sizes known, every rank's shape and offset are torch.chunk's, an empty
    # shard's offset the dim's size, one Shard or two of the same dim.
    def test_offsets_follow_chunk(self):
        for mesh_shape, size in itertools.product(self.MESHES, range(10)):
            placements = [Shard(0)] * len(mesh_shape)
            for coordinate in itertools.product(*map(range, mesh_shape)):
                with self.subTest(mesh=mesh_shape, size=size, coordinate=coordinate):
                    shape, offset = _compute_local_shape_and_global_offset(
                        (size, 3), mesh_shape, list(coordinate), placements)
                    want_size, want_offset = _chunked(size, mesh_shape, coordinate, placements)
                    self.assertEqual((shape, offset), ((want_size, 3), (want_offset, 0)))

    # Proof: stock raises "Could not guard on data-dependent expression
    # Eq(Max(0, Min(u0, ((u0 + 1)//2))), 0)", is rank 1's shard empty.
    def test_offset_of_an_unbacked_size_is_symbolic(self):
        shape_env = ShapeEnv()
        u0 = shape_env.create_unbacked_symint()
        torch._check(u0 >= 0)
        for mesh_shape in ((2,), (3,)):
            for rank in range(mesh_shape[0]):
                shape, offset = _compute_local_shape_and_global_offset(
                    (u0, 3), mesh_shape, [rank], [Shard(0)])
                for size in (0, 1, 2, 3, 7, 100):
                    with self.subTest(mesh=mesh_shape, rank=rank, size=size):
                        want_size, want_offset = _chunked(size, mesh_shape, (rank,), [Shard(0)])
                        at = {u0.node.expr: size}
                        self.assertEqual(int(shape[0].node.expr.xreplace(at)), want_size)
                        self.assertEqual(shape[1], 3)
                        self.assertEqual(int(offset[0].node.expr.xreplace(at)), want_offset)
                        self.assertEqual(offset[1], 0)


if __name__ == "__main__":
    run_tests()
