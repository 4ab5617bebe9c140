# Owner(s): ["module: sdpa"]
import contextlib
import subprocess
import sys
import threading

import torch
import torch._dynamo
import torch.nn.functional as F
from torch._dispatch.python import enable_python_dispatcher
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.decorators import mark_unbacked
from torch._dynamo.source import ConstantSource, LocalSource
from torch._dynamo.testing import CompileCounterWithBackend
from torch._guards import tracing, TracingContext
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
)
from torch.nn.attention import SDPBackend
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


def _attend(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def _attend_masked(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _fake_unbacked_seq(fake_mode, hint, name):
    # a [2, 3, S, 16] fake input whose S is unbacked (min 0, hint override),
    # as a graph trainer hands its step to make_fx
    t = torch.randn(2, 3, hint, 16)
    mark_unbacked(t, 2, hint_override=hint, min=0)
    ctx = StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.STATIC] * 2 + [DimDynamic.UNBACKED, DimDynamic.STATIC],
        unbacked_bounds=t._dynamo_unbacked_bounds,
    )
    return fake_mode.from_tensor(
        t, source=LocalSource(name, is_input=True), symbolic_context=ctx
    )


class _DynamoResetTestCase(TestCase):
    # every test compiles from a clean Dynamo cache and leaves one
    def setUp(self):
        super().setUp()
        torch._dynamo.reset()

    def tearDown(self):
        torch._dynamo.reset()
        super().tearDown()


FUSED_CPU = aten._scaled_dot_product_flash_attention_for_cpu.default


class _OpLog(TorchDispatchMode):
    """Records the aten ops a call decomposes into (prim.device aside)."""

    def __init__(self, on_op=None):
        super().__init__()
        self.ops, self.on_op = [], on_op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "aten":
            self.ops.append(func)
        if self.on_op is not None:
            self.on_op(func)
        return func(*args, **(kwargs or {}))


