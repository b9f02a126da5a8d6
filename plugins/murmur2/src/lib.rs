//! weir partitioner `murmur2`: Kafka's default partitioner, bit for bit.
//!
//! A keyed record goes to `(murmur2(key) & 0x7fffffff) % partition_count`, as Kafka's
//! `BuiltInPartitioner.partitionForKey` (`Utils.toPositive(Utils.murmur2(key)) % n`) and
//! librdkafka's `murmur2`/`murmur2_random` partitioners. A keyless record is spread
//! round-robin (Kafka 2.4+ uses a sticky partition per batch and librdkafka's
//! `murmur2_random` a random one; neither is reproducible across clients anyway).
//!
//! The hash lives in the SDK (`weir_plugin_sdk::murmur2`), shared with `json-field`.

use std::cell::RefCell;

pub use weir_plugin_sdk::murmur2::murmur2;
use weir_plugin_sdk::murmur2::{partition_for_bytes, RoundRobin};

thread_local! {
    /// Where the next keyless record goes.
    static KEYLESS: RefCell<RoundRobin> = const { RefCell::new(RoundRobin::new()) };
}

/// The partition of a record: murmur2 of the key, masked positive, mod the partition
/// count; keyless records round-robin.
pub fn partition(key: Option<&[u8]>, _value: Option<&[u8]>, partition_count: u32) -> u32 {
    match key {
        Some(k) => partition_for_bytes(k, partition_count),
        None => KEYLESS.with(|rr| rr.borrow_mut().next_partition(partition_count)),
    }
}

weir_plugin_sdk::export_partitioner!(fn partition);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_records_use_the_masked_hash_and_keyless_ones_spread() {
        // Kafka's `UtilsTest.testMurmur2`: murmur2("21") = -973932308.
        assert_eq!(
            partition(Some(b"21"), None, 1000),
            (-973_932_308i32 as u32 & 0x7fff_ffff) % 1000
        );
        let spread: Vec<u32> = (0..4).map(|_| partition(None, Some(b"v"), 2)).collect();
        assert_eq!(spread, vec![0, 1, 0, 1]);
    }
}
