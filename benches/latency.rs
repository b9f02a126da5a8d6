//! A paced produce-latency client for `benches/run.sh`: librdkafka (through the rdkafka
//! crate, the same library as `rdkafka_performance`) producing at a fixed rate, with the
//! latency of every record from its `produce()` call to its delivery report.
//!
//! Why not only `rdkafka_performance -l -r RATE`: that tool paces by spinning. Between two
//! records it calls `rd_kafka_poll(rk, 0)` in a loop until the next record is due (its
//! sleep is `1e6 / RATE` µs, below the 1 ms poll granularity), so its main thread keeps
//! one CPU busy whatever the rate. On a 2-core machine shared with the broker that leaves
//! one core for the broker's threads and librdkafka's own, and the latency tail it
//! reports is mostly their wait for a CPU. This client paces by the clock instead: every
//! 100 µs it produces the records due by then and sleeps until the next tick, while
//! rdkafka's `ThreadedProducer` thread waits for delivery reports in a blocking poll
//! and records each latency as it arrives. (A `BaseProducer::poll(timeout)` loop would
//! spin too: it polls with the time left in whole ms, 0 for the last millisecond.)
//!
//! ```text
//! latency BOOTSTRAP TOPIC PARTITION RECORDS RATE [RECORD_BYTES] [-X key=value ...]
//!     RATE records/s (0: as fast as the queue takes them); acks=1, linger.ms=0, no compression unless -X says
//!     otherwise; PARTITION -1 leaves partitioning to librdkafka.
//! ```
//! Prints `latency: records=.. secs=.. records/s=.. p50_ms=.. p99_ms=.. max_ms=.. errors=..`
//! (p50/p99 nearest rank over every delivered record), then where the time went by
//! librdkafka's own statistics (`statistics.interval.ms` 200; per broker connection,
//! rolling windows in µs; each figure is the largest over the windows of the timed
//! part): `int_latency_p99_ms` (produce() to the record being put in a request: the
//! client's queue), `outbuf_p99_ms` (request queued to written to the socket), `rtt_p99_ms`
//! and `rtt_max_ms` (written to its response handled: the broker, the network and the
//! client's broker thread getting a CPU). Exits non-zero when a record failed or the run
//! took longer than RECORDS / RATE + 60 s.

use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::statistics::{Statistics, Window};
use rdkafka::ClientContext;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Collects one latency (µs) per delivered record; called only from the producer's
/// polling thread, so the lock is never contended.
struct Latencies {
    start: Instant,
    micros: Mutex<Vec<u32>>,
    errors: Mutex<u64>,
    windows: Mutex<Windows>,
}

/// The largest of librdkafka's per-connection window figures (µs) over the statistics
/// emitted while `counting`.
#[derive(Default, Debug, Clone, Copy)]
struct Windows {
    counting: bool,
    /// Statistics callbacks since `counting` was set; the first is skipped (its window
    /// began before the clock: connection set-up and warm-up).
    seen: u32,
    int_latency_p99: i64,
    outbuf_p99: i64,
    rtt_p99: i64,
    rtt_max: i64,
}

impl ClientContext for Latencies {
    fn stats(&self, statistics: Statistics) {
        let mut w = self.windows.lock().expect("windows lock");
        if !w.counting {
            return;
        }
        w.seen += 1;
        if w.seen == 1 {
            return;
        }
        let p99 = |x: &Option<Window>| x.as_ref().map_or(0, |x| x.p99);
        // Real brokers only (the bootstrap entry has node id -1).
        for b in statistics.brokers.values().filter(|b| b.nodeid >= 0) {
            w.int_latency_p99 = w.int_latency_p99.max(p99(&b.int_latency));
            w.outbuf_p99 = w.outbuf_p99.max(p99(&b.outbuf_latency));
            w.rtt_p99 = w.rtt_p99.max(p99(&b.rtt));
            w.rtt_max = w.rtt_max.max(b.rtt.as_ref().map_or(0, |x| x.max));
        }
    }
}

impl ProducerContext for Latencies {
    /// Nanoseconds since `start` at the record's `produce()` call.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, sent_ns: usize) {
        let now_ns = self.start.elapsed().as_nanos() as usize;
        match result {
            Ok(_) => {
                let us = (now_ns.saturating_sub(sent_ns) / 1_000).min(u32::MAX as usize) as u32;
                self.micros.lock().expect("latency lock").push(us);
            }
            Err(_) => *self.errors.lock().expect("error lock") += 1,
        }
    }
}

struct Args {
    bootstrap: String,
    topic: String,
    partition: i32,
    records: u64,
    rate: u64,
    record_bytes: usize,
    extra: Vec<(String, String)>,
}