class TestSDPAUnbackedSeqLenCPU(_DynamoResetTestCase):
    """CPU scaled_dot_product_attention traced with an unbacked sequence
    length whose range includes 0 (mark_unbacked(..., min=0)): the CPU
    backend choice must not guard on Eq(u, 0). The fused CPU kernel cannot run
    a zero-length sequence, so the traced graph must hold a backend that is
    correct for every length."""

    @staticmethod
    def _qkv(seq_len, kv_len=None):
        kv_len = seq_len if kv_len is None else kv_len
        return (
            torch.randn(2, 3, seq_len, 16),
            torch.randn(2, 3, kv_len, 16),
            torch.randn(2, 3, kv_len, 16),
        )

    @staticmethod
    def _unbacked(tensors, dim, min):
        out = []
        for t in tensors:
            t = t.clone()
            mark_unbacked(t, dim, min=min)
            out.append(t)
        return out

    def _aten_targets(self, fn, args, min):
        # The ops of the forward graph AOTAutograd traces (no decompositions).
        graphs = []

        def fw_compiler(gm, example_inputs):
            graphs.append(gm)
            return gm

        compiled = torch.compile(
            fn, backend=aot_autograd(fw_compiler=fw_compiler), fullgraph=True
        )
        compiled(*self._unbacked(args, 2, min))
        (gm,) = graphs
        return {n.target for n in gm.graph.nodes if n.op == "call_function"}

    # Proof tests: stock 2.13.0 and 2.14.1 raise a data-dependent error on
    # Eq(u0, 0) while tracing.

    def test_seq_len_min_zero_compiles_once(self):
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(_attend, backend=counter, fullgraph=True)
        for seq_len in (8, 5, 1):
            qkv = self._qkv(seq_len)
            self.assertEqual(compiled(*self._unbacked(qkv, 2, min=0)), _attend(*qkv))
        self.assertEqual(counter.frame_count, 1)

    def test_zero_length_sequence_runs(self):
        # The fused CPU kernel cannot run this length; the traced graph must.
        compiled = torch.compile(_attend, backend="aot_eager", fullgraph=True)
        qkv = self._qkv(0)
        out = compiled(*self._unbacked(qkv, 2, min=0))
        self.assertEqual(out.shape, (2, 3, 0, 16))
        self.assertEqual(out, _attend(*qkv))

    def test_kv_len_min_zero_with_mask(self):
        def fn(q, kv, mask):
            return _attend_masked(q, kv, kv * 2, mask)

        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        for kv_len in (6, 0):
            q, kv, _ = self._qkv(4, kv_len)
            mask = torch.rand(4, kv_len) < 0.7
            mask[:, :1] = True
            kv_c, mask_c = kv.clone(), mask.clone()
            mark_unbacked(kv_c, 2, min=0)
            mark_unbacked(mask_c, 1, min=0)
            self.assertEqual(compiled(q, kv_c, mask_c), fn(q, kv, mask))

    def test_seq_len_min_zero_backward(self):
        q, k, v = self._qkv(7)
        q_c, k_c, v_c = (t.requires_grad_() for t in self._unbacked((q, k, v), 2, 0))
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        compiled = torch.compile(_attend, backend="aot_eager", fullgraph=True)
        out_c, out = compiled(q_c, k_c, v_c), _attend(q, k, v)
        self.assertEqual(out_c, out)
        out_c.sum().backward()
        out.sum().backward()
        for a, b in ((q_c, q), (k_c, k), (v_c, v)):
            self.assertEqual(a.grad, b.grad)

    def test_seq_len_min_zero_traces_math_backend(self):
        targets = self._aten_targets(_attend, self._qkv(8), min=0)
        self.assertNotIn(aten._scaled_dot_product_flash_attention_for_cpu.default, targets)

    # Guard tests: what the choice must keep.

    def test_nonzero_unbacked_seq_len_keeps_fused_cpu_backend(self):
        targets = self._aten_targets(_attend, self._qkv(8), min=1)
        self.assertIn(aten._scaled_dot_product_flash_attention_for_cpu.default, targets)

    def test_backed_dynamic_seq_len_keeps_fused_cpu_backend(self):
        gm = make_fx(_attend, tracing_mode="symbolic")(*self._qkv(8))
        self.assertEqual(
            len(
                gm.graph.find_nodes(
                    op="call_function",
                    target=aten._scaled_dot_product_flash_attention_for_cpu.default,
                )
            ),
            1,
        )

    # A plain FakeTensorMode, without make_fx or the Python dispatcher: the
    # choice is made where the composite starts, before any op reaches the
    # mode.

    @staticmethod
    def _fake_qkv(fake_mode, seq_len, min):
        q = torch.randn(2, 3, seq_len, 16)
        mark_unbacked(q, 2, min=min)
        ctx = StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.STATIC] * 2
            + [DimDynamic.UNBACKED, DimDynamic.STATIC],
            unbacked_bounds=q._dynamo_unbacked_bounds,
        )
        return fake_mode.from_tensor(
            q, symbolic_context=ctx, source=ConstantSource("q")
        )

    def test_plain_fake_mode_takes_math_backend(self):
        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        q = self._fake_qkv(fake_mode, 8, min=0)
        with fake_mode, _OpLog() as log:
            out = _attend(q, q, q)
        self.assertEqual(out.shape[2], q.shape[2])
        self.assertNotIn(FUSED_CPU, log.ops)
        self.assertIn(aten.bmm.default, log.ops)

    def test_plain_fake_mode_nonzero_seq_len_keeps_fused_cpu_backend(self):
        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        q = self._fake_qkv(fake_mode, 8, min=1)
        with fake_mode, _OpLog() as log:
            _attend(q, q, q)
        self.assertEqual(log.ops, [FUSED_CPU])

    def test_cpp_choice_of_static_lengths(self):
        # check_nonzero_sequence_lengths_dense: a known non-zero length keeps the fused CPU
        # kernel, a known zero length takes math; only a length that may be 0 changes (0015).
        q = torch.randn(1, 2, 8, 16)
        self.assertEqual(torch._fused_sdp_choice(q, q, q), SDPBackend.FLASH_ATTENTION.value)
        q0 = torch.randn(1, 2, 0, 16)
        self.assertEqual(torch._fused_sdp_choice(q0, q0, q0), SDPBackend.MATH.value)

    def test_choice_changes_no_global_state_while_tracing(self):
        # While this thread is inside a traced SDPA call that takes the math
        # backend (under the Python dispatcher, as Dynamo and make_fx symbolic
        # trace), another thread still sees the fused CPU backend enabled and
        # still gets it for an eager call.
        seen = []

        def other_thread():
            qkv = self._qkv(4)
            with _OpLog() as log:
                _attend(*qkv)
            seen.append((torch._C._get_flash_sdp_enabled(), log.ops))

        def on_op(func):
            if not seen:
                t = threading.Thread(target=other_thread)
                t.start()
                t.join()

        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        q = self._fake_qkv(fake_mode, 8, min=0)
        with fake_mode, enable_python_dispatcher(), _OpLog(on_op) as log:
            _attend(q, q, q)
        self.assertNotIn(FUSED_CPU, log.ops)
        self.assertEqual(seen, [(True, [FUSED_CPU])])


