# Owner(s): ["module: ProxyTensor"]
import contextlib
import io
import operator
import pickle
import subprocess
import sys

import torch
import torch.utils._pytree as pytree
from torch._dynamo.source import LocalSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import DecompositionInterpreter, make_fx
from torch.fx.experimental.symbolic_shapes import (
    CallMethodKey,
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
)
from torch.nn.attention.flex_attention import flex_attention
from torch.testing._internal.common_utils import run_tests, TestCase


def _placeholders(gm):
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


class TestUnbackedBindingProvenance(TestCase):
    """
    unbacked_bindings land on the proxy that owns each binding (symfix
    backport of pytorch/pytorch#187231, issue #187230).
    """

    def _check_binding_resolves(self, node):
        # every recorded path is relative to the node's own value and leads
        # to the very symbol it binds
        bindings = node.meta["unbacked_bindings"]
        for sym, path in bindings.items():
            got = pytree.key_get(node.meta["val"], path)
            self.assertIsInstance(got, torch.SymInt)
            self.assertEqual(got.node._expr, sym)
        return bindings

    def test_inputs_sharing_unbacked_shape_id(self):
        # The graph-chunking pattern: token ids and labels share one unbacked
        # batch dim (same shape_id); each fakified input brings a fresh
        # unbacked symbol into make_fx.
        shape_env = ShapeEnv()
        mode = FakeTensorMode(shape_env=shape_env)
        ctx = StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.UNBACKED, DimDynamic.STATIC],
            shape_ids={0: "batch"},
        )
        fresh = {}
        for name in ("tokens", "labels"):
            before = set(shape_env.pending_fresh_unbacked_symbols)
            fresh[name] = mode.from_tensor(
                torch.zeros(4, 8, dtype=torch.long),
                source=LocalSource(name),
                symbolic_context=ctx,
            )
            (sym,) = set(shape_env.pending_fresh_unbacked_symbols) - before
            fresh[name + "_sym"] = sym

        def step(tokens, labels):
            b = tokens.shape[0]
            return (tokens + labels).view(b * 8).float().sum() / b

        with mode:
            gm = make_fx(step, tracing_mode="real")(fresh["tokens"], fresh["labels"])

        tokens_ph, labels_ph = _placeholders(gm)
        # each input's fresh symbol is bound on its own placeholder
        self.assertEqual(
            list(self._check_binding_resolves(tokens_ph)), [fresh["tokens_sym"]]
        )
        self.assertEqual(
            list(self._check_binding_resolves(labels_ph)), [fresh["labels_sym"]]
        )
        # no binding was left on a non-owner node
        for n in gm.graph.nodes:
            if n.op != "placeholder":
                self.assertNotIn("unbacked_bindings", n.meta)

        # the batch stays symbolic: the graph runs for another batch size
        tokens = torch.randint(0, 5, (3, 8))
        labels = torch.randint(0, 5, (3, 8))
        self.assertEqual(gm(tokens, labels), step(tokens, labels))

    def test_single_unbacked_input_binding_path(self):
        shape_env = ShapeEnv()
        mode = FakeTensorMode(shape_env=shape_env)
        ctx = StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.STATIC, DimDynamic.UNBACKED]
        )
        x = mode.from_tensor(
            torch.randn(2, 6), source=LocalSource("x"), symbolic_context=ctx
        )
        (sym,) = shape_env.pending_fresh_unbacked_symbols

        with mode:
            gm = make_fx(lambda x: x.sum(1), tracing_mode="real")(x)
        (x_ph,) = _placeholders(gm)
        # the list-of-placeholders prefix is dropped; only size()[1] remains
        self.assertEqual(
            x_ph.meta["unbacked_bindings"],
            {sym: (CallMethodKey("size"), pytree.SequenceKey(1))},
        )

    def test_op_output_binding_unchanged(self):
        # Guard: a single output proxy owns all of its bindings with the
        # full path, as before (single tensor and multi-output ops).
        def f(x):
            nz = x.nonzero()
            vals, counts = torch.unique(x, return_counts=True)
            return nz, vals, counts

        gm = make_fx(f, tracing_mode="symbolic")(torch.tensor([1, 0, 2, 2]))
        nodes = {
            n.target: n for n in gm.graph.nodes if "unbacked_bindings" in n.meta
        }
        nonzero = nodes[torch.ops.aten.nonzero.default]
        bindings = self._check_binding_resolves(nonzero)
        self.assertEqual(
            list(bindings.values()),
            [(CallMethodKey("size"), pytree.SequenceKey(0))],
        )
        (unique_target,) = [t for t in nodes if t is not torch.ops.aten.nonzero.default]
        unique = nodes[unique_target]
        bindings = self._check_binding_resolves(unique)
        for path in bindings.values():
            # the path still starts with the output index of the tuple
            self.assertIsInstance(path[0], pytree.SequenceKey)
        for n in gm.graph.nodes:
            if n.target is operator.getitem:
                self.assertNotIn("unbacked_bindings", n.meta)


