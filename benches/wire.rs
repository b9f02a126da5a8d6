//! A nearly free Kafka-wire load client for `benches/run.sh`: what the broker can do when
//! the client costs (almost) nothing, to hold against benches/floor.rs's plain socket.
//!
//! On a small machine librdkafka spends several times the broker's CPU per record (it
//! builds every record), so an rdkafka_performance run measures the client as much as
//! the broker. This client builds its record batches once and then only moves bytes:
//!
//! ```text
//! wire produce ADDR TOPIC PARTITIONS RECORDS [RECORD_BYTES] [REQUEST_BYTES] [IN_FLIGHT]
//!     acks=1 Produce v8 requests of ~REQUEST_BYTES (default 1000000): one batch per
//!     partition, each request the same pre-encoded bytes (the broker assigns offsets),
//!     at most IN_FLIGHT (default 5) unanswered, on one connection; every partition
//!     response is checked for error 0.
//! wire fetch ADDR TOPIC PARTITIONS RECORDS [RECORD_BYTES] [PARTITION_MAX_BYTES]
//!     Fetch v11 from offset 0 of every partition (max 1 MiB per partition, 50 MiB per
//!     response, librdkafka's defaults), one request at a time, until RECORDS records
//!     came back; the response is walked batch header by batch header, not decoded.
//! ```
//! Prints `wire: records=.. secs=.. records/s=.. MB/s=..` (MB/s of record payload,
//! 10^6 B, as rdkafka_performance counts).

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::sync::mpsc::sync_channel;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader,
    TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const PRODUCE_VERSION: i16 = 8;
const FETCH_VERSION: i16 = 11;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let num = |i: usize, default: u64| -> Result<u64> {
        match args.get(i) {
            None => Ok(default),
            Some(s) => s
                .replace('_', "")
                .parse()
                .map_err(|e| format!("bad number {s}: {e}").into()),
        }
    };
    let result = match args.first().map(String::as_str) {
        Some("produce") if args.len() >= 5 => (|| {
            produce(&ProduceLoad {
                addr: &args[1],
                topic: &args[2],
                partitions: num(3, 1)? as i32,
                records: num(4, 0)?,
                record_bytes: num(5, 100)? as usize,
                request_bytes: num(6, 1_000_000)? as usize,
                in_flight: num(7, 5)? as usize,
            })
        })(),
        Some("fetch") if args.len() >= 5 => (|| {
            fetch(
                &args[1],
                &args[2],
                num(3, 1)? as i32,
                num(4, 0)?,
                num(5, 100)?,
                num(6, 1 << 20)? as i32,
            )
        })(),
        _ => {
            eprintln!(
                "usage: wire produce ADDR TOPIC PARTITIONS RECORDS [RECORD_BYTES] [REQUEST_BYTES] [IN_FLIGHT]\n       \
                 wire fetch ADDR TOPIC PARTITIONS RECORDS [RECORD_BYTES] [PARTITION_MAX_BYTES]"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wire: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A size-prefixed request frame; the correlation id sits at bytes 8..12.
fn frame<R: Request + Encodable>(req: &R, version: i16) -> Result<Vec<u8>> {
    let key = ApiKey::try_from(R::KEY).map_err(|_| "unknown api key")?;
    let header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(0)
        .with_client_id(Some(StrBytes::from_static_str("weir-bench-wire")));
    let mut buf = BytesMut::new();
    header.encode(&mut buf, key.request_header_version(version))?;
    req.encode(&mut buf, version)?;
    let mut out = (buf.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&buf);
    Ok(out)
}

fn read_frame(r: &mut impl Read, buf: &mut Vec<u8>) -> Result<()> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as u64;
    buf.clear();
    // read_to_end into a reused Vec: no zeroing, no allocation once it is big enough.
    let got = r.by_ref().take(len).read_to_end(buf)?;
    if got as u64 != len {
        return Err("connection closed mid-frame".into());
    }
    Ok(())
}

fn report(records: u64, payload_bytes: u64, secs: f64) {
    println!(
        "wire: records={records} secs={secs:.6} records/s={:.0} MB/s={:.2}",
        records as f64 / secs,
        payload_bytes as f64 / secs / 1e6
    );
}

/// What `wire produce` sends.
struct ProduceLoad<'a> {
    addr: &'a str,
    topic: &'a str,
    partitions: i32,
    /// Records to send, rounded up to whole requests.
    records: u64,
    /// Value bytes of each record (no key, no headers).
    record_bytes: usize,
    /// Approximate size of each Produce request, split evenly over the partitions.
    request_bytes: usize,
    /// Unanswered requests allowed on the connection.
    in_flight: usize,
}

fn produce(load: &ProduceLoad) -> Result<()> {
    let &ProduceLoad {
        addr,
        topic,
        partitions,
        records,
        record_bytes,
        request_bytes,
        in_flight,
    } = load;
    let partitions = partitions.max(1);
    // ~8 bytes of record framing (length, attributes, deltas, key, headers) per record
    // and a 61-byte batch header per partition.
    let per_partition =
        ((request_bytes / partitions as usize).saturating_sub(61) / (record_bytes + 8)).max(1);
    let per_request = per_partition as u64 * partitions as u64;
    let requests = records.div_ceil(per_request);
    let value = Bytes::from(vec![b'x'; record_bytes]);
    let batch_records: Vec<Record> = (0..per_partition)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // kafka-protocol starts a new batch unless offset - sequence is constant;
            // the batch's base sequence comes out as -1 (no idempotence), as wanted.
            sequence: i as i32 - 1,
            timestamp: 1_700_000_000_000,
            key: None,
            value: Some(value.clone()),
            headers: Default::default(),
        })
        .collect();
    let mut batch = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut batch,
        batch_records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )?;
    let batch = batch.freeze();
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(
                (0..partitions)
                    .map(|p| {
                        PartitionProduceData::default()
                            .with_index(p)
                            .with_records(Some(batch.clone()))
                    })
                    .collect(),
            )]);
    let mut request = frame(&req, PRODUCE_VERSION)?;
    eprintln!(
        "wire: {requests} produce requests of {} bytes, {partitions} batch(es) of {per_partition} records",
        request.len()
    );

    let stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    let mut reader = BufReader::with_capacity(64 << 10, stream.try_clone()?);
    let mut writer = stream;
    let (slots, answered) = sync_channel::<()>(in_flight.max(1));
    let start = Instant::now();
    let responses = std::thread::spawn(move || -> Result<()> {
        let key = ApiKey::Produce;
        let mut buf = Vec::new();
        for n in 0..requests {
            read_frame(&mut reader, &mut buf)?;
            let mut body = Bytes::copy_from_slice(&buf);
            let header =
                ResponseHeader::decode(&mut body, key.response_header_version(PRODUCE_VERSION))?;
            if header.correlation_id != n as i32 {
                return Err(format!("response {} for request {n}", header.correlation_id).into());
            }
            let resp = ProduceResponse::decode(&mut body, PRODUCE_VERSION)?;
            for t in &resp.responses {
                for p in &t.partition_responses {
                    if p.error_code != 0 {
                        return Err(format!("partition {} error {}", p.index, p.error_code).into());
                    }
                }
            }
            answered.recv().map_err(|_| "writer gone")?;
        }
        Ok(())
    });
    let mut write_err = None;
    for n in 0..requests {
        if slots.send(()).is_err() {
            break; // the reader failed: its error is the one to report
        }
        request[8..12].copy_from_slice(&(n as i32).to_be_bytes());
        if let Err(e) = writer.write_all(&request) {
            write_err = Some(e);
            break;
        }
    }
    drop(slots);
    responses.join().map_err(|_| "response thread panicked")??;
    if let Some(e) = write_err {
        return Err(e.into());
    }
    let secs = start.elapsed().as_secs_f64();
    let sent = requests * per_request;
    report(sent, sent * record_bytes as u64, secs);
    Ok(())
}

