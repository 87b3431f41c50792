"""Builds the extension module attnref._attnref from python/src/*.cpp and the headers in include/.

Options (environment variables):
  ATTNREF_EIGEN_INCLUDE  Eigen 3.4's include folder (default: pkg-config eigen3, then /usr/include/eigen3)
  ATTNREF_NATIVE=0       do not compile for the building machine's CPU (-march=native is the default,
                         as for attnref's benchmarks: the kernels pick AVX2 / AVX-512 at compile time)
  ATTNREF_OPT            the optimisation flag (default -O3)
"""

import glob
import os
import shutil
import subprocess

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup

ParallelCompile("ATTNREF_BUILD_JOBS", default=0).install()


def eigen_include():
    if os.environ.get("ATTNREF_EIGEN_INCLUDE"):
        return os.environ["ATTNREF_EIGEN_INCLUDE"]
    if shutil.which("pkg-config"):
        r = subprocess.run(["pkg-config", "--cflags-only-I", "eigen3"], capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().split()[0][2:]
    return "/usr/include/eigen3"


flags = [os.environ.get("ATTNREF_OPT", "-O3"), "-fopenmp"]
if os.environ.get("ATTNREF_NATIVE", "1") != "0":
    flags.append("-march=native")

here = os.path.dirname(os.path.abspath(__file__))
setup(
    ext_modules=[
        Pybind11Extension(
            "attnref._attnref",
            sorted(os.path.relpath(p, here) for p in glob.glob(os.path.join(here, "python/src/*.cpp"))),
            include_dirs=["include", "python/src", eigen_include()],
            extra_compile_args=flags,
            extra_link_args=["-fopenmp"],
            cxx_std=17,
        )
    ],
    cmdclass={"build_ext": build_ext},
)