class TestScalarPlaceholderVal(TestCase):
    """Scalar placeholders carry meta["val"] (pytorch/pytorch#187231)."""

    def test_make_fx_scalar_placeholders(self):
        def f(x, n, scale, flag):
            y = x * n * scale
            return y if flag else -y

        args = (torch.randn(3), 3, 0.5, True)
        for mode in ("real", "fake"):
            gm = make_fx(f, tracing_mode=mode)(*args)
            phs = _placeholders(gm)
            self.assertEqual(len(phs), 4)
            for ph, arg in zip(phs[1:], args[1:]):
                self.assertIn("val", ph.meta, f"{mode}: {ph.name}")
                self.assertIs(type(ph.meta["val"]), type(arg))
                self.assertEqual(ph.meta["val"], arg)

    def test_decomposition_interpreter_scalar_placeholders(self):
        def f(x, n, scale):
            return torch.add(x, x, alpha=n) * scale

        gm = torch.fx.symbolic_trace(f)
        new_graph = torch.fx.Graph()
        DecompositionInterpreter(gm, new_graph).run(torch.randn(2), 2, 1.5)
        phs = [n for n in new_graph.nodes if n.op == "placeholder"]
        self.assertEqual([ph.meta.get("val") for ph in phs[1:]], [2, 1.5])
        self.assertEqual([type(ph.meta.get("val")) for ph in phs[1:]], [int, float])

    def test_symbolic_int_placeholder_keeps_symint_val(self):
        # Guard: with tracing_mode="symbolic" ints become SymInts and keep the
        # symbolic val; tensor placeholders keep their fake tensor val.
        gm = make_fx(lambda x, n: x * n, tracing_mode="symbolic")(torch.randn(3), 4)
        x_ph, n_ph = _placeholders(gm)
        self.assertIsInstance(n_ph.meta["val"], torch.SymInt)
        self.assertIsInstance(x_ph.meta["val"], torch.Tensor)


def _relative_position(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx) * (h + 1)


def _attention_step(q: "torch.Tensor", k: "torch.Tensor") -> "torch.Tensor":
    # String annotations, as under `from __future__ import annotations`.
    return flex_attention(q, k, q + 1, score_mod=_relative_position)


_UNPICKLE_AND_RUN = """
import pickle, sys
import torch
gm, args = pickle.loads(sys.stdin.buffer.read())
sys.stdout.buffer.write(pickle.dumps(gm(*args)))
"""

_TORCH_LOAD_AND_RUN = """
import io, pickle, sys
import torch
gm, args = torch.load(io.BytesIO(sys.stdin.buffer.read()), weights_only=False)
sys.stdout.buffer.write(pickle.dumps(gm(*args)))
"""


# Replay modes of the differential checks (issue 24): one trace per mode,
# under that mode; replayed under it.  name: (mode, inputs require grad)
_MODES = {
    "grad": (contextlib.nullcontext, True),
    "autocast_bf16": (lambda: torch.autocast("cpu", dtype=torch.bfloat16), False),
    "no_grad": (torch.no_grad, True),
    "inference_mode": (torch.inference_mode, True),
}

# Replays the round-tripped graphs of every mode at every size, under its mode;
# imports nothing but torch before unpickling.
_UNPICKLE_AND_REPLAY_IN_MODES = """
import contextlib, pickle, sys
import torch
graphs, sizes = pickle.loads(sys.stdin.buffer.read())
modes = {
    "grad": contextlib.nullcontext,
    "autocast_bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
}
results = {}
for name, gm in graphs.items():
    for key, args in sizes[name].items():
        with modes[name]():
            out = gm(*args)
            results[name, key] = (out.detach().clone(), out.requires_grad)
sys.stdout.buffer.write(pickle.dumps(results))
"""


