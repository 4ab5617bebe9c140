# Owner(s): ["module: dynamo"]
"""Dynamo called under a FakeTensorMode whose sizes are unbacked (pytorch#187547): FlexAttention
with a BlockMask whose ``seq_lengths`` are that trace's unbacked SymInts graph-broke in strict
(fullgraph) Dynamo ("Attempted to wrap unbacked SymInt")."""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.nn.attention.flex_attention import BlockMask, flex_attention, noop_mask
from torch.testing._internal.common_utils import run_tests, TestCase


def block_mask(q_len, kv_len):
    q_blocks, kv_blocks = (q_len + 127) // 128, (kv_len + 127) // 128
    kv_num = torch.full((1, 1, q_blocks), kv_blocks, dtype=torch.int32)
    kv_idx = torch.arange(kv_blocks, dtype=torch.int32).expand(1, 1, q_blocks, kv_blocks)
    return BlockMask.from_kv_blocks(kv_num, kv_idx.contiguous(), BLOCK_SIZE=128,
                                    mask_mod=noop_mask, seq_lengths=(q_len, kv_len))


def attend(q, k, v, mask):
    return flex_attention(q, k, v, block_mask=mask) * 2


def inputs(q_len, kv_len):
    return {"q": torch.randn(1, 2, q_len, 16), "k": torch.randn(1, 2, kv_len, 16),
            "v": torch.randn(1, 2, kv_len, 16), "mask": block_mask(q_len, kv_len)}


class TestRawUnbackedSymIntInputs(TestCase):
    def capture(self):
        """attend compiled fullgraph on fake inputs of an unbacked length s (keys: s + 3): the
        graph and its placeholders' example values."""
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm

        shape_env = ShapeEnv()
        with FakeTensorMode(shape_env=shape_env):
            s = shape_env.create_unbacked_symint()
            torch._check(s >= 1)
            torch._check(s <= 4096)
            out = torch.compile(attend, backend=backend, fullgraph=True)(**inputs(s, s + 3))
        self.assertEqual(str(out.shape), "torch.Size([1, 2, u0, 16])")
        self.assertEqual(len(graphs), 1)
        return graphs[0]

    def test_block_mask_lengths_of_an_outer_trace_compile_and_match_eager(self):
        gm = self.capture()
        holders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        # bind the placeholders to real values: tensors and seq_lengths by name, each size
        # symbol by a tensor placeholder that has it as a size
        for q_len in (1, 130, 257):
            real = inputs(q_len, q_len + 3)
            by_name = {"l_q_": real["q"], "l_k_": real["k"], "l_v_": real["v"],
                       "l_mask_seq_lengths_0_": q_len, "l_mask_seq_lengths_1_": q_len + 3}
            for attr in ("kv_num_blocks", "kv_indices", "q_num_blocks", "q_indices",
                         "full_kv_num_blocks", "full_kv_indices"):
                by_name[f"l_mask_{attr}"] = getattr(real["mask"], attr)
            sizes = {str(d): by_name[n.name].size(i) for n in holders if n.name in by_name
                     and isinstance(by_name[n.name], torch.Tensor)
                     for i, d in enumerate(n.meta["example_value"].shape)}
            args = [by_name[n.name] if n.name in by_name else sizes[str(n.meta["example_value"])]
                    for n in holders]
            got = gm(*args)
            got = got[0] if isinstance(got, (tuple, list)) else got
            self.assertEqual(got, attend(**real), atol=1e-5, rtol=1e-5)


if __name__ == "__main__":
    run_tests()
