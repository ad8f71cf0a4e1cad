"""Files in and out: atomic writes, deterministic .npz, and model inputs matched to parameters.

Every file nxsat writes goes through :func:`atomic_write` (write a temporary file beside the
target, fsync, rename), so an interrupted run never leaves half a file. ``.npz`` files are written
with fixed zip timestamps so that the same arrays give the same bytes, and read without pickle.
"""

from __future__ import annotations

import io
import os
import re
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from nxsat import dtypes as dt
from nxsat.diagnostics import error
from nxsat.ir import Module, TensorType

_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` to ``path`` all at once: readers see the old file or the whole new one."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    directory = path.parent if str(path.parent) else Path(".")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise error("NCC_EFIL002", f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
            # mkstemp makes the file private (0600); give it the mode a plain open() would.
            os.fchmod(f.fileno(), _file_mode(path))
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise error("NCC_EFIL002", f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


PathArg = str | os.PathLike


def check_output(path: PathArg, inputs: Sequence[PathArg | None] = (),
                 outputs: Sequence[PathArg | None] = ()) -> None:
    """Refuse an output file before any work is done (NCC_EFIL002), so that a long run is not lost
    at its end and no input is destroyed: ``path`` must not be one of ``inputs`` (the same file,
    however spelt: another relative path, a hard or symbolic link), nor another output of the
    same command, nor a directory; its directory must exist and take new files (atomic_write
    makes a temporary file there). ``None`` entries (options not given) are skipped.
    """
    p = Path(path)
    for inp in inputs:
        if inp is not None and _same_file(p, Path(inp)):
            raise error("NCC_EFIL002", f"{path}: this output would overwrite the input {inp}",
                        hint="write the output to another file")
    for other in outputs:
        if other is not None and (_same_file(p, Path(other)) or os.path.realpath(p) == os.path.realpath(other)):
            raise error("NCC_EFIL002", f"{path}: the same file as the other output {other}",
                        hint="give each output its own file")
    if p.is_dir():
        raise error("NCC_EFIL002", f"{path}: is a directory", hint="give a file name for the output")
    directory = p.parent
    if not directory.exists():
        raise error("NCC_EFIL002", f"{path}: directory {directory} does not exist",
                    hint=f"create it first: mkdir -p {directory}")
    if not directory.is_dir():
        raise error("NCC_EFIL002", f"{path}: {directory} is not a directory")
    try:  # the only sure test of permissions (ACLs, read-only file systems) is to try
        fd, probe = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise error("NCC_EFIL002", f"{path}: cannot write in {directory}: {exc.strerror or exc}",
                    hint="choose a directory you can write to") from None


def _same_file(a: Path, b: Path) -> bool:
    """Whether two existing paths name one file (device and inode: links and other spellings too)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _file_mode(path: Path) -> int:
    """The existing file's permissions, else 0666 less the umask (what ``open(path, "w")`` gives)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """A deterministic .npz (stored, fixed timestamps, keys in the given order)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asarray(storable(value), order="C"), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            zf.writestr(info, member.getvalue())
    return buf.getvalue()


def storable(a: np.ndarray) -> np.ndarray:
    """Arrays numpy's format can hold: bf16 and fp8 (ml_dtypes) widen exactly to fp32."""
    a = np.asarray(a)
    if a.dtype in (dt.BF16.np, dt.F8E4M3FN.np, dt.F8E5M2.np):
        return a.astype(np.float32)
    return a


def write_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> None:
    atomic_write(path, npz_bytes(arrays))


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read an .npz without pickle; NCC_EFIL001 when it is missing or not an .npz."""
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise error("NCC_EFIL001", f"{path}: a single .npy array, not an .npz",
                        hint="save the arrays with numpy.savez(path, in0=..., in1=...)")
        with z:
            return {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise error("NCC_EFIL001", f"{path}: no such file") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise error("NCC_EFIL001", f"{path}: not a readable .npz file ({exc})") from None


def read_text(path: str | os.PathLike) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error("NCC_EFIL001", f"{path}: no such file") from None
    except IsADirectoryError:
        raise error("NCC_EFIL001", f"{path}: is a directory") from None
    except UnicodeDecodeError as exc:
        raise error("NCC_EFIL001", f"{path}: not UTF-8 text (byte {exc.start})",
                    hint="is this a binary file?") from None
    except OSError as exc:
        raise error("NCC_EFIL001", f"{path}: {exc.strerror or exc}") from None


def match_inputs(module: Module, arrays: Mapping[str, np.ndarray], source: str = "inputs") -> list[np.ndarray]:
    """Order ``arrays`` by the entry's parameters: keys ``in0``, ``in1``, ... or parameter names
    (``out0``, ``out1``, ... are reference outputs and are ignored).

    Values are converted to the parameter's element type when that loses nothing that matters
    (floats to another float type, integers that fit); anything else is NCC_EINP001.
    """
    params = module.entry.params
    out: list[np.ndarray] = []
    used: set[str] = set()
    for i, p in enumerate(params):
        candidates = [f"in{i}", p.name, p.name.lstrip("%")]
        key = next((k for k in candidates if k in arrays), None)
        if key is None:
            raise error("NCC_EINP001", f"{source}: no value for parameter {i} ({p.name}: {p.type})",
                        hint=f"give it as in{i} or {p.name}")
        used.add(key)
        out.append(conform_input(arrays[key], p.type, f"{source}[{key}]"))
    # Reference outputs (out0, out1, ...) may share the file, as in the corpus convention.
    extra = sorted(k for k in set(arrays) - used if not re.fullmatch(r"out\d+", k))
    if extra:
        raise error("NCC_EINP001", f"{source}: {', '.join(extra)} match no parameter of {module.name}",
                    hint=f"the model takes {len(params)} inputs")
    return out


def conform_input(a: np.ndarray, t: object, what: str) -> np.ndarray:
    """One input array converted to a parameter's type (see match_inputs), or NCC_EINP001."""
    if not isinstance(t, TensorType):
        raise error("NCC_EINP001", f"{what}: tuple-typed parameters cannot be given in an .npz")
    a = np.asarray(a)
    if tuple(a.shape) != t.shape:
        raise error("NCC_EINP001", f"{what} has shape {list(a.shape)}, the parameter is {t}")
    if a.dtype == t.dtype.np:
        return a
    if a.dtype.kind == "V" and a.dtype.itemsize == t.dtype.itemsize and t.dtype.is_float and a.dtype.fields is None:
        # numpy.savez writes ml_dtypes' bfloat16 and fp8 arrays (what JAX hands back) as raw bytes, |V2 or |V1:
        # they are the parameter's own bits
        return a.view(t.dtype.np)
    src_float = a.dtype.kind == "f" or a.dtype in (dt.BF16.np, dt.F8E4M3FN.np, dt.F8E5M2.np)
    if t.dtype.is_float and src_float:
        return dt.cast(a, t.dtype)
    if t.dtype.is_int and a.dtype.kind in "iu":
        info = np.iinfo(t.dtype.np)
        if a.size and (a.min() < info.min or a.max() > info.max):
            raise error("NCC_EINP001", f"{what}: values do not fit {t.dtype.name}")
        return a.astype(t.dtype.np)
    if t.dtype.is_pred and a.dtype.kind in "biu":
        return a != 0
    raise error("NCC_EINP001", f"{what} is {a.dtype}, the parameter is {t}")


def outputs_dict(outputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    return {f"out{i}": o for i, o in enumerate(outputs)}