class TestPickleCapturedGraph(TestCase):
    """Captured make_fx graphs, with FlexAttention subgraphs, shipped to
    another process with pickle."""

    def _step_graph(self):
        args = (torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8))
        return make_fx(_attention_step)(*args), args

    def _run_in_fresh_process(self, gm, args):
        # A process that imported nothing but torch.
        proc = subprocess.run(
            [sys.executable, "-c", _UNPICKLE_AND_RUN],
            input=pickle.dumps((gm, args)),
            capture_output=True,
            check=False,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr.decode()[-2000:])
        return pickle.loads(proc.stdout)

    # Proof tests.

    def test_pickle_graph_with_string_annotations(self):
        # Stock 2.13.0: "'str' object has no attribute '__name__'".
        gm, args = self._step_graph()
        self.assertEqual(
            len(gm.graph.find_nodes(op="call_function", target=torch.ops.higher_order.flex_attention)),
            1,
        )
        self.assertEqual(pickle.loads(pickle.dumps(gm))(*args), _attention_step(*args))

    def test_unpickle_make_fx_graph_in_fresh_process(self):
        # Stock 2.13.0 and 2.14.1: "module 'torch._higher_order_ops' has no
        # attribute 'triton_kernel_wrap'".
        x = torch.randn(4, 3)
        gm = make_fx(lambda x: torch.mm(x, x.t()).relu() + 1)(x)
        self.assertEqual(self._run_in_fresh_process(gm, (x,)), torch.mm(x, x.t()).relu() + 1)

    def test_unpickle_flex_attention_graph_in_fresh_process(self):
        def step(q, k):
            return flex_attention(q, k, q + 1, score_mod=_relative_position)

        args = (torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8))
        gm = make_fx(step)(*args)
        self.assertEqual(self._run_in_fresh_process(gm, args), step(*args))

    # Proof tests: a captured flex graph whose score_mod closes over tensors
    # the step takes as inputs (ALiBi slopes, a relative position table), and
    # symbolic graphs.

    @staticmethod
    def _alibi_step(q, k, slopes, rel):
        def score_mod(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - q_idx) + rel[q_idx - kv_idx + 15]

        return flex_attention(q, k, q + 1, score_mod=score_mod)

    @staticmethod
    def _alibi_args(seq=16):
        torch.manual_seed(0)
        return (torch.randn(1, 2, seq, 8), torch.randn(1, 2, seq, 8), torch.rand(2), torch.randn(31))

    def test_unpickle_flex_graph_with_graph_input_closures_in_fresh_process(self):
        # Stock 2.13.0 and 2.15.0, at load: "(Proxy(slopes_1), Proxy(rel_1))
        # can only be of (Tensor, int, SymInt)" (after 0012's import error).
        args = self._alibi_args()
        gm = make_fx(self._alibi_step)(*args)
        self.assertEqual(self._run_in_fresh_process(gm, args), self._alibi_step(*args))

    def test_pickle_symbolic_flex_graph_in_fresh_process(self):
        # Stock 2.13.0 and 2.15.0: pickle.dumps fails on gm.shape_env
        # ("... pybind11 ... object is not pickleable").
        args = self._alibi_args()
        gm = make_fx(self._alibi_step, tracing_mode="symbolic")(*args)
        self.assertIsNotNone(gm.shape_env)
        # The loaded graph is still symbolic: it serves another length.
        other = self._alibi_args(seq=12)
        out = self._run_in_fresh_process(gm, other)
        self.assertEqual(out, self._alibi_step(*other))
        # Pickling left the traced module as it was.
        self.assertIsNotNone(gm.shape_env)

    def test_torch_save_symbolic_flex_graph_in_fresh_process(self):
        args = self._alibi_args()
        gm = make_fx(self._alibi_step, tracing_mode="symbolic")(*args)
        buf = io.BytesIO()
        torch.save((gm, args), buf)
        proc = subprocess.run(
            [sys.executable, "-c", _TORCH_LOAD_AND_RUN],
            input=buf.getvalue(),
            capture_output=True,
            check=False,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr.decode()[-2000:])
        self.assertEqual(pickle.loads(proc.stdout), self._alibi_step(*args))

    # Proof test (issue 24's differential check of 0012, 0022, 0023): one
    # symbolic capture per mode, under that mode, of a step whose score_mod
    # closes over step inputs; all four pickled to one fresh process, which
    # re-traces them on load and replays each under its mode at other sizes.

    @staticmethod
    def _projected_alibi_step(q, k, slopes, rel, w):
        # the projection makes autocast cast: flex_attention runs in bf16 there.
        # rel[q_idx - kv_idx + 63]: lengths up to 64
        def score_mod(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - q_idx) + rel[q_idx - kv_idx + 63]

        q, k = q @ w, k @ w
        return flex_attention(q, k, q + 1, score_mod=score_mod)

    @staticmethod
    def _projected_alibi_args(batch, heads, seq, requires_grad):
        # FlexAttention has no CPU backward: query, key and value must not
        # require grad; the score_mod's buffers do (grad mode)
        return (
            torch.randn(batch, heads, seq, 8),
            torch.randn(batch, heads, seq, 8),
            torch.rand(heads, requires_grad=requires_grad),
            torch.randn(127, requires_grad=requires_grad),
            torch.randn(8, 8),
        )

    def test_round_trip_replays_match_eager_in_fresh_process(self):
        # (batch, heads, seq): the hint (distinct sizes, so that no two dims
        # share a symbol), ones, uneven ones, and the longest rel allows
        hint, *others = [(2, 3, 16), (1, 1, 1), (3, 2, 5), (1, 4, 64)]
        step = self._projected_alibi_step
        torch.manual_seed(0)
        graphs, sizes, expected = {}, {}, {}
        for name, (mode, requires_grad) in _MODES.items():
            with mode():
                graphs[name] = make_fx(step, tracing_mode="symbolic")(
                    *self._projected_alibi_args(*hint, requires_grad)
                )
            sizes[name] = {}
            for size in [hint, *others]:
                args = self._projected_alibi_args(*size, requires_grad)
                with mode():
                    expected[name, size] = (step(*args), graphs[name](*args))
                sizes[name][size] = args
        proc = subprocess.run(
            [sys.executable, "-c", _UNPICKLE_AND_REPLAY_IN_MODES],
            input=pickle.dumps((graphs, sizes)),
            capture_output=True,
            check=False,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr.decode()[-2000:])
        results = pickle.loads(proc.stdout)
        for (name, size), (ref, original) in expected.items():
            with self.subTest(mode=name, size=size):
                got, got_requires_grad = results[name, size]
                tol = {"atol": 2e-2, "rtol": 2e-2} if ref.dtype == torch.bfloat16 else {}
                for out, requires_grad in ((got, got_requires_grad), (original, original.requires_grad)):
                    self.assertEqual(out.shape, ref.shape)
                    self.assertEqual(out.stride(), ref.stride())
                    self.assertEqual(out.dtype, ref.dtype)
                    self.assertEqual(requires_grad, ref.requires_grad)
                    self.assertEqual(out, ref, **tol)
                # the round trip computes what the graph it came from computes
                self.assertEqual(got, original, atol=0, rtol=0)

    # Guard tests.

    def test_subgraph_args_still_validated(self):
        from torch._higher_order_ops.utils import validate_subgraph_args_types

        validate_subgraph_args_types((torch.ones(2), 3))
        with self.assertRaisesRegex(AssertionError, "can only be of"):
            validate_subgraph_args_types((torch.ones(2), 1.5))

    # Guard test: unpickling where the triton wrapper module is already loaded.

    def test_unpickle_in_same_process(self):
        import torch._higher_order_ops.triton_kernel_wrap  # noqa: F401

        x = torch.randn(5)
        gm = make_fx(lambda x: x.sin() * 2)(x)
        gm2 = pickle.loads(pickle.dumps(gm))
        self.assertEqual(gm2(x), x.sin() * 2)
        self.assertEqual(
            [n.target for n in gm2.graph.nodes if n.op == "call_function"],
            [n.target for n in gm.graph.nodes if n.op == "call_function"],
        )


