"""Protobuf schemas at run time: ``.proto`` text -> descriptors, with ``grpc_tools.protoc``.

Schema-registry Protobuf schemas arrive as ``.proto`` source text plus references (other
``.proto`` files, by import name). :func:`compile_sources` writes them to a temporary
directory and runs the protoc bundled with grpcio-tools (in-process) with its well-known-type
includes, producing a ``FileDescriptorSet`` that :class:`ProtoSchema` loads into a *private*
``DescriptorPool`` (so two versions of the same file never collide). A descriptor-set file
made by ``protoc --descriptor_set_out --include_imports`` or ``buf build -o x.binpb`` loads
the same way (:meth:`ProtoSchema.from_descriptor_set_file`).
"""

from __future__ import annotations

import base64
import importlib
import os
import re
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FileDescriptor

_B64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_PROTOC_LOCK = threading.Lock()  # protoc.main is a process-global C++ entry point


class SchemaCompileError(ValueError):
    """protoc rejected the schema (the message carries protoc's diagnostics)."""


def _wkt_include() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).resolve().parent / "_proto")


def decode_schema_string(name: str, text: str) -> descriptor_pb2.FileDescriptorProto | None:
    """A registry schema string that is a base64 ``FileDescriptorProto`` (what confluent-kafka's
    serializers register, and what Apicurio stores verbatim) -> that proto; ``.proto`` text -> None."""
    t = text.strip()
    if not t or not _B64.fullmatch(t):
        return None
    try:
        fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(t, validate=True))
    except Exception:
        return None
    fdp.name = name
    return fdp