class TestSDPAGraphTrainerCapture(TestCase):
    """SDPA in a step captured the way TorchTitan's graph_trainer captures:
    make_fx in its default mode (no Python dispatcher) over fake inputs whose
    sequence length is unbacked with mark_unbacked(..., hint_override=...),
    under FakeTensorMode, a TracingContext and non-strict tracing. The
    captured forward and backward must run every length, 0 included."""

    HINT = 8

    @staticmethod
    def _step(q, k, v, causal_mask):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        if causal_mask:
            s = q.size(2)
            mask = torch.ones(s, s, dtype=torch.bool).tril()
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            out = F.scaled_dot_product_attention(q, k, v)
        loss = (out * out).sum()
        return [loss, *torch.autograd.grad(loss, (q, k, v))]

    def _capture(self, causal_mask):
        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        fake = [_fake_unbacked_seq(fake_mode, self.HINT, f"qkv{i}") for i in range(3)]

        def step(q, k, v):
            return self._step(q, k, v, causal_mask)

        with (
            fake_mode,
            tracing(TracingContext(fake_mode)),
            torch.compiler._non_strict_tracing_context(),
        ):
            return make_fx(step)(*fake)

    def _check_runs_every_length(self, causal_mask):
        gm = self._capture(causal_mask)
        self.assertEqual(len(gm.graph.find_nodes(op="call_function", target=FUSED_CPU)), 0)
        for seq_len in (0, 1, 5, self.HINT):
            qkv = [torch.randn(2, 3, seq_len, 16) for _ in range(3)]
            self.assertEqual(gm(*qkv), self._step(*qkv, causal_mask))

    def test_unbacked_seq_len_min_zero(self):
        self._check_runs_every_length(causal_mask=False)

    def test_unbacked_seq_len_min_zero_with_mask(self):
        self._check_runs_every_length(causal_mask=True)