class TestSymExprProxyNary(TestCase):
    """
    make_fx rebuilds a SymInt/SymBool it never saw traced from its sympy
    expression.  sympy Mul/And/Or are n-ary, the FX nodes built for them must
    be binary (symfix: proxy-nary-sym-expr).
    """

    def _trace(self, combine, *, ints=3, out=None):
        # Graph-trainer shape: an ambient FakeTensorMode with a ShapeEnv,
        # make_fx in "real" mode over fake inputs.  The unbacked ints are
        # traced (.item()), but `combine` runs with proxy tracing disabled, as
        # DTensor does when it computes a size outside the trace.
        from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

        def f(x, *scalars):
            us = [t.item() for t in scalars]
            for u in us:
                torch._check(u >= 0)
            with disable_proxy_modes_tracing():
                val = combine(*us)
            if out is None:
                return x.new_zeros(val, 4).reshape(-1, 4)
            return out(x, val)

        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        with fake_mode:
            args = (torch.randn(3),) + tuple(
                torch.empty((), dtype=torch.int64) for _ in range(ints)
            )
            gm = make_fx(f, tracing_mode="real")(*args)
        return gm, fake_mode, args

    def _check_graph_runs(self, gm, fake_mode, args):
        from torch.fx.passes.fake_tensor_prop import FakeTensorProp

        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target in (
                operator.mul,
                operator.and_,
                operator.or_,
            ):
                self.assertEqual(len(node.args), 2, node.format_node())
        with fake_mode:
            FakeTensorProp(gm, fake_mode).propagate(*args)

    def _run(self, gm, *vals):
        return gm(torch.randn(3), *(torch.tensor(v) for v in vals))

    def test_three_factor_product_reaches_reshape(self):
        gm, fake_mode, args = self._trace(lambda u0, u1: 2 * u0 * u1, ints=2)
        self._check_graph_runs(gm, fake_mode, args)
        self.assertExpectedInline(
            gm.code.strip(),
            """\
def forward(self, arg0_1, arg1_1, arg2_1):
    _local_scalar_dense = torch.ops.aten._local_scalar_dense.default(arg1_1);  arg1_1 = None
    _local_scalar_dense_1 = torch.ops.aten._local_scalar_dense.default(arg2_1);  arg2_1 = None
    mul = 2 * _local_scalar_dense;  _local_scalar_dense = None
    mul_1 = mul * _local_scalar_dense_1;  mul = _local_scalar_dense_1 = None
    new_zeros = torch.ops.aten.new_zeros.default(arg0_1, [mul_1, 4], pin_memory = False);  arg0_1 = mul_1 = None
    view = torch.ops.aten.view.default(new_zeros, [-1, 4]);  new_zeros = None
    return view""",
        )
        self.assertEqual(self._run(gm, 3, 5).shape, (30, 4))
        self.assertEqual(self._run(gm, 0, 5).shape, (0, 4))

    def test_four_factor_product(self):
        gm, fake_mode, args = self._trace(lambda u0, u1, u2: 3 * u0 * u1 * u2)
        self._check_graph_runs(gm, fake_mode, args)
        self.assertEqual(self._run(gm, 2, 5, 7).shape, (210, 4))

    def test_product_inside_sum(self):
        # the Mul is a sub-expression here: it is built eagerly, not as the
        # node for the SymInt being looked up
        gm, fake_mode, args = self._trace(lambda u0, u1: 2 * u0 * u1 + 1, ints=2)
        self._check_graph_runs(gm, fake_mode, args)
        self.assertEqual(self._run(gm, 3, 5).shape, (31, 4))

    def test_three_factor_product_symbolic_view(self):
        from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

        def f(x):
            with disable_proxy_modes_tracing():
                n = 2 * x.shape[0] * x.shape[1]
            return x.view(n, 4)

        gm = make_fx(f, tracing_mode="symbolic")(torch.randn(3, 5, 2, 4))
        x = torch.randn(6, 7, 2, 4)
        self.assertEqual(gm(x), x.view(84, 4))

    def _check_three_way(self, combine, holds):
        def out(x, cond):
            torch.ops.aten._assert_scalar.default(cond, "cond failed")
            return x + 1

        gm, fake_mode, args = self._trace(combine, out=out)
        self._check_graph_runs(gm, fake_mode, args)
        for vals in ((1, 2, 3), (1, 2, 4), (0, 2, 3), (0, 0, 0)):
            if holds(*vals):
                self._run(gm, *vals)
            else:
                with self.assertRaisesRegex(RuntimeError, "cond failed"):
                    self._run(gm, *vals)

    def test_three_way_and(self):
        from torch.fx.experimental.symbolic_shapes import sym_and

        self._check_three_way(
            lambda a, b, c: sym_and(a == 1, b == 2, c == 3),
            lambda a, b, c: a == 1 and b == 2 and c == 3,
        )

    def test_three_way_or(self):
        from torch.fx.experimental.symbolic_shapes import sym_or

        self._check_three_way(
            lambda a, b, c: sym_or(a == 1, b == 5, c == 3),
            lambda a, b, c: a == 1 or b == 5 or c == 3,
        )

    def test_binary_product_unchanged(self):
        gm, fake_mode, args = self._trace(lambda u0, u1: u0 * u1, ints=2)
        self._check_graph_runs(gm, fake_mode, args)
        self.assertExpectedInline(
            gm.code.strip(),
            """\
def forward(self, arg0_1, arg1_1, arg2_1):
    _local_scalar_dense = torch.ops.aten._local_scalar_dense.default(arg1_1);  arg1_1 = None
    _local_scalar_dense_1 = torch.ops.aten._local_scalar_dense.default(arg2_1);  arg2_1 = None
    mul = _local_scalar_dense * _local_scalar_dense_1;  _local_scalar_dense = _local_scalar_dense_1 = None
    new_zeros = torch.ops.aten.new_zeros.default(arg0_1, [mul, 4], pin_memory = False);  arg0_1 = mul = None
    view = torch.ops.aten.view.default(new_zeros, [-1, 4]);  new_zeros = None
    return view""",
        )
        self.assertEqual(self._run(gm, 3, 5).shape, (15, 4))

    def test_scaled_symbol_unchanged(self):
        gm, fake_mode, args = self._trace(lambda u0: 2 * u0, ints=1)
        self._check_graph_runs(gm, fake_mode, args)
        self.assertExpectedInline(
            gm.code.strip(),
            """\
def forward(self, arg0_1, arg1_1):
    _local_scalar_dense = torch.ops.aten._local_scalar_dense.default(arg1_1);  arg1_1 = None
    mul = 2 * _local_scalar_dense;  _local_scalar_dense = None
    new_zeros = torch.ops.aten.new_zeros.default(arg0_1, [mul, 4], pin_memory = False);  arg0_1 = mul = None
    view = torch.ops.aten.view.default(new_zeros, [-1, 4]);  new_zeros = None
    return view""",
        )
        self.assertEqual(self._run(gm, 3).shape, (6, 4))

    def test_nary_sum_unchanged(self):
        # sympy.Add is n-ary too, but its handler is torch.sym_sum, which takes
        # any number of terms: 2.13.0 (with or without the fix) builds one
        # sym_sum node, 2.15.0 folds every n-ary handler, sym_sum included, into
        # a chain of two-term nodes. Both are right; what must hold is that
        # the sum is built from sym_sum nodes and that every term reaches it.
        gm, fake_mode, args = self._trace(lambda u0, u1, u2: u0 + u1 + u2)
        self._check_graph_runs(gm, fake_mode, args)
        targets = {
            n.target
            for n in gm.graph.nodes
            if n.op == "call_function" and not isinstance(n.target, torch._ops.OpOverload)
        }
        self.assertEqual(targets, {torch.sym_sum})
        self.assertEqual(self._run(gm, 3, 5, 7).shape, (15, 4))
        self.assertEqual(self._run(gm, 1, 10, 100).shape, (111, 4))
        self.assertEqual(self._run(gm, 0, 0, 2).shape, (2, 4))


