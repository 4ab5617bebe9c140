# Owner(s): ["module: dynamo"]
import json
import logging

import torch
from torch._dynamo.source import LocalSource
from torch._logging._internal import TorchLogsFormatter, trace_log
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    free_unbacked_symbols,
    ShapeEnv,
    StatelessSymbolicContext,
)
from torch.testing._internal.common_utils import run_tests, TestCase


class _CollectLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class TestDescribeStorageSizeHint(TestCase):
    """
    describe_storage records for FakeTensor storages whose size is symbolic
    (symfix backport of pytorch/pytorch#183839, issue #183835).
    """

    def _describe(self, fake: torch.Tensor) -> dict:
        # Re-fakify ``fake`` (owned by another FakeTensorMode) with a source, so
        # the MetaConverter emits describe_storage through trace_structured and
        # the same formatter TORCH_TRACE uses serializes it to JSON.
        handler = _CollectLines()
        handler.setFormatter(TorchLogsFormatter(trace=True))
        old_level = trace_log.level
        trace_log.addHandler(handler)
        trace_log.setLevel(logging.DEBUG)
        try:
            FakeTensorMode(shape_env=ShapeEnv()).from_tensor(
                fake, source=LocalSource("x")
            )
        finally:
            trace_log.removeHandler(handler)
            trace_log.setLevel(old_level)
        records = []
        for line in handler.lines:
            # "<glog prefix>] {json}" followed by optional tab-indented payload
            first = line.split("\n", 1)[0]
            record = json.loads(first.split("] ", 1)[1])
            if "describe_storage" in record:
                records.append(record["describe_storage"])
        self.assertEqual(len(records), 1, handler.lines)
        return records[0]

    def _unbacked_fake(self, *sizes, hint_override=None):
        # Fakify a real tensor with every dim unbacked in its own ShapeEnv;
        # hint_override goes through mark_unbacked like a user would write it.
        real = torch.empty(*sizes)
        for d in range(real.dim()):
            torch._dynamo.decorators.mark_unbacked(
                real,
                d,
                hint_override=None if hint_override is None else hint_override[d],
            )
        shape_env = ShapeEnv()
        ctx = StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.UNBACKED] * real.dim()
        )
        fake = FakeTensorMode(shape_env=shape_env).from_tensor(
            real, source=LocalSource("t"), symbolic_context=ctx
        )
        shape_env.pending_fresh_unbacked_symbols.clear()
        return fake, shape_env

    def test_size_hint_from_mark_unbacked_hint_override(self):
        fake, shape_env = self._unbacked_fake(5, 3, hint_override=[16, 3])
        desc = self._describe(fake)
        (s0, s1) = fake.shape
        # size stays the symbolic expression ...
        self.assertIsInstance(desc["size"], str)
        self.assertEqual(desc["size"], repr(fake.untyped_storage().size()))
        self.assertIn(str(s0.node.expr), desc["size"])
        # ... and the hint is a separate, plain JSON number
        self.assertIsInstance(desc["size_hint"], int)
        self.assertEqual(desc["size_hint"], 16 * 3 * fake.element_size())

    def test_size_hint_from_override_optimization_hint(self):
        shape_env = ShapeEnv()
        mode = FakeTensorMode(shape_env=shape_env)
        u0 = shape_env.create_unbacked_symint()
        u1 = shape_env.create_unbacked_symint()
        torch._dynamo.override_optimization_hint(u0, 6)
        torch._dynamo.override_optimization_hint(u1, 7)
        with mode:
            fake = torch.empty(u0, 2 * u1 + 1, dtype=torch.float16)
        shape_env.pending_fresh_unbacked_symbols.clear()
        desc = self._describe(fake)
        self.assertIsInstance(desc["size"], str)
        self.assertIn("u0", desc["size"])
        self.assertIn("u1", desc["size"])
        self.assertEqual(desc["size_hint"], 6 * (2 * 7 + 1) * fake.element_size())

    def test_no_size_hint_without_override(self):
        fake, _ = self._unbacked_fake(5, 3)
        desc = self._describe(fake)
        self.assertIsInstance(desc["size"], str)
        self.assertTrue(free_unbacked_symbols(fake.untyped_storage().size()))
        self.assertNotIn("size_hint", desc)

    def test_no_size_hint_when_one_symbol_lacks_override(self):
        shape_env = ShapeEnv()
        mode = FakeTensorMode(shape_env=shape_env)
        u0 = shape_env.create_unbacked_symint()
        u1 = shape_env.create_unbacked_symint()
        torch._dynamo.override_optimization_hint(u0, 6)
        with mode:
            fake = torch.empty(u0, u1)
        shape_env.pending_fresh_unbacked_symbols.clear()
        desc = self._describe(fake)
        self.assertIn("u1", desc["size"])
        self.assertNotIn("size_hint", desc)

    def test_describing_with_hint_does_not_specialize(self):
        fake, shape_env = self._unbacked_fake(5, 3, hint_override=[16, 3])
        self._describe(fake)
        # the hint was only read: the storage size is still symbolic, no
        # replacement or guard pins it to the hinted value
        size = fake.untyped_storage().size()
        self.assertIsInstance(size, torch.SymInt)
        self.assertTrue(free_unbacked_symbols(size))
        for s in free_unbacked_symbols(size):
            self.assertNotIn(s, shape_env.replacements)
        self.assertEqual(shape_env.guards, [])

    def test_real_storage_size_stays_int(self):
        desc = self._describe(torch.empty(4, 3))
        self.assertEqual(desc["size"], 4 * 3 * 4)
        self.assertNotIn("size_hint", desc)


if __name__ == "__main__":
    run_tests()
