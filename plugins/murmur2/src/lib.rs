//! weir partitioner `murmur2`: Kafka's default partitioner, bit for bit.
//!
//! A keyed record goes to `(murmur2(key) & 0x7fffffff) % partition_count`, as Kafka's
//! `BuiltInPartitioner.partitionForKey` (`Utils.toPositive(Utils.murmur2(key)) % n`) and
//! librdkafka's `murmur2`/`murmur2_random` partitioners. A keyless record is spread
//! round-robin (Kafka 2.4+ uses a sticky partition per batch and librdkafka's
//! `murmur2_random` a random one; neither is reproducible across clients anyway).

use std::cell::Cell;

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`): 32-bit MurmurHash2
/// with seed `0x9747b28c`, reading the key as little-endian 4-byte words.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    // Java's `seed ^ length` on an int: the length wraps the same way.
    let mut h = SEED ^ (data.len() as u32);
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        let mut k = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = words.remainder();
    if tail.len() == 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

thread_local! {
    /// Next partition for a keyless record.
    static NEXT_KEYLESS: Cell<u32> = const { Cell::new(0) };
}

/// The partition of a record: murmur2 of the key, masked positive, mod the partition
/// count; keyless records round-robin.
pub fn partition(key: Option<&[u8]>, _value: Option<&[u8]>, partition_count: u32) -> u32 {
    let n = partition_count.max(1);
    match key {
        Some(k) => (murmur2(k) as u32 & 0x7fff_ffff) % n,
        None => NEXT_KEYLESS.with(|c| {
            let p = c.get() % n;
            c.set(c.get().wrapping_add(1));
            p
        }),
    }
}

weir_plugin_sdk::export_partitioner!(fn partition);

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's `UtilsTest.testMurmur2` vectors.
    #[test]
    fn java_vectors() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (k, want) in cases {
            assert_eq!(murmur2(k), want, "{:?}", String::from_utf8_lossy(k));
        }
    }
}
