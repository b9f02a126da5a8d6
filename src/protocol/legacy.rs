//! Request versions older than the `kafka-protocol` crate's codecs: OffsetCommit v0–v1
//! and OffsetFetch v0 (protocol guide, "OffsetCommit" and "OffsetFetch"; Kafka 4.0 removed
//! them, KIP-896, but Kafka 3.x and older clients still speak them).
//!
//! OffsetCommit v0 (`group_id, [topic, [partition, offset, metadata]]`) and v1 (adds
//! `generation_id, member_id` and a per-partition `timestamp`, ignored as Kafka ≥ 2.1 does)
//! are decoded here into the crate's `OffsetCommitRequest`; their responses have exactly
//! the v2 layout, so they are encoded as v2. OffsetFetch v0 has exactly the v1 layout in
//! both directions. Only non-flexible versions are involved, so the header versions are
//! the same.
//!
//! Errors: a body that does not parse (short, negative lengths, bad UTF-8) is a `String`
//! naming the field; the caller closes the connection, as for any undecodable request.

use bytes::{Buf, Bytes};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{ApiKey, GroupId, OffsetCommitRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

/// The version whose codec reads and writes `(key, version)`'s body: v2 for OffsetCommit
/// v0–v1, v1 for OffsetFetch v0, `version` itself otherwise.
pub(crate) fn codec_version(key: ApiKey, version: i16) -> i16 {
    match key {
        ApiKey::OffsetCommit if version < 2 => 2,
        ApiKey::OffsetFetch if version < 1 => 1,
        _ => version,
    }
}

/// True when [`decode_offset_commit`] must decode the body instead of the crate.
pub(crate) fn is_legacy_offset_commit(key: ApiKey, version: i16) -> bool {
    key == ApiKey::OffsetCommit && version < 2
}

fn need(buf: &Bytes, n: usize, field: &str) -> Result<(), String> {
    if buf.remaining() < n {
        return Err(format!("OffsetCommit body ends inside {field}"));
    }
    Ok(())
}

fn string(buf: &mut Bytes, field: &str) -> Result<StrBytes, String> {
    need(buf, 2, field)?;
    let len = buf.get_i16();
    if len < 0 {
        return Err(format!("OffsetCommit {field} is null"));
    }
    need(buf, len as usize, field)?;
    StrBytes::from_utf8(buf.split_to(len as usize))
        .map_err(|_| format!("OffsetCommit {field} is not UTF-8"))
}

fn nullable_string(buf: &mut Bytes, field: &str) -> Result<Option<StrBytes>, String> {
    need(buf, 2, field)?;
    if i16::from_be_bytes([buf[0], buf[1]]) < 0 {
        buf.advance(2);
        return Ok(None);
    }
    string(buf, field).map(Some)
}

/// An array length, checked against the bytes left (each element takes at least
/// `min_element_bytes`), so a hostile length cannot make the broker reserve memory.
fn array_len(buf: &mut Bytes, min_element_bytes: usize, field: &str) -> Result<usize, String> {
    need(buf, 4, field)?;
    let n = buf.get_i32();
    if n < 0 {
        return Ok(0);
    }
    let n = n as usize;
    if n.saturating_mul(min_element_bytes) > buf.remaining() {
        return Err(format!("OffsetCommit {field} claims {n} elements"));
    }
    Ok(n)
}

/// Decodes an OffsetCommit v0 or v1 body.
pub(crate) fn decode_offset_commit(
    buf: &mut Bytes,
    version: i16,
) -> Result<OffsetCommitRequest, String> {
    let group_id = string(buf, "group_id")?;
    let mut request = OffsetCommitRequest::default().with_group_id(GroupId(group_id));
    if version >= 1 {
        need(buf, 4, "generation_id")?;
        request = request
            .with_generation_id_or_member_epoch(buf.get_i32())
            .with_member_id(string(buf, "member_id")?);
    }
    let partition_bytes = if version >= 1 { 22 } else { 14 };
    let topic_count = array_len(buf, 6, "topics")?;
    let mut topics = Vec::with_capacity(topic_count);
    for _ in 0..topic_count {
        let name = string(buf, "topic name")?;
        let partition_count = array_len(buf, partition_bytes, "partitions")?;
        let mut partitions = Vec::with_capacity(partition_count);
        for _ in 0..partition_count {
            need(buf, 12, "partition")?;
            let index = buf.get_i32();
            let offset = buf.get_i64();
            if version >= 1 {
                need(buf, 8, "timestamp")?;
                let _commit_timestamp = buf.get_i64();
            }
            let metadata = nullable_string(buf, "metadata")?;
            partitions.push(
                OffsetCommitRequestPartition::default()
                    .with_partition_index(index)
                    .with_committed_offset(offset)
                    .with_committed_metadata(metadata),
            );
        }
        topics.push(
            OffsetCommitRequestTopic::default()
                .with_name(TopicName(name))
                .with_partitions(partitions),
        );
    }
    Ok(request.with_topics(topics))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn body(version: i16) -> Bytes {
        let mut b = bytes::BytesMut::new();
        b.put_i16(1);
        b.put_slice(b"g");
        if version >= 1 {
            b.put_i32(4);
            b.put_i16(2);
            b.put_slice(b"m1");
        }
        b.put_i32(1);
        b.put_i16(1);
        b.put_slice(b"t");
        b.put_i32(1);
        b.put_i32(3);
        b.put_i64(42);
        if version >= 1 {
            b.put_i64(-1);
        }
        b.put_i16(4);
        b.put_slice(b"meta");
        b.freeze()
    }

    #[test]
    fn decodes_v0_and_v1() {
        for version in [0, 1] {
            let r = decode_offset_commit(&mut body(version), version).unwrap();
            assert_eq!(r.group_id.0.as_str(), "g");
            let p = &r.topics[0].partitions[0];
            assert_eq!((p.partition_index, p.committed_offset), (3, 42));
            assert_eq!(p.committed_metadata.as_ref().unwrap().as_str(), "meta");
            if version == 1 {
                assert_eq!(r.generation_id_or_member_epoch, 4);
                assert_eq!(r.member_id.as_str(), "m1");
            } else {
                assert_eq!(r.generation_id_or_member_epoch, -1);
            }
        }
    }

    #[test]
    fn refuses_truncated_and_hostile_bodies() {
        let full = body(1);
        for cut in 0..full.len() {
            assert!(
                decode_offset_commit(&mut full.slice(..cut), 1).is_err(),
                "cut at {cut}"
            );
        }
        let mut huge = bytes::BytesMut::new();
        huge.put_i16(1);
        huge.put_slice(b"g");
        huge.put_i32(i32::MAX);
        assert!(decode_offset_commit(&mut huge.freeze(), 0).is_err());
    }
}
