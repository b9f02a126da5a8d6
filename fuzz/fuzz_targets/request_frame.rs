//! A request frame (the bytes after the 4-byte size prefix) through the broker's decoder:
//! key and version gating, request header, body. Must not panic; a decoded request must
//! re-encode and decode to the same value (`weir::fuzzing::request_frame`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: { weir_fuzz::seed_empty_corpus(weir::fuzzing::seed_request_frames) },
    |data: &[u8]| {
        let _ = weir::fuzzing::request_frame(data);
    }
);
