"""PEP 517 build backend of the zenflow-bind Python package. The metadata below is the one pip
sees (pyproject.toml's [project] table states the same for people and tools that read it).

A wheel holds the pure-Python package plus the native parts it drives, built by the project's own
CMake from the source tree this directory sits in (python/..): libzenbind.so.N (N: ZB_SOVERSION,
the ABI zenflow_bind/_native.py loads) and the zenflow-optimizer executable, both in
zenflow_bind/_lib/. Only the standard library is used, so
pip's isolated build environment needs no download.

config_settings: build-dir (default <project>/build/wheel, reused between builds), cmake-args
(extra arguments to the CMake configure step, space-separated).
"""

import base64
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.dirname(HERE)  # python
PROJECT = os.path.dirname(PACKAGE_DIR)
NAME = "zenflow_bind"


def _cmake_value(pattern, what):
    with open(os.path.join(PROJECT, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(pattern, f.read())
    if not m:
        raise RuntimeError(f"no {what} in {PROJECT}/CMakeLists.txt")
    return m.group(1)


def _version():
    return _cmake_value(r"project\(\s*zenflow-bind\s+VERSION\s+([0-9.]+)",
                        "project(zenflow-bind VERSION ...)")


def _soname():
    return "libzenbind.so." + _cmake_value(r"set\(\s*ZB_SOVERSION\s+([0-9]+)\s*\)",
                                           "set(ZB_SOVERSION N)")


def _metadata(version):
    """The core metadata, from the template the system packages install too (python/CMakeLists)."""
    with open(os.path.join(PACKAGE_DIR, "METADATA.in"), encoding="utf-8") as f:
        return f.read().replace("@PROJECT_VERSION@", version)


def _tag():
    return "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")


def _build_native(config_settings):
    settings = config_settings or {}
    build = settings.get("build-dir") or os.path.join(PROJECT, "build", "wheel")
    extra = shlex.split(settings.get("cmake-args", ""))
    if not shutil.which("cmake"):
        raise RuntimeError("building zenflow-bind needs cmake (and the -dev packages that "
                           "scripts/install-deps.sh installs)")
    subprocess.run(["cmake", "-S", PROJECT, "-B", build, "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                    "-DZB_BUILD_TESTS=OFF", "-DZB_BUILD_PLUGIN=OFF", *extra], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", build, "--target", "zenbind", "zenflow-optimizer",
                    "--parallel"], check=True)
    soname = _soname()
    return {soname: os.path.join(build, "libzenbind", soname),
            "zenflow-optimizer": os.path.join(build, "optimizer", "zenflow-optimizer")}


class _Wheel:
    def __init__(self, path):
        self.zip = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED)
        self.record = []

    def add(self, arcname, data, mode=0o644):
        info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (0o100000 | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.record.append(f"{arcname},sha256={digest},{len(data)}")

    def close(self, record_name):
        self.record.append(f"{record_name},,")
        self.zip.writestr(record_name, "\n".join(self.record) + "\n")
        self.zip.close()


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    natives = _build_native(config_settings)
    name = f"{NAME}-{version}-{_tag()}.whl"
    wheel = _Wheel(os.path.join(wheel_directory, name))
    source = os.path.join(PACKAGE_DIR, NAME)
    for root, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(root, f)
                with open(path, "rb") as fh:
                    wheel.add(os.path.relpath(path, PACKAGE_DIR), fh.read())
    for arcname, path in natives.items():
        with open(path, "rb") as fh:  # follows the soname symlink
            wheel.add(f"{NAME}/_lib/{arcname}", fh.read(), 0o755)
    info = f"{NAME}-{version}.dist-info"
    wheel.add(f"{info}/METADATA", _metadata(version).encode())
    wheel.add(f"{info}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: zenflow-bind backend\n"
                                f"Root-Is-Purelib: false\nTag: {_tag()}\n").encode())
    wheel.close(f"{info}/RECORD")
    return name


def build_sdist(sdist_directory, config_settings=None):
    raise RuntimeError("zenflow-bind's Python package is built from the whole source tree: "
                       "pip install ./python (a wheel), not an sdist")