/// Big-endian reader over a response, for the fields the fetch loop needs.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let s = self
            .b
            .get(self.at..self.at + n)
            .ok_or("truncated fetch response")?;
        self.at += n;
        Ok(s)
    }
    fn i16(&mut self) -> Result<i16> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into()?))
    }
    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into()?))
    }
}

fn fetch(
    addr: &str,
    topic: &str,
    partitions: i32,
    records: u64,
    record_bytes: u64,
    partition_max: i32,
) -> Result<()> {
    let partitions = partitions.max(1) as usize;
    let mut offsets = vec![0i64; partitions];
    let stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    let mut reader = BufReader::with_capacity(64 << 10, stream.try_clone()?);
    let mut writer = stream;
    let mut buf = Vec::new();
    let (mut got, mut correlation) = (0u64, 0i32);
    let start = Instant::now();
    while got < records {
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(500)
            .with_min_bytes(1)
            .with_max_bytes(50 << 20)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(
                    offsets
                        .iter()
                        .enumerate()
                        .map(|(p, &o)| {
                            FetchPartition::default()
                                .with_partition(p as i32)
                                .with_fetch_offset(o)
                                .with_partition_max_bytes(partition_max)
                        })
                        .collect(),
                )]);
        let mut request = frame(&req, FETCH_VERSION)?;
        request[8..12].copy_from_slice(&correlation.to_be_bytes());
        writer.write_all(&request)?;
        read_frame(&mut reader, &mut buf)?;
        // Fetch v11 (not flexible): correlation id, throttle, error, session, topics.
        let mut c = Cursor { b: &buf, at: 0 };
        if c.i32()? != correlation {
            return Err("fetch response out of order".into());
        }
        correlation += 1;
        c.i32()?;
        let error = c.i16()?;
        if error != 0 {
            return Err(format!("fetch error {error}").into());
        }
        c.i32()?;
        for _ in 0..c.i32()? {
            let name_len = c.i16()?;
            c.take(name_len.max(0) as usize)?;
            for _ in 0..c.i32()? {
                let p = c.i32()? as usize;
                let error = c.i16()?;
                if error != 0 {
                    return Err(format!("partition {p} error {error}").into());
                }
                c.take(24)?; // high watermark, last stable offset, log start offset
                let aborted = c.i32()?;
                c.take(aborted.max(0) as usize * 16)?;
                c.i32()?; // preferred read replica
                let len = c.i32()?;
                let set = c.take(len.max(0) as usize)?;
                // Walk the batch headers: base offset @0, batch length @8, last offset
                // delta @23, record count @57; a trailing partial batch is ignored.
                let mut at = 0usize;
                while set.len() - at >= 61 {
                    let base = i64::from_be_bytes(set[at..at + 8].try_into()?);
                    let total = i32::from_be_bytes(set[at + 8..at + 12].try_into()?) as usize + 12;
                    if at + total > set.len() {
                        break;
                    }
                    let last_delta = i32::from_be_bytes(set[at + 23..at + 27].try_into()?);
                    let count = i32::from_be_bytes(set[at + 57..at + 61].try_into()?);
                    if let Some(o) = offsets.get_mut(p) {
                        if base + i64::from(last_delta) >= *o {
                            *o = base + i64::from(last_delta) + 1;
                            got += count.max(0) as u64;
                        }
                    }
                    at += total;
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    report(got, got * record_bytes, secs);
    Ok(())
}
