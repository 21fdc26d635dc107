#!/usr/bin/env bash
# Can MXNet's own GPU kernels run on this GPU? (docs/mxnet.md, "MXNet on a GPU")
#
# No MXNet GPU wheel on PyPI (mxnet-cu112 1.9.1 and 2.0.0b1, mxnet-cu117 1.9.1, the newest) has
# sm_90 machine code or PTX in libmxnet.so, so on a Hopper GPU the driver has nothing to run or JIT.
# This probe checks that on the GPU itself, in one short call, without installing MXNet there
# (its wheel is 509 MB and links CUDA 11 libraries, cuDNN 8 among them, that the GPU machine lacks):
#
#   benchmarks/probes/mxnet_gpu_probe.sh stage   # here (needs pip and the index): writes .device-stage/mxnet/ (git-ignored)
#   benchmarks/probes/mxnet_gpu_probe.sh run     # on the GPU machine: device call with carry [".device-stage/mxnet"]
#
# `stage` downloads mxnet-cu117==1.9.1, lists the architectures of every fatbin in libmxnet.so and
# copies one real kernel fatbin (679 KB) out of it. `run` asks the CUDA driver (cuModuleLoadData) to
# load that fatbin, and, as controls, a one-kernel fatbin nvcc builds there as sm_86 machine code
# only (what MXNet ships), as sm_90 machine code, and as compute_86 PTX only. Results go to
# $OUT/mxnet_gpu_probe.json (or ./mxnet_gpu_probe.json) and stdout.
set -euo pipefail
root=$(git rev-parse --show-toplevel 2>/dev/null || pwd)
stage="$root/.device-stage/mxnet"
PY=${PYTHON:-python3}

fatbin_tool() {  # python: list the fatbins of an ELF file's .nv_fatbin section; optionally write one out
  "$PY" - "$@" <<'PYEOF'
import json, struct, sys
path, out = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
with open(path, "rb") as f:
    elf = f.read()
# ELF64 section headers: find .nv_fatbin by name (plain struct, no pyelftools needed)
shoff, = struct.unpack_from("<Q", elf, 0x28)
shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
def section(i):
    name, _t, _f, _a, off, size = struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize)
    return name, off, size
_, stroff, _ = section(shstrndx)
for i in range(shnum):
    name, off, size = section(i)
    if elf[stroff + name: elf.index(b"\0", stroff + name)] == b".nv_fatbin":
        data = elf[off: off + size]
        break
else:
    sys.exit(f"{path} has no .nv_fatbin section (no CUDA kernels)")
fatbins, pos = [], 0
while pos + 16 <= len(data):
    magic, _v, hsize, psize = struct.unpack_from("<IHHQ", data, pos)
    if magic != 0xBA55ED50:  # fatbins are 8-byte aligned in the section
        pos += 8
        continue
    entries, e, end = [], pos + hsize, pos + hsize + psize
    while e < end:  # entry: kind (1 PTX, 2 machine code), ..., arch at byte 28
        kind, _v, ehsize, epsize, _a, _b, _c, arch = struct.unpack_from("<HHIQIIII", data, e)
        entries.append(("ptx" if kind == 1 else "sm") + f"_{arch}")
        e += ehsize + epsize
    fatbins.append((pos, hsize + psize, entries))
    pos = end
kinds = sorted({k for _, _, ent in fatbins for k in ent}, key=lambda k: (k[:2], int(k.split("_")[1])))
summary = {"file": path, "fatbins": len(fatbins), "entries": kinds,
           "any_ptx": any(k.startswith("ptx") for k in kinds), "has_sm_90": "sm_90" in kinds}
print(json.dumps(summary))
if out:
    real = sorted((size, off) for off, size, _ in fatbins if size > 100_000)[0]  # the smallest with real kernels
    with open(out, "wb") as f:
        f.write(data[real[1]: real[1] + real[0]])
PYEOF
}

case "${1:-}" in
stage)
  cache=${MXNET_PROBE_CACHE:-/tmp/mxnet-probe-cache}
  mkdir -p "$cache" "$stage"
  [ -f "$cache"/mxnet_cu117-1.9.1-*.whl ] || "$PY" -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 -d "$cache" mxnet-cu117==1.9.1
  (cd "$cache" && unzip -q -o mxnet_cu117-1.9.1-*.whl mxnet/libmxnet.so)
  fatbin_tool "$cache/mxnet/libmxnet.so" "$stage/mxnet_cu117_kernels.fatbin" | tee "$stage/libmxnet_archs.json"
  cp "$0" "$stage/probe.sh"
  echo "staged $(du -sh "$stage" | cut -f1) in $stage; device call: carry [\".device-stage/mxnet\"], command: bash .device-stage/mxnet/probe.sh run"
  ;;
run)
  out=${OUT:-.}
  [ -f "$stage/mxnet_cu117_kernels.fatbin" ] || { echo "no $stage/mxnet_cu117_kernels.fatbin: run '$0 stage' first and carry .device-stage/mxnet" >&2; exit 2; }
  nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
  work=$(mktemp -d)
  printf '__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n' > "$work/k.cu"
  nvcc -fatbin -gencode arch=compute_86,code=sm_86 "$work/k.cu" -o "$work/control_sm86_sass_only.fatbin"
  nvcc -fatbin -gencode arch=compute_90,code=sm_90 "$work/k.cu" -o "$work/control_sm90_sass.fatbin"
  nvcc -fatbin -gencode arch=compute_86,code=compute_86 "$work/k.cu" -o "$work/control_compute86_ptx_only.fatbin"
  "$PY" - "$stage/mxnet_cu117_kernels.fatbin" "$work"/control_*.fatbin "$stage/libmxnet_archs.json" "$out/mxnet_gpu_probe.json" <<'PYEOF'
import ctypes, json, os, sys
*fatbins, archs, result = sys.argv[1:]
cuda = ctypes.CDLL("libcuda.so.1")
def name(code):
    s = ctypes.c_char_p()
    cuda.cuGetErrorName(code, ctypes.byref(s))
    return s.value.decode()
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
major, minor = ctypes.c_int(), ctypes.c_int()
cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)
loads = {}
for path in fatbins:
    image = open(path, "rb").read()
    module = ctypes.c_void_p()
    code = cuda.cuModuleLoadData(ctypes.byref(module), ctypes.create_string_buffer(image, len(image)))
    loads[os.path.basename(path)] = {"bytes": len(image), "cuModuleLoadData": name(code)}
    print(f"{os.path.basename(path):40s} {len(image):>8d} B  cuModuleLoadData -> {name(code)}")
report = {"compute_capability": f"{major.value}.{minor.value}", "loads": loads, "libmxnet_cu117": json.load(open(archs))}
json.dump(report, open(result, "w"), indent=1)
print("wrote", result)
PYEOF
  ;;
*)
  sed -n '2,16p' "$0"
  exit 2
  ;;
esac