class TestSymExprProxyNaryModes(TestCase):
    """A make_fx(tracing_mode="symbolic") capture whose graph gets the
    product u0*u1*u2 of three unbacked sizes rebuilt from SymPy (the flatten
    of a data-dependent [u0, u1, u2, 4] slice, its token count computed with
    proxy tracing off, as DTensor does): one trace per mode, replayed at
    other sizes (0, 1, the whole input, far from the hint) against eager
    (symfix: proxy-nary-sym-expr).  Stock 2.13.0 prints mul(a, b, c) as
    a * b: the graph reshapes to u0*u1 tokens."""

    # (x's leading dims, counts): the hint, an empty slice, ones, the whole
    # input, and far from the hint
    SIZES = [
        ((5, 6, 7), (2, 3, 4)),
        ((5, 6, 7), (0, 3, 4)),
        ((1, 1, 1), (1, 1, 1)),
        ((5, 6, 7), (5, 6, 7)),
        ((40, 3, 9), (33, 2, 9)),
    ]

    @staticmethod
    def step(x, counts, w):
        from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

        u0, u1, u2 = counts.tolist()
        for u, dim in zip((u0, u1, u2), x.shape[:3]):
            torch._check(u >= 0)
            torch._check(u <= dim)
        tokens = x[:u0, :u1, :u2]
        with disable_proxy_modes_tracing():
            n = u0 * u1 * u2
        # the matmul makes autocast cast
        return (tokens.reshape(n, 4) @ w).sin() * 2

    @staticmethod
    def _inputs(dims, counts, requires_grad):
        x = torch.randn(*dims, 4, requires_grad=requires_grad)
        return x, torch.tensor(counts), torch.randn(4, 3, requires_grad=requires_grad)

    def test_modes_match_eager(self):
        for name, (mode, requires_grad) in _MODES.items():
            with self.subTest(mode=name):
                dims, counts = self.SIZES[0]
                with mode():
                    gm = make_fx(self.step, tracing_mode="symbolic")(
                        *self._inputs(dims, counts, requires_grad)
                    )
                for dims, counts in self.SIZES:
                    msg = f"{name} {dims} {counts}"
                    x, c, w = self._inputs(dims, counts, requires_grad)
                    x_g, w_g = (t.detach().clone().requires_grad_(requires_grad) for t in (x, w))
                    with mode():
                        got, ref = gm(x_g, c, w_g), self.step(x, c, w)
                    self.assertEqual(got.shape, ref.shape, msg=msg)
                    self.assertEqual(got.stride(), ref.stride(), msg=msg)
                    self.assertEqual(got.dtype, ref.dtype, msg=msg)
                    self.assertEqual(got.requires_grad, ref.requires_grad, msg=msg)
                    tol = {"atol": 2e-2, "rtol": 2e-2} if ref.dtype == torch.bfloat16 else {}
                    self.assertEqual(got, ref, msg=msg, **tol)
                    if ref.requires_grad:
                        got.sum().backward()
                        ref.sum().backward()
                        self.assertEqual(x_g.grad, x.grad, msg=msg)
                        self.assertEqual(w_g.grad, w.grad, msg=msg)


