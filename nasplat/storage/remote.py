"""A folder behind a local path or a `pyarrow.fs` URI (s3://, gs://, file://), and mirroring an experiment to it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from nasplat.storage.files import APPEND_ONLY, WHOLE_FILES, StorageError, is_uri, write_atomic, written


class Storage:
    """A folder behind a local path or a `pyarrow.fs` URI: read, write whole files atomically, list, delete."""

    def __init__(self, location: str | Path) -> None:
        from pyarrow import fs

        self.location = str(location).rstrip("/")
        if is_uri(self.location):
            self.fs, self.root = fs.FileSystem.from_uri(self.location)
        else:
            self.location = str(Path(self.location).expanduser().resolve())
            self.fs, self.root = fs.LocalFileSystem(), self.location
        self.local = isinstance(self.fs, fs.LocalFileSystem)

    def __repr__(self) -> str:
        return f"Storage({self.location!r})"

    def path(self, name: str = "") -> str:
        """`name` (a relative path) inside this folder, as the filesystem names it."""
        return f"{self.root}/{name}".rstrip("/") if name else self.root

    def uri(self, name: str = "") -> str:
        """`name` inside this folder as a location another process can open with `Storage` (path or URI)."""
        return f"{self.location}/{name}".rstrip("/") if name else self.location

    def child(self, name: str) -> Storage:
        """The sub-folder `name` as a Storage."""
        return Storage(self.uri(name))

    def write(self, name: str, payload: bytes | Callable[[BinaryIO], Any]) -> int:
        """Write the file `name` whole, from bytes or a function that writes into the open file; atomically (temp
        file + rename locally; an object store's put is atomic). Returns the size written. A failure of the storage
        (a full disk, a refused upload) raises `StorageError` naming the errno (where there is one) and the file."""
        try:
            if self.local:
                Path(self.path(name)).parent.mkdir(parents=True, exist_ok=True)
                return write_atomic(self.path(name), payload)
            with self.fs.open_output_stream(self.path(name)) as out:
                written(payload, out)
                return out.tell()
        except OSError as exc:
            raise StorageError.of(self.uri(name), exc) from None

    def size(self, name: str) -> int | None:
        """The size in bytes of the file `name`, or None if there is no such file."""
        from pyarrow import fs

        info = self.fs.get_file_info(self.path(name))
        return info.size if info.type == fs.FileType.File else None

    def read(self, name: str) -> bytes:
        with self.fs.open_input_stream(self.path(name)) as f:
            return f.read()

    def exists(self, name: str = "") -> bool:
        from pyarrow import fs

        return self.fs.get_file_info(self.path(name)).type != fs.FileType.NotFound

    def list(self, name: str = "") -> list[str]:
        """Names of the entries directly inside `name` (sorted; empty if it does not exist)."""
        from pyarrow import fs

        selector = fs.FileSelector(self.path(name), allow_not_found=True)
        return sorted(info.base_name for info in self.fs.get_file_info(selector))

    def delete(self, name: str) -> None:
        """Delete the file or folder `name`; a missing one is fine."""
        from pyarrow import fs

        info = self.fs.get_file_info(self.path(name))
        if info.type == fs.FileType.Directory:
            self.fs.delete_dir(self.path(name))
        elif info.type == fs.FileType.File:
            self.fs.delete_file(self.path(name))

    # -- mirroring an experiment folder --------------------------------------------------------------
    def upload(self, folder: Path, uploaded: dict[str, int]) -> None:
        """Bring this (remote) folder up to date with the local experiment `folder`: whole files are rewritten, and
        the bytes appended to each append-only file since the last upload (`uploaded`: name -> bytes) go up as a
        part named by its first byte (`results.jsonl.parts/000000001234`)."""
        for name in WHOLE_FILES:
            if (folder / name).exists() and name not in uploaded:
                self.write(name, (folder / name).read_bytes())
                uploaded[name] = 1
        for name in APPEND_ONLY:
            path = folder / name
            if not path.exists():
                continue
            start = uploaded.get(name, 0)
            with open(path, "rb") as f:
                f.seek(start)
                chunk = f.read()
            chunk = chunk[:chunk.rfind(b"\n") + 1]  # whole lines only
            if chunk:
                self.write(f"{name}.parts/{start:015d}", chunk)
                uploaded[name] = start + len(chunk)

    def download(self, folder: Path) -> dict[str, int]:
        """Copy this remote experiment into the local `folder` (created); returns what is uploaded already."""
        folder.mkdir(parents=True, exist_ok=True)
        uploaded: dict[str, int] = {}
        for name in WHOLE_FILES:
            if self.exists(name):
                write_atomic(folder / name, self.read(name))
                uploaded[name] = 1
        for name in APPEND_ONLY:
            data = bytearray()
            for part in self.list(f"{name}.parts"):
                if int(part) != len(data):
                    raise ValueError(f"{self.uri(name)}.parts: part {part} does not start where the previous "
                                     f"ended ({len(data)} bytes); the uploaded experiment is incomplete")
                data += self.read(f"{name}.parts/{part}")
            write_atomic(folder / name, bytes(data))
            uploaded[name] = len(data)
        return uploaded

    def replace_parts(self, folder: Path, name: str) -> int:
        """After the local append-only file `name` was rewritten (rows dropped on resume), replace its parts."""
        self.delete(f"{name}.parts")
        data = (folder / name).read_bytes()
        if data:
            self.write(f"{name}.parts/{0:015d}", data)
        return len(data)
