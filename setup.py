"""Build of PORT's C kernel library (kernels/src/*.c -> port/exec/_port_kernels*.so), and the wheel's package
data: build_py copies the top-level configs/ into port/configs/ and the C headers into port/exec/include/ (the
binding reads their prototypes; BuildPy below); MANIFEST.in puts the C
sources, headers, port-rt's main and the Makefile into the sdist, so port-rt builds from it.

The library is a plain shared object loaded with ctypes (port/exec/capi.py); it is
built as a setuptools Extension only so that `pip install -e .` builds it.

* Portable flags only (-O3 -fopenmp -std=c11); ISA-specific code is behind
  runtime CPU dispatch in the sources.  PORT_NATIVE=1 adds -march=native.
* GEMM goes to OpenBLAS from the PyPI wheel scipy-openblas32 (symbols prefixed
  scipy_cblas_*).  Its lib dir is added as rpath; at run time port/exec/capi.py
  additionally pre-loads libscipy_openblas.so from the *installed* wheel (the
  build may run in an isolated, temporary environment).
  PORT_NO_BLAS=1 builds without BLAS (vendored SGEMM only).

OpenMP: the sources are compiled with -fopenmp, but on Linux the library is
linked WITHOUT the OpenMP runtime (no DT_NEEDED libgomp; GOMP_*/omp_* stay
undefined).  port/exec/capi.py loads, RTLD_GLOBAL and before the library, the
OpenMP runtime torch already uses (torch/lib/libgomp*.so*), else the system
libgomp.so.1 -- so PORT and torch share ONE OpenMP thread pool (a second
libgomp copy would be a second spinning pool).  OpenBLAS is used
single-threaded (port__gemm splits GEMMs over the OpenMP threads itself).
PORT_LINK_OPENMP=1 links libgomp as before.

Sanitizer build (separate file, used by `make test-asan`; links libgomp, whose
soname libgomp.so.1 the loader shares with torch's copy when names match):
    python setup.py build_asan   ->  kernels/build/asan/libport_kernels_asan.so
"""
import glob
import os
import subprocess
import sys

import shutil

from setuptools import Command, Extension, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
SOURCES = sorted(glob.glob(os.path.join("kernels", "src", "*.c")) + glob.glob(os.path.join("kernels", "runtime", "*.c")))
SHIPPED = ("configs",)     # top-level folders the wheel carries as package data (port/<name>/)
INCLUDE = [os.path.join("kernels", "include"), os.path.join("kernels", "src")]


def _blas():
    """(include_dirs, library_dirs, libraries, extra_link_args, macros) for OpenBLAS."""
    if os.environ.get("PORT_NO_BLAS") == "1":
        return [], [], [], [], []
    try:
        import scipy_openblas32 as ob
    except ImportError:
        print("port setup: scipy_openblas32 not found, building with vendored SGEMM only",
              file=sys.stderr)
        return [], [], [], [], []
    lib_dir = ob.get_lib_dir()
    return ([ob.get_include_dir()], [lib_dir], [ob.get_library()],
            [f"-Wl,-rpath,{lib_dir}"], [("PORT_HAVE_OPENBLAS", "1")])


def _cflags(opt="-O3"):
    # -fno-trapping-math: no program reads the FP exception flags, so selects of computed values may be
    # if-converted and vectorised (results are unchanged: no reassociation, no fast-math)
    flags = [opt, "-fopenmp", "-std=c11", "-fno-trapping-math", "-fvisibility=hidden", "-Wall", "-Wextra",
             "-Wno-unused-parameter", "-D_GNU_SOURCE"]
    if os.environ.get("PORT_NATIVE") == "1":
        flags.append("-march=native")
    return flags


class BuildAsan(Command):
    """Build the kernels with ASan+UBSan into kernels/build/asan/."""

    description = "build libport_kernels_asan.so with -fsanitize=address,undefined"
    user_options = [("output=", "o", "output .so path")]

    def initialize_options(self):
        self.output = None

    def finalize_options(self):
        if self.output is None:
            self.output = os.path.join(ROOT, "kernels", "build", "asan",
                                       "libport_kernels_asan.so")

    def run(self):
        inc, libdirs, libs, link, macros = _blas()
        os.makedirs(os.path.dirname(self.output), exist_ok=True)
        cmd = ["gcc", "-shared", "-fPIC", "-g", "-fsanitize=address,undefined",
               "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
        cmd += [f for f in _cflags("-O1")]
        cmd += [f"-I{os.path.join(ROOT, d)}" for d in INCLUDE] + [f"-I{d}" for d in inc]
        cmd += [f"-D{k}={v}" for k, v in macros]
        cmd += [os.path.join(ROOT, s) for s in SOURCES]
        cmd += ["-o", self.output] + [f"-L{d}" for d in libdirs] + [f"-l{l}" for l in libs]
        cmd += link + ["-lm"]
        print(" ".join(cmd))
        subprocess.check_call(cmd)


class BuildPy(build_py):
    """build_py that also copies the top-level configs/ (experiment configs, device descriptions) into the built
    package as port/configs/: package data of the wheel, found by port.config.shipped_dir through
    importlib.resources. The repository keeps one copy (configs/); an editable install reads it in place."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for name in SHIPPED:
            src = os.path.join(ROOT, name)
            dst = os.path.join(self.build_lib, "port", name)
            if os.path.isdir(dst):
                shutil.rmtree(dst)
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.pyc", "__pycache__"))
        # the C headers: port/exec/capi.py binds the library from their PORT_API prototypes
        dst = os.path.join(self.build_lib, "port", "exec", "include")
        os.makedirs(dst, exist_ok=True)
        for h in glob.glob(os.path.join(ROOT, "kernels", "include", "*.h")):
            shutil.copy2(h, dst)


def _openmp_link():
    """Link flags for OpenMP: none on Linux (runtime pre-loaded by port/exec/capi.py)."""
    if sys.platform.startswith("linux") and os.environ.get("PORT_LINK_OPENMP") != "1":
        return []
    return ["-fopenmp"]


_inc, _libdirs, _libs, _link, _macros = _blas()

ext = Extension(
    "port.exec._port_kernels",
    sources=SOURCES,
    include_dirs=INCLUDE + _inc,
    library_dirs=_libdirs,
    libraries=_libs + ["m"],
    define_macros=_macros,
    extra_compile_args=_cflags(),
    extra_link_args=_openmp_link() + _link,
    depends=glob.glob(os.path.join("kernels", "include", "*.h"))
    + glob.glob(os.path.join("kernels", "src", "*.h")),
)

setup(ext_modules=[ext], cmdclass={"build_asan": BuildAsan, "build_py": BuildPy})