class TestMakeFxRuntimeAsserts(TestCase):
    """A make_fx capture runs no check of the ShapeEnv's facts (torch._check, the marks' ranges)
    until the caller inserts them: upstream's insert_deferred_runtime_asserts, then
    gm.recompile() (the pass edits the graph, not the module's code). The graph trainer workload
    (test/distributed/_graph_trainer_model.py) does this; docs/audit.md tells users to."""

    @staticmethod
    def capture():
        from torch.fx.experimental.symbolic_shapes import DimDynamic

        def step(x):
            torch._check(x.size(0) != 7)
            return x.sum(0) / x.size(0)

        example = torch.randn(5, 3)
        torch._dynamo.decorators.mark_unbacked(example, 0, min=2, max=100)
        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        ctx = StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.UNBACKED, DimDynamic.STATIC],
            unbacked_bounds=example._dynamo_unbacked_bounds,
        )
        fake = fake_mode.from_tensor(
            example, source=LocalSource("x", is_input=True), symbolic_context=ctx
        )
        with fake_mode:
            gm = make_fx(step)(fake)
        return gm, fake_mode.shape_env, step

    def test_inserted_asserts_refuse_what_the_trace_assumed(self):
        from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

        gm, shape_env, step = self.capture()
        self.assertEqual(gm(torch.ones(7, 3)), torch.ones(3))  # nothing checked yet
        insert_deferred_runtime_asserts(gm, shape_env, "step")
        gm.recompile()
        for n in (7, 1, 101):
            with self.assertRaisesRegex(RuntimeError, "Runtime assertion failed"):
                gm(torch.randn(n, 3))
        for n in (2, 5, 100):
            x = torch.randn(n, 3)
            self.assertEqual(gm(x), step(x))


if __name__ == "__main__":
    run_tests()
