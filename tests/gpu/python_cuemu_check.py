#!/usr/bin/env python3
"""Issue 48's GPU paths of the Python layer, under cuemu (the emulator's build tree, ctest gpu_tests_python): what
bench/gpu_python_check.py checks on a card, as far as a machine without one can. The emulator's device memory is
host memory, so the CUDA tensor's bytes are read straight from its address, where on a card torch.from_dlpack
would take them.

  1. anvil.train(device="cuda") runs its steps and calls on_step for each;
  2. Model.load(device="cuda"): forward's logits are a CUDA tensor: __dlpack_device__ (2, 0), the DLPack capsule's
     DLTensor names kDLCUDA and the tensor's own address, __cuda_array_interface__ the same address, shape and
     type, and __array_interface__ refuses (a CUDA tensor);
  3. the logits there agree with the CPU model's within 1e-4 of the largest;
  4. they outlive the model (`del`), and anvil.Tensor.from_dlpack of the tensor wraps the same memory.
Exit 77 (skipped) without numpy.
"""
import ctypes
import os
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("SKIPPED: needs numpy (apt-get install python3-numpy)")
    sys.exit(77)
import anvil  # noqa: E402

KDL_CUDA = 2


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", ctypes.c_uint32), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def capsule_tensor(capsule):
    """The DLTensor an unversioned "dltensor" capsule holds (it stays owned by the capsule)."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return DLTensor.from_address(get(capsule, b"dltensor"))


def device_values(t):
    """A float32 CUDA tensor's values, read from its address (the emulator's device memory is the host's)."""
    n = t.numel()
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(t.data_ptr())).reshape(t.shape).copy()


def main():
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as d:
        text = os.path.join(d, "text.txt")
        with open(text, "w") as f:
            f.write("the quick brown fox jumps over the lazy dog. " * 200)
        seen = []
        summary = anvil.train(data=text, out=os.path.join(d, "run"), device="cuda", steps=4, layers=2, heads=2,
                              dim=32, seq=32, batch=4, eval_every=0, tensorboard="off", on_step=seen.append)
        check(summary.get("steps") == 4 and len(seen) == 4, f"anvil.train(device='cuda'): 4 steps, {len(seen)} "
              f"callbacks, loss {seen[0]['loss']:.3f} -> {seen[-1]['loss']:.3f}" if seen else "anvil.train ran")
        gpu = anvil.Model.load(os.path.join(d, "run"), device="cuda")
        cpu = anvil.Model.load(os.path.join(d, "run"), device="cpu")
        check(gpu.device == "cuda", f"Model.load(device='cuda').device is {gpu.device}")
        ids = np.random.default_rng(1).integers(0, 257, size=(2, 32))
        t = gpu.forward(ids)
        check(t.device == "cuda:0" and t.__dlpack_device__() == (KDL_CUDA, 0),
              f"forward's logits on {t.device}, __dlpack_device__ {t.__dlpack_device__()}")
        cap = t.__dlpack__()
        dl = capsule_tensor(cap)
        check(dl.device.device_type == KDL_CUDA and dl.data == t.data_ptr() and dl.ndim == len(t.shape) and
              tuple(dl.shape[i] for i in range(dl.ndim)) == tuple(t.shape),
              f"the DLPack capsule: device type {dl.device.device_type}, the tensor's address and shape")
        cai = t.__cuda_array_interface__
        check(cai["data"][0] == t.data_ptr() and tuple(cai["shape"]) == tuple(t.shape) and cai["typestr"] == "<f4",
              f"__cuda_array_interface__: {cai['typestr']} {tuple(cai['shape'])}, the same address")
        try:
            t.__array_interface__
            check(False, "__array_interface__ refuses a CUDA tensor")
        except AttributeError:
            check(True, "__array_interface__ refuses a CUDA tensor")
        ref = np.asarray(cpu.forward(ids))
        got = device_values(t)
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        check(err < 1e-4, f"the device's logits match the CPU model's (max error {err:.1e} of the largest)")
        again = anvil.Tensor.from_dlpack(t)
        check(again.data_ptr() == t.data_ptr() and again.device == "cuda:0",
              "anvil.Tensor.from_dlpack of a CUDA tensor wraps the same memory")
        del gpu, cap
        check(np.array_equal(device_values(t), got), "the logits outlive the model")
    if failures:
        print(f"FAILED: {len(failures)} check(s)")
        return 1
    print("PASSED: the Python layer's CUDA paths under cuemu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
