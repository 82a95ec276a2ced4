"""What keeps the Python package and the C library in step: the library is the ABI the package
mirrors (zb_api_version, the SONAME's number, checked at load), every struct the package mirrors
has the size the library was built with (checked at load; either mismatch refused with EVERSION),
the environment names are the header's, the status names cover the header's statuses, and the dtype
and step-flag values are the worker header's."""
import ctypes
import os
import re
import unittest

from zenflow_bind import _native
import zenflow_bind.deepspeed  # noqa: F401  (its variable names are checked below)

PROJECT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
INCLUDE = os.path.join(PROJECT, "include", "zenbind")


def header(name="zenbind.h"):
    with open(os.path.join(INCLUDE, name)) as f:
        return f.read()


class Layouts(unittest.TestCase):
    def test_the_library_loads_and_every_mirror_matches(self):
        lib = _native.library()
        size = lib.zb_struct_size
        for name, mirror in _native._MIRRORS.items():
            self.assertEqual(size(name.encode()), ctypes.sizeof(mirror), name)

    def test_the_library_is_the_abi_mirrored(self):
        with open(os.path.join(PROJECT, "CMakeLists.txt")) as f:
            soversion = int(re.search(r"set\(ZB_SOVERSION (\d+)\)", f.read()).group(1))
        self.assertEqual(_native.API_VERSION, soversion)
        self.assertEqual(_native.SONAME, f"libzenbind.so.{soversion}")
        self.assertEqual(_native.library().zb_api_version(), soversion)
        # the calls ABI 2 removed are gone, and the binding names none of them
        for name in ("zb_worker_wait", "zb_worker_last_step_seconds", "zb_worker_attr_init",
                     "zb_adam_args_init", "zb_plan_compute_gpus"):
            self.assertFalse(hasattr(_native.library(), name), name)
            self.assertNotIn(name, _native._PROTOS)

    def test_a_library_of_another_abi_is_refused(self):
        class Library:
            def __init__(self, version):
                self.zb_api_version = lambda: version

        # 0x000500: what zb_api_version() returned before ABI 2 (the package version 0.5.0)
        for version, says in ((0x000500, "0.5.0, of an ABI before 2"), (3, "of ABI 3")):
            with self.assertRaises(_native.ZenbindError) as e:
                _native._check_api(Library(version), "/x/libzenbind.so")
            self.assertEqual(e.exception.status, "EVERSION")
            self.assertIn(f"/x/libzenbind.so is libzenbind {says}", str(e.exception))
            self.assertIn("needs ABI 2 (libzenbind.so.2)", str(e.exception))
        _native._check_api(Library(_native.API_VERSION), "/x/libzenbind.so")
        with self.assertRaises(_native.ZenbindError) as e:
            _native._check_api(object(), "/x/libother.so")
        self.assertEqual(e.exception.status, "EVERSION")

    def test_a_missing_library_says_how_to_get_one(self):
        import subprocess
        import sys
        # (__version__ then falls back to the installed metadata, none here: no attribute)
        script = ("import zenflow_bind; assert not hasattr(zenflow_bind, '__version__'); "
                  "zenflow_bind.library()")
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "ZENFLOW_BIND_LIB": "/no/libzb.so"})
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("OSError: /no/libzb.so: cannot open shared object file", r.stderr)
        self.assertIn("install the libzenbind2 package, or `pip install ./python`", r.stderr)

    def test_a_mirror_of_another_size_is_refused(self):
        class Shorter(ctypes.Structure):
            _fields_ = [("step", ctypes.c_int64)]

        saved = dict(_native._MIRRORS)
        _native._MIRRORS["zb_worker_step"] = Shorter
        try:
            path = _native.library_path()
            with self.assertRaises(_native.ZenbindError) as e:
                _native._check_layouts(ctypes.CDLL(path), path)
            self.assertEqual(e.exception.status, "EVERSION")
            self.assertIn("zb_worker_step", str(e.exception))
        finally:
            _native._MIRRORS.clear()
            _native._MIRRORS.update(saved)


class Names(unittest.TestCase):
    def test_environment_names_are_the_headers(self):
        names = dict(re.findall(r'#define ZB_ENV_(\w+) "(\w+)"', header()))
        self.assertEqual(names["TRAIN_CPUS"], "ZENFLOW_TRAIN_CPUS")
        source = open(zenflow_bind.deepspeed.__file__).read()
        for key in ("TRAIN_CPUS", "OPT_CPUS", "OPT_THREADS"):
            self.assertIn(f'"{names[key]}"', source, key)
        native = open(_native.__file__).read()
        self.assertIn(f'"{names["OPTIMIZER"]}"', native)

    def test_every_status_has_its_name(self):
        statuses = {int(v): k for k, v in re.findall(r"ZB_(E?[A-Z]+) = (-?\d+)", header())}
        for code, name in statuses.items():
            self.assertEqual(_native.STATUS.get(code), name, code)

    def test_dtypes_and_flags_are_the_headers(self):
        worker = header("worker.h")
        dtypes = {k.lower(): int(v) for k, v in re.findall(r"ZB_DTYPE_(\w+) = (\d+)", worker)}
        self.assertEqual(len(dtypes), 4)
        for name, value in dtypes.items():
            self.assertEqual(_native.DTYPES[name], value, name)
            if name != "none":
                self.assertEqual(_native.DTYPE_NAMES[value], name)
        limit = re.search(r"#define ZB_WORKER_MAX_GROUPS (\d+)", worker)
        self.assertEqual(int(limit.group(1)), _native.MAX_GROUPS)
        flags = dict(re.findall(r"#define ZB_STEP_(\w+) (0x\w+)u", worker))
        self.assertEqual(int(flags["SKIP_NONFINITE"], 16), _native.STEP_SKIP_NONFINITE)
        self.assertEqual(int(flags["GRAD_NORM"], 16), _native.STEP_GRAD_NORM)
        # each rule zb_adam_hyper_check can state begins with a name the binding translates
        for h, name in ((_native.hyper(-1.0, (0.9, 0.999), 1e-8, 0.0, True), "learning rate"),
                        (_native.hyper(1e-3, (1.0, 0.999), 1e-8, 0.0, True), "betas"),
                        (_native.hyper(1e-3, (0.9, 0.999), -1.0, 0.0, True), "eps"),
                        (_native.hyper(1e-3, (0.9, 0.999), 1e-8, -1.0, True), "weight_decay"),
                        (_native.hyper(1e-3, (0.9, 0.999), 1e-8, 0.0, 2), "adamw_mode")):
            with self.assertRaisesRegex(ValueError, f"^invalid {name}"):
                _native.check_hyper(h)
        flags = dict(re.findall(r"#define ZB_GROUP_(\w+) (0x\w+)u", worker))
        self.assertEqual(int(flags["STALE"], 16), _native.GROUP_STALE)
        self.assertEqual(int(flags["ONE_GRAD_BUFFER"], 16), _native.GROUP_ONE_GRAD_BUFFER)


if __name__ == "__main__":
    unittest.main(verbosity=2)
