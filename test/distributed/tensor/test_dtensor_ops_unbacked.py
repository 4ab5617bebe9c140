# Owner(s): ["oncall: distributed"]
import contextlib

import torch
import torch._dynamo
import torch.distributed as dist
from torch._dynamo.decorators import mark_unbacked
from torch._dynamo.testing import CompileCounterWithBackend
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
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

    # Differential check (issue 24): one capture per mode, replayed against
    # eager DTensor at sizes of 1, far from the hints and, unless the step
    # checks that the sequence is even, uneven to the mesh.

    MODES = {
        "grad": contextlib.nullcontext,
        "autocast_bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
        "no_grad": torch.no_grad,
        "inference_mode": torch.inference_mode,
    }

    def _projected_tokens(self, even):
        weight = torch.randn(8, 8)
        mesh = self.mesh

        def step(x):
            if even:
                torch._check(x.shape[1] % 2 == 0)
            # the matmul on the _StridedShard tokens is where the hint policy
            # decides (and what bf16 autocast casts). The DTensor output is
            # detached: the backward of a DTensor op over the tokens would
            # guard Eq(u0, 1) in _maybe_convert_StridedShard_to_shard_order
            # (a symbolic split factor; not the policy of this fix)
            w = DTensor.from_local(weight, mesh, [Replicate()], run_check=False)
            h = (x.flatten(0, 1) * 2 + 1) @ w
            return h.detach().sum(0), h.to_local()

        return step

    def _leaf(self, local, batch, seq):
        # a Shard(1) leaf of global [batch, seq, 8]; seq need not be even
        return (
            DTensor.from_local(
                local.clone(), self.mesh, [Shard(1)], run_check=False,
                shape=(batch, seq, 8), stride=(seq * 8, 8, 1),
            )
            .detach()
            .requires_grad_()
        )

    def _assert_same_dtensor(self, out, ref, tol):
        self.assertIsInstance(out, DTensor)
        self.assertEqual(out.placements, ref.placements)
        self.assertEqual(out.shape, ref.shape)
        self.assertEqual(out.stride(), ref.stride())
        self.assertEqual(out.dtype, ref.dtype)
        self.assertEqual(out.requires_grad, ref.requires_grad)
        self.assertEqual(out.to_local(), ref.to_local(), **tol)

    def _check_modes_match_eager(self, sizes, even):
        # sizes: (batch, global sequence), the hints (4, 8) first
        step = self._projected_tokens(even)
        for mode, ctx in self.MODES.items():
            with self.subTest(mode=mode):
                torch._dynamo.reset()
                cnt = CompileCounterWithBackend("aot_eager")
                compiled = torch.compile(step, backend=cnt, fullgraph=True)
                for batch, seq in sizes:
                    with self.subTest(mode=mode, batch=batch, seq=seq):
                        local = torch.randn(batch, -(-seq // self.world_size), 8)
                        x, x_c = self._leaf(local, batch, seq), self._leaf(local, batch, seq)
                        mark_unbacked(x_c, 0, hint_override=4)
                        mark_unbacked(x_c, 1, hint_override=8)
                        with ctx():
                            (total, out), (total_ref, ref) = compiled(x_c), step(x)
                        tol = {"atol": 3e-2, "rtol": 3e-2} if ref.dtype == torch.bfloat16 else {}
                        self._assert_same_dtensor(total, total_ref, tol)
                        self.assertEqual(out.shape, ref.shape)
                        self.assertEqual(out.stride(), ref.stride())
                        self.assertEqual(out.dtype, ref.dtype)
                        self.assertEqual(out.requires_grad, ref.requires_grad)
                        self.assertEqual(out, ref, **tol)
                        if ref.requires_grad:  # grad and autocast_bf16
                            weights = torch.arange(ref.numel(), dtype=ref.dtype).view_as(ref)
                            (out * weights).sum().backward()
                            (ref * weights).sum().backward()
                            self._assert_same_dtensor(x_c.grad, x.grad, tol)
                # a global sequence shorter than the mesh (rank 1 holds
                # nothing) is refused at run time, never by a guard: the hints
                # chose the sharded strategy, whose requirement 2*u0 <= u0*u1
                # is a runtime assertion
                x_c = self._leaf(torch.randn(3, 1, 8), 3, 1)
                mark_unbacked(x_c, 0, hint_override=4)
                mark_unbacked(x_c, 1, hint_override=8)
                with ctx(), self.assertRaisesRegex(RuntimeError, "Runtime assertion failed"):
                    compiled(x_c)
                # one graph for every batch and sequence length
                self.assertEqual(cnt.frame_count, 1)

    def test_hint_overrides_modes_match_eager(self):
        # stock 2.13.0 and 2.15.0: 2*u0 <= 32 at the capture, as above.
        # A batch of 1, a local sequence of 1 (global 2), far from the hints.
        self._check_modes_match_eager([(4, 8), (1, 6), (3, 2), (1, 2), (9, 34), (16, 60)], even=True)

    def test_hint_overrides_uneven_sequence_modes_match_eager(self):
        # sequences uneven to the mesh; stock 2.13.0 and 2.15.0 stop earlier,
        # at the flatten's evenness check Ne(Mod(u1, 2), 0) (symfix 0019)
        self._check_modes_match_eager([(4, 8), (1, 7), (3, 3), (1, 3), (7, 33), (2, 5)], even=False)

    # dtensor-strided-shard-keep-dim-unbacked. Stock: Ne(Mod(u0, 2*u0), 0)
    # (_find_keep_ss_dim asks the size of the flattened tokens whether the
    # shards divide it, though no Split could keep the _StridedShard).

    def test_keepdim_reduction_and_repeat_of_strided_tokens(self):
        def step(x):
            # local results: an output's split factor may not depend on sizes
            tokens = x.flatten(0, 1)
            centered = tokens - tokens.mean(-1, keepdim=True)
            return centered.to_local(), torch.repeat_interleave(tokens, 2, dim=1).to_local()

        torch._dynamo.reset()
        cnt = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(step, backend=cnt, fullgraph=True)
        for batch, seq in ((4, 8), (1, 6), (3, 2), (1, 2), (9, 34), (2, 5), (5, 3)):
            with self.subTest(batch=batch, seq=seq):
                local = torch.randn(batch, -(-seq // self.world_size), 8)
                x, x_c = self._leaf(local, batch, seq), self._leaf(local, batch, seq)
                mark_unbacked(x_c, 0)
                mark_unbacked(x_c, 1)
                for out, ref in zip(compiled(x_c), step(x)):
                    self.assertEqual((out.shape, out.stride()), (ref.shape, ref.stride()))
                    self.assertEqual(out, ref)
        self.assertEqual(cnt.frame_count, 1)
        # a sequence of 1 is refused at run time (the flatten takes the
        # sequence as not 1), loudly
        x_c = self._leaf(torch.randn(2, 1, 8), 2, 1)
        mark_unbacked(x_c, 0)
        mark_unbacked(x_c, 1)
        with self.assertRaisesRegex(RuntimeError, "Runtime assertion failed"):
            compiled(x_c)

    # Guards: behaviour the hint policy must keep.

    def test_flattened_seq_shard_with_batch_hint_only(self):
        # The token count has no hint of its own: the hint policy stays out,
        # allow_unbacked_sharding decides as before.
        x, compiled_in = self._seq_sharded(4, 8, batch_hint=4)
        compiled = torch.compile(self._tokens_step, backend="aot_eager", fullgraph=True)
        self.assertEqual(compiled(compiled_in), self._tokens_step(x))


def _rank_view(full, placements, rank, world_size):
    """What ``rank`` holds of the global value ``full`` under ``placements``; None under Partial."""
    for p in placements:
        if p.is_partial():
            return None
        if p.is_shard():
            chunks = full.chunk(world_size, p.dim)  # Shard splits as torch.chunk does
            full = chunks[rank] if rank < len(chunks) else full.narrow(p.dim, full.shape[p.dim], 0)
    return full


class TestDTensorUnbackedStrategies(TestCase):
    """
    DTensor ops over unbacked sizes, captured once and replayed at sizes the
    capture did not see, on rank 0 and on rank 1 of a fake 2-rank group (rank
    1 holds an empty shard at a size of 1). Each replay's global shape and
    dtype must equal eager DTensor's, and the rank's local values the part of
    the plain-tensor result that the compiled result's placements give it:
    which strategy to take is sharding propagation's policy (below the mesh
    size eager may replicate where the graph keeps a Shard), the values are
    not.
    """

    world_size = 2
    SIZES = (4, 1, 2, 3, 7)

    def tearDown(self):
        if dist.is_initialized():
            dist.destroy_process_group()
        torch._dynamo.reset()
        super().tearDown()

    def _dtensor(self, t, mesh, placement, rank):
        # this rank's part, laid out by hand: the fake group's collectives
        # (distribute_tensor's scatter) leave their outputs unwritten
        local = _rank_view(t, [placement], rank, self.world_size).clone()
        return DTensor.from_local(local, mesh, [placement], run_check=False,
                                  shape=t.shape, stride=t.stride())

    def _replay(self, fn, make_inputs, placements, unbacked, hint=None, sizes=SIZES,
                redistributes=False):
        """``make_inputs(n)``: plain tensors; ``placements``: one per input;
        ``unbacked``: the (input, dim) pairs marked unbacked. ``redistributes``:
        the strategy runs a collective first, whose result the fake group does
        not compute: the values are not compared, and the output must not be
        Partial."""
        for rank in range(self.world_size):
            if dist.is_initialized():
                dist.destroy_process_group()
            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=self.world_size)
            mesh = init_device_mesh("cpu", (self.world_size,))
            torch._dynamo.reset()
            # aot_eager: the graph runs the strategies chosen at the capture
            # (backend="eager" runs eager DTensor's dispatch on every call)
            cnt = CompileCounterWithBackend("aot_eager")
            compiled = torch.compile(fn, backend=cnt, fullgraph=True)
            for n in sizes:
                with self.subTest(rank=rank, n=n):
                    plain = make_inputs(n)
                    dts = [self._dtensor(t, mesh, p, rank) for t, p in zip(plain, placements)]
                    for i, d in unbacked:
                        mark_unbacked(dts[i], d, hint_override=hint)
                    out, ref, want = compiled(*dts), fn(*dts), fn(*plain)
                    self.assertEqual((out.shape, out.dtype), (ref.shape, ref.dtype))
                    if redistributes:
                        self.assertFalse(any(p.is_partial() for p in out.placements))
                        continue
                    expected = _rank_view(want, out.placements, rank, self.world_size)
                    if expected is not None:
                        self.assertEqual(out.to_local(), expected)
            self.assertEqual(cnt.frame_count, 1)

    # dtensor-shardable-unbacked-policy. Stock: "Could not guard on
    # data-dependent expression u0 < 2" (is_tensor_shardable) at the capture.

    def test_single_dim_strategies_keep_the_shard(self):
        def fn(x):
            return torch.topk(torch.flip(x, [1]), 3, dim=1).values * 2

        self._replay(fn, lambda n: [torch.randn(n, 8)], [Shard(0)], [(0, 0)])

    def test_pooling_keeps_the_shard(self):
        def fn(x):
            return torch.nn.functional.avg_pool1d(x, 2)

        self._replay(fn, lambda n: [torch.randn(n, 3, 8)], [Shard(0)], [(0, 0)])

    def test_batch_hint_does_not_refuse_a_batch_of_one(self):
        # stock: with the hint, mm records torch._check(u0 >= 2) for the
        # Shard(0) strategy, and a batch of 1 raises at run time
        def fn(x, w):
            return torch.relu(x @ w)

        self._replay(fn, lambda n: [torch.randn(n, 8), torch.randn(8, 4)],
                     [Shard(0), Replicate()], [(0, 0)], hint=4)

    # dtensor-evenly-shardable-unbacked. Stock: Eq(Mod(u0, 2), 0).

    def test_mean_over_an_unbacked_sharded_dim(self):
        def fn(x):
            return x.mean(0)

        # evenness is not known: no Partial("avg") of uneven shards (another
        # dim sharded or replicated first)
        self._replay(fn, lambda n: [torch.randn(n, 5)], [Shard(0)], [(0, 0)], redistributes=True)

    # dtensor-new-factory-unbacked-shape. Stock: Eq(u0, 4).

    def test_new_factories_over_unbacked_sizes(self):
        def fn(x):
            return x.new_ones(4, 6) * 2 + x.new_full(x.shape, 3.0).sum(0, keepdim=True)

        self._replay(fn, lambda n: [torch.randn(n, 6)], [Shard(1)], [(0, 0)])

    # dtensor-unbacked-broadcast-and-equal-sizes. Stock: Eq(u0, 1) (addmm's
    # bias), Eq(u2, 1) (gather's index), Eq(u0, u2) (scatter_add).

    def test_addmm_with_an_unbacked_bias(self):
        def fn(bias, x, w):
            return torch.addmm(bias, x, w)

        self._replay(fn, lambda n: [torch.randn(n, 4), torch.randn(n, 8), torch.randn(8, 4)],
                     [Shard(0), Shard(0), Replicate()], [(0, 0), (1, 0)])

    def test_addmm_bias_of_one_row_is_refused_loudly(self):
        # the bias's unbacked size is taken as not 1, as broadcasting takes it
        # (plain tensors too): a bias of one row against three rows is
        # refused at run time, not broadcast with a sharding made for 3 rows
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=self.world_size)
        mesh = init_device_mesh("cpu", (self.world_size,))
        compiled = torch.compile(torch.addmm, backend="aot_eager", fullgraph=True)
        x, w = (self._dtensor(t, mesh, Replicate(), 0) for t in (torch.randn(3, 8), torch.randn(8, 4)))
        for rows in (3, 1):
            bias = self._dtensor(torch.randn(rows, 4), mesh, Replicate(), 0)
            mark_unbacked(bias, 0)
            if rows == 3:
                self.assertEqual(compiled(bias, x, w).to_local(), torch.addmm(bias, x, w).to_local())
            else:
                # loud, though not yet the graph's own assertion: Dynamo's
                # recompile for the size-1 local tensor fails ("Guard failed
                # on the same frame it was created"), stock cannot compile
                with self.assertRaises((RuntimeError, AssertionError)):
                    compiled(bias, x, w)

    def test_gather_and_scatter_add_over_unbacked_sizes(self):
        def fn(x, idx):
            return x.scatter_add(1, idx, torch.gather(x, 1, idx))

        self._replay(fn, lambda n: [torch.randn(n, 5), torch.randint(0, 5, (n, 2))],
                     [Shard(0), Shard(0)], [(0, 0), (1, 0)], redistributes=True)

    # dtensor-shard-offset-unbacked. Stock: Eq(Max(0, Min(u0, ((u0 + 1)//2))), 0)
    # (_get_shard_size_and_offsets: is this rank's shard empty?).

    def test_argmax_over_an_unbacked_sharded_dim(self):
        # The global indices of a reduction over the sharded dim come back
        # through a collective, which the fake group does not compute (the
        # offsets themselves: test_utils.py). Every rank holds a row: eager
        # DTensor's argmin of an empty shard raises.
        def fn(x):
            return x.argmin(0) * 10 + x.argmax(1).max()

        sizes = (4, 2, 3, 7)
        self._replay(fn, lambda n: [torch.randn(n, 6)], [Shard(0)], [(0, 0)], sizes=sizes,
                     redistributes=True)
        self._replay(fn, lambda n: [torch.randn(6, n)], [Shard(1)], [(0, 1)], sizes=sizes,
                     redistributes=True)

    # dtensor-complex-polar-pointwise. Stock: "Operator aten.complex.default
    # does not have a sharding strategy registered" (the decomposition's
    # strategy fails over an unbacked size; static sizes compile).

    def test_complex_and_polar_over_unbacked_sizes(self):
        def fn(a, b):
            return torch.complex(a, b) * torch.polar(a.abs(), b)

        self._replay(fn, lambda n: [torch.randn(n, 6), torch.randn(n, 6)],
                     [Shard(0), Shard(0)], [(0, 0), (1, 0)])
        self._replay(fn, lambda n: [torch.randn(n, 6), torch.randn(6)],
                     [Shard(1), Replicate()], [(0, 0)])

    # dtensor-nll-loss-mean-unbacked. Stock: Ne(Mod(u4, 2), 0)
    # (is_tensor_evenly_shardable, nll_loss's mean over a batch-sharded target).

    def test_mean_loss_over_an_unbacked_sharded_batch(self):
        def fn(x, t):
            return torch.nn.functional.cross_entropy(x, t)

        # Evenness is not known: input and target are gathered, no Partial("avg")
        # of uneven shards (the gathered values come from the fake group). Eager
        # DTensor refuses uneven shards (below); the graph serves them too.
        make = lambda n: [torch.randn(n, 5), torch.randint(0, 5, (n,))]  # noqa: E731
        self._replay(fn, make, [Shard(0), Shard(0)], [(0, 0), (1, 0)], sizes=(4, 2, 6),
                     redistributes=True)
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        mesh = init_device_mesh("cpu", (self.world_size,))
        for n in (3, 1, 7):
            dts = [self._dtensor(t, mesh, Shard(0), dist.get_rank()) for t in make(n)]
            for d in dts:
                mark_unbacked(d, 0)
            out = compiled(*dts)
            self.assertEqual((out.shape, out.placements), (torch.Size([]), (Replicate(),)))

    def test_mean_loss_over_an_uneven_static_batch_is_never_biased(self):
        # guard: with sizes known, uneven shards never give a Partial("avg") of
        # their means: 2.13.0 refuses them, 2.14.1 on have no sharded mean
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=self.world_size)
        mesh = init_device_mesh("cpu", (self.world_size,))
        x = self._dtensor(torch.randn(3, 5), mesh, Shard(0), 0)
        t = self._dtensor(torch.randint(0, 5, (3,)), mesh, Shard(0), 0)
        try:
            out = torch.nn.functional.cross_entropy(x, t)
        except RuntimeError as e:
            self.assertIn("cannot be evenly sharded", str(e))
        else:
            self.assertFalse(any(p.is_partial() for p in out.placements))

    # dtensor-decomp-strategy-metadata-queries. Stock: "Operator
    # aten.log_sigmoid_forward.default does not have a sharding strategy
    # registered" (the decomposition's x.is_cuda reached the tracking mode as
    # prim::device, which has no strategy, over symbolic sizes).

    def test_decomposition_strategies_over_unbacked_sizes(self):
        def fn(x, t):
            return (torch.nn.functional.logsigmoid(x)
                    + torch.nn.functional.binary_cross_entropy_with_logits(x, t, reduction="none"))

        self._replay(fn, lambda n: [torch.randn(n, 6), torch.rand(n, 6)],
                     [Shard(0), Shard(0)], [(0, 0), (1, 0)])
        # (an empty shard of dim 1 is laid out with other strides: a recompile)
        self._replay(fn, lambda n: [torch.randn(6, n), torch.rand(6, n)],
                     [Shard(1), Replicate()], [(0, 1), (1, 1)], sizes=(4, 2, 3, 7))

    # dtensor-index-strategy-unbacked. Stock: Eq(u0, 1) (index's single-dim
    # strategy asked an unbacked index size whether it broadcasts).

    def test_take_and_index_with_an_unbacked_index(self):
        def fn(x, idx):
            return torch.take(x, idx) + x.flatten()[idx]

        self._replay(fn, lambda n: [torch.randn(4, 6), torch.randint(0, 24, (n,))],
                     [Replicate(), Shard(0)], [(1, 0)])
        self._replay(fn, lambda n: [torch.randn(n, 6), torch.randint(0, 6, (n,))],
                     [Replicate(), Replicate()], [(0, 0), (1, 0)])

    # dtensor-embedding-unbacked-weight. Stock: "Could not extract specialized
    # integer from data-dependent expression u0" (the rowwise strategy's int()
    # of the weight's shape).

    def test_embedding_of_an_unbacked_weight_and_indices(self):
        def fn(weight, idx):
            return torch.nn.functional.embedding(idx, weight) * 2

        # a weight sharded by rows is gathered: its values come from the fake group
        self._replay(fn, lambda n: [torch.randn(n + 5, 4), torch.randint(0, 5, (n, 3))],
                     [Replicate(), Shard(0)], [(0, 0), (1, 0)])
        self._replay(fn, lambda n: [torch.randn(n + 5, 4), torch.randint(0, 5, (n, 3))],
                     [Shard(0), Replicate()], [(0, 0), (1, 0)], redistributes=True)

    def test_gather_of_an_unbacked_size(self):
        # 2.14.1 on: gather's _MaskPartial strategy hashed the unbacked shape
        # ("unhashable type: non-nested SymInt"); quantile reaches it too
        def fn(x, idx):
            return torch.gather(x, 0, idx) * 2

        self._replay(fn, lambda n: [torch.randn(n + 1, 4), torch.zeros(1, 4, dtype=torch.long)],
                     [Shard(0), Replicate()], [(0, 0)], redistributes=True)
        self._replay(fn, lambda n: [torch.randn(n + 1, 4), torch.zeros(1, 4, dtype=torch.long)],
                     [Replicate(), Replicate()], [(0, 0)])


if __name__ == "__main__":
    run_tests()
