"""DTensor steps for `symfix audit` (test/tools/test_symfix_audit.py), on a fake process group
of 2 ranks (this process is rank 0; collectives do not run).

Each ``*_target`` returns ``(fn, args)``; ``mark_unbacked`` marks say which sizes are unbacked.
"""

import torch
import torch.distributed as dist
from torch._dynamo.decorators import mark_unbacked
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, DTensor, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

B, D = 3, 8


def _mesh():
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    return init_device_mesh("cpu", (2,))


def local_batch_target():
    """A rank's batch (unbacked) made a DTensor sharded on the batch: the step returns its local
    result and the global batch and stride, as a graph trainer's step returns local tensors."""
    mesh = _mesh()
    x = torch.randn(B, D)
    mark_unbacked(x, 0, hint_override=B)

    def step(x):
        dt = DTensor.from_local(x, mesh, [Shard(0)], run_check=False)
        return (dt * 2).to_local(), dt.shape[0], dt.stride(0)

    return step, (x,)


def dtensor_output_target():
    """local_batch_target returning the DTensor itself: make_fx cannot return a tensor subclass
    the step makes; the graph returns the one of the trace, a constant."""
    mesh = _mesh()
    x = torch.randn(B, D)
    mark_unbacked(x, 0, hint_override=B)
    return (lambda x: DTensor.from_local(x, mesh, [Shard(0)], run_check=False) * 2), (x,)


def local_tensor_marked_target():
    """A DTensor argument whose local tensor alone is marked unbacked (the DTensor is not)."""
    dt = distribute_tensor(torch.randn(2 * B, D), _mesh(), [Shard(0)])
    mark_unbacked(dt._local_tensor, 0, hint_override=B)
    return (lambda dt: dt * 2), (dt,)
