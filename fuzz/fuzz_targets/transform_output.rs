//! What a transform plugin returns ("weir batch v1" output layout) through the host's
//! reader. The first byte is the input batch's record count, the rest the guest's buffer.
//! Must not panic (`weir::fuzzing::transform_output`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fn seeds() -> Vec<Vec<u8>> {
    weir::fuzzing::seed_transform_outputs()
        .into_iter()
        .map(|(buf, input_count)| {
            let mut seed = vec![input_count as u8];
            seed.extend_from_slice(&buf);
            seed
        })
        .collect()
}

fuzz_target!(
    init: { weir_fuzz::seed_empty_corpus(seeds) },
    |data: &[u8]| {
        if let Some((&input_count, buf)) = data.split_first() {
            let _ = weir::fuzzing::transform_output(buf, usize::from(input_count));
        }
    }
);
