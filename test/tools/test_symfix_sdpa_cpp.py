# Owner(s): ["module: ci"]
"""Tests of the source-only patch 0015 (sdpa-nonzero-seq-guard-or-false-cpp), a C++ header
change: the wheel build skips it, and it applies to 2.13.0's header and compiles against 2.13.0's
headers.

The official wheel ships the header the patch changes as
torch/include/ATen/native/transformers/sdp_utils_cpp.h, wrapped by the packaging in a
TORCH_STABLE_ONLY guard; unwrapped, it is the v2.13.0 source file.
"""

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from torch.testing._internal.common_utils import run_tests, TestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from symfixlib import git  # noqa: E402
from symfixlib.series import git_blob_id  # noqa: E402
from test_symfix_source import source_file  # noqa: E402
from test_symfix_wheel import real_base_wheel, SERIES  # noqa: E402

FIX = "sdpa-nonzero-seq-guard-or-false-cpp"
SOURCE = "aten/src/ATen/native/transformers/sdp_utils_cpp.h"
SHIPPED = "torch/include/ATen/native/transformers/sdp_utils_cpp.h"
# A translation unit that calls the patched check, so its body is type-checked.
TU = """#include <ATen/native/transformers/sdp_utils_cpp.h>

bool nonzero_lengths(const sdp::sdp_params& params) {
  return sdp::check_nonzero_sequence_lengths_dense(params, /*debug=*/false);
}
"""


class TestSdpaCppPatch(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.patch = next(p for p in SERIES.patches if SERIES.fix_for(p).id == FIX)
        (cls.change,) = cls.patch.changes
        cls.tmp = Path(tempfile.mkdtemp(prefix="symfix-sdpa-cpp-"))
        with zipfile.ZipFile(real_base_wheel()) as zf:
            members = [n for n in zf.namelist() if n.startswith("torch/include/")]
            zf.extractall(cls.tmp / "wheel", members)
            cls.source = source_file(zf, SOURCE)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    def patched_header(self) -> bytes:
        tree = self.tmp / "tree"
        (tree / SOURCE).parent.mkdir(parents=True, exist_ok=True)
        (tree / SOURCE).write_bytes(self.source)
        self.assertIsNone(git.apply(self.patch, tree))
        return (tree / SOURCE).read_bytes()

    def test_source_only(self):
        self.assertEqual(self.change.path, SOURCE)
        self.assertFalse(self.patch.wheel)
        self.assertNotIn(self.patch, SERIES.wheel_patches)
        self.assertNotIn(SOURCE, SERIES.touched_files())
        self.assertEqual(SERIES.touched_files(source=True)[SOURCE], self.change.pre_blob)

    def test_wheel_header_is_the_patch_base(self):
        self.assertEqual(git_blob_id(self.source), self.change.pre_blob)

    def test_applies_to_the_wheel_header(self):
        header = self.patched_header()
        self.assertEqual(git_blob_id(header), self.change.post_blob)
        self.assertIn(b"TORCH_GUARD_OR_FALSE(params.query.sym_size(-2).sym_ne(0))", header)

    def test_guard_or_false_is_in_2_13_c10(self):
        symbool = (self.tmp / "wheel" / "torch/include/c10/core/SymBool.h").read_text()
        self.assertIn("#define TORCH_GUARD_OR_FALSE(cond)", symbool)

    def test_patched_header_compiles(self):
        # the patched header in a directory searched before the wheel's include dirs
        overlay = self.tmp / "overlay"
        header = overlay / SHIPPED.removeprefix("torch/include/")
        header.parent.mkdir(parents=True, exist_ok=True)
        header.write_bytes(self.patched_header())
        (self.tmp / "tu.cpp").write_text(TU)
        inc = self.tmp / "wheel" / "torch" / "include"
        proc = subprocess.run(
            ["g++", "-std=c++17", "-fsyntax-only", "-H", f"-I{overlay}", f"-I{inc}",
             f"-I{inc / 'torch/csrc/api/include'}", str(self.tmp / "tu.cpp")],
            capture_output=True, text=True, timeout=300,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr[-4000:])
        # -H lists every header read: the patched one, not the wheel's
        self.assertIn(f". {header}\n", proc.stderr)
        self.assertNotIn(SHIPPED, proc.stderr)


if __name__ == "__main__":
    run_tests()
