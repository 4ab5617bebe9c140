# Owner(s): ["module: ci"]
"""Tests of the source-only patch 0015 (sdpa-nonzero-seq-guard-or-false-cpp), a C++ header
change: the wheel build skips it, and it applies to 2.13.0's header and compiles against 2.13.0's
headers.

The official wheel ships the header the patch changes as
torch/include/ATen/native/transformers/sdp_utils_cpp.h, wrapped by the packaging in a
TORCH_STABLE_ONLY guard; unwrapped, it is the v2.13.0 source file.
"""

import importlib.util
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.utils import cpp_extension

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from symfixlib import git  # noqa: E402
from symfixlib.series import git_blob_id  # noqa: E402
from test_symfix_source import source_file, unwrap_header  # noqa: E402
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


EXTENSION = """#include <torch/extension.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>

bool nonzero_lengths(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  sdp::sdp_params params{q, k, v, std::nullopt, 0.0, false, false};
  return sdp::check_nonzero_sequence_lengths_dense(params, /*debug=*/false);
}

PYBIND11_MODULE(symfix_sdpa_check, m) { m.def("nonzero_lengths", &nonzero_lengths); }
"""


def build_header() -> bytes:
    """The header this torch's build compiled: the installed one, and for a symfix build the
    header its source build compiles (the installed v2.13.0 one with 0015 applied; the wheel
    build cannot carry a C++ change, so the patched wheel ships the stock header)."""
    installed = Path(torch.__file__).parent / "include" / SHIPPED.removeprefix("torch/include/")
    if importlib.util.find_spec("torch._symfix") is None:
        return installed.read_bytes()
    text = unwrap_header(installed.read_text(), SOURCE)
    patch = next(p for p in SERIES.patches if SERIES.fix_for(p).id == FIX)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / SOURCE).parent.mkdir(parents=True)
        (Path(tmp) / SOURCE).write_text(text)
        assert git.apply(patch, Path(tmp)) is None
        return (Path(tmp) / SOURCE).read_bytes()


class TestSdpaCppCheckCompiled(TestCase):
    """The C++ check itself, on traced unbacked lengths: the header of this build compiled into
    a small extension against this torch's headers and libtorch, called with fake tensors whose
    query length is an unbacked SymInt (0 allowed). Stock 2.13.0's header guards on it (a
    data-dependent error); 0015's and 2.15.0's answer false (not known non-zero: the math
    backend). This is 0015's proof without a source build."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if shutil.which("g++") is None:
            raise AssertionError("0015's proof needs a C++ compiler (g++): none on PATH")
        cls.tmp = Path(tempfile.mkdtemp(prefix="symfix-sdpa-ext-"))
        overlay = cls.tmp / "overlay"
        header = overlay / SHIPPED.removeprefix("torch/include/")
        header.parent.mkdir(parents=True)
        header.write_bytes(build_header())
        (cls.tmp / "ext.cpp").write_text(EXTENSION)
        out = cls.tmp / f"symfix_sdpa_check{sysconfig.get_config_var('EXT_SUFFIX')}"
        libs = cpp_extension.library_paths()
        proc = subprocess.run(
            ["g++", "-std=c++20", "-O0", "-shared", "-fPIC", f"-I{overlay}",
             *(f"-I{p}" for p in cpp_extension.include_paths()),
             f"-I{sysconfig.get_paths()['include']}",
             f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
             str(cls.tmp / "ext.cpp"), "-o", str(out), *(f"-L{p}" for p in libs),
             *(f"-Wl,-rpath,{p}" for p in libs), "-lc10", "-ltorch", "-ltorch_cpu",
             "-ltorch_python"],
            capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-4000:]
        spec = importlib.util.spec_from_file_location("symfix_sdpa_check", out)
        cls.ext = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cls.ext)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    def test_unbacked_length_answers_false(self):
        shape_env = ShapeEnv()
        mode = FakeTensorMode(shape_env=shape_env)
        with mode:
            seq_len = shape_env.create_unbacked_symint()
            torch._check(seq_len >= 0)
            q = torch.empty(2, 3, seq_len, 8)
            k = v = torch.empty(2, 3, 6, 8)
        self.assertFalse(self.ext.nonzero_lengths(q, k, v))

    def test_static_lengths(self):
        # guard: a real zero length is refused, real non-zero lengths are accepted
        k = v = torch.randn(2, 3, 6, 8)
        self.assertTrue(self.ext.nonzero_lengths(torch.randn(2, 3, 4, 8), k, v))
        self.assertFalse(self.ext.nonzero_lengths(torch.randn(2, 3, 0, 8), k, v))


if __name__ == "__main__":
    run_tests()