def compile_sources(main_name: str, sources: Mapping[str, str]) -> descriptor_pb2.FileDescriptorSet:
    """Compile ``sources[main_name]`` with the other ``sources`` importable by their names and
    the well-known types from grpcio-tools into a FileDescriptorSet including all imports.

    Each source is ``.proto`` text or a base64 ``FileDescriptorProto``; text files are compiled
    by protoc with the descriptor ones given through ``--descriptor_set_in``.
    """
    from grpc_tools import protoc

    if main_name not in sources:
        raise SchemaCompileError(f"{main_name!r} is not among the sources {sorted(sources)}")
    binary: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    texts: dict[str, str] = {}
    for name, text in sources.items():
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise SchemaCompileError(f"reference name {name!r} is not a relative import path")
        fdp = decode_schema_string(name, text)
        if fdp is None:
            texts[name] = text
        else:
            binary[name] = fdp
    # Well-known types imported by descriptor-form files come from protoc's include path.
    wkt = sorted(
        {
            d
            for f in binary.values()
            for d in f.dependency
            if d not in sources and d.startswith("google/protobuf/")
        }
    )
    with tempfile.TemporaryDirectory(prefix="rsm-proto-") as tmp:
        root = Path(tmp) / "src"
        root.mkdir()
        for name, text in texts.items():
            p = root / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
        out = Path(tmp) / "set.binpb"
        err_file = Path(tmp) / "stderr"
        args = [
            "protoc",
            f"-I{root}",
            f"-I{_wkt_include()}",
            "--include_imports",
            f"--descriptor_set_out={out}",
        ]
        if binary:
            dep_set = Path(tmp) / "deps.binpb"
            dep_set.write_bytes(
                descriptor_pb2.FileDescriptorSet(file=list(binary.values())).SerializeToString()
            )
            args.append(f"--descriptor_set_in={dep_set}")
        inputs = [*texts, *wkt]
        if not inputs:  # everything is in descriptor form already
            return _with_wkt(descriptor_pb2.FileDescriptorSet(file=list(binary.values())))
        args += inputs
        with _PROTOC_LOCK:
            # protoc prints diagnostics on fd 2: capture them for the error message.
            saved = os.dup(2)
            fd = os.open(err_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                os.dup2(fd, 2)
                rc = protoc.main(args)
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                os.close(fd)
        if rc != 0 or not out.exists():
            diag = err_file.read_text(errors="replace").replace(str(root) + "/", "").strip()
            raise SchemaCompileError(f"protoc failed on {main_name}: {diag or f'exit {rc}'}")
        fds = descriptor_pb2.FileDescriptorSet()
        fds.ParseFromString(out.read_bytes())
        have = {f.name for f in fds.file}
        for name, fdp in binary.items():
            if name not in have:
                fds.file.append(fdp)
        return fds


_WELL_KNOWN_TYPES = (
    "any_pb2",
    "api_pb2",
    "duration_pb2",
    "empty_pb2",
    "field_mask_pb2",
    "source_context_pb2",
    "struct_pb2",
    "timestamp_pb2",
    "type_pb2",
    "wrappers_pb2",
)


def _with_wkt(fds: descriptor_pb2.FileDescriptorSet) -> descriptor_pb2.FileDescriptorSet:
    """Add the well-known-type files that descriptor-form files import (from protobuf itself)."""
    # Importing protobuf's well-known-type modules registers their files in the default pool.
    for name in _WELL_KNOWN_TYPES:
        importlib.import_module(f"google.protobuf.{name}")

    have = {f.name for f in fds.file}
    todo = [d for f in fds.file for d in f.dependency if d not in have]
    default = descriptor_pool.Default()
    while todo:
        name = todo.pop()
        if name in have:
            continue
        fd = default.FindFileByName(name)
        fdp = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(fdp)
        fds.file.append(fdp)
        have.add(name)
        todo.extend(d for d in fdp.dependency if d not in have)
    return fds


def _topo(files: list[descriptor_pb2.FileDescriptorProto]) -> list[descriptor_pb2.FileDescriptorProto]:
    by_name = {f.name: f for f in files}
    out: list[descriptor_pb2.FileDescriptorProto] = []
    seen: set[str] = set()

    def visit(f: descriptor_pb2.FileDescriptorProto) -> None:
        if f.name in seen:
            return
        seen.add(f.name)
        for d in f.dependency:
            if d in by_name:
                visit(by_name[d])
        out.append(f)

    for f in files:
        visit(f)
    return out


@dataclass
class ProtoSchema:
    """A compiled Protobuf schema: a private pool and the main file's descriptor."""

    pool: descriptor_pool.DescriptorPool
    file: FileDescriptor

    @classmethod
    def from_file_descriptor_set(
        cls, fds: descriptor_pb2.FileDescriptorSet, main_file: str | None = None
    ) -> ProtoSchema:
        pool = descriptor_pool.DescriptorPool()
        files = _topo(list(fds.file))
        for fdp in files:
            pool.Add(fdp)
        name = main_file or fds.file[-1].name  # protoc lists dependencies first
        return cls(pool, pool.FindFileByName(name))

    @classmethod
    def from_sources(cls, main_name: str, sources: Mapping[str, str]) -> ProtoSchema:
        return cls.from_file_descriptor_set(compile_sources(main_name, sources), main_name)

    @classmethod
    def from_descriptor_set_file(
        cls, path: str | os.PathLike[str], main_file: str | None = None
    ) -> ProtoSchema:
        fds = descriptor_pb2.FileDescriptorSet()
        fds.ParseFromString(Path(path).read_bytes())
        if not fds.file:
            raise SchemaCompileError(f"{path}: empty descriptor set")
        return cls.from_file_descriptor_set(fds, main_file)

    def message_by_indexes(self, indexes: Sequence[int]) -> Descriptor:
        """The message at Confluent message ``indexes`` (top-level index, then nested)."""
        if not indexes:
            indexes = (0,)
        types = list(self.file.message_types_by_name.values())
        desc: Descriptor | None = None
        for depth, i in enumerate(indexes):
            if i >= len(types):
                raise LookupError(
                    f"message index {list(indexes)} out of range at depth {depth} in {self.file.name}"
                )
            desc = types[i]
            types = list(desc.nested_types)
        assert desc is not None
        return desc

    def message_by_name(self, full_name: str) -> Descriptor:
        try:
            return self.pool.FindMessageTypeByName(full_name)
        except KeyError:
            names = [m.full_name for m in self.file.message_types_by_name.values()]
            raise LookupError(f"message {full_name!r} not found (top-level messages: {names})") from None

    def indexes_of(self, desc: Descriptor) -> tuple[int, ...]:
        path: list[int] = []
        d = desc
        while d.containing_type is not None:
            path.append(list(d.containing_type.nested_types).index(d))
            d = d.containing_type
        path.append(list(self.file.message_types_by_name.values()).index(d))
        return tuple(reversed(path))

    @staticmethod
    def message_class(desc: Descriptor) -> type:
        return message_factory.GetMessageClass(desc)