class TestSDPAUnbackedSeqLenModes(_DynamoResetTestCase):
    """Traced once with an unbacked (min 0) query length, the graph computes
    what eager computes at every length and in every mode: values, dtype and
    requires_grad under bf16 autocast, no_grad and inference_mode. The math
    backend is taken above Autocast, which must still cast the inputs as it
    does for eager SDPA (symfix 0013 returned float32 under bf16 autocast)."""

    MODES = {
        "grad": contextlib.nullcontext,
        "autocast_bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
        "no_grad": torch.no_grad,
        "inference_mode": torch.inference_mode,
    }
    # 0, 1, a length that is not a multiple of anything, and one far from
    # the hint of the graph-trainer capture
    LENGTHS = (0, 1, 5, 37)
    HINT = 8

    @staticmethod
    def _inputs(seq_len):
        return (
            torch.randn(2, 3, seq_len, 16, requires_grad=True),
            torch.randn(2, 3, 6, 16),
            torch.randn(2, 3, 6, 16),
            torch.randn(seq_len, 6),
        )

    def _assert_same(self, out, ref):
        self.assertEqual(out.dtype, ref.dtype)
        self.assertEqual(out.requires_grad, ref.requires_grad)
        # the math backend against eager's fused CPU kernel, both in bf16
        tol = {"atol": 3e-2, "rtol": 3e-2} if ref.dtype == torch.bfloat16 else {}
        self.assertEqual(out, ref, **tol)

    def test_compiled_matches_eager_in_every_mode(self):
        for name, mode in self.MODES.items():
            with self.subTest(mode=name):
                torch._dynamo.reset()
                compiled = torch.compile(
                    _attend_masked, backend="aot_eager", fullgraph=True
                )
                for seq_len in self.LENGTHS:
                    q, k, v, mask = self._inputs(seq_len)
                    q_c, mask_c = q.detach().clone().requires_grad_(), mask.clone()
                    mark_unbacked(q_c, 2, min=0)
                    mark_unbacked(mask_c, 0, min=0)
                    with mode():
                        out, ref = compiled(q_c, k, v, mask_c), _attend_masked(q, k, v, mask)
                    self._assert_same(out, ref)

    def test_graph_trainer_capture_under_autocast(self):
        # make_fx in its default mode under the trainer's own fake mode, the
        # step entering bf16 autocast itself; the graph replayed at every length
        def step(q, k, v):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = _attend(q, k, v)
            return [out, *torch.autograd.grad(out.float().sum(), q)]

        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        fake_q = _fake_unbacked_seq(fake_mode, self.HINT, "q").requires_grad_()
        k, v = torch.randn(2, 3, 6, 16), torch.randn(2, 3, 6, 16)
        with (
            fake_mode,
            tracing(TracingContext(fake_mode)),
            torch.compiler._non_strict_tracing_context(),
        ):
            gm = make_fx(step)(fake_q, fake_mode.from_tensor(k), fake_mode.from_tensor(v))
        for seq_len in self.LENGTHS:
            q = torch.randn(2, 3, seq_len, 16, requires_grad=True)
            out, grad = gm(q, k, v)
            ref, ref_grad = step(q, k, v)
            self.assertEqual(out.dtype, torch.bfloat16)
            self.assertEqual(out, ref, atol=3e-2, rtol=3e-2)
            self.assertEqual(grad, ref_grad, atol=3e-2, rtol=3e-2)

    def test_refuses_what_eager_refuses(self):
        # mixed dtypes and a 1-d value: eager's composite checks its inputs
        # before choosing a backend; a graph traced with an unbacked (min 0)
        # query length must refuse them too, not compute (math would upcast
        # a half query to match its float key)
        cases = {
            "same dtype": ((torch.half, torch.float, torch.float), (2, 3, 6, 16)),
            "2 dimensional": ((torch.float,) * 3, (16,)),
        }
        for what, (dtypes, value_shape) in cases.items():
            with self.subTest(what=what):
                q = torch.randn(2, 3, 5, 16, dtype=dtypes[0])
                k = torch.randn(2, 3, 6, 16, dtype=dtypes[1])
                v = torch.randn(value_shape, dtype=dtypes[2])
                with self.assertRaisesRegex(RuntimeError, what):
                    _attend(q, k, v)
                torch._dynamo.reset()
                compiled = torch.compile(_attend, backend="aot_eager", fullgraph=True)
                q_c = q.clone()
                mark_unbacked(q_c, 2, min=0)
                with self.assertRaisesRegex(Exception, what):
                    compiled(q_c, k, v)

    def test_no_python_kernel_after_an_unbacked_trace(self):
        # once a step over an unbacked (min 0) length has been compiled (any
        # kernel it needed was held only while its fake mode was entered),
        # SDPA under a dispatch mode costs what it costs on stock: no Python
        # kernel at PythonTLSSnapshot, even after a trace in another thread
        code = """if True:
            import threading
            import torch
            from torch._dynamo.decorators import mark_unbacked
            def has_kernel():
                return torch._C._dispatch_has_kernel_for_dispatch_key(
                    "aten::scaled_dot_product_attention", "PythonTLSSnapshot")
            f = torch.nn.functional.scaled_dot_product_attention
            def trace():
                q = torch.randn(1, 1, 4, 8)
                mark_unbacked(q, 2, min=0)
                torch.compile(f, backend="aot_eager", fullgraph=True)(q, q, q)
            trace()
            thread = threading.Thread(target=trace)
            thread.start()
            thread.join()
            print(has_kernel())
        """
        out = subprocess.check_output([sys.executable, "-c", code], text=True)
        self.assertEqual(out.split()[-1], "False")

    def test_no_python_kernel_without_unbacked_sizes(self):
        # SDPA under a dispatch mode (DTensor, FlopCounter, activation
        # checkpointing) pays for a Python kernel at PythonTLSSnapshot on
        # every call: a process that never makes an unbacked size, the only
        # kind that needs one, must not have it, even after tracing with
        # static and backed sizes
        code = """if True:
            import torch
            from torch.fx.experimental.proxy_tensor import make_fx
            def has_kernel():
                return torch._C._dispatch_has_kernel_for_dispatch_key(
                    "aten::scaled_dot_product_attention", "PythonTLSSnapshot")
            q = torch.randn(1, 1, 4, 8)
            f = torch.nn.functional.scaled_dot_product_attention
            make_fx(f, tracing_mode="symbolic")(q, q, q)
            torch.compile(f, backend="aot_eager", dynamic=True)(q, q, q)
            print(has_kernel())
        """
        out = subprocess.check_output([sys.executable, "-c", code], text=True)
        self.assertEqual(out.split()[-1], "False")


if __name__ == "__main__":
    run_tests()
