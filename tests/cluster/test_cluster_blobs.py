"""A node's blob receiver (``cluster.blobs``) builds file paths from the digest
it is sent: the digest is checked with the store's one validator before any
path is made, so a crafted one cannot name a file outside ``blobs/``. Pure:
no Ray needed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from jupyter_llm.cluster import blobs
from jupyter_llm.cluster.blobs import BlobMismatch, BlobReceiver
from jupyter_llm.models import store
from jupyter_llm.request.errors import InvalidRequest

BAD = [
    "sha256:../../../../etc/passwd",
    "../../outside",
    "sha256-" + "0" * 64 + "/../../outside",
    "sha256:" + "A" * 64,  # upper case: not the store's spelling
    "sha256:" + "0" * 63,
    "sha256:" + "0" * 64 + "\n",
    "md5:" + "0" * 32,
    "",
]


def test_the_receiver_uses_the_stores_validator():
    assert blobs.parse_digest is store.parse_digest


@pytest.mark.parametrize("digest", BAD)
def test_a_bad_digest_is_refused_before_any_path_is_made(tmp_path: Path, digest: str):
    receiver = BlobReceiver(tmp_path / "node" / "blobs")
    with pytest.raises(InvalidRequest, match="invalid digest"):
        receiver.path_of(digest)
    with pytest.raises(InvalidRequest):
        receiver.cached(digest, 0)
    with pytest.raises(InvalidRequest):
        receiver.write(digest, 0, b"data")
    with pytest.raises(InvalidRequest):
        receiver.finish(digest)
    with pytest.raises(InvalidRequest):
        receiver.discard(digest)
    assert [p for p in tmp_path.rglob("*")] == []  # nothing written anywhere


def test_a_blob_arrives_under_its_digest(tmp_path: Path):
    data = b"model bytes"
    hexdigest = hashlib.sha256(data).hexdigest()
    receiver = BlobReceiver(tmp_path / "blobs")
    receiver.write(f"sha256-{hexdigest}", 0, data[:5])  # either spelling names one blob
    receiver.write(f"sha256:{hexdigest}", 5, data[5:])
    path = Path(receiver.finish(f"sha256:{hexdigest}"))
    assert path == tmp_path / "blobs" / f"sha256-{hexdigest}"
    assert path.read_bytes() == data
    assert receiver.cached(f"sha256:{hexdigest}", len(data)) == str(path)


def test_a_blob_with_other_content_is_not_kept(tmp_path: Path):
    receiver = BlobReceiver(tmp_path / "blobs")
    digest = "sha256:" + "0" * 64
    receiver.write(digest, 0, b"not it")
    with pytest.raises(BlobMismatch):
        receiver.finish(digest)
    assert list((tmp_path / "blobs").iterdir()) == []
