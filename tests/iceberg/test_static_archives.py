"""Spark's Python workers re-read every zip archive on their ``sys.path`` before each task
(``importlib.invalidate_caches()``: pyspark.zip, py4j's zip, Spark's core jar - 0.1-0.25 s of
CPU a task). :func:`static_archive_imports` makes those importers keep what they read. Real zip
archives and the interpreter's own import machinery; no Spark needed to show the effect."""

from __future__ import annotations

import importlib
import sys
import zipfile
import zipimport

import pytest

from rsm_sidecar.iceberg.stages import static_archive_imports, with_static_archive_imports


@pytest.fixture
def archive(tmp_path):
    path = tmp_path / "lib.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("zmod_first.py", "VALUE = 1\n")
        z.writestr("zmod_second.py", "VALUE = 2\n")
    sys.path.insert(0, str(path))
    yield path
    sys.path.remove(str(path))
    finder = sys.path_importer_cache.pop(str(path), None)
    for name in ("zmod_first", "zmod_second"):
        sys.modules.pop(name, None)
    for f in [finder, *sys.path_importer_cache.values()]:
        if f is not None and "invalidate_caches" in vars(f):
            del f.invalidate_caches  # back to the class's behaviour for the rest of the run


def test_an_invalidated_archive_is_read_again_without_it(archive):
    import zmod_first  # noqa: F401  (creates the archive's importer)

    finder = sys.path_importer_cache[str(archive)]
    assert isinstance(finder, zipimport.zipimporter)
    files = finder._files
    importlib.invalidate_caches()
    assert finder._files is not files  # the whole directory was read again


def test_static_archives_keep_their_directory_and_still_import(archive):
    import zmod_first

    assert zmod_first.VALUE == 1
    finder = sys.path_importer_cache[str(archive)]
    assert static_archive_imports() >= 1
    assert static_archive_imports() == 0  # once per importer
    files = finder._files
    importlib.invalidate_caches()
    assert finder._files is files
    import zmod_second  # another module of the same archive still imports

    assert zmod_second.VALUE == 2


def test_the_rdd_wrapper_passes_rows_through(archive):
    import zmod_first  # noqa: F401

    rows = [(0, 0, "{}"), (1, 0, "{}")]
    assert list(with_static_archive_imports(iter(rows))) == rows
    assert "invalidate_caches" in vars(sys.path_importer_cache[str(archive)])
