//! A Produce request's `records` field through batch and record validation, as sent and
//! again with every batch's CRC-32C made right (so mutations reach the record walker and
//! the decompressors instead of stopping at the checksum). Must not panic; an accepted
//! batch must decode with the record decoder (`weir::fuzzing::produce_payload`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: { weir_fuzz::seed_empty_corpus(weir::fuzzing::seed_produce_payloads) },
    |data: &[u8]| {
        let _ = weir::fuzzing::produce_payload(data, false);
        let mut fixed = data.to_vec();
        weir::fuzzing::fix_crcs(&mut fixed);
        if let weir::fuzzing::PayloadVerdict::Accepted { .. } =
            weir::fuzzing::produce_payload(&fixed, false)
        {
            let _ = weir::fuzzing::produce_payload(&fixed, true);
        }
    }
);
