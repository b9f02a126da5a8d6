//! Mutated request frames through a real broker: every frame that decodes reaches its
//! handler and gets an answer (or none, for acks=0 Produce), every frame that does not
//! decode closes only its own connection, and the broker keeps serving. A handler that
//! panics on a decoded request shows up as a connection closed without an answer.
//!
//! The frames are `weir::fuzzing::seed_request_frames()` (every API at every supported
//! version) with a few random edits after the API key and version, so each case lands on
//! a known handler. The seed of the edits is printed (set `WEIR_FRAME_SEED` to replay).
//! Long-poll APIs (Fetch, JoinGroup, SyncGroup) may legitimately park for as long as a
//! mutated timeout says, so they are only decoded here (the decoder is fuzzed for them in
//! `src/fuzzing.rs` and `fuzz/`).

use weir::fuzzing::{request_frame, seed_request_frames, FrameVerdict};

use crate::harness::{RawConn, TestBroker};

const CASES: usize = 300;
/// Fetch, JoinGroup, SyncGroup: answers may wait for a (mutated) timeout.
const PARKING_API_KEYS: [i16; 3] = [1, 11, 14];
const PRODUCE_API_KEY: i16 = 0;
/// ApiVersions v0, correlation id 0x5eed, null client id: sent after each case on the same
/// connection to learn whether the case was answered (responses come in request order).
const PROBE: [u8; 10] = [0, 18, 0, 0, 0, 0, 0x5e, 0xed, 0xff, 0xff];
const PROBE_CORRELATION_ID: i32 = 0x5eed;

/// splitmix64: a small deterministic generator, so a seed replays a run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One to four edits anywhere after the first four bytes (API key and version).
fn mutate(frame: &mut Vec<u8>, rng: &mut Rng) {
    const WORDS: [i32; 7] = [-1, 0, 1, i32::MAX, i32::MIN, 0x7fff, 0x1_0000];
    for _ in 0..1 + rng.below(4) {
        if frame.len() <= 4 {
            return;
        }
        let at = 4 + rng.below(frame.len() - 4);
        match rng.below(5) {
            0 | 1 => frame[at] ^= 1 + rng.below(255) as u8,
            2 => {
                let word = WORDS[rng.below(WORDS.len())].to_be_bytes();
                let n = (frame.len() - at).min(4);
                frame[at..at + n].copy_from_slice(&word[..n]);
            }
            3 => frame.truncate(at),
            _ => {
                let tail = frame.split_off(at);
                for _ in 0..1 + rng.below(8) {
                    frame.push(rng.next() as u8);
                }
                frame.extend_from_slice(&tail);
            }
        }
    }
}

fn correlation_id(response: &[u8]) -> i32 {
    i32::from_be_bytes([response[0], response[1], response[2], response[3]])
}

fn size_prefixed(frame: &[u8]) -> Vec<u8> {
    let mut out = (frame.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(frame);
    out
}

/// Sends `frame` then the probe on a fresh connection and checks the broker's reaction
/// against what the decoder made of the frame. `Err` says what went wrong.
fn check(bootstrap: &str, frame: &[u8]) -> Result<(), String> {
    let verdict = request_frame(frame);
    let mut conn = RawConn::connect(bootstrap);
    let mut bytes = size_prefixed(frame);
    bytes.extend_from_slice(&size_prefixed(&PROBE));
    conn.send_raw(&bytes);
    match verdict {
        FrameVerdict::Close(_) => match conn.read_frame() {
            None => Ok(()),
            Some(r) => Err(format!(
                "an undecodable frame was answered (correlation id {})",
                correlation_id(&r)
            )),
        },
        FrameVerdict::Respond => match conn.read_frame() {
            Some(_) => Ok(()),
            None => Err("no KIP-511 answer".into()),
        },
        FrameVerdict::Request { api_key, version } => {
            let Some(first) = conn.read_frame() else {
                return Err(format!(
                    "decoded key {api_key} v{version}, but the connection closed without an \
                     answer (a handler panic or a response that does not encode)"
                ));
            };
            if correlation_id(&first) == PROBE_CORRELATION_ID && api_key != PRODUCE_API_KEY {
                return Err(format!("decoded key {api_key} v{version} got no answer"));
            }
            if correlation_id(&first) != PROBE_CORRELATION_ID && conn.read_frame().is_none() {
                return Err(format!(
                    "after key {api_key} v{version}, the connection closed before the probe"
                ));
            }
            Ok(())
        }
    }
}

#[test]
fn mutated_frames_are_answered_or_close_only_their_connection() {
    let seed = std::env::var("WEIR_FRAME_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    println!("WEIR_FRAME_SEED={seed}");
    let b = TestBroker::start();
    let seeds: Vec<Vec<u8>> = seed_request_frames()
        .into_iter()
        .filter(|f| !PARKING_API_KEYS.contains(&i16::from_be_bytes([f[0], f[1]])))
        .collect();
    // Unmutated first: every one is answered, and topic-a and group-1 exist afterwards
    // so the mutated cases land on real partitions and groups.
    for (i, frame) in seeds.iter().enumerate() {
        if let Err(e) = check(&b.bootstrap, frame) {
            panic!("seed {i}: {e}");
        }
    }
    let mut rng = Rng(seed);
    for case in 0..CASES {
        let mut frame = seeds[rng.below(seeds.len())].clone();
        mutate(&mut frame, &mut rng);
        if let Err(e) = check(&b.bootstrap, &frame) {
            panic!("WEIR_FRAME_SEED={seed} case {case}: {e}; frame {frame:02x?}");
        }
    }
    // Still serving a fresh connection.
    let mut conn = RawConn::connect(&b.bootstrap);
    conn.send_raw(&size_prefixed(&PROBE));
    let answer = conn.read_frame().expect("ApiVersions answered");
    assert_eq!(correlation_id(&answer), PROBE_CORRELATION_ID);
}
