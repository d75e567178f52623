"""The small pure pieces of `inspect` (no stack): field rendering, byte ranges, the streamed
JSON document and the listing grouping, the last over a local-directory store written by the
sidecar's own copier."""

from __future__ import annotations

import concurrent.futures
import io
import json

import pytest

from rsm_sidecar.format.keys import KeyLayout, SegmentMetadata
from rsm_sidecar.inspect.cat import byte_range
from rsm_sidecar.inspect.context import UsageError
from rsm_sidecar.inspect.decoders import plain, render_text
from rsm_sidecar.inspect.output import JsonStream
from rsm_sidecar.segment import listing
from rsm_sidecar.segment.copy import SegmentCopier
from rsm_sidecar.segment.settings import CopySettings
from rsm_sidecar.segment.sources import BytesSource
from rsm_sidecar.storage.local import LocalObjectStore


def test_plain_rendering():
    assert plain(None) is None
    assert plain(b"") == {"utf8": ""}
    assert plain(b"hello\tworld\n") == {"utf8": "hello\tworld\n"}
    assert plain(b"\x00\x01") == {"hex": "0001"}
    assert plain("é".encode() * 3, 3) == {"utf8": "é", "size": 6, "truncated": True}  # cut inside a character
    assert render_text(plain("é".encode() * 3, 3)) == '"é"...(+4 bytes)'
    assert plain(b"\xc3", 0) == {"hex": "c3"}  # not cut by a limit: invalid UTF-8
    assert plain(b"\xff" * 10, 4) == {"hex": "ffffffff", "size": 10, "truncated": True}
    assert render_text(plain(b"\xff" * 10, 4)) == "hex:ffffffff...(+6 bytes)"
    assert render_text(plain(b'say "hi"')) == '"say \\"hi\\""'
    assert render_text(None) == "null"


def test_byte_ranges_are_inclusive_and_clamped():
    assert byte_range(100, None, None) == (0, 99)
    assert byte_range(100, 10, 20) == (10, 20)
    assert byte_range(100, 10, 1000) == (10, 99)
    assert byte_range(100, 100, None) == (100, 99)  # empty: at the end
    for start, end in ((101, None), (10, 5), (-1, None)):
        with pytest.raises(UsageError):
            byte_range(100, start, end)


def test_json_stream_is_one_document():
    out = io.StringIO()
    with JsonStream(out) as doc:
        doc.member("a", {"x": 1})
        with doc.list("items") as items:
            for i in range(3):
                items.append({"i": i})
        with doc.list("none"):
            pass
        doc.member("summary", None)
    assert json.loads(out.getvalue()) == {
        "a": {"x": 1},
        "items": [{"i": 0}, {"i": 1}, {"i": 2}],
        "none": [],
        "summary": None,
    }


def _copy(store, layout, md, data: bytes, chunk: int) -> None:
    settings = CopySettings(
        chunk_size=chunk,
        compression=True,
        compression_heuristic=False,
        compression_level=3,
        parallelism=2,
        custom_metadata_fields=(),
    )
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        SegmentCopier(store, layout, None, settings, ex).copy(
            md,
            BytesSource(
                data, {"offset": b"", "timestamp": b"", "producerSnapshot": b"", "transaction": None}
            ),
            b"0\n0\n",
        )


def test_scan_groups_objects_by_segment_and_finds_strays(tmp_path):
    store = LocalObjectStore(tmp_path, fsync=False)
    layout = KeyLayout("p/")
    mds = [
        SegmentMetadata("MWJ6FHTfRYy67jzwZdeqSQ", "t", p, sid, start, start + 9)
        for p, sid, start in (
            (0, "AAAAAAAAAAAAAAAAAAAAAA", 0),
            (0, "BBBBBBBBBBBBBBBBBBBBBB", 10),
            (10, "CCCCCCCCCCCCCCCCCCCCCC", 0),
        )
    ]
    for md in mds:
        _copy(store, layout, md, b"x" * 100, 64)
    store.put(layout.key(mds[1], "rsm-manifest") + ".bak", b"stray next to a segment")
    store.put("p/junk", b"j")
    store.delete(layout.key(mds[2], "rsm-manifest"))
    items = list(listing.scan(store, layout))
    segs = [i for i in items if isinstance(i, listing.StoredSegment)]
    strays = sorted(i.info.key for i in items if isinstance(i, listing.StrayObject))
    assert strays == ["p/junk", layout.key(mds[1], "rsm-manifest") + ".bak"]
    assert [(s.partition, s.segment_id, sorted(s.objects)) for s in segs] == [
        (0, "AAAAAAAAAAAAAAAAAAAAAA", ["indexes", "log", "rsm-manifest"]),
        (0, "BBBBBBBBBBBBBBBBBBBBBB", ["indexes", "log", "rsm-manifest"]),
        (10, "CCCCCCCCCCCCCCCCCCCCCC", ["indexes", "log"]),
    ]
    assert [s.segment_id for s in listing.segments(store, layout)] == [
        "AAAAAAAAAAAAAAAAAAAAAA",
        "BBBBBBBBBBBBBBBBBBBBBB",
    ]
    assert [s.partition for s in listing.scan(store, layout, "t", 10)] == [10]
    assert list(listing.scan(store, layout, "other")) == []


def test_progress_lines_are_rate_limited_and_quiet_for_short_work():
    from rsm_sidecar.inspect.progress import Progress

    now = [0.0]
    out = io.StringIO()
    p = Progress("inspect verify", 3, stream=out, clock=lambda: now[0])
    p.advance(1, 1024)
    assert out.getvalue() == ""  # under the interval
    now[0] = 2.5
    p.advance(1, 1024)
    now[0] = 3.0
    p.advance(1, 0)
    p.done()
    assert out.getvalue().splitlines() == [
        "inspect verify: 2/3 segments, 2.0 KiB (819 B/s) [2s]",
        "inspect verify: 3/3 segments, 2.0 KiB (682 B/s) done [3s]",
    ]
    quiet = io.StringIO()
    q = Progress("x", stream=quiet, clock=lambda: now[0], enabled=False)
    now[0] = 100.0
    q.advance()
    q.done()
    assert quiet.getvalue() == ""
    now[0] = 0.0
    b = io.StringIO()
    cat = Progress("inspect cat", unit="", stream=b, clock=lambda: now[0])
    now[0] = 4.0
    cat.add_bytes(4096)
    assert b.getvalue() == "inspect cat: 4.0 KiB (1.0 KiB/s) [4s]\n"