fn parse_args() -> Result<Args> {
    let mut args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mut extra = Vec::new();
    while let Some(i) = args.iter().position(|a| a == "-X") {
        if i + 1 >= args.len() {
            return Err("-X needs key=value".into());
        }
        let kv = args.remove(i + 1);
        args.remove(i);
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("-X {kv}: not key=value"))?;
        extra.push((k.to_string(), v.to_string()));
    }
    if args.len() < 5 {
        return Err(
            "usage: latency BOOTSTRAP TOPIC PARTITION RECORDS RATE [RECORD_BYTES] [-X key=value ...]"
                .into(),
        );
    }
    let num = |s: &str| -> Result<i64> {
        s.replace('_', "")
            .parse()
            .map_err(|e| format!("bad number {s}: {e}").into())
    };
    Ok(Args {
        bootstrap: args[0].clone(),
        topic: args[1].clone(),
        partition: num(&args[2])? as i32,
        records: num(&args[3])?.max(1) as u64,
        rate: num(&args[4])?.max(0) as u64,
        record_bytes: args
            .get(5)
            .map(|s| num(s))
            .transpose()?
            .unwrap_or(100)
            .max(1) as usize,
        extra,
    })
}

/// Nearest-rank percentile of sorted `v`, in ms.
fn rank_ms(v: &[u32], p: f64) -> f64 {
    let i = ((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    f64::from(v[i]) / 1000.0
}

fn run(a: Args) -> Result<()> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &a.bootstrap)
        .set("acks", "1")
        .set("linger.ms", "0")
        .set("compression.codec", "none")
        .set("statistics.interval.ms", "200");
    for (k, v) in &a.extra {
        config.set(k, v);
    }
    let context = Latencies {
        start: Instant::now(),
        micros: Mutex::new(Vec::with_capacity(a.records as usize)),
        errors: Mutex::new(0),
        windows: Mutex::new(Windows::default()),
    };
    let producer: ThreadedProducer<Latencies> = config.create_with_context(context)?;
    let payload = vec![b'x'; a.record_bytes];
    // Connected, with the topic's metadata, before the clock starts: the first records
    // must not carry the connection set-up (tens of ms, 1% of a 2 M-record run at
    // 850 k/s).
    producer
        .client()
        .fetch_metadata(Some(&a.topic), Duration::from_secs(10))?;
    let mut warm_up = BaseRecord::with_opaque_to(&a.topic, 0usize).payload(&payload[..]);
    if a.partition >= 0 {
        warm_up = warm_up.partition(a.partition);
    }
    producer.send::<[u8], [u8]>(warm_up).map_err(|(e, _)| e)?;
    producer.flush(Duration::from_secs(10))?;
    producer
        .context()
        .micros
        .lock()
        .expect("latency lock")
        .clear();
    producer
        .context()
        .windows
        .lock()
        .expect("windows lock")
        .counting = true;
    let deadline = Instant::now()
        + Duration::from_secs(60)
        + Duration::from_secs_f64(a.records as f64 / a.rate.max(1) as f64);
    let began = Instant::now();
    let mut sent: u64 = 0;
    let tick = Duration::from_micros(100);
    let mut next_tick = began + tick;
    while sent < a.records {
        if Instant::now() > deadline {
            return Err(format!(
                "{sent} of {} records produced before the deadline",
                a.records
            )
            .into());
        }
        // The records due by now (all of them at RATE 0).
        let due = if a.rate == 0 {
            a.records
        } else {
            ((began.elapsed().as_secs_f64() * a.rate as f64) as u64).min(a.records)
        };
        while sent < due {
            let sent_ns = producer.context().start.elapsed().as_nanos() as usize;
            let mut record = BaseRecord::with_opaque_to(&a.topic, sent_ns).payload(&payload[..]);
            if a.partition >= 0 {
                record = record.partition(a.partition);
            }
            match producer.send::<[u8], [u8]>(record) {
                Ok(()) => sent += 1,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => return Err(format!("produce: {e}").into()),
            }
            if Instant::now() > deadline {
                break;
            }
        }
        if a.rate != 0 {
            let now = Instant::now();
            if next_tick > now {
                std::thread::sleep(next_tick - now);
            }
            next_tick += tick;
        }
    }
    // Every record delivered (or failed) before the count.
    while producer.in_flight_count() > 0 {
        if Instant::now() > deadline {
            return Err(format!(
                "{} records undelivered at the deadline",
                producer.in_flight_count()
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let secs = began.elapsed().as_secs_f64();
    // The last window, with the run's end in it.
    std::thread::sleep(Duration::from_millis(250));
    let windows = *producer.context().windows.lock().expect("windows lock");
    let errors = *producer.context().errors.lock().expect("error lock");
    let mut v = std::mem::take(&mut *producer.context().micros.lock().expect("latency lock"));
    v.sort_unstable();
    if v.is_empty() {
        return Err("no record delivered".into());
    }
    let ms = |us: i64| us as f64 / 1000.0;
    println!(
        "latency: records={} secs={secs:.3} records/s={:.0} p50_ms={:.2} p99_ms={:.2} max_ms={:.2} errors={errors} \
         int_latency_p99_ms={:.2} outbuf_p99_ms={:.2} rtt_p99_ms={:.2} rtt_max_ms={:.2}",
        v.len(),
        v.len() as f64 / secs,
        rank_ms(&v, 50.0),
        rank_ms(&v, 99.0),
        rank_ms(&v, 100.0),
        ms(windows.int_latency_p99),
        ms(windows.outbuf_p99),
        ms(windows.rtt_p99),
        ms(windows.rtt_max),
    );
    if errors > 0 {
        return Err(format!("{errors} records failed").into());
    }
    Ok(())
}

fn main() -> ExitCode {
    match parse_args().and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("latency: {e}");
            ExitCode::FAILURE
        }
    }
}
