"""`rsm-sidecar inspect`: look at, verify and re-key the segments in remote storage
without a broker. The CLI wiring is :mod:`rsm_sidecar.cli.inspect`; the logic lives
here, one concept per module:

* :mod:`.context` - the segment access (object store, key layout, keyring, reader) with
  bounded memory, built from the sidecar's own configuration.
* :mod:`.listing` - listing the store and grouping objects into segments.
* :mod:`.locate` - turning a SEGMENT argument (UUID, object key, topic/partition/offset)
  into a segment.
* :mod:`.summary` - one line of facts about a segment (manifest + object sizes).
* :mod:`.decoders` - key/value rendering: UTF-8, hex, optionally schema-registry decoding.
* the commands: :mod:`.ls`, :mod:`.show`, :mod:`.dump`, :mod:`.cat`, :mod:`.verify`,
  :mod:`.rekey`, :mod:`.du`, :mod:`.orphans`.
* :mod:`.output` (tables, JSON, sizes, times), :mod:`.progress` (stderr progress lines),
  :mod:`.duration` (``90s``/``10m``/``1h``/``2d``).
"""
