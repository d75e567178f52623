"""A follower whose disk is lost is rebuilt from remote storage, then leads and serves every
record from offset 0 with read_committed and read_uncommitted.

The topic holds committed and aborted transactions and plain records, tiered partly by the
follower's own sidecar (while it led) and partly by the leader's; the leader keeps the newest
2.5 MB on its disk (``local.retention.bytes``), tiered or not, so its first local offset is
below the first offset not tiered yet. The follower is stopped, its whole log directory deleted
(meta.properties included: a new disk, formatted again) and started:

* **classic** (Kafka 3.9.2, stream transfer mode, local-directory storage; in
  test_classic_rebuild_kafka39.py, on a cluster of its own): the empty follower
  fetches from offset 0, the leader answers OFFSET_MOVED_TO_TIERED_STORAGE, and the follower
  builds its leader-epoch cache and producer state for the leader's first local offset from the
  remote segment below it (``fetchIndex(LEADER_EPOCH)`` and ``fetchIndex(PRODUCER_SNAPSHOT)``
  through its own sidecar), then copies the leader's local log from there, tiered part included;
* **KIP-1023** (Kafka 4.4, ``follower.fetch.last.tiered.offset.enable=true``, path mode, S3;
  here, on the shared cluster):
  the follower asks the leader for the first offset not tiered yet and starts there, with the
  same two indexes from remote storage: it does not copy what is already tiered.

Either way the rebuilt broker is then elected leader: offsets below its first local one are
remote reads through its own sidecar, including segments the other broker's sidecar copied; it
then tiers new segments through its sidecar, contiguous with what is there."""

from __future__ import annotations

from tests.cluster.scenarios import rebuild_then_lead


def test_follower_rebuilt_from_the_last_tiered_offset_kip_1023(cluster, store):
    assert cluster.dist.version_tuple >= (4, 3, 0) and cluster.transfer_mode == "path"
    rebuild_then_lead(cluster, store, "rebuild-kip1023", kip1023=True)
