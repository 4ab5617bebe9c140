# Owner(s): ["oncall: pt2"]
"""OpInfo ops with every size unbacked: upstream's scoreboard of the base ops a graph trainer's step
is made of, run on every base symfix carries.

Each op's first float32 CPU sample whose tensors have a size >= 2, every size >= 2 of every tensor
marked unbacked, compiled with ``torch.compile(backend="eager", fullgraph=True)``, as upstream's
test does. The compiled result must equal eager's: shapes and dtypes, and values wherever eager
reproduces itself under the same seed (random ops: shape and dtype only).

Which ops are expected to fail is data, per base, beside the manifests:
``patches/<base>/ops_unbacked.toml``: ``[xfail]``, the ops that fail with every fix of the series,
each with why; ``[fixed]``, the ops that fail on the stock release and pass with the fix named. On
a symfix build each op's test expects ``[xfail]`` to fail (an unexpected success fails it) and
every other op to pass; on the stock release every op runs as it is, and exactly the ops of
``[xfail]`` and ``[fixed]`` fail: the matrix runs those of ``[fixed]`` as the fixes' proofs.
"""

import contextlib
import copy
import functools
import importlib.util
import tomllib
import unittest
from pathlib import Path

import torch
import torch._dynamo
from torch.testing._internal import common_methods_invocations
from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import DecorateInfo, op_db
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parents[1]
SYMFIX_BUILD = importlib.util.find_spec("torch._symfix") is not None
SAMPLES = 3
OPS = [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]


def op_key(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@functools.cache
def scoreboard_data(name: str = "ops_unbacked.toml") -> dict:
    """A scoreboard's data (``name``, beside this torch's base's manifest): its own series'
    file, or the one of the series it shares. test_dtensor_ops.py reads its own this way."""
    from packaging.version import Version

    pdir = ROOT / "patches" / f"v{Version(torch.__version__).public}"
    manifest = tomllib.loads((pdir / "manifest.toml").read_text())
    if of := manifest.get("series-of"):
        pdir = ROOT / "patches" / of
    return tomllib.loads((pdir / name).read_text())


class Skip(Exception):
    """The op has no sample to use or eager refuses it: not a result either way."""


def _tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def samples(op):
    """The first SAMPLES samples with a size to mark (upstream's test takes every one: about five
    times as long on two cores)."""
    found = [((s.input, *s.args), s.kwargs)
             for s in op.sample_inputs("cpu", torch.float32, requires_grad=False)
             if any(d >= 2 for t in _tensors((s.input, s.args, s.kwargs)) for d in t.shape)]
    found = found[:SAMPLES]
    if not found:
        raise Skip("no sample with a size >= 2")
    return found


def mark_unbacked(tree):
    for t in _tensors(tree):
        for dim, size in enumerate(t.shape):
            if size >= 2:
                torch._dynamo.decorators.mark_unbacked(t, dim)


def _describe(out):
    return [(tuple(t.shape), t.dtype) for t in _tensors(out)]


def _same(a, b) -> bool:
    if a.dtype == torch.complex32:  # no CPU kernels to compare with
        a, b = a.to(torch.complex64), b.to(torch.complex64)
    return a.shape == b.shape and (torch.equal(a, b) or (
        a.is_floating_point() or a.is_complex()) and torch.allclose(a, b, equal_nan=True))


# Ops whose result is uninitialized memory: only their shape and dtype are compared.
UNINITIALIZED = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")


@contextlib.contextmanager
def _seeded_outside():
    """Random OpInfo ops seed themselves inside the op (``wrapper_set_seed``), a call fullgraph
    Dynamo refuses at every size; the test seeds before each call instead, so that what is
    measured is the op."""
    wrapper = common_methods_invocations.wrapper_set_seed
    common_methods_invocations.wrapper_set_seed = lambda f, *a, **k: f(*a, **k)
    try:
        yield
    finally:
        common_methods_invocations.wrapper_set_seed = wrapper


def _seeded(fn, *args):
    torch.manual_seed(0)
    return fn(*args)


def check_op(testcase, op):
    """Compile each of ``op``'s samples with every size unbacked; the first difference from
    eager raises."""
    def run(a, k):
        return op(*a, **k)

    with _seeded_outside():
        for args, kwargs in samples(op):
            try:
                ref = _seeded(run, *copy.deepcopy((args, kwargs)))
                again = _seeded(run, *copy.deepcopy((args, kwargs)))
            except Exception as e:  # noqa: BLE001 - eager refuses it: nothing to compare
                raise Skip(f"eager raises {type(e).__name__}") from None
            mark_unbacked((args, kwargs))
            torch._dynamo.reset()
            got = _seeded(torch.compile(run, backend="eager", fullgraph=True), args, kwargs)
            testcase.assertEqual(_describe(got), _describe(ref), msg=op_key(op))
            if op.name in UNINITIALIZED:
                continue
            for i, (g, r, a) in enumerate(zip(_tensors(got), _tensors(ref), _tensors(again))):
                if _same(r, a):  # eager reproduces itself under the seed: the graph must too
                    testcase.assertTrue(_same(g, r), msg=f"{op_key(op)}: output {i} differs")


def expected_to_fail(op, data: str, test_class: str, test_name: str):
    """``op`` with upstream's xfail decoration of ``test_class.test_name`` where this symfix
    build's series lists it in the [xfail] of ``data``. A stock release runs every op as it is:
    the matrix reads its failures."""
    if not SYMFIX_BUILD or op_key(op) not in scoreboard_data(data)["xfail"]:
        return op
    op = copy.copy(op)
    op.decorators = (*op.decorators, DecorateInfo(unittest.expectedFailure, test_class, test_name))
    return op


class TestOpsUnbacked(TestCase):
    @classmethod
    def tearDownClass(cls):
        torch._dynamo.reset()
        super().tearDownClass()

    @ops([expected_to_fail(op, "ops_unbacked.toml", "TestOpsUnbacked", "test_unbacked")
          for op in OPS], allowed_dtypes=(torch.float32,))
    def test_unbacked(self, device, dtype, op):
        try:
            check_op(self, op)
        except Skip as e:
            self.skipTest(str(e))


instantiate_device_type_tests(TestOpsUnbacked, globals(), only_for=("cpu",))

if __name__ == "__main__":
    run_tests()
