"""crossdali's DALI plugin: compile the C++/CUDA operators under ``plugins/`` and load them into DALI.

    python -m crossdali.common.plugins build         # g++ (CPU) + nvcc (GPU, where nvcc is found); cached
    python -m crossdali.common.plugins build --cpu-only
    python -m crossdali.common.plugins path          # the library this environment would load

Every ``plugins/*/*.cc`` (CPU implementations and schemas) and ``plugins/*/*.cu`` (GPU implementations)
becomes one shared library, compiled against the headers and ``libdali.so`` of the installed DALI wheel
(``nvidia.dali.sysconfig``). DALI's headers include ``cuda_runtime.h`` even for CPU-only operators: without
nvcc they come from the pinned ``nvidia-cuda-runtime``, ``nvidia-cuda-crt`` and ``nvidia-cuda-cccl`` wheels
(requirements/base.txt). The library is cached under ``$CROSSDALI_CACHE/plugins`` (default
``~/.cache/crossdali/plugins``) in a folder named by a hash of the sources, the DALI version and the
compilers, so each environment builds once and a changed source rebuilds. ``load_plugin`` registers the
operators with ``nvidia.dali.plugin_manager.load_library``; they then appear under ``fn.crossdali``.

The operator here, ``fn.crossdali.color_jitter_normalize``, is the SSD train pipeline's colour jitter and
normalisation in one pass (``DetectionTransform(fused_colour=True)``); docs/custom-operators.md says how
to write, build and load one's own.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from crossdali.common.errors import UsageError

__all__ = ["PLUGIN_DIR", "LIBRARY_NAME", "BUILD_COMMAND", "PluginBuildError", "plugin_library", "build_plugin",
           "load_plugin", "color_jitter_normalize"]

log = logging.getLogger(__name__)

#: The operators' sources: one folder per operator, ``*.cc`` for the CPU and ``*.cu`` for the GPU.
PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugins"
LIBRARY_NAME = "libcrossdali_plugins.so"
BUILD_COMMAND = "python -m crossdali.common.plugins build"
_CXX_FLAGS = ("-std=c++20", "-O2", "-fPIC")  # DALI 2's headers need C++20
_loaded: list[Path] = []


class PluginBuildError(RuntimeError):
    """The compiler failed or is missing; the message names the command and the compiler's last lines."""


def _cache_root() -> Path:
    env = os.environ.get("CROSSDALI_CACHE")
    return (Path(env) if env else Path.home() / ".cache" / "crossdali") / "plugins"


def _sources() -> tuple[list[Path], list[Path]]:
    cc, cu = sorted(PLUGIN_DIR.glob("*/*.cc")), sorted(PLUGIN_DIR.glob("*/*.cu"))
    if not cc:
        raise UsageError(f"no operator sources under {PLUGIN_DIR} (plugins/*/*.cc): run from a crossdali checkout "
                         "installed with `pip install -e .`")
    return cc, cu


def _dali() -> tuple[str, list[str], list[str]]:
    """DALI's version, compile flags (include dir, ABI) and link flags, from the installed wheel."""
    import nvidia.dali as dali
    import nvidia.dali.sysconfig as sysconfig

    return dali.__version__, sysconfig.get_compile_flags(), sysconfig.get_link_flags()


def _wheel_cuda_include() -> Path | None:
    """The include folder of the pip CUDA headers (``nvidia/cu13/include``), if installed with crt and cccl."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        inc = Path(base) / "cu13" / "include"
        if (inc / "cuda_runtime.h").is_file() and (inc / "crt" / "host_config.h").is_file():
            return inc
    return None


def _nvcc() -> str | None:
    """nvcc from ``$CUDA_HOME/bin`` or ``PATH``, if it runs."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [str(Path(home) / "bin" / "nvcc")] if home else []
    candidates.append(shutil.which("nvcc") or "")
    for nvcc in filter(None, candidates):
        try:
            subprocess.run([nvcc, "--version"], check=True, capture_output=True, timeout=60)
            return nvcc
        except (OSError, subprocess.SubprocessError):
            continue
    return None


def _cuda_arch_flags() -> list[str]:
    """``$CROSSDALI_CUDA_ARCHS`` (e.g. ``90`` or ``80;90``) as real code; else the visible GPUs' own
    architecture (nvcc's ``native``); else PTX for compute 7.5, which the driver compiles for any newer GPU."""
    archs = os.environ.get("CROSSDALI_CUDA_ARCHS")
    if archs:
        return [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs.replace(",", ";").split(";") if a]
    try:
        gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        gpus = ""
    return ["-arch=native"] if "GPU" in gpus else ["-gencode=arch=compute_75,code=compute_75"]


