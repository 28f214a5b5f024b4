"""pip install . : the anvil Python package, its native module built by CMake (the anvil_python target, as
`make python` builds it) from this checkout.

    python3 -m venv --system-site-packages ~/venvs/anvil && ~/venvs/anvil/bin/pip install --no-build-isolation .

Debian's pip installs into the system only with --break-system-packages; a venv with --system-site-packages
keeps Debian's numpy and torch visible. --no-build-isolation uses the installed setuptools instead of fetching
one. Environment: ANVIL_BUILD, a CMake build tree to build in (and reuse; default build/pip), ANVIL_CUDA
(AUTO, ON, OFF; default AUTO: the CUDA backend where nvcc is found), JOBS (parallel compiles).
"""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
SCRATCH = os.path.join(ROOT, "build", "setuptools")  # setuptools' own files, beside the CMake trees
os.makedirs(SCRATCH, exist_ok=True)


def version():
    for line in open(os.path.join(ROOT, "CMakeLists.txt")):
        if line.strip().startswith("project(anvil VERSION"):
            return line.split("VERSION")[1].split()[0]
    return "0.0.0"


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        tree = os.path.abspath(os.environ.get("ANVIL_BUILD", os.path.join(ROOT, "build", "pip")))
        jobs = os.environ.get("JOBS", str(os.cpu_count() or 1))
        if not os.path.exists(os.path.join(tree, "CMakeCache.txt")):  # a tree configured already keeps its settings
            subprocess.check_call(["cmake", "-S", ROOT, "-B", tree, "-DCMAKE_BUILD_TYPE=Release", "-DANVIL_PYTHON=ON",
                                   f"-DPython_EXECUTABLE={sys.executable}",
                                   "-DANVIL_CUDA=" + os.environ.get("ANVIL_CUDA", "AUTO")])
        subprocess.check_call(["cmake", "--build", tree, "-j", jobs, "--target", "anvil_python"])
        built = os.path.join(tree, "python", "anvil")
        dest = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        os.makedirs(dest, exist_ok=True)
        native = [f for f in os.listdir(built) if f.startswith("_anvil") and f.endswith(".so")]
        if not native:
            sys.exit(f"setup.py: the build left no _anvil*.so in {built}")
        shutil.copy2(os.path.join(built, native[0]), self.get_ext_fullpath(ext.name))


setup(
    name="anvil",
    version=version(),
    description="Pretrain, fine-tune, evaluate and serve GPT-style language models (anvil's Python layer)",
    packages=["anvil"],
    package_dir={"": "python"},
    package_data={"anvil": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("anvil._anvil", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": SCRATCH}, "egg_info": {"egg_base": SCRATCH}},
    python_requires=">=3.9",
    install_requires=["numpy"],
    zip_safe=False,
)