def _version(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _plan(cuda: bool | None) -> dict:
    """What a build would compile, with what, and the cache folder that names all of it."""
    cc, cu = _sources()
    version, cflags, ldflags = _dali()
    cxx = os.environ.get("CXX", "g++")
    cuda_inc = _wheel_cuda_include()
    found = _nvcc() if (cuda is not False and cu) or cuda_inc is None else None  # a CPU build needs headers too
    nvcc = found if cuda is not False and cu else None
    if cuda and not nvcc:
        raise PluginBuildError("the GPU build needs nvcc (CUDA 13, as DALI's cuda130 wheel): none found on PATH or "
                               f"in $CUDA_HOME/bin; `{BUILD_COMMAND} --cpu-only` builds the CPU operators")
    if cuda_inc is None and found:
        cuda_inc = Path(found).resolve().parents[1] / "include"
    if cuda_inc is None or not (cuda_inc / "cuda_runtime.h").is_file():
        raise PluginBuildError("DALI's headers include cuda_runtime.h: install the pinned CUDA header wheels "
                               "(`pip install -r requirements/base.txt`: nvidia-cuda-runtime, nvidia-cuda-crt, "
                               "nvidia-cuda-cccl) or put CUDA 13's nvcc on PATH")
    archs = _cuda_arch_flags() if nvcc else []
    digest = hashlib.sha256()
    for f in cc + cu + sorted(PLUGIN_DIR.glob("*/*.h")):
        digest.update(f"{f.relative_to(PLUGIN_DIR)}\0".encode() + f.read_bytes())
    # no paths in the key: every environment with the same DALI, CUDA headers and compilers shares one build
    # (the library finds libdali.so by name, already loaded by `import nvidia.dali`)
    abi = [f for f in cflags if not f.startswith("-I")]
    for part in (version, *abi, _version([cxx, "-dumpfullversion"]), (cuda_inc / "cuda_runtime_api.h").read_bytes(),
                 *_CXX_FLAGS, _version([nvcc, "--version"]) if nvcc else "cpu-only", *archs):
        digest.update(b"\0" + (part if isinstance(part, bytes) else part.encode()))
    return dict(cc=cc, cu=cu if nvcc else [], cxx=cxx, nvcc=nvcc, archs=archs, cflags=cflags, ldflags=ldflags,
                cuda_include=cuda_inc, dali=version, folder=_cache_root() / digest.hexdigest()[:16])


def plugin_library(*, cuda: bool | None = None) -> Path:
    """The library path a build in this environment produces (``cuda=None``: with the GPU operators when
    nvcc is found). It exists once ``build_plugin`` has run."""
    return _plan(cuda)["folder"] / LIBRARY_NAME


def _run(cmd: list[str], what: str) -> subprocess.Popen:
    log.info("%s", " ".join(cmd))
    try:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except FileNotFoundError:
        raise PluginBuildError(f"{what} needs {cmd[0]}, which is not installed (apt-get install g++)") from None


def _wait(proc: subprocess.Popen, what: str) -> None:
    out, _ = proc.communicate()
    if proc.returncode:
        tail = "\n".join(line for line in out.splitlines() if "Wc++20-extensions" not in line)[-4000:]
        raise PluginBuildError(f"{what} failed (exit {proc.returncode}): {' '.join(proc.args)}\n{tail}")


def build_plugin(*, cuda: bool | None = None, force: bool = False) -> Path:
    """Compile ``plugins/`` into ``libcrossdali_plugins.so`` (or find the cached build) and return its path.

    Args:
        cuda: ``None``: add the GPU operators when nvcc is found; ``False``: CPU operators only (what a
            machine without nvcc gets anyway); ``True``: fail unless nvcc is found.
        force: compile even when the cached library exists.
    """
    plan = _plan(cuda)
    target = plan["folder"] / LIBRARY_NAME
    if target.is_file() and not force:
        return target
    if cuda is None and not plan["nvcc"] and _sources()[1]:
        log.warning("nvcc not found: building the CPU operators only (the GPU ones need CUDA 13's nvcc)")
    plan["folder"].mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=plan["folder"]) as tmp:  # parallel builds never see a half-written file
        include = [*plan["cflags"], f"-I{plan['cuda_include']}"]
        objects, jobs = [], []
        for src in plan["cc"]:
            obj = Path(tmp) / f"{src.parent.name}_{src.stem}.o"
            jobs.append((_run([plan["cxx"], *_CXX_FLAGS, *include, "-c", str(src), "-o", str(obj)], "compiling"),
                         f"compiling {src.name}"))
            objects.append(obj)
        for src in plan["cu"]:
            obj = Path(tmp) / f"{src.parent.name}_{src.stem}_cu.o"
            cmd = [plan["nvcc"], "-std=c++20", "-O2", "-Xcompiler", "-fPIC", *plan["archs"], *plan["cflags"], "-c",
                   str(src), "-o", str(obj)]
            jobs.append((_run(cmd, "compiling"), f"compiling {src.name}"))
            objects.append(obj)
        for proc, what in jobs:
            _wait(proc, what)
        out = Path(tmp) / LIBRARY_NAME
        if plan["nvcc"]:  # nvcc links the CUDA runtime (static) into the library
            link = [plan["nvcc"], "-shared", "-Xcompiler", "-fPIC", *map(str, objects), *plan["ldflags"], "-o", str(out)]
        else:
            link = [plan["cxx"], "-shared", *map(str, objects), *plan["ldflags"], "-o", str(out)]
        _wait(_run(link, "linking"), "linking")
        (Path(tmp) / "build.json").write_text(json.dumps(
            dict(dali=plan["dali"], gpu=bool(plan["nvcc"]), archs=plan["archs"],
                 sources=[str(s.relative_to(PLUGIN_DIR)) for s in plan["cc"] + plan["cu"]]), indent=1) + "\n")
        os.replace(Path(tmp) / "build.json", plan["folder"] / "build.json")
        os.replace(out, target)
    return target


def load_plugin(path: str | os.PathLike | None = None) -> Path:
    """Register crossdali's operators with DALI and return the library's path (default: the build of
    this environment, ``build_plugin``'s). A process loads one library: later calls return the first.

    Raises ``UsageError`` naming the missing library and the build command when it is not built.
    """
    if _loaded:  # DALI cannot unload a library nor register an operator twice
        return _loaded[0]
    lib = Path(path) if path is not None else _built_library()
    if not lib.is_file():
        raise UsageError(f"crossdali's DALI plugin is not built ({lib} is missing): run `{BUILD_COMMAND}`")
    from nvidia.dali import plugin_manager

    plugin_manager.load_library(str(lib))
    _loaded.append(lib)
    return lib


def _built_library() -> Path:
    """The build this environment would make (with the GPU operators where nvcc is found) if it exists,
    else the CPU-only build if that exists, else the path of the former."""
    paths = []
    for cuda in (None, False):
        try:
            paths.append(plugin_library(cuda=cuda))
        except PluginBuildError as e:
            if not paths:
                raise UsageError(f"crossdali's DALI plugin is not built and cannot be here: {e}") from None
            break
        if paths[-1].is_file():
            return paths[-1]
    return paths[0]


def color_jitter_normalize(images, *, hue, saturation, brightness, contrast, mirror, mean, std):
    """``fn.hsv(hue, saturation)`` -> ``fn.brightness_contrast(brightness, contrast)`` ->
    ``fn.crop_mirror_normalize(mean, std, mirror, output_layout="CHW", dtype=FLOAT)`` as one operator of
    crossdali's plugin (loaded here): uint8 HWC ``images`` in, float CHW out, the same values
    (bit-identical on the CPU; docs/custom-operators.md states the GPU's tolerance). Call inside a
    ``pipeline_def``; each parameter is a number or a per-sample ``DataNode`` (a random draw).

    The operator takes ``hsv=[hue, saturation]`` and ``levels=[brightness, contrast]``: stacking the draws
    there puts them, and the two stacks, where DALI's graph walk met the draws and the two replaced
    operators, so a pipeline seeded alike draws the very same values as the three-operator spelling
    (tests/common/test_custom_operator.py holds SSD's train batches equal)."""
    load_plugin()
    from nvidia.dali import fn, types

    def pair(a, b):
        if all(isinstance(x, (int, float)) for x in (a, b)):
            return [float(a), float(b)]
        return fn.stack(*(x if not isinstance(x, (int, float)) else types.Constant(float(x)) for x in (a, b)))

    return fn.crossdali.color_jitter_normalize(images, hsv=pair(hue, saturation), levels=pair(brightness, contrast),
                                               mirror=mirror, mean=list(mean), std=list(std))


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m crossdali.common.plugins", add_help=add_help,
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="compile plugins/ (or find the cached build) and print the library's path")
    build.add_argument("--cpu-only", action="store_true", help="skip the GPU operators even where nvcc is found")
    build.add_argument("--force", action="store_true", help="compile even when the cached library exists")
    sub.add_parser("path", help="print the library this environment loads (exit 2 if it is not built)")
    return parser


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.command == "build":
            lib = build_plugin(cuda=False if args.cpu_only else None, force=args.force)
            info = json.loads((lib.parent / "build.json").read_text())
            gpu = "CPU and GPU operators" if info["gpu"] else "CPU operators only (no nvcc)"
            print(f"{lib}  ({gpu}, DALI {info['dali']})")
        else:
            lib = _built_library()
            if not lib.is_file():
                raise UsageError(f"crossdali's DALI plugin is not built ({lib} is missing): run `{BUILD_COMMAND}`")
            print(lib)
    except (UsageError, PluginBuildError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
